"""HandoffExecutor against in-memory workers (no processes, no broker): the restore-before-handoff
order of calls, exclusive ownership at every call, persistence before calls, resume after a crash,
the learner-timeout fallback, and the pure helpers of the local control plane."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

from multilane.operator.local.plane import write_json_atomic
from multilane.operator.platform import WorkerInfo
from multilane.operator.rollout.assignment import AssignmentState
from multilane.operator.rollout.handoff import HandoffConfig, HandoffExecutor, observe_worker
from multilane.operator.rollout.protocol import Rollout
from multilane.operator.rollout.workers import ReleasedPartition
from multilane.testing.fleet import CHANGELOG_END
from multilane.testing.fleet import WorkerFleetDouble as FakeWorkers

P = [f"t/{i}" for i in range(4)]


def infos(fake: FakeWorkers, names: Iterable[str]) -> list[WorkerInfo]:
    return [WorkerInfo(n, int(n.split("-")[1]), n not in fake.dead, f"fake://{n}") for n in sorted(names)]


class Store:
    """The persisted status; ``log`` keeps what was persisted before each worker call."""

    def __init__(self) -> None:
        self.assignment = AssignmentState()
        self.rollout: Rollout | None = None
        self.writes = 0

    async def persist(self, a: AssignmentState, r: Rollout | None) -> None:
        self.assignment, self.rollout = a, r
        self.writes += 1


async def run_until_settled(
    ex: HandoffExecutor, store: Store, fake: FakeWorkers, names: list[str], replicas: int, steps: int = 20
) -> None:
    for _ in range(steps):
        eligible = {n for n in names if int(n.split("-")[1]) < replicas}
        res = await ex.step(store.assignment, store.rollout, infos(fake, names), P, eligible, replicas)
        store.assignment, store.rollout = res.assignment, res.rollout
        if res.rollout is None and all(
            len(store.assignment.members.get(n, ())) == len(P) // len(eligible) for n in eligible
        ):
            return
    raise AssertionError(f"not settled: {store.assignment} {store.rollout}")


def test_observe_worker_maps_status() -> None:
    o = observe_worker(
        "w-0",
        True,
        {
            "partitions": [
                {"topic": "t", "partition": 0, "phase": "active"},
                {"topic": "t", "partition": 1, "phase": "releasing"},
            ],
            "learners": [
                {"topic": "t", "partition": 2, "phase": "learning", "restore_lag": 5000, "unread": 5},
                {"topic": "t", "partition": 3, "phase": "restoring", "restore_lag": None},
                {"topic": "t", "partition": 0, "phase": "active", "restore_lag": 0},
            ],
        },
    )
    assert o.active == frozenset({"t/0"})
    assert dict(o.learner_lag) == {"t/2": 5, "t/3": None}
    assert not observe_worker("w-1", False, None).alive


def test_scale_up_learns_before_release_and_grants_after() -> None:
    async def main() -> None:
        fake, store = FakeWorkers(["w-0", "w-1"], learn_ticks=2), Store()
        ex = HandoffExecutor(fake, store.persist, HandoffConfig(acceptable_recovery_lag=0))
        await run_until_settled(ex, store, fake, ["w-0"], 1)
        assert fake.active["w-0"] == set(P)
        fake.calls.clear()
        await run_until_settled(ex, store, fake, ["w-0", "w-1"], 2)
        moved = sorted(fake.active["w-1"])
        assert len(moved) == 2 and not fake.active["w-0"] & fake.active["w-1"]
        for p in moved:
            kinds = [(k, w) for k, w, ps in fake.calls if p in ps or (k == "assign" and w == "w-0")]
            learn = kinds.index(("learn", "w-1"))
            release = next(
                i for i, c in enumerate(fake.calls) if c[0] == "assign" and c[1] == "w-0" and p not in c[2]
            )
            grant = next(
                i for i, c in enumerate(fake.calls) if c[0] == "assign" and c[1] == "w-1" and p in c[2]
            )
            assert learn < release < grant, fake.calls
        assert [r.eager for r in ex.completed] == [False, False]
        # placement + one generation for the batch of releases; both partitions released in one call
        assert store.assignment.generation >= 2
        releases = [c for c in fake.calls if c[0] == "assign" and c[1] == "w-0"]
        assert len(releases) == 1 and not set(moved) & set(releases[0][2]), fake.calls
        learns = [c for c in fake.calls if c[0] == "learn"]
        assert len(learns) == 1 and sorted(learns[0][2]) == moved, fake.calls

    asyncio.run(main())


def test_learner_timeout_falls_back_to_eager_handoff() -> None:
    async def main() -> None:
        fake, store = FakeWorkers(["w-0", "w-1"], learn_ticks=10_000), Store()
        clock = [0.0]
        ex = HandoffExecutor(
            fake,
            store.persist,
            HandoffConfig(acceptable_recovery_lag=0, learner_timeout_s=5),
            clock=lambda: clock[0],
        )
        await run_until_settled(ex, store, fake, ["w-0"], 1)
        for _ in range(40):
            clock[0] += 1.0
            res = await ex.step(
                store.assignment, store.rollout, infos(fake, ["w-0", "w-1"]), P, {"w-0", "w-1"}, 2
            )
            store.assignment, store.rollout = res.assignment, res.rollout
            if res.rollout is None and len(fake.active["w-1"]) == 2:
                break
        assert len(fake.active["w-1"]) == 2
        assert [r.eager for r in ex.completed] == [True, True]

    asyncio.run(main())


@pytest.mark.parametrize(
    ("warmups", "crash_after_calls"), [(4, 1), (4, 2), (1, 1), (1, 2), (1, 3), (1, 4)]
)
def test_crash_anywhere_then_resume_from_persisted_status(warmups: int, crash_after_calls: int) -> None:
    """A new executor, given only what was persisted, finishes the rollout; ownership stays exclusive.
    With 4 moves at once the two moves take one batched release call and one promotion call; one at
    a time they take four calls."""

    class CrashError(Exception):
        pass

    async def main() -> None:
        fake, store = FakeWorkers(["w-0", "w-1"], learn_ticks=1), Store()
        config = HandoffConfig(acceptable_recovery_lag=0, max_concurrent_warmups=warmups)
        ex = HandoffExecutor(fake, store.persist, config)
        await run_until_settled(ex, store, fake, ["w-0"], 1)
        n = [0]
        original = fake.assign

        async def crashing_assign(*args: Any, **kwargs: Any) -> list[ReleasedPartition]:
            out = await original(*args, **kwargs)
            n[0] += 1
            if n[0] == crash_after_calls:
                raise CrashError  # the operator dies right after the worker acted, before recording it
            return out

        fake.assign = crashing_assign  # type: ignore[method-assign,assignment]
        with pytest.raises(CrashError):
            await run_until_settled(ex, store, fake, ["w-0", "w-1"], 2)
        fake.assign = original  # type: ignore[method-assign]
        # a fresh executor: nothing in memory, only the persisted status
        resumed = HandoffExecutor(fake, store.persist, config)
        await run_until_settled(resumed, store, fake, ["w-0", "w-1"], 2)
        assert fake.active["w-0"] | fake.active["w-1"] == set(P)
        assert not fake.active["w-0"] & fake.active["w-1"]

    asyncio.run(main())


def test_source_death_promotes_target_without_release() -> None:
    async def main() -> None:
        fake, store = FakeWorkers(["w-0", "w-1"], learn_ticks=3), Store()
        ex = HandoffExecutor(fake, store.persist, HandoffConfig(acceptable_recovery_lag=0))
        await run_until_settled(ex, store, fake, ["w-0", "w-1"], 2)
        fake.dead.add("w-0")  # known dead: its partitions are placed on w-1 at once
        res = await ex.step(store.assignment, store.rollout, infos(fake, ["w-0", "w-1"]), P, {"w-1"}, 1)
        assert fake.active["w-1"] == set(P)
        assert res.assignment.members["w-1"] == tuple(P)

    asyncio.run(main())


def test_write_json_atomic(tmp_path: Path) -> None:
    path = tmp_path / "status.json"
    write_json_atomic(path, {"a": 1})
    write_json_atomic(path, {"a": 2})
    assert json.loads(path.read_text()) == {"a": 2}
    assert not list(tmp_path.glob("*.tmp"))


def test_spec_state_fields_drive_the_handoff_config() -> None:
    from multilane.operator.spec.validation import validate_spec

    base = {
        "kafka": {"bootstrapServers": "k:9092", "topics": ["t"], "consumerGroup": "g"},
        "workload": {"image": "i", "processor": "m:f"},
        "scaling": {"maxPartitionsMovedAtOnce": 2},
    }
    spec, problems = validate_spec(base)
    assert spec is not None and not problems
    assert (spec.state_enabled, spec.acceptable_recovery_lag, spec.learner_timeout_s) == (
        False,
        10_000,
        600.0,
    )
    spec, _ = validate_spec(
        {**base, "state": {"enabled": True, "acceptableRecoveryLag": 5, "learnerTimeoutSeconds": 30}}
    )
    assert spec is not None
    assert (spec.state_enabled, spec.acceptable_recovery_lag, spec.learner_timeout_s) == (True, 5, 30.0)
    spec, problems = validate_spec({**base, "state": {"learnerTimeoutSeconds": 0}})
    assert spec is None and any("learnerTimeoutSeconds" in p.message for p in problems)


def test_the_promotion_hands_the_target_what_the_source_released() -> None:
    """The progress record and changelog end each source answered its release with go to the target
    with the promotion (the target then need not read the progress topic inside the pause, and its
    learner reads to that end without a fresh fetch; issue 22)."""

    async def main() -> None:
        fake, store = FakeWorkers(["w-0", "w-1"], learn_ticks=2), Store()
        ex = HandoffExecutor(fake, store.persist, HandoffConfig(acceptable_recovery_lag=0))
        await run_until_settled(ex, store, fake, ["w-0"], 1)
        await run_until_settled(ex, store, fake, ["w-0", "w-1"], 2)
        moved = sorted(fake.active["w-1"])
        handed = {p: h.progress for w, hs in fake.handovers_received if w == "w-1" for p, h in hs.items()}
        assert handed == {p: f"progress-of-{p}" for p in moved}
        assert not [h for w, h in fake.handovers_received if w == "w-0" and h]  # the source gets none
        ends = {p: h.changelog_end for w, hs in fake.handovers_received if w == "w-1" for p, h in hs.items()}
        assert ends == dict.fromkeys(moved, CHANGELOG_END)
        assert not ex.memory.handovers  # forgotten once promoted

    asyncio.run(main())
