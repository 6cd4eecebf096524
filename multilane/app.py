"""``multilane.App``: an application in one object -- its processor, typed settings, startup and
shutdown hooks, and the worker settings it runs with. Does I/O (reads the settings file; ``run`` starts a
worker).

Run it with ``multilane worker --app package.module:app`` or, from the app's own module,
``app.run()`` (so ``python -m package.module`` works). Settings are resolved in layers, each overriding
the one before (steps of :meth:`App.resolve`):

1. the worker's built-in defaults, then the keyword arguments of ``App(...)`` (``topic="orders"``,
   ``value_format="json"``, ...: any ``multilane worker`` flag, dashes as underscores);
2. a settings file (``--config FILE``, TOML or JSON): top-level keys are worker settings, the
   ``[settings]`` table fills the app's own settings class;
3. the environment: ``MULTILANE_<FLAG>`` for worker settings (``MULTILANE_BOOTSTRAP_SERVERS``,
   ``MULTILANE_TOPIC=a,b``), ``MULTILANE_APP_<FIELD>`` for the app's settings;
4. the command line: worker flags, and ``--set FIELD=VALUE`` for the app's settings.

The app's settings class is a dataclass whose fields are typed ``str``, ``int``, ``float`` or ``bool``
(optionally ``| None``); values from text are converted to the field's type, a bad one is a one-line
:class:`AppConfigError`. Hooks (``@app.on_startup``, ``@app.on_shutdown``, ``@app.context`` for an
async generator that yields once) run on the worker's event loop: startup before the engine is
created, shutdown after it stopped (:meth:`App.lifespan`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import json
import os
import sys
import tomllib
import types
import typing
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, NoReturn

from multilane.api import Processor, check_processor, needs_state

__all__ = ["SETTINGS_ENV_PREFIX", "WORKER_ENV_PREFIX", "App", "AppConfigError"]

WORKER_ENV_PREFIX = "MULTILANE_"  # + the flag's name, upper case, dashes as underscores
SETTINGS_ENV_PREFIX = "MULTILANE_APP_"  # + the settings field's name, upper case

# Flags that choose the app and its settings: only ever from the command line.
_NOT_LAYERED = frozenset({"app", "config", "set"})

Hook = Callable[[], Any]  # a function or an async function taking no arguments


class AppConfigError(ValueError):
    """A setting that does not exist or does not convert to its type (one line)."""


class App:
    """A multilane application: its processor, settings and hooks.

    Invariants: the processor handed out by :meth:`get_processor` is checked
    (:func:`~multilane.api.check_processor`); with ``state=True`` it is marked
    :func:`~multilane.api.needs_state`, so a worker without ``--state-dir`` refuses to start.
    """

    def __init__(self, processor: Processor | None = None, *, name: str | None = None,
                 settings: type | None = None, state: bool = False, **worker: Any) -> None:
        if settings is not None and not dataclasses.is_dataclass(settings):
            raise TypeError(f"App(settings=...) must be a dataclass type, got {settings!r}")
        self.name = name or "multilane-app"
        self.state = state
        self.settings_class = settings
        self.worker_defaults: dict[str, Any] = dict(worker)  # worker flag dests -> values (layer 1)
        self._processor: Processor | None = None
        self._settings: Any = None  # the resolved settings instance (None until resolved)
        self._startup: list[Hook] = []
        self._shutdown: list[Hook] = []
        self._contexts: list[Callable[[], contextlib.AbstractAsyncContextManager[Any]]] = []
        if processor is not None:
            self.processor(processor)

    # -- declaration -------------------------------------------------------------------------------

    def processor(self, fn: Processor) -> Processor:
        """Set the processor (usable as a decorator). Its signature is checked by
        :meth:`get_processor` (the worker and ``run_processor`` call it), so that a wrong one stops a
        worker with one line however it was started."""
        if self.state and callable(fn):
            needs_state(fn)
        self._processor = fn
        return fn

    def get_processor(self) -> Processor:
        """The processor, checked (:class:`~multilane.api.ProcessorSignatureError` when it is wrong)."""
        if self._processor is None:
            raise AppConfigError(f"{self.name} has no processor: pass App(handle) or decorate it "
                                 "with @app.processor")
        check_processor(self._processor, f"{self.name}'s processor")
        return self._processor

    def on_startup(self, fn: Hook) -> Hook:
        """Decorator: run ``fn()`` (sync or async) when the worker starts, before it consumes."""
        self._startup.append(fn)
        return fn

    def on_shutdown(self, fn: Hook) -> Hook:
        """Decorator: run ``fn()`` (sync or async) after the worker stopped (also after a failed
        start); shutdown hooks run in reverse order."""
        self._shutdown.append(fn)
        return fn

    def context(self, fn: Callable[[], AsyncIterator[Any]]) -> Callable[[], AsyncIterator[Any]]:
        """Decorator: an async generator that sets up, ``yield``s once, then cleans up (like
        :func:`contextlib.asynccontextmanager`); entered at startup, left at shutdown."""
        if not inspect.isasyncgenfunction(fn):
            raise TypeError(f"@app.context needs an async generator function (with one yield), got {fn!r}")
        self._contexts.append(contextlib.asynccontextmanager(fn))
        return fn

    # -- settings ----------------------------------------------------------------------------------

    @property
    def settings(self) -> Any:
        """The app's settings (an instance of ``settings=``); resolved from the environment alone when
        nothing resolved them yet (e.g. in a unit test)."""
        if self._settings is None:
            self._settings = self.build_settings({}, os.environ, [])
        return self._settings

    @settings.setter
    def settings(self, value: Any) -> None:
        self._settings = value

    def build_settings(self, from_file: Mapping[str, Any], environ: Mapping[str, str],
                       assignments: Sequence[str]) -> Any:
        """The settings instance from the file's ``[settings]`` table, the environment and ``--set``."""
        cls = self.settings_class
        if cls is None:
            if from_file or assignments:
                raise AppConfigError(f"{self.name} declares no settings class (App(settings=...))")
            return None
        fields = {f.name: f for f in dataclasses.fields(cls)}
        hints = typing.get_type_hints(cls)
        values: dict[str, Any] = {}
        for key, value in from_file.items():
            name = _field_name(key, fields, "the settings file")
            values[name] = _convert(value, hints[name], f"setting {name!r}")
        for name in fields:
            raw = environ.get(SETTINGS_ENV_PREFIX + name.upper())
            if raw is not None:
                values[name] = _convert(raw, hints[name], f"{SETTINGS_ENV_PREFIX}{name.upper()}")
        for item in assignments:
            key, sep, raw = item.partition("=")
            if not sep:
                raise AppConfigError(f"--set {item!r} must look like FIELD=VALUE")
            name = _field_name(key.strip(), fields, "--set")
            values[name] = _convert(raw, hints[name], f"--set {name}")
        try:
            return cls(**values)
        except TypeError as exc:  # a field without a default and no value
            raise AppConfigError(f"{self.name} settings: {exc}") from exc

    def resolve(self, dests: Mapping[str, Any], config_file: str | None,
                environ: Mapping[str, str]) -> tuple[dict[str, Any], Mapping[str, Any]]:
        """The worker defaults of layers 1-3 (module docstring) and the file's ``[settings]`` table.

        ``dests`` maps each worker flag's dest to its built-in default; the command line (layer 4) is
        parsed on top of what this returns.
        """
        # 1. App(...) keyword arguments
        out: dict[str, Any] = {}
        for key, value in self.worker_defaults.items():
            out[_dest(key, dests, f"App({key}=...)")] = value
        # 2. settings file
        from_file: dict[str, Any] = {}
        if config_file:
            data = read_settings_file(config_file)
            table = data.pop("settings", {})
            if not isinstance(table, dict):
                raise AppConfigError(f"{config_file}: [settings] must be a table")
            from_file = table
            for key, value in data.items():
                out[_dest(key, dests, config_file)] = value
        # 3. environment
        for dest in dests:
            if dest in _NOT_LAYERED:
                continue
            raw = environ.get(WORKER_ENV_PREFIX + dest.upper())
            if raw is not None:
                out[dest] = raw
        # list flags (--topic, --consumer-config, ...) take a list; "a,b" from text
        for dest, default in dests.items():
            if isinstance(default, list) and dest in out and not isinstance(out[dest], list):
                value = out[dest]
                out[dest] = [v.strip() for v in value.split(",") if v.strip()] if isinstance(value, str) \
                    else [value]
        return out, from_file

    # -- lifecycle ---------------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def lifespan(self) -> AsyncIterator[App]:
        """Startup hooks and contexts in order on entry; on exit, in reverse order, the shutdown hooks
        and the contexts' clean-up (each runs even when an earlier one failed)."""
        async with contextlib.AsyncExitStack() as stack:
            for hook in self._shutdown:  # the stack runs them last, newest first
                stack.push_async_callback(_call, hook)
            for hook in self._startup:
                await _call(hook)
            for make in self._contexts:
                await stack.enter_async_context(make())
            yield self

    def run(self, argv: Sequence[str] | None = None) -> NoReturn:
        """Run a worker for this app (``python -m package.module``); exits with the worker's code.

        ``argv`` (default ``sys.argv[1:]``) takes the flags of ``multilane worker`` (without ``--app``).
        """
        raise SystemExit(_runner()(self, list(sys.argv[1:] if argv is None else argv)))


