"""``tests/support/after_workers.py``: a check over the whole session's record gives the same outcome
serially and under ``pytest -n 2``, where it runs on the controller over the merged parts of every
worker (and a failing check fails the run with its message).

An inner pytest runs a small suite of its own in a subprocess: eight tests that each record one rule
use, and two deferred checks, one that holds only on the union of all eight and one that fails on
purpose, naming the workers that sent a part."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

CONFTEST = '''
import os
import pytest

pytest_plugins = ["tests.support.after_workers"]


@pytest.fixture(scope="session")
def used(request):
    seen = {}
    yield seen
    from tests.support import after_workers

    worker = os.environ.get("PYTEST_XDIST_WORKER", "serial")
    after_workers.export(request.config, [{"kind": "Role"}], seen, [f"part from {worker}"], [worker])
'''

TESTS = '''
import time
import pytest
from tests.support.after_workers import Record, after_workers

VERBS = ["get", "list", "watch", "create", "update", "patch", "delete", "deletecollection"]


@pytest.mark.parametrize("verb", VERBS)
def test_scenario(used, verb):
    time.sleep(0.3)  # long enough that both workers take a share
    used[("Role/ns/r", 0, "", "pods", verb)] = 1


def union_has_every_verb(record: Record) -> None:
    assert sorted(key[4] for key in record.used) == sorted(VERBS)
    assert len(record.collected) == len(VERBS) + 2


def fails_naming_the_parts(record: Record) -> None:
    assert False, "parts: " + ", ".join(sorted(set(record.denied)))


def _local(used, request) -> Record:
    return Record(collected={i.nodeid for i in request.session.items}, used=dict(used),
                  denied=["part from serial"])


@after_workers(union_has_every_verb)
def test_union(used, request):
    union_has_every_verb(_local(used, request))


@after_workers(fails_naming_the_parts)
def test_fails(used, request):
    fails_naming_the_parts(_local(used, request))
'''


def _inner(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_inner.py").write_text(TESTS)
    # only the plugins the inner suite needs: each xdist worker imports them, on a loaded machine too
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    env.pop("PYTEST_XDIST_WORKER", None)  # this test may itself run on a worker
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "xdist", "-p", "no:cacheprovider", "-q", "-rfs", *args],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180,
    )  # fmt: skip


@pytest.mark.parametrize("workers", ["0", "2"])
def test_a_check_after_workers_sees_every_workers_part(tmp_path: Path, workers: str) -> None:
    proc = _inner(tmp_path, "-n", workers)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert "1 failed, 9 passed" in out, out  # the union check passed, the other failed
    assert "FAILED test_inner.py::test_fails" in out, out
    if workers == "0":
        assert "parts: part from serial" in out, out
    else:  # the failing check ran on the controller, over the parts of both workers
        assert "parts: part from gw0, part from gw1" in out, out


def test_a_run_stopped_early_skips_the_checks(tmp_path: Path) -> None:
    (tmp_path / "test_stop.py").write_text("def test_stop():\n    assert False\n")
    proc = _inner(tmp_path, "-n", "2", "-x")
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out
    assert "FAILED test_stop.py::test_stop" in out, out
    assert "passed, 2 failed" not in out, out


def test_the_modules_that_start_first_exist() -> None:
    """``tests/support/xdist_order.py`` names modules by path: a renamed one would silently start late."""
    from tests.support.xdist_order import STARTS_FIRST

    assert [p for p in STARTS_FIRST if not (ROOT / p).is_file()] == []
