"""A hard bound on each test, behind pytest-timeout: a pytest plugin (``tests/conftest.py`` loads it).
Does I/O (a timer thread, signals to this process's children, ``os._exit``).

pytest-timeout runs with its default ``signal`` method: at the test's timeout it raises ``Failed`` in
the main thread, the test fails normally and its fixtures tear down (processes stopped by PID), and
the pytest process, an xdist worker or the serial broker-matrix pass, goes on with the next test. In
an asyncio test that exception lands wherever the event loop is (in ``select``, or inside one of its
tasks, which then dies of it), so the teardown can wait for a task that will never end; and
pytest-timeout arms its timer once per test, so nothing bounds that teardown. Its ``thread`` method
would bound it, but ends the whole process at every timeout: the serial matrix pass would stop at the
first one.

So this plugin arms a second timer per test, ``GRACE_S`` after the test's timeout (setup, call and
teardown together, as pytest-timeout counts them). When it fires, the test's protocol is still not
done: it writes every thread's stack to stderr, SIGKILLs this process's child processes (the test
doubles' pods, brokers, JVMs: also those in their own sessions) and exits the process with status 1.
Under xdist the controller reports the test as failed ("worker crashed") and starts a new worker;
run serially, the run ends there. Either way CI is held at most timeout + ``GRACE_S``.
"""

from __future__ import annotations

import contextlib
import faulthandler
import os
import signal
import sys
import threading
from collections.abc import Generator
from pathlib import Path

import pytest

# A teardown that stops pods (30 s SIGTERM grace) and servers fits well within it; the environment
# variable is for the plugin's own test (tests/unit/test_timeout_backstop.py).
GRACE_S = float(os.environ.get("MULTILANE_TIMEOUT_GRACE_S", "120"))


def timeout_of(item: pytest.Item) -> float:
    """The item's pytest-timeout limit in seconds (its ``timeout`` marker, else ``--timeout``, else the
    ``timeout`` ini value); 0 means none."""
    marker = item.get_closest_marker("timeout")
    if marker is not None:
        value = marker.kwargs.get("timeout", marker.args[0] if marker.args else None)
        if value is not None:
            return float(value)
    option = item.config.getoption("timeout", None)
    if option is not None:
        return float(option)
    return float(item.config.getini("timeout") or 0)


def children(parent: int) -> list[int]:
    """PIDs of ``parent``'s direct child processes (from ``/proc``; [] where there is none)."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            # pid (comm) state ppid ...: comm may hold spaces and parentheses, so split after the last ")"
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == parent:
                out.append(int(stat.parent.name))
    return out


def _abort(item: pytest.Item, limit_s: float) -> None:
    nodeid = item.nodeid
    capman = item.config.pluginmanager.getplugin("capturemanager")
    if capman is not None:  # stderr is the terminal's (or the xdist worker's) again, not the capture's
        with contextlib.suppress(Exception):
            capman.suspend_global_capture(in_=True)
    err = sys.stderr
    err.write(
        f"\n+++ timeout backstop: {nodeid} still not torn down {GRACE_S:.0f} s after its {limit_s:.0f} s "
        f"timeout; the stacks of every thread, then SIGKILL to the child processes and exit 1\n"
    )
    err.flush()
    faulthandler.dump_traceback(file=err, all_threads=True)
    for pid in children(os.getpid()):
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    err.flush()
    os._exit(1)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(
    item: pytest.Item, nextitem: pytest.Item | None
) -> Generator[None, object, object]:
    limit = timeout_of(item)
    if limit <= 0:
        return (yield)
    timer = threading.Timer(limit + GRACE_S, _abort, args=(item, limit))
    timer.daemon = True
    timer.start()
    try:
        return (yield)
    finally:
        timer.cancel()
