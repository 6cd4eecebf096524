"""Unit tests of the restore-before-handoff state machine (pure; no I/O)."""

from __future__ import annotations

from collections.abc import Mapping

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from multilane.operator.rollout.protocol import (
    ActionKind,
    MovePhase,
    Rollout,
    RolloutCoordinator,
    WorkerObservation,
)


def obs(name: str, *, alive: bool = True, active: set[str] | None = None,
        lag: Mapping[str, int | None] | None = None,
        released: Mapping[str, int] | None = None) -> WorkerObservation:
    return WorkerObservation(name=name, alive=alive, active=frozenset(active or ()),
                             learner_lag=dict(lag or {}), released=dict(released or {}))


def kinds(actions: list) -> list[tuple[str, str, str]]:
    return [(a.kind.value, a.worker, a.partition) for a in actions]


def test_single_move_follows_learn_release_promote_done() -> None:
    coord = RolloutCoordinator(acceptable_recovery_lag=10)
    r = coord.start(1, {"t/0": "a", "t/1": "a"}, {"t/0": "a", "t/1": "b"}, now=0.0)
    assert [m.partition for m in r.moves] == ["t/1"]

    r, acts = coord.step(r, {"a": obs("a", active={"t/0", "t/1"}), "b": obs("b")}, now=1.0)
    assert kinds(acts) == [("learn", "b", "t/1")]
    # still restoring: lag above the threshold -> nothing happens, source keeps processing
    r, acts = coord.step(r, {"a": obs("a", active={"t/0", "t/1"}), "b": obs("b", lag={"t/1": 500})}, 2.0)
    assert acts == [] and r.phases() == {"t/1": "learning"}
    # caught up -> the source is told to release
    r, acts = coord.step(r, {"a": obs("a", active={"t/0", "t/1"}), "b": obs("b", lag={"t/1": 3})}, 3.0)
    assert kinds(acts) == [("release", "a", "t/1")]
    # release reported with its final offset -> promote with that offset
    r, acts = coord.step(r, {"a": obs("a", active={"t/0"}, released={"t/1": 1234}),
                             "b": obs("b", lag={"t/1": 0})}, 4.0)
    assert kinds(acts) == [("promote", "b", "t/1")] and acts[0].final_offset == 1234
    r, acts = coord.step(r, {"a": obs("a", active={"t/0"}), "b": obs("b", active={"t/1"})}, 5.0)
    assert acts == [] and r.phases() == {"t/1": "done"} and r.finished


def test_release_is_resent_until_reported() -> None:
    coord = RolloutCoordinator(acceptable_recovery_lag=0)
    r = coord.start(1, {"t/0": "a"}, {"t/0": "b"}, now=0.0)
    r, _ = coord.step(r, {"a": obs("a"), "b": obs("b")}, 1.0)
    r, acts = coord.step(r, {"a": obs("a"), "b": obs("b", lag={"t/0": 0})}, 2.0)
    assert kinds(acts) == [("release", "a", "t/0")]
    r, acts = coord.step(r, {"a": obs("a"), "b": obs("b", lag={"t/0": 0})}, 3.0)
    assert kinds(acts) == [("release", "a", "t/0")]
    assert r.moves[0].phase is MovePhase.RELEASING


def test_dead_source_promotes_without_offset() -> None:
    coord = RolloutCoordinator(acceptable_recovery_lag=0)
    r = coord.start(1, {"t/0": "a"}, {"t/0": "b"}, now=0.0)
    r, _ = coord.step(r, {"a": obs("a"), "b": obs("b")}, 1.0)
    r, acts = coord.step(r, {"a": obs("a"), "b": obs("b", lag={"t/0": 0})}, 2.0)
    r, acts = coord.step(r, {"a": obs("a", alive=False), "b": obs("b", lag={"t/0": 0})}, 3.0)
    assert kinds(acts) == [("promote", "b", "t/0")] and acts[0].final_offset is None


def test_warmups_are_limited() -> None:
    coord = RolloutCoordinator(acceptable_recovery_lag=0, max_concurrent_warmups=2)
    cur = {f"t/{i}": "a" for i in range(5)}
    r = coord.start(1, cur, {p: "b" for p in cur}, now=0.0)
    r, acts = coord.step(r, {"a": obs("a"), "b": obs("b")}, 1.0)
    assert [a.kind for a in acts] == [ActionKind.LEARN, ActionKind.LEARN]
    assert sum(1 for m in r.moves if m.phase is MovePhase.PENDING) == 3


