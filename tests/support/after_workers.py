"""Checks over what every pytest-xdist worker saw: a pytest plugin (``tests/conftest.py`` loads it). No
I/O beyond pytest's own channel between the controller and its workers.

A test that checks a record of the whole session (``tests/operator/test_zz_least_privilege.py``: every
rule the chart grants was used by some scenario) cannot run on one worker of ``pytest -n N``: that
worker holds only the record of the tests it ran, and cannot know when the others are done. Such a
test is marked ``@after_workers(check)``, where ``check(record)`` is a module-level function that
asserts (or skips) on a :class:`Record`. Run serially, the test runs as written. Under xdist:

1. **Defer.** A worker collects the marked test, then takes it out of the tests it may run (last in
   ``pytest_collection_modifyitems``, after ``-m`` and ``-k`` have deselected).
2. **Send.** When a worker finishes, it sends to the controller, in ``workeroutput``: its part of the
   record (set by :func:`export` from a session fixture) and the tests it deferred.
3. **Merge.** The controller merges the parts as each worker goes down (``pytest_testnodedown``).
4. **Check.** At the end of the session the controller calls each deferred test's ``check`` on the
   merged record and reports the outcome as that test's (passed, failed with its assertion, or
   skipped); a failure fails the run. A worker that went down without finishing leaves the record
   incomplete: the deferred tests then fail, saying so.
"""

from __future__ import annotations

import importlib
import inspect
import os
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

import pytest

__all__ = ["Record", "after_workers", "export"]

_OUT = "multilane-after-workers"  # the workeroutput key
_CHECK_ATTR = "_multilane_after_workers_check"
_DEFERRED = pytest.StashKey[list[dict[str, Any]]]()  # a worker's deferred tests
_MERGED = pytest.StashKey["Record"]()  # the controller's merged record
_PENDING = pytest.StashKey[dict[str, dict[str, Any]]]()  # the controller's deferred tests, by node id
F = TypeVar("F", bound=Callable[..., Any])


@dataclass
class Record:
    """What the tests of a session (or of every worker) saw, merged: plain data only (it crosses the
    xdist channel).

    - ``collected``: node ids of every collected test (each worker collects them all);
    - ``manifests``: the chart's rendered documents (the same from every worker that rendered them);
    - ``used``: (role, rule index, API group, resource, verb) -> requests it authorized, summed;
    - ``denied``: every refusal line, in the order the workers reported them;
    - ``scenarios``: node ids of the tests that ran under the chart's RBAC;
    - ``incomplete``: why the record lacks a part (a worker that went down), empty when whole."""

    collected: set[str] = field(default_factory=set)
    manifests: list[dict[str, Any]] = field(default_factory=list)
    used: dict[tuple[str, int, str, str, str], int] = field(default_factory=dict)
    denied: list[str] = field(default_factory=list)
    scenarios: set[str] = field(default_factory=set)
    incomplete: list[str] = field(default_factory=list)

    def to_wire(self) -> dict[str, Any]:
        return {
            "collected": sorted(self.collected),
            "manifests": self.manifests,
            "used": [[*key, n] for key, n in self.used.items()],
            "denied": list(self.denied),
            "scenarios": sorted(self.scenarios),
        }

    def merge(self, wire: Mapping[str, Any]) -> None:
        self.collected.update(wire["collected"])
        if not self.manifests:
            self.manifests = list(wire["manifests"])
        for role, index, group, resource, verb, n in wire["used"]:
            key = (str(role), int(index), str(group), str(resource), str(verb))
            self.used[key] = self.used.get(key, 0) + int(n)
        self.denied.extend(wire["denied"])
        self.scenarios.update(wire["scenarios"])


def after_workers(check: Callable[[Record], None]) -> Callable[[F], F]:
    """Marks a test whose ``check`` needs the record of the whole session (see the module's doc)."""
    if "<locals>" in check.__qualname__:
        raise ValueError(f"{check.__qualname__}: the check must be a module-level function")

    def mark(test: F) -> F:
        # module:qualname:file -- the controller imports the module from its file's folder (a test
        # folder without __init__.py is on sys.path only in the processes that collected it)
        source = inspect.getsourcefile(check) or ""
        setattr(test, _CHECK_ATTR, f"{check.__module__}:{check.__qualname__}:{source}")
        return test

    return mark