RUNNER_GROUP = "multilane.runners"  # the entry-point group that names the worker's runner of an App


def _runner() -> Callable[[App, list[str]], int]:
    """The runner of :meth:`App.run`: the entry point ``worker`` of :data:`RUNNER_GROUP`
    (``multilane.worker.cli:run_app``, in pyproject.toml). The App names no module above it: the
    command line imports the App, never the other way round (import-linter contract ``app-below-cli``).
    """
    from importlib.metadata import entry_points

    found = entry_points(group=RUNNER_GROUP, name="worker")
    if not found:
        raise AppConfigError(f"no entry point 'worker' in group {RUNNER_GROUP!r}: multilane is not "
                             "installed (pip install multilane), or its metadata is stale (reinstall)")
    runner: Callable[[App, list[str]], int] = next(iter(found)).load()
    return runner


def read_settings_file(path: str) -> dict[str, Any]:
    """A TOML (``.toml``) or JSON file's top-level table; AppConfigError (one line) when unreadable."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise AppConfigError(f"settings file {path}: {exc.strerror or exc}") from exc
    try:
        data = json.loads(text) if path.endswith(".json") else tomllib.loads(text)
    except (ValueError, tomllib.TOMLDecodeError) as exc:
        raise AppConfigError(f"settings file {path}: {exc}") from exc
    if not isinstance(data, dict):
        raise AppConfigError(f"settings file {path}: the top level must be a table/object")
    return data


async def _call(hook: Hook) -> None:
    result = hook()
    if isinstance(result, Awaitable):
        await result


def _dest(key: str, dests: Mapping[str, Any], where: str) -> str:
    dest = key.replace("-", "_")
    if dest not in dests or dest in _NOT_LAYERED:
        raise AppConfigError(f"{where}: {key!r} is not a multilane worker setting "
                             "(see multilane worker --help)")
    return dest


def _field_name(key: str, fields: Mapping[str, Any], where: str) -> str:
    name = key.replace("-", "_")
    if name not in fields:
        raise AppConfigError(f"{where}: no setting {key!r} (known: {', '.join(fields)})")
    return name


def _convert(value: Any, hint: Any, where: str) -> Any:
    """``value`` converted to the field type ``hint`` (str, int, float, bool, optionally | None)."""
    args = typing.get_args(hint)
    if typing.get_origin(hint) in (typing.Union, types.UnionType) and type(None) in args:
        if value is None or (isinstance(value, str) and value.strip().lower() in ("", "none", "null")):
            return None
        hint = next(a for a in args if a is not type(None))
    if not isinstance(value, str):
        if hint is float and isinstance(value, int) and not isinstance(value, bool):
            return float(value)
        if isinstance(hint, type) and isinstance(value, hint):
            return value
        raise AppConfigError(f"{where}: expected {getattr(hint, '__name__', hint)}, got {value!r}")
    try:
        if hint is bool:
            low = value.strip().lower()
            if low in ("1", "true", "yes", "on"):
                return True
            if low in ("0", "false", "no", "off"):
                return False
            raise ValueError(value)
        if hint in (int, float, str):
            return hint(value.strip() if hint is not str else value)
    except ValueError:
        raise AppConfigError(f"{where}: {value!r} is not a {hint.__name__}") from None
    raise AppConfigError(f"{where}: settings fields must be str, int, float or bool, not {hint!r}")