def test_learner_timeout_falls_back_to_eager_handoff() -> None:
    coord = RolloutCoordinator(acceptable_recovery_lag=0, learner_timeout_s=60)
    r = coord.start(1, {"t/0": "a"}, {"t/0": "b"}, now=0.0)
    r, _ = coord.step(r, {"a": obs("a"), "b": obs("b")}, 1.0)
    r, acts = coord.step(r, {"a": obs("a"), "b": obs("b", lag={"t/0": 10**6})}, 30.0)
    assert acts == []
    r, acts = coord.step(r, {"a": obs("a"), "b": obs("b", lag={"t/0": 10**6})}, 62.0)
    assert [a.kind for a in acts] == [ActionKind.EVENT, ActionKind.RELEASE]
    assert acts[0].reason == "LearnerTimeout" and r.moves[0].eager


def test_target_lost_before_release_keeps_source() -> None:
    coord = RolloutCoordinator()
    r = coord.start(1, {"t/0": "a"}, {"t/0": "b"}, now=0.0)
    r, _ = coord.step(r, {"a": obs("a"), "b": obs("b")}, 1.0)
    r, acts = coord.step(r, {"a": obs("a"), "b": obs("b", alive=False)}, 2.0)
    assert acts[0].reason == "HandoffTargetLost"
    assert r.moves[0].phase is MovePhase.ABANDONED and r.orphaned() == []


def test_target_lost_after_release_orphans_partition() -> None:
    coord = RolloutCoordinator(acceptable_recovery_lag=0)
    r = coord.start(1, {"t/0": "a"}, {"t/0": "b"}, now=0.0)
    r, _ = coord.step(r, {"a": obs("a"), "b": obs("b")}, 1.0)
    r, _ = coord.step(r, {"a": obs("a"), "b": obs("b", lag={"t/0": 0})}, 2.0)
    r, _ = coord.step(r, {"a": obs("a", released={"t/0": 7}), "b": obs("b", alive=False)}, 3.0)
    assert r.orphaned() == ["t/0"]


def test_scale_down_removes_leaving_workers_last() -> None:
    coord = RolloutCoordinator(acceptable_recovery_lag=0, max_concurrent_warmups=4)
    r = coord.start(1, {"t/0": "a", "t/1": "b"}, {"t/0": "a", "t/1": "a"}, now=0.0, leaving=["b"])
    r, acts = coord.step(r, {"a": obs("a", active={"t/0"}), "b": obs("b", active={"t/1"})}, 1.0)
    assert ActionKind.REMOVE_WORKERS not in [a.kind for a in acts]
    r, _ = coord.step(r, {"a": obs("a", active={"t/0"}, lag={"t/1": 0}), "b": obs("b", active={"t/1"})}, 2.0)
    r, _ = coord.step(r, {"a": obs("a", active={"t/0"}), "b": obs("b", released={"t/1": 5})}, 3.0)
    r, acts = coord.step(r, {"a": obs("a", active={"t/0", "t/1"}), "b": obs("b")}, 4.0)
    assert [a.kind for a in acts] == [ActionKind.REMOVE_WORKERS] and acts[0].workers == ("b",)
    assert r.finished


def test_leaving_worker_cannot_be_target() -> None:
    with pytest.raises(ValueError, match="leaving"):
        RolloutCoordinator().start(1, {"t/0": "a"}, {"t/0": "b"}, now=0.0, leaving=["b"])


def test_status_round_trip_and_bad_status() -> None:
    coord = RolloutCoordinator(acceptable_recovery_lag=0)
    r = coord.start(3, {"t/0": "a"}, {"t/0": "b"}, now=0.0)
    r, _ = coord.step(r, {"a": obs("a"), "b": obs("b")}, 1.0)
    assert Rollout.from_dict(r.to_dict()) == r
    with pytest.raises(ValueError, match="invalid rollout"):
        Rollout.from_dict({"moves": [{"partition": "t/0"}]})


