"""The temporary-directory check of the suite (``tests/support/tempdir_check.py``) fails a session that
leaves a file behind, with or without xdist, names the process that created it (a test's own process,
or a Python child it started), and passes a session that leaves nothing."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

TESTS = '''
import os
import subprocess
import sys
import tempfile

def test_uses_tempfile():
    with tempfile.TemporaryDirectory() as d:
        assert d.startswith(os.environ["TMPDIR"])

def test_maybe_leaks(tmp_path):
    (tmp_path / "kept-by-pytest").write_text("pytest prunes these")
    if os.environ.get("LEAK") == "test":
        fd, _ = tempfile.mkstemp(prefix="leaked-by-a-test-")
        os.close(fd)
    if os.environ.get("LEAK") == "child":  # a child process, as the operator or a worker would be
        code = "import os, tempfile; os.close(tempfile.mkstemp(prefix='leaked-by-a-child-')[0])"
        subprocess.run([sys.executable, "-c", code, "child-marker"], check=True)
'''


def _run(tmp_path: Path, leak: str, *extra: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "test_inner.py").write_text(TESTS)
    # only the plugins the check needs: the run starts faster
    env = {**os.environ, "PYTHONPATH": str(ROOT), "LEAK": leak, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p",
                           "tests.support.tempdir_check", *extra, "test_inner.py"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)


def _xdist() -> None:
    if importlib.util.find_spec("xdist") is None:
        if os.environ.get("CI") == "true":
            pytest.fail("pytest-xdist is not installed (pip install -c constraints.txt -e '.[test]')")
        pytest.skip("pytest-xdist is not installed")


@pytest.mark.parametrize("workers", [[], ["-p", "xdist.plugin", "-n", "2"]], ids=["serial", "xdist"])
def test_a_leak_fails_the_session_naming_its_creator(tmp_path: Path, workers: list[str]) -> None:
    if workers:
        _xdist()
    done = _run(tmp_path, "test", *workers)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "2 passed" in done.stdout
    assert "1 new in the session's temporary directory (TMPDIR):" in done.stdout, done.stdout
    # the file, the process that made it, and where
    line = re.search(r"^  leaked-by-a-test-\S+ \(created by pid (\d+): (.*)$", done.stdout, re.M)
    assert line is not None, done.stdout
    assert "test_inner.py:" in line.group(2) and "test_maybe_leaks" in line.group(2), line.group(0)


def test_a_child_process_leak_names_the_child(tmp_path: Path) -> None:
    done = _run(tmp_path, "child")
    assert done.returncode == 1, done.stdout + done.stderr
    line = re.search(r"^  leaked-by-a-child-\S+ \(created by pid \d+: -c child-marker; at <string>:1 ",
                     done.stdout, re.M)
    assert line is not None, done.stdout


def test_a_clean_session_passes(tmp_path: Path) -> None:
    done = _run(tmp_path, "")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "temporary files left" not in done.stdout
    # the TemporaryDirectory of test_uses_tempfile was recorded, and removed
    assert "temporary directory check: nothing left in TMPDIR (ledger: 1 path(s) from 1 process(es)" \
        in done.stdout, done.stdout
    assert "created.jsonl" not in done.stdout
