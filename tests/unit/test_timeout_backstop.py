"""tests/support/timeout_backstop.py: a test whose teardown hangs past its timeout ends its pytest
process within the grace, and the child processes it started (in their own session) are killed."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

HANGING = '''
import subprocess, time
import pytest

@pytest.fixture
def child(tmp_path):
    proc = subprocess.Popen(["sleep", "600"], start_new_session=True)
    (tmp_path.parent / "child.pid").write_text(str(proc.pid))
    yield proc
    time.sleep(600)  # a teardown that never ends

def test_hangs(child):
    time.sleep(600)
'''


def test_a_hung_teardown_ends_the_process_and_its_children(tmp_path: Path) -> None:
    (tmp_path / "test_hang.py").write_text(HANGING)
    env = {**os.environ, "MULTILANE_TIMEOUT_GRACE_S": "3", "PYTHONPATH": str(ROOT)}
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "tests.support.timeout_backstop", "-p", "no:cacheprovider",
         "--timeout", "2", "--basetemp", str(tmp_path / "base"), "--rootdir", str(tmp_path),
         "-c", os.devnull, str(tmp_path / "test_hang.py")],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    took = time.monotonic() - started
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "timeout backstop: " in proc.stderr and "test_hangs" in proc.stderr, proc.stderr
    assert took < 60, f"the process took {took:.0f} s to end"  # 2 s timeout + 3 s grace, on a loaded machine
    pid = int((tmp_path / "base" / "child.pid").read_text())
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and running(pid):
        time.sleep(0.1)
    assert not running(pid), "the test's child process still runs"


def running(pid: int) -> bool:
    """The process exists and is no zombie (a killed orphan waits for init to reap it)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False
