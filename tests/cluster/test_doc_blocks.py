"""README's, docs/operator-install.md's and docs/runbook.md's bash blocks, run as written on the real
control plane (:mod:`multilane.testing.doc_blocks` reads their markers).

Each runnable block runs in ``bash -euo pipefail`` with ``KUBECONFIG`` = a copy of the cluster's admin
kubeconfig whose context namespace is the test's own (so a block without ``-n`` acts there, as it
does for a reader whose context names a namespace), the cluster's ``kubectl`` first on ``PATH``, and
its placeholders replaced (``NS`` by that namespace). Its expected output is matched in order. What a
block ``needs`` is made first:

- ``crd``: the CRD from ``crds/``, applied by kubectl (session-wide);
- ``pc``: ``examples/parallelconsumer-minimal.yaml`` (``orders``) in the namespace;
- ``stuck-pc``: the same with the operator's finalizer, deleted without an operator (the runbook's case);
- ``kubelet``: the process kubelet (the node, which runs the docs' image ``registry.example.com/...``
  as this machine's ``multilane``), ``helm`` beside ``kubectl``, Helm's homes in a temp directory; a
  CRD an earlier test applied is made adoptable by the release (a user's first install meets none),
  and the docs' namespaces (``multilane-system``, ``payments``, ``analytics``) are gone first;
- ``chart``: docs/operator-install.md's Install block has run (release ``multilane``, the
  ParallelConsumer ``orders`` in ``payments``); run here if it has not.

Blocks run in the docs' order, except that the ones on the chart run after the others (the
``stuck-pc`` case needs no operator running) and the one that uninstalls it runs last. The marker's
substitutions (``helm-values``, ``watch``) are the only changes to a block; docs/real-cluster.md
lists why each is needed. At the end the release and the docs' namespaces are removed, so the next
test file installs into a clean cluster.
"""

from __future__ import annotations

import os
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from multilane.testing.cluster import LocalCluster
from multilane.testing.doc_blocks import DocBlock, extract, match_in_order
from multilane.testing.process_kubelet import ProcessKubelet
from tests.cluster.helm_harness import RELEASE, RELEASE_NS, adopt_crd, helm_env

ROOT = Path(__file__).resolve().parents[2]
DOCS = ("README.md", "docs/operator-install.md", "docs/runbook.md")
CRD = ROOT / "crds" / "parallelconsumers.multilane.dev.yaml"
EXAMPLE = ROOT / "examples" / "parallelconsumer-minimal.yaml"
FINALIZER = "multilane.dev/finalizer"


def _blocks() -> list[DocBlock]:
    return [b for doc in DOCS for b in extract(doc, (ROOT / doc).read_text(encoding="utf-8"))]


DOCS_NAMESPACES = ("payments", "analytics", "multilane-system")


def _order(block: DocBlock) -> int:
    on_chart = bool({"chart", "kubelet"} & set(block.needs))
    return 0 if not on_chart else 2 if "helm uninstall" in block.body else 1


RUNNABLE = sorted((b for b in _blocks() if b.runnable), key=_order)  # stable: the docs' order within
INSTALL = next(
    b for b in RUNNABLE if b.doc == "docs/operator-install.md" and "helm upgrade --install" in b.body
)


@pytest.fixture(scope="module")
def crd(real_cluster: LocalCluster) -> None:
    real_cluster.kubectl("apply", "--server-side", "-f", str(CRD))
    # `kubectl wait` on a CRD whose status the server has not written yet fails at once
    # (".status.conditions accessor error: <nil>"), so wait for the conditions first
    deadline = time.monotonic() + 60
    jsonpath = "jsonpath={.status.conditions[?(@.type=='Established')].status}"
    while real_cluster.kubectl("get", "crd/parallelconsumers.multilane.dev", "-o", jsonpath) != "True":
        assert time.monotonic() < deadline, "the CRD was not Established within 60 s"
        time.sleep(0.3)


def _make_pc(cluster: LocalCluster, ns: str) -> None:
    cluster.kubectl("apply", "-n", ns, "-f", str(EXAMPLE))


def _make_stuck_pc(cluster: LocalCluster, ns: str) -> None:
    _make_pc(cluster, ns)
    cluster.kubectl(
        "patch",
        "-n",
        ns,
        "parallelconsumer.multilane.dev/orders",
        "--type=merge",
        "-p",
        f'{{"metadata":{{"finalizers":["{FINALIZER}"]}}}}',
    )
    cluster.kubectl("delete", "-n", ns, "parallelconsumer.multilane.dev/orders", "--wait=false")
    stamp = cluster.kubectl(
        "get",
        "-n",
        ns,
        "parallelconsumer.multilane.dev/orders",
        "-o",
        "jsonpath={.metadata.deletionTimestamp}",
    )
    assert stamp, "the finalizer must hold the deletion, as it does without an operator"


