"""``docs/getting-started.md`` runs as written: every code block, in order, installing as the guide says.

1. Extract the fenced blocks: ``sh`` blocks are commands, ``<lang> file=NAME`` blocks are files
   written at that point (as a here-document in the script, so they land in the directory the commands
   are in), ``text`` blocks are output the commands above must print. Any other block fails the test:
   nothing in the guide goes unchecked.
2. Build one bash script (``set -euo pipefail``) from them, with the broker's port 9092 replaced by a
   free one. Nothing else is changed: the install line runs for real.
3. Run it in an empty directory, as a new user would: no virtual environment active, nothing of this
   checkout on ``PYTHONPATH``, a ``python3`` (the interpreter running the tests) first on ``PATH``,
   and ``MULTILANE_REPO`` (the guide's clone source) naming this checkout, or, when its working tree
   has changes, a commit of that tree in a scratch repository. pip uses its usual cache, and
   ``PIP_CONSTRAINT`` pins the versions CI tested (``constraints.txt``). The guide's own ``kill`` lines
   stop the broker and the worker (the script's exit trap kills them too when a step fails).
4. Check the ``text`` blocks against the output in order: each block's lines are consecutive output
   lines (``...`` matches anything within a line), each block after the one before. Check that the
   worker stopped cleanly, and that ``multilane`` ran from the new environment, not from this checkout.

The broker is the one the guide starts (``multilane broker``: the embedded broker), so the test runs
the guide's own commands, not a stand-in. The install takes most of the time (tens of seconds with a
warm pip cache).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from multilane.testing.broker import free_port

pytestmark = pytest.mark.broker

ROOT = Path(__file__).resolve().parents[2]
GUIDE = ROOT / "docs" / "getting-started.md"
FENCE = re.compile(r"^```([^\n]*)\n(.*?)^```\s*$", re.S | re.M)


def blocks(text: str) -> list[tuple[str, str | None, str]]:
    """``(kind, file name or None, body)`` of every fenced block, in order."""
    out: list[tuple[str, str | None, str]] = []
    for info, body in FENCE.findall(text):
        words = info.split()
        kind = words[0] if words else ""
        name = next((w.split("=", 1)[1] for w in words[1:] if w.startswith("file=")), None)
        out.append((kind, name, body))
    return out


def build_script(text: str, port: int) -> tuple[str, list[list[str]]]:
    """The bash script of the guide's blocks and the ``text`` blocks it must print, in order (step 2)."""
    lines = ["set -euo pipefail", "trap 'kill $(jobs -p) 2>/dev/null || true' EXIT"]
    expected: list[list[str]] = []
    for kind, name, body in blocks(text):
        if name is not None:
            assert "GUIDE_EOF" not in body
            lines += [f"cat > {name} <<'GUIDE_EOF'", body.rstrip("\n"), "GUIDE_EOF"]
        elif kind == "sh":
            lines += body.splitlines()
        elif kind == "text":
            expected.append([line.replace("9092", str(port)) for line in body.splitlines() if line.strip()])
        else:
            raise AssertionError(f"a ```{kind} block without file=NAME: the test cannot run it")
    script = "\n".join(lines) + "\n"
    return script.replace("9092", str(port)), expected


def _matches(pattern: str, line: str) -> bool:
    return re.fullmatch(".*".join(re.escape(part) for part in pattern.strip().split("...")),
                        line.strip()) is not None


def unmatched(expected: list[list[str]], output: str) -> list[str] | None:
    """The first ``text`` block not found in ``output`` after the blocks before it (step 4), or None."""
    out = output.splitlines()
    at = 0
    for block in expected:
        for start in range(at, len(out) - len(block) + 1):
            if all(_matches(want, out[start + i]) for i, want in enumerate(block)):
                at = start + len(block)
                break
        else:
            return block
    return None


