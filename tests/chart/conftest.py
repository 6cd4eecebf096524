"""Fixtures and helpers of the chart/CRD tests: offline Helm rendering, the CRD as JSON Schema, CEL.

Nothing here contacts a cluster: Helm renders through helm-python-sdk (Helm's Go SDK as a shared
library), manifests are validated by kubernetes-validate, custom resources by jsonschema against the
CRD's openAPIV3Schema, and the CRD's x-kubernetes-validations rules by cel-python when it is installed.
"""

from __future__ import annotations

import copy
import importlib.util
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
CHART_DIR = REPO / "charts" / "multilane"
CRD_FILE = REPO / "crds" / "parallelconsumers.multilane.dev.yaml"
EXAMPLES_DIR = REPO / "examples"
DOCKERFILE = REPO / "Dockerfile"

#: Kubernetes version that manifests are validated against (the newest kubernetes-validate ships).
KUBE_VERSION = "1.37.0"
RELEASE = "ml"
NAMESPACE = "multilane-system"

Manifest = dict[str, Any]

helm = pytest.importorskip("helm_python", reason="helm-python-sdk is not installed")


@pytest.fixture(scope="session")
def chart() -> Any:
    """The chart, loaded once."""
    return helm.Chart.load(str(CHART_DIR))


@pytest.fixture(scope="session")
def render(chart: Any) -> Callable[..., list[Manifest]]:
    """``render(values)``: every non-empty document the chart renders (NOTES.txt left out)."""

    cache: dict[str, list[Manifest]] = {}

    def _render(values: dict[str, Any] | None = None, *, namespace: str = NAMESPACE) -> list[Manifest]:
        key = json.dumps([values or {}, namespace], sort_keys=True)
        if key not in cache:
            cache[key] = _render_uncached(values, namespace)
        return copy.deepcopy(cache[key])

    def _render_uncached(values: dict[str, Any] | None, namespace: str) -> list[Manifest]:
        out = chart.render(values or {}, name=RELEASE, namespace=namespace, is_install=True)
        docs: list[Manifest] = []
        for path, text in sorted(out.items()):
            if path.endswith("NOTES.txt"):
                continue
            for doc in yaml.safe_load_all(text):
                if doc:
                    doc.setdefault("metadata", {})
                    docs.append(doc)
        return docs

    return _render


@pytest.fixture(scope="session")
def render_notes(chart: Any) -> Callable[..., str]:
    def _notes(values: dict[str, Any] | None = None) -> str:
        out = chart.render(values or {}, name=RELEASE, namespace=NAMESPACE, is_install=True)
        return "".join(text for path, text in out.items() if path.endswith("NOTES.txt"))

    return _notes


def find(docs: list[Manifest], kind: str, name: str | None = None) -> list[Manifest]:
    """Documents of ``kind`` (and ``name``)."""
    return [d for d in docs if d.get("kind") == kind and (name is None or d["metadata"].get("name") == name)]


def one(docs: list[Manifest], kind: str, name: str | None = None) -> Manifest:
    found = find(docs, kind, name)
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


@pytest.fixture(scope="session")
def crd() -> Manifest:
    loaded: Manifest = yaml.safe_load(CRD_FILE.read_text(encoding="utf-8"))
    return loaded


@pytest.fixture(scope="session")
def crd_version(crd: Manifest) -> Manifest:
    versions = crd["spec"]["versions"]
    assert len(versions) == 1
    version: Manifest = versions[0]
    return version


@pytest.fixture(scope="session")
def openapi_schema(crd_version: Manifest) -> Manifest:
    schema: Manifest = crd_version["schema"]["openAPIV3Schema"]
    return schema


def to_json_schema(node: Any, *, strict: bool = True) -> Any:
    """A Kubernetes structural schema as JSON Schema (draft 2020-12 keywords).

    - ``nullable: true`` admits null;
    - with ``strict``, objects that list ``properties`` and neither ``additionalProperties`` nor
      ``x-kubernetes-preserve-unknown-fields`` reject unknown fields (as ``kubectl --validate=strict``
      does; the API server would otherwise prune them silently);
    - ``x-kubernetes-*`` keys are dropped (CEL rules are checked separately).
    """
    if isinstance(node, list):
        return [to_json_schema(item, strict=strict) for item in node]
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key.startswith("x-kubernetes-") or key == "nullable":
            continue
        if key in ("properties", "patternProperties"):
            out[key] = {name: to_json_schema(sub, strict=strict) for name, sub in value.items()}
        elif key in ("items", "additionalProperties", "not") or key in ("anyOf", "oneOf", "allOf"):
            out[key] = to_json_schema(value, strict=strict)
        else:
            out[key] = copy.deepcopy(value)
    if node.get("nullable") and "type" in out:
        out["type"] = [out["type"], "null"]
    if (
        strict
        and "properties" in node
        and "additionalProperties" not in node
        and not node.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    return out


def apply_defaults(schema: Manifest, obj: Any) -> Any:
    """Fill in ``default`` values the way the API server does (parents before children)."""
    if not isinstance(obj, dict) or schema.get("type") != "object":
        if isinstance(obj, list) and "items" in schema:
            return [apply_defaults(schema["items"], item) for item in obj]
        return obj
    result = dict(obj)
    for name, sub in schema.get("properties", {}).items():
        if name not in result and "default" in sub:
            result[name] = copy.deepcopy(sub["default"])
        if name in result:
            result[name] = apply_defaults(sub, result[name])
    return result


def iter_schema_nodes(node: Manifest, path: str = "") -> Iterator[tuple[str, Manifest]]:
    """Every schema node with its path (``.spec.kafka.topics[]``, ``.spec.kafka.config{}``)."""
    yield path, node
    for name, sub in node.get("properties", {}).items():
        yield from iter_schema_nodes(sub, f"{path}.{name}")
    if isinstance(node.get("items"), dict):
        yield from iter_schema_nodes(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        yield from iter_schema_nodes(node["additionalProperties"], f"{path}{{}}")


def load_examples() -> dict[str, Manifest]:
    examples: dict[str, Manifest] = {}
    for path in sorted(EXAMPLES_DIR.glob("parallelconsumer-*.yaml")):
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
        examples[path.name] = doc
    return examples


def load_sync_module() -> ModuleType:
    """charts/multilane/hack/sync_crd.py (a script, not part of the package)."""
    spec = importlib.util.spec_from_file_location(
        "multilane_chart_sync_crd", CHART_DIR / "hack" / "sync_crd.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