MAKERS: dict[str, Callable[[LocalCluster, str], None]] = {"pc": _make_pc, "stuck-pc": _make_stuck_pc}


def _kubeconfig_in(cluster: LocalCluster, ns: str, tmp_path: Path) -> Path:
    copy = tmp_path / "kubeconfig"
    copy.write_text(Path(cluster.kubeconfig).read_text(encoding="utf-8"), encoding="utf-8")
    subprocess.run(
        [
            str(cluster.bin_dir / "kubectl"),
            f"--kubeconfig={copy}",
            "config",
            "set-context",
            "--current",
            f"--namespace={ns}",
        ],
        check=True,
        capture_output=True,
        timeout=30,
    )
    return copy


def _after(block: DocBlock, cluster: LocalCluster, ns: str) -> None:
    """What the block's prose says it does, read back from the API server."""
    if block is INSTALL:  # the operator's two replicas ready; the ParallelConsumer seen by it
        ready = cluster.kubectl("get", "deployment", RELEASE, "-n", RELEASE_NS, "-o",
                                "jsonpath={.status.readyReplicas}")  # fmt: skip
        assert ready == "2", f"operator replicas ready: {ready!r}"
        def finalizers() -> str:
            return cluster.kubectl("get", "parallelconsumers.multilane.dev", "orders", "-n", "payments",
                                   "-o", "jsonpath={.metadata.finalizers}")  # fmt: skip

        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not finalizers():
            time.sleep(0.5)
        assert "multilane.dev/finalizer" in finalizers(), \
            "the operator did not take the ParallelConsumer (no finalizer)"
    if "helm uninstall" in block.body:  # every ParallelConsumer gone, the operator with the release
        assert not cluster.kubectl("get", "parallelconsumers.multilane.dev", "-A", "-o", "name")
        assert not cluster.kubectl(
            "get", "deployment", RELEASE, "-n", RELEASE_NS, "--ignore-not-found", "-o", "name"
        )
    if block.name.startswith("docs/operator-install.md") and "kubectl scale" in block.body:
        scaling = cluster.kubectl(
            "get", "-n", ns, "parallelconsumer.multilane.dev/orders", "-o", "jsonpath={.spec.scaling}"
        )
        assert '"replicas"' not in scaling, scaling  # scaled to 3, then handed back to the autoscaler
    if "recreate-on-immutable-change" in block.body:
        value = cluster.kubectl(
            "get",
            "-n",
            ns,
            "parallelconsumer.multilane.dev/orders",
            "-o",
            r"jsonpath={.metadata.annotations.multilane\.dev/recreate-on-immutable-change}",
        )
        assert value == "true"
    if "finalizers" in block.body:
        deadline = time.monotonic() + 30
        while (
            cluster.kubectl("get", "-n", ns, "parallelconsumers.multilane.dev", "-o", "name")
            and time.monotonic() < deadline
        ):
            time.sleep(0.5)
        assert not cluster.kubectl("get", "-n", ns, "parallelconsumers.multilane.dev", "-o", "name"), (
            "the deletion did not complete"
        )


def _helm(cluster: LocalCluster, home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "KUBECONFIG": str(cluster.kubeconfig), **helm_env(home)}
    return subprocess.run([str(cluster.bin_dir / "helm"), *args], env=env, capture_output=True, text=True,
                          timeout=300)  # fmt: skip


def _installed(cluster: LocalCluster, home: Path) -> bool:
    return _helm(cluster, home, "status", RELEASE, "-n", RELEASE_NS).returncode == 0


def _remove_docs_namespaces(cluster: LocalCluster) -> None:
    present = [
        n
        for n in DOCS_NAMESPACES
        if cluster.kubectl("get", "namespace", n, "--ignore-not-found", "-o", "name")
    ]
    if present:
        cluster.kubectl("delete", "namespace", *present, "--wait=true", "--timeout=180s")


