"""The tree stays ``ruff`` and ``mypy`` clean (the house style), checked in CI like any test.

Both tools come with the ``dev`` extra (``multilane[all]`` installs it); a venv without them fails
here with the install line rather than skipping.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _tool(name: str) -> str:
    path = shutil.which(name, path=str(Path(sys.executable).parent))
    if path is None:
        pytest.fail(f"{name} is not installed beside {sys.executable}: pip install 'multilane[dev]'")
    return path


def test_ruff_check_is_clean() -> None:
    proc = subprocess.run(
        [_tool("ruff"), "check", "--no-cache", "--output-format", "concise", "."],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]


# A cold mypy run over the whole tree (the claim: no cached result hides an error) takes minutes when
# the suite's other workers share 2 cores; its subprocess bound is 600 s, the test's leaves room above.
@pytest.mark.timeout(720)
def test_mypy_is_clean(tmp_path: Path) -> None:
    """``mypy`` over the packages configured in pyproject.toml (``multilane`` and ``benchmarks``), with
    a fresh cache so that nothing left by an earlier run hides an error."""
    proc = subprocess.run(
        [_tool("mypy"), "--cache-dir", str(tmp_path / "mypy-cache")],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "Success: no issues found" in proc.stdout
