"""Generates the kubectl-facing examples of docs/operator.md from a real run, and checks the doc.

The real kopf operator runs against the emulated API server (see test_lifecycle.py for what is
emulated); the real ``kubectl`` binary then reads the stored ParallelConsumer through the emulator:
printer columns (``-o custom-columns`` built from the CRD's ``additionalPrinterColumns``: the emulator
does not serve server-side Tables), conditions and Events. The field reference is rendered from the
CRD's schema in the style of ``kubectl explain``.

Regenerate the doc:
``MULTILANE_WRITE_DOCS=1 python -m pytest -p no:cacheprovider tests/operator/test_docs.py``.
Without the variable the test still runs everything and checks that the doc's field reference and
column headers match the CRD.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import textwrap
from pathlib import Path
from typing import Any

import pytest
import yaml

from multilane.operator.k8s.kube import KubeClient
from multilane.testing.broker import EmbeddedBroker
from tests.operator.conftest import CR_COLLECTION, CRD_PATH, NS, cond, consumer_body, get_status
from tests.operator.doubles import StatefulSetControllerDouble, StaticSource, WorkerFleet, wait_for

pytestmark = pytest.mark.asyncio(loop_scope="function")

DOC = Path(__file__).resolve().parents[2] / "docs" / "operator.md"
BEGIN, END = "<!-- BEGIN GENERATED: tests/operator/test_docs.py -->", "<!-- END GENERATED -->"


def printer_columns(crd: dict[str, Any], wide: bool) -> list[dict[str, Any]]:
    cols = crd["spec"]["versions"][0].get("additionalPrinterColumns") or []
    return [c for c in cols if wide or not c.get("priority")]


def custom_columns(crd: dict[str, Any], wide: bool) -> str:
    cols = [("NAME", ".metadata.name")]
    cols += [(c["name"].upper(), c["jsonPath"]) for c in printer_columns(crd, wide)]
    return ",".join(f"{name}:{path}" for name, path in cols)


def explain(schema: dict[str, Any], path: str, depth: int = 0, max_depth: int = 3) -> list[str]:
    """``kubectl explain --recursive``-like text for one object schema."""
    lines: list[str] = []
    required = set(schema.get("required") or [])
    for name, sub in (schema.get("properties") or {}).items():
        kind = sub.get("type", "object")
        if kind == "array":
            kind = f"[]{(sub.get('items') or {}).get('type', 'object')}"
        if sub.get("x-kubernetes-int-or-string"):
            kind = "IntOrString"
        extra = []
        if name in required:
            extra.append("required")
        if "default" in sub:
            extra.append(f"default: {json.dumps(sub['default'])}")
        if "enum" in sub:
            extra.append("enum: " + ", ".join(str(e) for e in sub["enum"]))
        indent = "  " * depth
        lines.append(f"{indent}{name}\t<{kind}>" + (f"  ({'; '.join(extra)})" if extra else ""))
        desc = " ".join(str(sub.get("description", "")).split())
        if desc:
            lines += [indent + "    " + line for line in textwrap.wrap(desc, 96 - len(indent))]
        child = sub.get("items") if sub.get("type") == "array" else sub
        if isinstance(child, dict) and child.get("properties") and depth + 1 < max_depth:
            lines += explain(child, f"{path}.{name}", depth + 1, max_depth)
    return lines


def explain_block(crd: dict[str, Any]) -> str:
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    out = ["KIND:     ParallelConsumer", "VERSION:  multilane.dev/v1alpha1", "", "FIELDS (spec):"]
    out += explain(schema["properties"]["spec"], "spec")
    out += ["", "FIELDS (status):"]
    out += explain(schema["properties"]["status"], "status", max_depth=2)
    return "\n".join(line.rstrip() for line in out)


async def kubectl(url: str, cache: Path, *args: str) -> str:
    proc = await asyncio.create_subprocess_exec(
        "kubectl",
        f"--server={url}",
        f"--cache-dir={cache}",
        "--request-timeout=20s",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err.decode()
    return out.decode()


def stable(text: str) -> str:
    """Mask what differs between runs (timestamps, generated topic names, ports)."""
    text = re.sub(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z", "2026-01-01T00:00:00Z", text)
    text = re.sub(r"t-test-[\w-]+?-\d+-\d+", "orders", text)
    return re.sub(r"127\.0\.0\.1:\d+", "kafka:9092", text)


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="needs the kubectl client")
async def test_kubectl_views_and_field_reference(
    api: Any,
    kube: KubeClient,
    broker: EmbeddedBroker,
    topic: str,
    fleet: WorkerFleet,
    sts_controller: StatefulSetControllerDouble,
    source: StaticSource,
    operator_factory: Any,
    tmp_path: Path,
) -> None:
    crd = yaml.safe_load(CRD_PATH.read_text())
    url = api[1]
    source.lag = {f"{topic}/{i}": 5_000 for i in range(4)}
    source.input_rate, source.processing_rate = 400.0, 350.0
    await operator_factory().start()
    await kube.create(
        CR_COLLECTION, consumer_body("orders", broker.bootstrap, topic, minReplicas=2, maxReplicas=4)
    )

    async def settled() -> bool:
        status = await get_status(kube, "orders")
        return cond(status, "Ready").get("status") == "True" and bool(
            status.get("lastDecision", {}).get("inputs")
        )

    await wait_for(settled, timeout=90, what="Ready with a decision")

    get = await kubectl(
        url,
        tmp_path,
        "get",
        "parallelconsumers",
        "-n",
        NS,
        "-o",
        "custom-columns=" + custom_columns(crd, False),
    )
    wide = await kubectl(
        url, tmp_path, "get", "pcon", "-n", NS, "-o", "custom-columns=" + custom_columns(crd, True)
    )
    conditions = await kubectl(
        url,
        tmp_path,
        "get",
        "pcon",
        "orders",
        "-n",
        NS,
        "-o",
        "jsonpath={range .status.conditions[*]}"
        '{.type}{"\\t"}{.status}{"\\t"}{.reason}{"\\t"}{.message}{"\\n"}{end}',
    )
    decision = await kubectl(
        url, tmp_path, "get", "pcon", "orders", "-n", NS, "-o", "jsonpath={.status.lastDecision}"
    )
    events = await kubectl(
        url,
        tmp_path,
        "get",
        "events",
        "-n",
        NS,
        "-o",
        "custom-columns=TYPE:.type,REASON:.reason,OBJECT:.involvedObject.name,MESSAGE:.message",
    )

    # What kubectl printed is what the operator wrote.
    header = get.splitlines()[0].split()
    assert header == ["NAME"] + [c["name"].upper() for c in printer_columns(crd, False)]
    row = get.splitlines()[1].split()
    status = await get_status(kube, "orders")
    assert row[:5] == ["orders", "True", str(status["replicas"]), str(status["factor"]), str(status["lag"])]
    assert "Ready\tTrue\tAllPartitionsAssigned" in conditions
    assert '"reason"' in decision and "ScalingDecision" in events and "Applied" in events

    events_lines = [events.splitlines()[0], *sorted(set(events.splitlines()[1:]))[:12]]
    generated = "\n".join(
        [
            BEGIN,
            "",
            "### `kubectl get pcon` (printer columns of the CRD)",
            "",
            "```console",
            "$ kubectl get pcon -n team-a",
            stable(get).rstrip(),
            "$ kubectl get pcon -n team-a -o wide",
            stable(wide).rstrip(),
            "```",
            "",
            "### Conditions",
            "",
            "```console",
            "$ kubectl get pcon orders -n team-a -o jsonpath='{range .status.conditions[*]}...{end}'",
            stable(conditions).rstrip(),
            "```",
            "",
            "### Last decision",
            "",
            "```console",
            "$ kubectl get pcon orders -n team-a -o jsonpath='{.status.lastDecision}'",
            stable(decision).rstrip(),
            "```",
            "",
            "### Events",
            "",
            "```console",
            "$ kubectl get events -n team-a",
            stable("\n".join(events_lines)).rstrip(),
            "```",
            "",
            "### Field reference (`kubectl explain`-style, from the CRD schema)",
            "",
            "```text",
            explain_block(crd),
            "```",
            "",
            END,
        ]
    )
    doc = DOC.read_text() if DOC.exists() else ""
    if os.environ.get("MULTILANE_WRITE_DOCS"):
        if BEGIN in doc:
            doc = doc[: doc.index(BEGIN)] + generated + doc[doc.index(END) + len(END) :]
        else:
            doc = doc.rstrip() + "\n\n" + generated + "\n"
        DOC.write_text(doc)
    assert explain_block(crd) in doc, (
        "docs/operator.md field reference is stale: regenerate (see module docstring)"
    )
    assert " ".join(header) in re.sub(r"\s+", " ", doc), "docs/operator.md printer columns are stale"