def test_blocks_are_understood() -> None:
    kinds = [(k, n is not None) for k, n, _ in blocks(GUIDE.read_text())]
    assert ("sh", False) in kinds and ("python", True) in kinds and ("text", False) in kinds
    script, expected = build_script(GUIDE.read_text(), 12345)
    assert "9092" not in script and "127.0.0.1:12345" in script
    assert 'pip install --quiet "./multilane[state,embedded]" pytest' in script
    assert expected and all(expected)


def test_expected_output_is_matched_in_order() -> None:
    out = "noise\na 1\nb 2\nnoise\nc 3\n"
    assert unmatched([["a ..."], ["c 3"]], out) is None
    assert unmatched([["a ...", "b 2"]], out) is None
    assert unmatched([["c 3"], ["a 1"]], out) == ["a 1"]  # out of order
    assert unmatched([["a 1", "c 3"]], out) == ["a 1", "c 3"]  # not consecutive
    assert unmatched([["b"]], out) == ["b"]  # a whole line, not a part of one


def _git(*args: str, cwd: Path = ROOT) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout


def source_repo(scratch: Path) -> Path:
    """What the guide clones: this checkout, or a commit of its working tree when that has changes."""
    if not _git("status", "--porcelain", "--untracked-files=all"):
        return ROOT
    repo = scratch / "source"
    _git("clone", "--quiet", str(ROOT), str(repo), cwd=scratch)
    for name in _git("ls-files", "-z", "--deleted").split("\0"):
        if name:
            (repo / name).unlink(missing_ok=True)
    for name in _git("ls-files", "-z", "--cached", "--others", "--exclude-standard").split("\0"):
        if name and (ROOT / name).is_file():
            (repo / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, repo / name)
    _git("add", "-A", cwd=repo)
    _git("-c", "user.name=test", "-c", "user.email=test@localhost", "commit", "--quiet", "--allow-empty",
         "-m", "the working tree", cwd=repo)
    return repo


def new_user_environment(scratch: Path) -> dict[str, str]:
    """The environment of step 3: a ``python3`` first on PATH, no virtual environment, no checkout."""
    bin_dir = scratch / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").symlink_to(os.path.realpath(getattr(sys, "_base_executable", sys.executable)))
    venv_bin = str(Path(sys.prefix) / "bin")
    path = [p for p in os.environ.get("PATH", "").split(os.pathsep) if p and p != venv_bin]
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env.update({"PATH": os.pathsep.join([str(bin_dir), *path]),
                "MULTILANE_REPO": str(source_repo(scratch)),
                "PIP_CONSTRAINT": str(ROOT / "constraints.txt"),
                "PIP_DISABLE_PIP_VERSION_CHECK": "1"})
    return env


@pytest.mark.timeout(900)
def test_getting_started_runs_as_written(tmp_path: Path) -> None:
    script, expected = build_script(GUIDE.read_text(), free_port())
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    (scratch / "guide.sh").write_text(script)
    home = tmp_path / "empty"
    home.mkdir()
    # 3. run it
    done = subprocess.run(["bash", str(scratch / "guide.sh")], cwd=home, env=new_user_environment(scratch),
                          capture_output=True, text=True, timeout=840)
    app_dir = home / "orders-app"
    worker_log = (app_dir / "worker.log").read_text() if (app_dir / "worker.log").exists() else ""
    tails = f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}\nworker:\n{worker_log[-3000:]}"
    assert done.returncode == 0, tails
    # 4. outputs, in order
    missing = unmatched(expected, done.stdout)
    assert missing is None, f"expected output {missing} not found in order in:\n{done.stdout}"
    assert "multilane-worker ready" in worker_log
    assert "Traceback" not in worker_log, worker_log[-3000:]
    where = subprocess.run([str(home / ".venv" / "bin" / "python"), "-c", "import multilane; "
                            "print(multilane.__file__)"], cwd=tmp_path, capture_output=True, text=True,
                           env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    assert where.stdout.startswith(str(home / ".venv")), where
