"""The quixstreams peer, run in its own venv (``.venv-quix``, gitignored) created on first use.

quixstreams 3.28 pins ``confluent-kafka<2.13``; installed beside multilane it would downgrade the
system's confluent-kafka, so it lives in a venv and :func:`run_quix` runs ``quix_runner.py`` by path
with that venv's interpreter.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from benchmarks._children import run_json_child
from benchmarks._common import log

QUIX_VERSION = "3.28.1"
REPO_ROOT = Path(__file__).resolve().parents[2]
VENV_DIR = REPO_ROOT / ".venv-quix"
RUNNER = Path(__file__).resolve().with_name("quix_runner.py")


class QuixUnavailableError(RuntimeError):
    """The quixstreams venv could not be created or does not import."""


def _venv_python() -> Path:
    return VENV_DIR / "bin" / "python"


def _imports_ok(python: Path) -> bool:
    if not python.exists():
        return False
    probe = subprocess.run(
        [
            str(python),
            "-c",
            f"import quixstreams, sys; sys.exit(quixstreams.__version__ != {QUIX_VERSION!r})",
        ],
        capture_output=True,
        timeout=120,
    )
    return probe.returncode == 0


MARKER = VENV_DIR / f".multilane-quixstreams-{QUIX_VERSION}-ok"  # written once the venv imports quixstreams


def ensure_quix_venv() -> Path:
    """Return the venv's interpreter, creating the venv and installing quixstreams on first use.

    Raises :class:`QuixUnavailableError` with pip's last output lines when the install fails.
    """
    python = _venv_python()
    if python.exists() and MARKER.exists():  # checked on an earlier run: skip the slow import probe
        return python
    if _imports_ok(python):
        MARKER.touch()
        return python
    log(f"creating {VENV_DIR} with quixstreams=={QUIX_VERSION} (first use)")
    steps = [
        [sys.executable, "-m", "venv", str(VENV_DIR)],
        [
            str(python),
            "-m",
            "pip",
            "install",
            "-q",
            "--disable-pip-version-check",
            f"quixstreams=={QUIX_VERSION}",
        ],
    ]
    for step in steps:
        proc = subprocess.run(step, capture_output=True, text=True, timeout=900)
        if proc.returncode != 0:
            tail = " | ".join((proc.stderr or proc.stdout).strip().splitlines()[-3:])
            raise QuixUnavailableError(f"{' '.join(step[:3])} failed: {tail}")
    if not _imports_ok(python):
        raise QuixUnavailableError(f"quixstreams=={QUIX_VERSION} does not import in {VENV_DIR}")
    MARKER.touch()
    return python


def run_quix(
    bootstrap: str, topic: str, group: str, records: int, sleep_ms: float = 0.0, timeout: float = 300.0
) -> dict[str, Any]:
    """Run the quixstreams row in a child process and return its JSON result."""
    python = ensure_quix_venv()
    argv = [
        str(python),
        str(RUNNER),
        "--bootstrap",
        bootstrap,
        "--topic",
        topic,
        "--group",
        group,
        "--records",
        str(records),
        "--sleep-ms",
        str(sleep_ms),
        "--timeout",
        str(timeout),
    ]
    # the venv must not see the system site-packages or this repository's modules
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    return run_json_child(argv, timeout=timeout + 60, env=env, cwd=str(RUNNER.parent), replace_env=True)
