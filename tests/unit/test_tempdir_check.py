"""The temporary-directory check of the suite (``tests/support/tempdir_check.py``) fails a session that
leaves a file behind, with or without xdist, and passes one that leaves nothing."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

TESTS = '''
import os
import tempfile

def test_uses_tempfile():
    with tempfile.TemporaryDirectory() as d:
        assert d.startswith(os.environ["TMPDIR"])

def test_maybe_leaks(tmp_path):
    (tmp_path / "kept-by-pytest").write_text("pytest prunes these")
    if os.environ.get("LEAK") == "1":
        fd, _ = tempfile.mkstemp(prefix="leaked-by-a-test-")
        os.close(fd)
'''


def _run(tmp_path: Path, leak: bool, *extra: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "test_inner.py").write_text(TESTS)
    # only the plugins the check needs: the run starts faster
    env = {**os.environ, "PYTHONPATH": str(ROOT), "LEAK": "1" if leak else "0",
           "MULTILANE_TEMPDIR_STRICT": "1",
           "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p",
                           "tests.support.tempdir_check", *extra, "test_inner.py"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)


def _xdist() -> None:
    if importlib.util.find_spec("xdist") is None:
        if os.environ.get("CI") == "true":
            pytest.fail("pytest-xdist is not installed (pip install -c constraints.txt -e '.[test]')")
        pytest.skip("pytest-xdist is not installed")


@pytest.mark.parametrize("workers", [[], ["-p", "xdist.plugin", "-n", "2"]], ids=["serial", "xdist"])
def test_a_leak_fails_the_session(tmp_path: Path, workers: list[str]) -> None:
    if workers:
        _xdist()
    done = _run(tmp_path, True, *workers)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "2 passed" in done.stdout
    assert "1 new in the session's temporary directory (TMPDIR): leaked-by-a-test-" in done.stdout


def test_a_clean_session_passes(tmp_path: Path) -> None:
    done = _run(tmp_path, False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "temporary files left" not in done.stdout
