"""Restore-before-handoff through the real operator (kopf against the emulated API server), with a
real ``multilane worker`` process per pod (``multilane/testing/pods.py``), each renewing its own Lease,
on the embedded broker, under paced load. Every test ends with every delivery checker and the state
restored from the changelogs equal to the reference (``tests/operator/k8s_harness.py``).

Scenarios: ``scale-up-down``, ``kill-learning``,
``kill-releasing``, ``kill-promoting``, ``operator-restart``.
"""

from __future__ import annotations

import asyncio

import pytest

from tests.operator.k8s_harness import NAME, K8sHarness, finish, k8s, wait_until

__all__ = ["k8s"]

pytestmark = [pytest.mark.broker, pytest.mark.asyncio(loop_scope="function")]


async def start_on_one(h: K8sHarness, **operator: object) -> object:
    runner = h.operator(**operator)  # type: ignore[arg-type]
    await runner.start()
    await h.create()
    await wait_until(lambda: h.balanced(1), 90, "every partition on orders-0", h)
    return runner


def assert_learned_before_release(
    calls: list[tuple[str, str, tuple[str, ...]]], partitions: list[str], learner: str, source: str
) -> None:
    for p in partitions:
        learned = [i for i, (k, w, ps) in enumerate(calls) if k == "learn" and w == learner and p in ps]
        released = [i for i, (k, w, ps) in enumerate(calls) if k == "release" and w == source and p in ps]
        assert learned and released and learned[0] < released[0], (p, calls)


async def test_scale_up_and_down_under_load(k8s: K8sHarness) -> None:
    """scale-up-down: 1 -> 2 pods (the new pod learns before each release), then 2 -> 1 (the staying
    pod learns the leaving one's partitions; the pod goes only after releasing)."""
    h = k8s
    runner = await start_on_one(h)
    h.start_load(200, 16)
    await asyncio.sleep(2)
    await h.scale(2)
    await wait_until(lambda: h.balanced(2), 90, "2 pods with 2 partitions each", h)
    moved = sorted(p for p, w in (await h.owners()).items() if w == f"{NAME}-1")
    assert len(moved) == 2
    # Restore before handoff: orders-1 learned each partition before orders-0 released it.
    assert_learned_before_release(h.calls, moved, learner=f"{NAME}-1", source=f"{NAME}-0")
    mark = len(h.calls)
    await h.scale(1)

    async def back_on_one() -> bool:
        return f"{NAME}-1" not in h.double.pods and await h.balanced(1)

    await wait_until(back_on_one, 90, "back on orders-0, orders-1 gone", h)
    assert f"{NAME}-1" in h.double.removed
    assert_learned_before_release(h.calls[mark:], moved, learner=f"{NAME}-0", source=f"{NAME}-1")
    v = await finish(h, runner)  # type: ignore[arg-type]
    print(f"scale-up-down: produced {v.produced}, processed {v.processed}, replayed {v.replayed}")


@pytest.mark.parametrize(
    ("kind", "delay"),
    [
        pytest.param("learn", 0.5, id="kill-learning", marks=pytest.mark.slow),  # the learner, restoring
        pytest.param("release", 0.05, id="kill-releasing"),  # the source pod, draining
        pytest.param("promote", 0.05, id="kill-promoting", marks=pytest.mark.slow),  # the new owner
    ],
)
async def test_kill_pod_process_during_handoff_step(k8s: K8sHarness, kind: str, delay: float) -> None:
    """kill-*: SIGKILL the pod's process during one step of a scale-up's handoff. The kubelet (the
    double) starts the container again in the same pod, with the same state volume; the operator
    re-plans and completes the rollout; nothing is lost, nothing runs twice at once."""
    h = k8s
    runner = await start_on_one(h, hook=h.kill_hook(kind, delay))
    h.start_load(200, 14)
    await asyncio.sleep(2)
    await h.scale(2)
    await wait_until(lambda: bool(h.killed), 60, f"a kill during {kind}", h)
    _, pod, pid = h.killed[0]
    await wait_until(lambda: h.double.pods[pod].pids[-1] != pid, 30, f"{pod} restarted by the double", h)

    async def settled() -> bool:
        return await h.balanced(2) and all(p.running() for p in h.double.pods.values())

    await wait_until(settled, 90, f"balanced with every pod running after a kill during {kind}", h)
    assert h.double.pods[pod].restarts >= 1
    v = await finish(h, runner)  # type: ignore[arg-type]
    print(f"kill during {kind} ({pod}): produced {v.produced}, replayed {v.replayed}")


@pytest.mark.parametrize(
    "at", [pytest.param("release", id="before-release"), pytest.param("promote", marks=pytest.mark.slow)]
)
async def test_operator_restart_mid_rollout_resumes_from_status(k8s: K8sHarness, at: str) -> None:
    """operator-restart: the operator dies (its task cancelled, no handover) while a rollout waits
    on a worker call; status.rollout and status.assignment are in the API server; a new operator
    process resumes the rollout from them and completes it."""
    h = k8s
    stuck = asyncio.Event()
    loop = asyncio.get_running_loop()

    async def hang(kind: str, pod: str, partitions: list[str]) -> None:
        if kind == at:
            loop.call_soon_threadsafe(stuck.set)
            await asyncio.sleep(3600)  # the operator "dies" here: cancelled by runner.stop()

    first = await start_on_one(h, hook=hang)
    h.start_load(200, 14)
    await asyncio.sleep(2)
    await h.scale(2)
    await asyncio.wait_for(stuck.wait(), 60)
    await first.stop()  # type: ignore[attr-defined]
    persisted = await h.status()
    assert persisted.get("rollout"), f"no rollout in status when the operator died: {persisted}"
    generation = (persisted.get("assignment") or {}).get("generation")
    second = h.operator()
    await second.start()
    await wait_until(lambda: h.balanced(2), 90, "rollout completed by the new operator", h)
    after = await h.status()
    # Before a release the new operator still has a generation to persist (the promotion's); a
    # promotion's generation is persisted before its push, so the resumed push re-sends it.
    if at == "release":
        assert after["assignment"]["generation"] > generation
    else:
        assert after["assignment"]["generation"] >= generation
    assert not after.get("rollout", {}).get("moves"), f"rollout not finished: {after.get('rollout')}"
    v = await finish(h, second)
    print(f"operator restart before {at}: produced {v.produced}, replayed {v.replayed}")