@pytest.fixture(scope="module")
def kubelet(
    real_cluster: LocalCluster, process_kubelet: ProcessKubelet, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Path]:
    """The node and helm, for blocks that install the chart; Helm's home. At the end: every
    ParallelConsumer deleted while the operator runs, the release uninstalled, the namespaces gone."""
    if not (real_cluster.bin_dir / "helm").exists():
        pytest.fail(f"helm is missing in {real_cluster.bin_dir} (bash scripts/k8s-binaries.sh builds it)")
    home = tmp_path_factory.mktemp("helm-home")
    _remove_docs_namespaces(real_cluster)
    adopt_crd(real_cluster)
    try:
        yield home
    finally:
        if _installed(real_cluster, home):
            real_cluster.kubectl("delete", "parallelconsumers.multilane.dev", "--all", "-A", "--timeout=120s",
                                 check=False)  # fmt: skip
            _helm(real_cluster, home, "uninstall", RELEASE, "-n", RELEASE_NS, "--wait", "--timeout=180s")
        _remove_docs_namespaces(real_cluster)


@pytest.fixture(scope="module")
def chart(real_cluster: LocalCluster, kubelet: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    """docs/operator-install.md's Install block has run (here, if its own test has not)."""
    if not _installed(real_cluster, kubelet):
        _run(INSTALL, real_cluster, "default", tmp_path_factory.mktemp("install"), kubelet)


def _run(block: DocBlock, cluster: LocalCluster, ns: str, tmp_path: Path, helm_home: Path | None) -> None:
    """Steps: 1. run the block as written (its marker's substitutions made); 2. its exit code;
    3. its expected output, in order; 4. what its prose says it did, read back."""
    env = {
        **os.environ,
        "KUBECONFIG": str(_kubeconfig_in(cluster, ns, tmp_path)),
        "PATH": f"{cluster.bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
        **(helm_env(helm_home) if helm_home is not None else {}),
    }
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", block.script(ns)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=360 if helm_home is not None else 120,
    )
    assert done.returncode == 0, f"{block.name}: exit {done.returncode}\n{done.stdout}\n{done.stderr}"
    missing = match_in_order(block.expected, done.stdout)
    assert missing is None, f"{block.name}: {missing}\n--- output:\n{done.stdout}"
    _after(block, cluster, ns)


@pytest.mark.parametrize("block", RUNNABLE, ids=[b.name for b in RUNNABLE])
def test_block_runs_as_written(
    block: DocBlock, real_cluster: LocalCluster, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    unknown = set(block.needs) - {"crd", "kubelet", "chart", *MAKERS}
    assert not unknown, f"{block.name}: the runner provides no {sorted(unknown)}"
    if "crd" in block.needs:
        request.getfixturevalue("crd")
    helm_home: Path | None = None
    if {"kubelet", "chart"} & set(block.needs):
        helm_home = request.getfixturevalue("kubelet")
    if "chart" in block.needs:
        request.getfixturevalue("chart")
    ns = f"docs-{uuid.uuid4().hex[:8]}"
    real_cluster.kubectl("create", "namespace", ns)
    try:
        for need in block.needs:
            if need in MAKERS:
                MAKERS[need](real_cluster, ns)
        _run(block, real_cluster, ns, tmp_path, helm_home)
    finally:
        real_cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)


def _refusal(cluster: LocalCluster, *args: str, input: str | None = None) -> str:
    done = cluster.kubectl_run(*args, input=input)
    assert done.returncode != 0, f"kube-apiserver admitted kubectl {' '.join(args)}: {done.stdout}"
    return done.stderr


def test_the_crds_cel_rules_the_docs_cite_are_kube_apiservers(real_cluster: LocalCluster, crd: None) -> None:
    """docs/operator-install.md: a name over 52 characters is refused at ``kubectl apply``, and
    ``kubectl scale`` outside ``[minReplicas, maxReplicas]`` is refused (both CEL rules, run by
    kube-apiserver); the CRD's short name ``pcon`` reaches ParallelConsumers."""
    ns = f"docs-{uuid.uuid4().hex[:8]}"
    real_cluster.kubectl("create", "namespace", ns)
    try:
        long_name = EXAMPLE.read_text(encoding="utf-8").replace("name: orders", "name: " + "o" * 53)
        err = _refusal(real_cluster, "apply", "-n", ns, "-f", "-", input=long_name)
        assert "metadata.name must be at most 52 characters" in err, err
        _make_pc(real_cluster, ns)
        assert real_cluster.kubectl("get", "pcon", "-n", ns, "-o", "name").strip() == (
            "parallelconsumer.multilane.dev/orders"
        )
        err = _refusal(real_cluster, "scale", "-n", ns, "pcon/orders", "--replicas=11")  # maxReplicas 10
        assert "replicas must lie within [minReplicas, maxReplicas]" in err, err
    finally:
        real_cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)