@settings(max_examples=200, deadline=None)
@given(
    n_parts=st.integers(1, 8),
    owners=st.lists(st.sampled_from("abc"), min_size=8, max_size=8),
    targets=st.lists(st.sampled_from("abc"), min_size=8, max_size=8),
    slots=st.integers(1, 3),
    restore_ticks=st.integers(0, 4),
)
def test_rollout_always_completes_and_never_double_owns(
    n_parts: int, owners: list[str], targets: list[str], slots: int, restore_ticks: int
) -> None:
    """With workers that behave, every rollout finishes, and no partition ever has two processors."""
    coord = RolloutCoordinator(acceptable_recovery_lag=0, max_concurrent_warmups=slots)
    cur = {f"t/{i}": owners[i] for i in range(n_parts)}
    tgt = {f"t/{i}": targets[i] for i in range(n_parts)}
    r = coord.start(1, cur, tgt, now=0.0)
    active = {w: {p for p, o in cur.items() if o == w} for w in "abc"}
    learning: dict[str, dict[str, int]] = {w: {} for w in "abc"}
    released: dict[str, dict[str, int]] = {w: {} for w in "abc"}
    for tick in range(1, 200):
        observations = {
            w: obs(w, active=set(active[w]),
                   lag={p: max(0, restore_ticks - (tick - t0)) for p, t0 in learning[w].items()},
                   released=released[w])
            for w in "abc"
        }
        r, acts = coord.step(r, observations, float(tick))
        for a in acts:
            if a.kind is ActionKind.LEARN:
                learning[a.worker].setdefault(a.partition, tick)
            elif a.kind is ActionKind.RELEASE:
                active[a.worker].discard(a.partition)
                released[a.worker][a.partition] = 100
            elif a.kind is ActionKind.PROMOTE:
                learning[a.worker].pop(a.partition, None)
                active[a.worker].add(a.partition)
        for p in tgt:
            assert sum(p in active[w] for w in "abc") <= 1, f"{p} processed twice at tick {tick}"
        if r.finished:
            break
    assert r.finished
    assert {p: w for w in "abc" for p in active[w]} == tgt


def test_learn_is_resent_when_the_target_does_not_report_it() -> None:
    coord = RolloutCoordinator(acceptable_recovery_lag=10)
    r = coord.start(1, {"t/0": "a"}, {"t/0": "b"}, now=0.0)
    r, acts = coord.step(r, {"a": obs("a", active={"t/0"}), "b": obs("b")}, 1.0)
    assert kinds(acts) == [("learn", "b", "t/0")]
    # the target restarted (or the call was lost): it reports no learner for t/0 -> LEARN again
    r, acts = coord.step(r, {"a": obs("a", active={"t/0"}), "b": obs("b")}, 2.0)
    assert kinds(acts) == [("learn", "b", "t/0")]
    # while it reports the learner (even without a lag yet) nothing is re-sent
    r, acts = coord.step(r, {"a": obs("a", active={"t/0"}), "b": obs("b", lag={"t/0": None})}, 3.0)
    assert acts == []


def test_learning_move_is_done_when_the_target_already_processes_the_partition() -> None:
    coord = RolloutCoordinator(acceptable_recovery_lag=10)
    r = coord.start(1, {"t/0": "a"}, {"t/0": "b"}, now=0.0)
    r, _ = coord.step(r, {"a": obs("a", active={"t/0"}), "b": obs("b")}, 1.0)
    r, acts = coord.step(r, {"a": obs("a", alive=False), "b": obs("b", active={"t/0"})}, 2.0)
    assert acts == [] and r.phases() == {"t/0": "done"} and r.finished


def test_release_known_without_offset_still_promotes() -> None:
    coord = RolloutCoordinator(acceptable_recovery_lag=10)
    r = coord.start(1, {"t/0": "a"}, {"t/0": "b"}, now=0.0)
    r, _ = coord.step(r, {"a": obs("a", active={"t/0"}), "b": obs("b")}, 1.0)
    r, acts = coord.step(r, {"a": obs("a", active={"t/0"}), "b": obs("b", lag={"t/0": 0})}, 2.0)
    assert kinds(acts) == [("release", "a", "t/0")]
    a = WorkerObservation(name="a", alive=True, released={"t/0": None})
    r, acts = coord.step(r, {"a": a, "b": obs("b", lag={"t/0": 0})}, 3.0)
    assert [(x.kind, x.final_offset) for x in acts] == [(ActionKind.PROMOTE, None)]
