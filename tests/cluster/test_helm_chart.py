"""The chart installed by the real Helm CLI into the real control plane, and week one on it
(docs/real-cluster.md, "The chart, installed by Helm"): the CRD, the RBAC and two operator replicas
with leader election, running as processes on the process kubelet under the chart's service account
with a real token. kube-apiserver decides every RBAC question and runs the CRD's CEL rules.

Each scenario drives a ParallelConsumer through :class:`tests.operator.k8s_harness.K8sHarness` (its
spec, its balance check and its verdict: every delivery checker and the restored state), with the
workers of the embedded broker on loopback. The operator reaches the workers by their pod DNS names
over mutual TLS, unchanged: the process kubelet's hosts file resolves them to the pod IPs.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import time
import urllib.request
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
import pytest_asyncio

from multilane.demo.processors import SLEEP_ENV
from multilane.operator.k8s.kube import KubeClient, KubeError, api_path
from multilane.operator.spec.children import CONSUMER_LABEL
from multilane.testing.broker import EmbeddedBroker
from multilane.testing.cluster import LocalCluster
from multilane.testing.loadgen import RateProfile
from multilane.testing.process_kubelet import ProcessKubelet
from tests.cluster.helm_harness import (
    FULLNAME,
    RELEASE_NS,
    HelmRelease,
    KubeletPods,
    admin_kube,
    adopt_crd,
    consumer_events,
    drained,
    move_table,
    moves,
    shared_dir,
)
from tests.operator.conftest import NS, cr_path
from tests.operator.k8s_harness import NAME, PARTITIONS, K8sHarness, wait_until
from tests.operator.test_k8s_rollout import template_hash, wait_rolled

# serial: its waits (a PVC bound by the local provisioner, a rollout) are bounded in wall time, and
# beside the parallel pass a claim stayed unbound past them (CI, 2026-11-28)
pytestmark = [pytest.mark.broker, pytest.mark.serial, pytest.mark.asyncio(loop_scope="function")]

SA = f"system:serviceaccount:{RELEASE_NS}:{FULLNAME}"
METRICS_PORT = 9465  # the chart's metrics.port
# The small rollout's bound on a handoff's pause: one release and one promotion call on a loaded
# machine (the 0.5 s goal is the slow test's, tests/operator/test_k8s_rollout.py).
PAUSE_BOUND_S = 5.0
PLURAL = "parallelconsumers.multilane.dev"


def _restricted_namespace(cluster: LocalCluster, name: str) -> None:
    cluster.kubectl("create", "namespace", name)
    cluster.kubectl("label", "namespace", name, "pod-security.kubernetes.io/enforce=restricted")


@pytest.fixture(scope="module")
def release(
    real_cluster: LocalCluster, process_kubelet: ProcessKubelet, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[HelmRelease]:
    """``helm install`` of the chart (the release namespace and the consumers' namespace, both under
    PodSecurity ``restricted``, made first); uninstalled at the end if a test did not."""
    helm = real_cluster.bin_dir / "helm"
    if not helm.exists():
        pytest.fail(f"helm is missing in {real_cluster.bin_dir} (bash scripts/k8s-binaries.sh builds it)")
    _restricted_namespace(real_cluster, RELEASE_NS)
    _restricted_namespace(real_cluster, NS)
    adopt_crd(real_cluster)  # a CRD another test of the session applied (the conformance test)
    rel = HelmRelease(helm, real_cluster, tmp_path_factory.mktemp("helm"))
    rel.install("--set", f"rbac.secretNamespaces={{{NS}}}")
    try:
        yield rel
    finally:
        if rel.installed:
            rel.uninstall()


@pytest_asyncio.fixture
async def h(real_cluster: LocalCluster, process_kubelet: ProcessKubelet, release: HelmRelease,
            broker: EmbeddedBroker, topic_name: str) -> AsyncIterator[K8sHarness]:  # fmt: skip
    """The harness on the real tier; the ParallelConsumer (if any) and its pods gone at the end."""
    broker.create_topic(topic_name, PARTITIONS)
    root = shared_dir("multilane-helm-")
    kube = admin_kube(real_cluster)
    pods = KubeletPods(process_kubelet, NS)
    harness = K8sHarness(real_cluster.server, kube, broker, topic_name, root, pods, make_operator=None)  # type: ignore[arg-type]
    try:
        yield harness
    finally:
        # the full name: the CRD's short name `pc` is PriorityClass's in kubectl (docs/real-cluster.md)
        real_cluster.kubectl("delete", PLURAL, NAME, "-n", NS, "--ignore-not-found", "--wait=false")
        await wait_until(lambda: _gone(kube, cr_path(NAME)), 120, "the ParallelConsumer deleted")
        await wait_until(lambda: not pods.pods, 120, "the consumer's pods gone")
        await kube.close()
        shutil.rmtree(root, ignore_errors=True)


async def _gone(kube: KubeClient, path: str) -> bool:
    return await kube.get(path) is None


def _operator_log(kubelet: ProcessKubelet, pod: str, grep: bool = False) -> str:
    worker = kubelet.worker(RELEASE_NS, pod)
    if worker is None:
        return ""
    logs = sorted((worker.dir / "logs").glob("*.log"))
    if grep:
        keep = ("elet", "rror", "arn", "atch", "inaliz")
        text = [ln for p in logs for ln in p.read_text(errors="replace").splitlines()]
        lines = [ln for ln in text if any(k in ln for k in keep)]
        return "\n".join(ln[:400] for ln in lines[-40:])
    return "".join(p.read_text(errors="replace")[-6000:] for p in logs[-1:])


async def test_install_then_a_parallel_consumer_delivers_with_every_checker(
    h: K8sHarness, release: HelmRelease, real_cluster: LocalCluster, process_kubelet: ProcessKubelet
) -> None:
    # 1. two operator replicas running on the node, one of them holding the leader Lease
    pods = release.operator_pods()
    assert len(pods) == 2, [p["metadata"]["name"] for p in pods]
    assert all(p["status"].get("phase") == "Running" for p in pods), [p["status"] for p in pods]
    names = {p["metadata"]["name"] for p in pods}
    try:
        leader = await wait_until(lambda: release.leader() in names and release.leader(), 60, "a leader")
    except AssertionError as exc:
        logs = "\n".join(f"--- {n}:\n{_operator_log(process_kubelet, n)}" for n in sorted(names))
        raise AssertionError(f"{exc}: Lease holder {release.leader()!r}\n{logs}") from None

    # 2. kube-apiserver's RBAC: what the chart grants, and what it does not
    def can(*args: str) -> bool:
        return real_cluster.kubectl("auth", "can-i", "--as", SA, *args, check=False).strip() == "yes"

    assert can("create", "statefulsets.apps", "-n", NS)
    assert can("create", "secrets", "-n", NS)
    assert not can("list", "secrets", "-n", NS)
    assert not can("get", "secrets", "-n", "kube-system")
    assert not can("create", "clusterrolebindings")
    # 3. a ParallelConsumer: its pod runs, owns every partition, and delivers a load
    await h.create(h.body(replicas=1))
    try:
        await wait_until(lambda: h.balanced(1), 120, "every partition on orders-0", h)
    except AssertionError as exc:
        log = _operator_log(process_kubelet, leader)
        raise AssertionError(f"{exc}\nleader {leader} log:\n{log}") from None
    h.start_load(100, 8)
    await wait_until(lambda: drained(h), 120, "every produced record committed", h)
    assert (await h.status()).get("rollout") is None
    v = h.assert_ok()
    # 4. the chart's --log-format=json: the leader logs JSON lines
    lines = _operator_log(process_kubelet, leader).splitlines()
    assert [json.loads(ln) for ln in lines if ln.startswith("{")], lines[-5:]
    # 5. the series the chart's alerts read, on the leader's metrics port: it leads, the consumer is Ready
    ip = next(p["status"]["podIP"] for p in release.operator_pods() if p["metadata"]["name"] == leader)
    labels = f'consumer="{NAME}",namespace="{NS}",status="True",type="Ready"'
    ready = f"multilane_consumer_condition{{{labels}}} 1.0"

    async def alert_series() -> bool:
        text = await asyncio.to_thread(_scrape, f"http://{ip}:{METRICS_PORT}/metrics")
        return "multilane_operator_leader 1.0" in text and ready in text

    await wait_until(alert_series, 60, "multilane_operator_leader 1 and Ready=True on the leader's /metrics")
    print(f"helm install + ParallelConsumer: produced {v.produced}, replayed {v.replayed}")


def _scrape(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as answer:
        return str(answer.read().decode())


async def test_a_spec_breaking_a_cel_rule_is_refused_by_kube_apiserver(h: K8sHarness) -> None:
    """The CRD's x-kubernetes-validations run in kube-apiserver: 422 Invalid with the rule's message."""
    body = h.body(replicas=1)
    body["spec"]["kafka"]["config"] = {"group.id": "stolen"}
    with pytest.raises(KubeError) as refused:
        await h.create(body)
    assert refused.value.status == 422, refused.value
    assert "set by multilane" in str(refused.value), refused.value
    long = h.body(replicas=1)
    long["metadata"]["name"] = "x" * 53
    with pytest.raises(KubeError) as too_long:
        await h.create(long)
    assert too_long.value.status == 422 and "at most 52 characters" in str(too_long.value), too_long.value


async def test_image_change_rolls_the_pods_through_on_delete_with_nothing_lost(h: K8sHarness) -> None:
    """Every pod replaced by one on the new image, each partition moved by restore-before-handoff
    (a ``HandedOff`` event per move, none an eager fallback), each pause bounded; nothing lost."""
    await h.create(h.body(replicas=2))
    await wait_until(lambda: h.balanced(2), 150, "2 pods with 2 partitions each", h)
    old = await template_hash(h)
    before = {p["metadata"]["name"]: p["metadata"]["uid"] for p in await _consumer_pods(h)}
    h.start_load(100, 15)
    await asyncio.sleep(2)
    patched_at = time.time()  # Events of this name from earlier tests of the module are older
    await h.kube.patch(cr_path(NAME), {"spec": {"workload": {"image": "local:v2"}}})
    await wait_rolled(h, 2, old, 240)
    after = await _consumer_pods(h)
    assert {p["metadata"]["name"] for p in after} == set(before), after
    assert all(p["metadata"]["uid"] != before[p["metadata"]["name"]] for p in after), "a pod not replaced"
    assert all(p["spec"]["containers"][0]["image"] == "local:v2" for p in after)
    rolled = [m for m in moves(await consumer_events(h.kube, NS, NAME)) if m.at >= patched_at - 1.0]
    assert rolled and not [m for m in rolled if m.eager], rolled
    pauses = sorted(m.pause_s for m in rolled)
    assert pauses[-1] < PAUSE_BOUND_S, rolled
    await wait_until(lambda: drained(h), 120, "every produced record committed", h)
    v = h.assert_ok()
    print(f"helm image-change: {len(rolled)} moves, longest pause {pauses[-1]:.3f}s;"
          f" produced {v.produced}, replayed {v.replayed}")  # fmt: skip


async def _consumer_pods(h: K8sHarness) -> list[dict[str, Any]]:
    return await h.kube.list(api_path("v1", "pods", NS), {CONSUMER_LABEL: NAME})


async def test_leader_killed_mid_rollout_the_other_replica_finishes_it(
    h: K8sHarness, release: HelmRelease, process_kubelet: ProcessKubelet, real_cluster: LocalCluster
) -> None:
    await h.create(h.body(replicas=2))
    await wait_until(lambda: h.balanced(2), 150, "2 pods with 2 partitions each", h)
    old = await template_hash(h)
    leader = release.leader()
    h.start_load(100, 20)
    await asyncio.sleep(2)
    await h.kube.patch(cr_path(NAME), {"spec": {"workload": {"image": "local:v3"}}})
    await wait_until(lambda: _rolling(h), 60, "the rollout under way", h)
    assert process_kubelet.pids(RELEASE_NS, leader), f"no process for the leader {leader}"
    # Killed with its pod (force: no grace; the kubelet SIGKILLs the process). A SIGKILL of the
    # process alone would restart the container in the same pod, whose identity (the pod name) is
    # the Lease's holder: it takes the Lease straight back, and the other replica never leads.
    real_cluster.kubectl("delete", "pod", leader, "-n", RELEASE_NS, "--grace-period=0", "--force")
    new_leader = await wait_until(
        lambda: release.leader() not in ("", leader) and release.leader(), 90, "the other replica leading"
    )
    lease = json.loads(real_cluster.kubectl("get", "lease", FULLNAME, "-n", RELEASE_NS, "-o", "json"))
    assert lease["spec"]["holderIdentity"] == new_leader, lease
    assert lease["spec"].get("leaseTransitions", 0) >= 1, lease
    await wait_rolled(h, 2, old, 240)
    assert not ((await h.status()).get("rollout") or {}).get("moves"), "the rollout is not finished"
    await wait_until(lambda: drained(h), 120, "every produced record committed", h)
    v = h.assert_ok()
    print(f"helm leader-kill: {leader} -> {new_leader}; produced {v.produced}, replayed {v.replayed}")


async def test_immutable_field_change_gives_degraded(h: K8sHarness) -> None:
    await h.create(h.body(replicas=1))
    await wait_until(lambda: h.balanced(1), 150, "every partition on orders-0", h)

    async def degraded_condition() -> dict[str, Any]:
        conditions = (await h.status()).get("conditions") or []
        return next((c for c in conditions if c.get("type") == "Degraded"), {})

    # A pod that started before its claim was bound leaves Degraded=True (Unschedulable) until the
    # operator's next pass sees it running: start from Degraded=False, so what follows is the patch's.
    async def healthy() -> bool:
        return (await degraded_condition()).get("status") == "False"

    await wait_until(healthy, 60, "Degraded=False before the change", h)
    await h.kube.patch(cr_path(NAME), {"spec": {"state": {"storage": {"size": "2Gi"}}}})

    async def degraded() -> dict[str, Any] | None:
        c = await degraded_condition()
        return c if c.get("status") == "True" and c.get("reason") == "ImmutableFieldChange" else None

    held = await wait_until(degraded, 60, "Degraded=True (ImmutableFieldChange)", h)
    assert "spec.volumeClaimTemplates" in held["message"], held
    sts = await h.kube.get(api_path("apps/v1", "statefulsets", NS, NAME)) or {}
    assert sts["spec"]["volumeClaimTemplates"][0]["spec"]["resources"]["requests"]["storage"] != "2Gi"


async def _rolling(h: K8sHarness) -> bool:
    return (await h.status()).get("rollout") is not None


# The burst: the PC's own autoscaling policy with short windows (the demo's, docs/demo.md), a lane
# budget of 8 per pod so that more than factor 2 on 4 partitions needs a second pod, and 40 ms of I/O
# per record (a lane does ~25 rec/s): one pod at factor 2 carries ~200 rec/s, the burst offers 250.
BURST_SCALING = {
    "minReplicas": 1, "maxReplicas": 2, "minFactor": 2, "maxFactor": 4, "maxLanesPerReplica": 8,
    "targetCatchUpSeconds": 5, "targetUtilisation": 0.7, "intervalSeconds": 2,
    "stabilisationSeconds": 4, "scaleDownDelaySeconds": 10, "maxPartitionsMovedAtOnce": 4,
}  # fmt: skip
BURST = RateProfile.parse("15x6,250x12,15x30")
BURST_SLEEP_MS = 40
PAUSE_BOUND_S = 10.0
"""Each move's pause (release call to promotion answered), bounded for a loaded 2-core machine: the
demo measures ~0.3-0.5 s (docs/demo.md). Not a timing claim: a stuck handover fails it."""
_SIZE = re.compile(r"replicas (\d+)->(\d+), factor (\d+)->(\d+)")


async def test_a_burst_scales_up_and_back_through_restore_before_handoff(h: K8sHarness) -> None:
    """A burst from the load generator on a stateful key-mode consumer that the operator sizes itself:
    it scales up (factor, then a second pod whose learners restore before the handoff) and back down
    to one pod (the partitions handed back the same way). Every move's pause comes from its
    ``HandedOff`` Event on kube-apiserver; every delivery checker and the restored state hold."""
    body = h.body(replicas=None, **BURST_SCALING)
    workload = body["spec"]["workload"]
    workload["ordering"] = "key"
    workload["env"] = [
        e if e["name"] != SLEEP_ENV else {"name": SLEEP_ENV, "value": str(BURST_SLEEP_MS)}
        for e in workload["env"]
    ]
    await h.create(body)
    await wait_until(lambda: h.balanced(1), 150, "every partition on orders-0", h)
    t0 = time.time()
    h.start_load(0, 0, BURST)
    peak = [1, 1]

    async def back_to_one() -> bool:
        status = await h.status()
        peak[0] = max(peak[0], int(status.get("replicas") or 1))
        peak[1] = max(peak[1], int(status.get("factor") or 1))
        return (
            peak[0] == 2
            and h.load_done()
            and int(status.get("replicas") or 0) == 1
            and await h.balanced(1)
            and "orders-1" not in h.double.pods
        )

    # the load (48 s), the scale-down delay and the moves back; generous for a loaded machine
    await wait_until(back_to_one, BURST.duration_s + 180, "scaled up to 2 pods and back to 1", h)
    await wait_until(lambda: drained(h), 120, "every produced record committed", h)
    events = await consumer_events(h.kube, NS, NAME)
    decisions = [(ev.at - t0, ev.message) for ev in events if ev.reason == "ScalingDecision"]
    moved = [mv for mv in moves(events) if mv.at >= t0]
    head = f"{BURST.total_records} records, profile 15x6,250x12,15x30 rec/s; peak {peak[0]}x{peak[1]}"
    print(f"\nhelm burst ({head}; load average {_loadavg()}):")
    for t, message in decisions:
        print(f"  t={t:6.1f}s {message[:150]}")
    print(move_table(moved, t0))
    # 1. up and back: a decision that raised the replicas, one that lowered them, in that order
    sizes = [(t, [int(x) for x in m.groups()]) for t, msg in decisions if (m := _SIZE.search(msg))]
    up = next((t for t, (r0, r1, _f0, _f1) in sizes if r1 > r0), None)
    down = next((t for t, (r0, r1, _f0, _f1) in sizes if up is not None and t > up and r1 < r0), None)
    assert up is not None and down is not None, decisions
    # 2. every partition the second pod took went there and came back through a move; none eager
    out = [mv for mv in moved if mv.source == "orders-0" and mv.target == "orders-1"]
    back = [mv for mv in moved if mv.source == "orders-1" and mv.target == "orders-0"]
    assert out and {mv.partition for mv in back} == {mv.partition for mv in out}, move_table(moved, t0)
    assert not [mv for mv in moved if mv.eager], "a move fell back to eager (no restored learner)"
    # 3. each pause within the bound
    slow = [mv for mv in moved if mv.pause_s > PAUSE_BOUND_S]
    assert not slow, f"pauses above {PAUSE_BOUND_S}s:\n{move_table(slow, t0)}"
    # 4. nothing lost: every delivery checker, the state restored from the changelogs = the reference
    v = h.assert_ok()
    longest = max(mv.pause_s for mv in moved)
    print(f"helm burst: produced {v.produced}, replayed {v.replayed}, {len(moved)} moves, longest pause "
          f"{longest:.3f}s (bound {PAUSE_BOUND_S:g}s), load average {_loadavg()}")  # fmt: skip


def _loadavg() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


async def test_zz_uninstall_then_namespace_deletion_both_finish(
    h: K8sHarness, release: HelmRelease, real_cluster: LocalCluster
) -> None:
    """docs/operator-install.md's order: the ParallelConsumers first (the operator removes its
    finalizer; the garbage collector takes the StatefulSet and its pods; the claims go by
    ``pvcRetention.whenDeleted: Delete``, the default), then ``helm uninstall`` (the CRD stays:
    ``crds.keep``), then the namespaces. Last in this module: it uninstalls the release."""
    await h.create(h.body(replicas=1))
    await wait_until(lambda: h.balanced(1), 150, "every partition on orders-0", h)
    claims = api_path("v1", "persistentvolumeclaims", NS)
    assert await h.kube.list(claims), "no claim for the worker's state"
    children = [api_path(gv, plural, NS, name) for gv, plural, name in CHILDREN]
    assert all([await h.kube.get(c) for c in children]), "a child the operator makes is missing"
    await h.kube.delete(cr_path(NAME))
    await wait_until(lambda: _gone(h.kube, cr_path(NAME)), 120, "the ParallelConsumer deleted (finalizer)")
    for child in children:  # through their owner references, by the garbage collector
        await wait_until(lambda child=child: _gone(h.kube, child), 120, f"{child} collected")
    await wait_until(lambda: _none(h.kube, claims), 120, "the claims deleted (whenDeleted: Delete)")
    await asyncio.to_thread(release.uninstall)
    assert await h.kube.get(api_path("apps/v1", "deployments", RELEASE_NS, FULLNAME)) is None
    crds = "customresourcedefinitions"
    crd = api_path("apiextensions.k8s.io/v1", crds, None, "parallelconsumers.multilane.dev")
    assert await h.kube.get(crd), "the CRD went with the release (crds.keep is true)"
    for ns in (NS, RELEASE_NS):
        real_cluster.kubectl("delete", "namespace", ns, "--wait=false")
    for ns in (NS, RELEASE_NS):
        await wait_until(lambda ns=ns: _gone(h.kube, api_path("v1", "namespaces", None, ns)), 180,
                         f"namespace {ns} deleted")  # fmt: skip


#: What the operator makes for a ParallelConsumer (multilane/operator/spec/children.py), each owned by it.
CHILDREN = [
    ("apps/v1", "statefulsets", NAME),
    ("v1", "services", f"{NAME}-workers"),
    ("policy/v1", "poddisruptionbudgets", NAME),
    ("v1", "serviceaccounts", f"{NAME}-worker"),
    ("rbac.authorization.k8s.io/v1", "roles", f"{NAME}-worker"),
    ("rbac.authorization.k8s.io/v1", "rolebindings", f"{NAME}-worker"),
    ("v1", "secrets", f"{NAME}-control-token"),
]


async def _none(kube: KubeClient, collection: str) -> bool:
    return not await kube.list(collection)
