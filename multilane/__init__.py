"""multilane: scale a Kafka consumer application past its topic's partition count.

Subpackages:

- ``multilane.worker``: the in-process engine (lanes, offset tracking, progress, state). Does I/O
  (Kafka, RocksDB, HTTP) in its runtime modules; its decision modules are pure.
- ``multilane.operator``: the kopf control plane and its pure policy and planning code.
- ``multilane.pipeline``: PySpark jobs for bulk state work (snapshots).
- ``multilane.sim``: a discrete-event simulator for autoscaling policies (pure, no I/O).
- ``multilane.testing``: the embedded broker, delivery-guarantee checkers and ``run_processor``.

The application API: :mod:`multilane.api` (``Record``, ``Context``, ``NonRetryable``, ...),
:class:`multilane.App` (:mod:`multilane.app`) and :mod:`multilane.codecs`. They are imported on first
use (``import multilane`` stays light: ``multilane.api.Record`` and ``multilane.App`` just work).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from multilane import api, app, codecs
    from multilane.app import App

__version__ = "0.1.0"

__all__ = ["App", "__version__", "api", "app", "codecs"]

# Submodules reachable as attributes of the package without importing them by hand.
_LAZY_MODULES = frozenset({"api", "app", "codecs", "testing"})


def __getattr__(name: str) -> Any:
    if name in _LAZY_MODULES:
        return importlib.import_module(f"multilane.{name}")
    if name == "App":
        from multilane.app import App

        return App
    raise AttributeError(f"module 'multilane' has no attribute {name!r}")