def export(config: pytest.Config, manifests: list[dict[str, Any]],
           used: Mapping[tuple[str, int, str, str, str], int], denied: Iterable[str],
           scenarios: Iterable[str]) -> None:
    """Called at the teardown of the session fixture that holds the record: on an xdist worker it
    becomes this worker's part (step 2); run serially it does nothing."""
    out = getattr(config, "workeroutput", None)
    if out is None:
        return
    part = Record(manifests=manifests, used=dict(used), denied=list(denied), scenarios=set(scenarios))
    out.setdefault(_OUT, {})["part"] = part.to_wire()


def _check_of(item: pytest.Item) -> str | None:
    return getattr(getattr(item, "function", None), _CHECK_ATTR, None)


def _is_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


# 1. defer (on a worker; after -m and -k have deselected)
@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not _is_worker(config):
        return
    deferred = config.stash.setdefault(_DEFERRED, [])
    kept = []
    for item in items:
        check = _check_of(item)
        if check is None:
            kept.append(item)
            continue
        path, lineno, name = item.location
        deferred.append({"nodeid": item.nodeid, "location": [path, lineno, name], "check": check})
    items[:] = kept


# 2. send (on a worker; xdist's own hook wrapper sends workeroutput after this)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    config = session.config
    if _is_worker(config):
        out = config.workeroutput  # type: ignore[attr-defined]
        mine = out.setdefault(_OUT, {})
        mine["deferred"] = config.stash.get(_DEFERRED, [])
        mine["collected"] = [item.nodeid for item in session.items] + [d["nodeid"] for d in mine["deferred"]]
        return
    if _MERGED in config.stash:
        _check_deferred(session)  # 4.


# 3. merge (on the controller)
@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: object) -> None:
    config: pytest.Config = node.config
    merged = config.stash.setdefault(_MERGED, Record())
    pending = config.stash.setdefault(_PENDING, {})
    out = getattr(node, "workeroutput", None) or {}
    mine = out.get(_OUT)
    if error or mine is None:
        merged.incomplete.append(f"worker {node.gateway.id} went down without finishing ({error})")
        return
    merged.collected.update(mine["collected"])
    if "part" in mine:
        merged.merge(mine["part"])
    for d in mine["deferred"]:
        pending[d["nodeid"]] = d


# 4. check (on the controller)
def _check_deferred(session: pytest.Session) -> None:
    config = session.config
    merged = config.stash[_MERGED]
    stopped = session.exitstatus not in (pytest.ExitCode.OK, pytest.ExitCode.TESTS_FAILED)
    pending = sorted(config.stash.get(_PENDING, {}).values(), key=lambda d: d["nodeid"])
    session.testscollected += len(pending)  # the workers counted only what they ran: progress to 100%
    failed = False
    for d in pending:
        report = _run_check(d, merged, stopped)
        config.hook.pytest_runtest_logstart(nodeid=report.nodeid, location=report.location)
        config.hook.pytest_runtest_logreport(report=report)
        config.hook.pytest_runtest_logfinish(nodeid=report.nodeid, location=report.location)
        failed |= report.failed
    if failed and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def _import_check_module(module: str, source: str) -> Any:
    """The check's module, imported as pytest's default (prepend) import mode would: its folder first
    on ``sys.path`` when it is not importable as it is (the xdist controller collected nothing)."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError:
        folder = os.path.dirname(source)
        if not folder or folder in sys.path:
            raise
        sys.path.insert(0, folder)
        return importlib.import_module(module)


def _run_check(deferred: Mapping[str, Any], record: Record, stopped: bool) -> pytest.TestReport:
    path, lineno, name = deferred["location"]
    started = time.monotonic()
    longrepr: Any = None
    try:
        if stopped:
            pytest.skip("the session stopped before every test ran: the record is incomplete")
        if record.incomplete:
            raise AssertionError("the record is incomplete: " + "; ".join(record.incomplete))
        module, qualname, source = ([*str(deferred["check"]).split(":", 2), "", ""])[:3]
        check = getattr(_import_check_module(module, source), qualname)
        check(record)
        outcome = "passed"
    except pytest.skip.Exception as skip:
        outcome, longrepr = "skipped", (path, (lineno or 0) + 1, f"Skipped: {skip.msg}")
    except Exception as exc:  # the check's assertion, or its import failing: both fail the test
        outcome = "failed"
        longrepr = f"{deferred['check']}, on the record of every worker:\n{type(exc).__name__}: {exc}"
    return pytest.TestReport(
        nodeid=deferred["nodeid"], location=(path, lineno, name), keywords={name: 1}, outcome=outcome,
        longrepr=longrepr, when="call", duration=time.monotonic() - started,
    )
