"""A pytest plugin: the suite leaves nothing in the temporary directory (``tests/conftest.py`` loads it).
Does I/O (the temporary directories, the creators' ledger).

1. At configure, in the process that runs the session (the xdist controller, or a run without xdist),
   make a private directory ``multilane-tests-XXXX`` in the system's temporary directory. Its ``tmp``
   becomes the temporary directory of this process and of every process it starts (``TMPDIR``,
   ``tempfile.tempdir``): xdist workers inherit it. pytest's own ``tmp_path`` directories stay where
   pytest keeps and prunes them (``PYTEST_DEBUG_TEMPROOT`` = the system's temporary directory).
2. Creators: ``tests/support/tmp_ledger`` goes first on ``PYTHONPATH``, and ``MULTILANE_TMP_LEDGER``
   names ``created.jsonl`` beside ``tmp``; every Python process started under the session (and this
   one) then appends who created each ``mkstemp``/``mkdtemp`` path (pid, argv, caller).
3. At the session's end in that process (after the xdist workers finished), list what is left in
   ``tmp``: any entry fails the session (exit status 1) and is named in the summary with its creator
   from the ledger (or "not recorded": a process that is not Python, or whose environment was
   replaced); with nothing left, the summary says so, with how many paths the ledger recorded. Then
   remove the private directory.
4. New entries of the system's temporary directory itself (before vs after) are listed too, as a
   report only: other processes of the machine write there as well. A program that ignores ``TMPDIR``
   (the JVM's ``java.io.tmpdir``) shows up there.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

PREFIX = "multilane-tests-"
LEDGER_DIR = Path(__file__).resolve().parent / "tmp_ledger"  # holds the sitecustomize of step 2
_ENV = ("TMPDIR", "PYTHONPATH", "MULTILANE_TMP_LEDGER")  # what step 1-2 set, restored at unconfigure


@dataclasses.dataclass
class _Session:
    """The check's facts (owner: this plugin, in the process that runs the session)."""

    system: str  # the system's temporary directory
    before: set[str]  # its entries at configure
    private: Path  # the session's own directory: ``tmp`` (TMPDIR) and ``created.jsonl`` (the ledger)
    old_env: dict[str, str | None]  # _ENV's values before configure
    left: list[str] = dataclasses.field(default_factory=list)  # "name (its creator)", left in ``tmp``
    new_in_system: list[str] = dataclasses.field(default_factory=list)
    recorded: tuple[int, int] = (0, 0)  # temporary paths the ledger holds, and how many processes made them

    @property
    def tmp(self) -> Path:
        return self.private / "tmp"

    @property
    def ledger(self) -> Path:
        return self.private / "created.jsonl"


_KEY = pytest.StashKey[_Session]()


def _controls(config: pytest.Config) -> bool:
    """This process runs the session (not an xdist worker)."""
    return not hasattr(config, "workerinput")


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    if not _controls(config):
        return
    # 1. a private temporary directory for the session and its children
    system = tempfile.gettempdir()
    os.environ.setdefault("PYTEST_DEBUG_TEMPROOT", system)
    before = set(os.listdir(system))
    private = Path(tempfile.mkdtemp(prefix=PREFIX, dir=system))
    state = _Session(system, before, private, {k: os.environ.get(k) for k in _ENV})
    state.tmp.mkdir()
    config.stash[_KEY] = state
    os.environ["TMPDIR"] = str(state.tmp)
    tempfile.tempdir = None  # gettempdir() reads TMPDIR again
    # 2. the creators' ledger, in the processes to come and in this one
    os.environ["MULTILANE_TMP_LEDGER"] = str(state.ledger)
    path = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = str(LEDGER_DIR) + (os.pathsep + path if path else "")
    sys.addaudithook(_ledger_hook(state.ledger))


def _ledger_hook(ledger: Path) -> Callable[[str, tuple[Any, ...]], None]:
    """The audit hook of ``tmp_ledger/sitecustomize.py``, for this process (already started)."""
    spec = importlib.util.spec_from_file_location("multilane_tmp_ledger", LEDGER_DIR / "sitecustomize.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    hook: Callable[[str, tuple[Any, ...]], None] = module.hook_for(str(ledger))
    return hook


def creators(ledger: Path) -> dict[str, dict[str, object]]:
    """The ledger's records by path (the last creation of a path wins)."""
    out: dict[str, dict[str, object]] = {}
    if ledger.exists():
        for line in ledger.read_text(encoding="utf-8", errors="replace").splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue  # a line cut short by a process killed while writing it
            out[str(record.get("path"))] = record
    return out


def _describe(path: Path, known: dict[str, dict[str, object]]) -> str:
    record = known.get(str(path))
    if record is None:
        return f"{path.name} (creator not recorded)"
    args = record.get("argv")
    argv = " ".join(str(a) for a in args) if isinstance(args, list) else ""
    return f"{path.name} (created by pid {record.get('pid')}: {argv[:300]}; at {record.get('caller')})"


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    # On every process (xdist workers too): the kubernetes client writes a kubeconfig's certificate
    # data to mkstemp files and removes them only in an atexit hook, which an xdist worker, ended by
    # its controller, never runs. Remove them at the end of the session, as that hook would.
    kube_config = sys.modules.get("kubernetes.config.kube_config")
    if kube_config is not None:
        kube_config._cleanup_temp_files()
    state = session.config.stash.get(_KEY, None)
    if state is None:
        return
    # 3. what the session left in its private temporary directory fails it
    known = creators(state.ledger)
    state.recorded = (len(known), len({r.get("pid") for r in known.values()}))
    if state.tmp.exists():
        state.left = [_describe(p, known) for p in sorted(state.tmp.iterdir())]
    if state.left and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    shutil.rmtree(state.private, ignore_errors=True)
    # 4. the system's temporary directory, report only
    state.new_in_system = sorted(set(os.listdir(state.system)) - state.before - {state.private.name})


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    state = terminalreporter.config.stash.get(_KEY, None)
    if state is None:
        return
    if state.left:
        terminalreporter.write_sep("=", "temporary files left by the suite: the session fails", red=True)
        terminalreporter.write_line(f"{len(state.left)} new in the session's temporary directory (TMPDIR):")
        for entry in state.left[:20]:
            terminalreporter.write_line(f"  {entry}")
        if len(state.left) > 20:
            terminalreporter.write_line(f"  and {len(state.left) - 20} more")
    else:
        paths, processes = state.recorded
        terminalreporter.write_line(f"temporary directory check: nothing left in TMPDIR (ledger: {paths} "
                                    f"path(s) from {processes} process(es), all removed)")
    if state.new_in_system:
        terminalreporter.write_line(f"new in {state.system} during the session (maybe other processes'; "
                                    f"not checked): {_names(state.new_in_system)}")


def _names(names: list[str]) -> str:
    return ", ".join(names[:20]) + (f" and {len(names) - 20} more" if len(names) > 20 else "")


def pytest_unconfigure(config: pytest.Config) -> None:
    state = config.stash.get(_KEY, None)
    if state is None:
        return
    for key, value in state.old_env.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    tempfile.tempdir = None
