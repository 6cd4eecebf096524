"""The pause of a completed move is timed from its own release: the timings of a move that was
abandoned (e.g. its target died after the release) do not start the pause of a later move of the
same partition (issue 22: pauses of several minutes were reported from such leftovers)."""

from __future__ import annotations

from multilane.operator.rollout.handoff_model import take_done_records
from multilane.operator.rollout.protocol import MovePhase, PartitionMove, Rollout


def test_an_abandoned_move_leaves_no_timings_behind() -> None:
    release_started = {"t/0": 10.0, "t/1": 11.0}
    learn_started = {"t/0": 5.0, "t/1": 6.0}
    pause_end: dict[str, float] = {"t/1": 11.2}
    call_s = {("release", "t/0"): 0.1, ("release", "t/1"): 0.05, ("promote", "t/1"): 0.1}
    wall = {("released", "t/0"): 1000.0, ("released", "t/1"): 1001.0}
    first = Rollout(
        1,
        (
            PartitionMove("t/0", "w-0", "w-1", MovePhase.ABANDONED, orphaned=True),
            PartitionMove("t/1", "w-0", "w-1", MovePhase.DONE),
        ),
    )
    records = take_done_records(first, release_started, learn_started, pause_end, call_s, wall, lambda: 99.0)
    assert [(r.partition, r.pause_s) for r in records] == [("t/1", 0.2)]
    assert release_started == {} and learn_started == {} and call_s == {} and wall == {}
    # a later move of t/0: timed from its own release (300 s later), not from the abandoned one
    release_started["t/0"], learn_started["t/0"], pause_end["t/0"] = 310.0, 300.0, 310.3
    later = Rollout(2, (PartitionMove("t/0", "w-2", "w-1", MovePhase.DONE),))
    records = take_done_records(later, release_started, learn_started, pause_end, call_s, wall, lambda: 999.0)
    assert [(r.partition, r.pause_s, r.learn_s) for r in records] == [("t/0", 0.3, 10.0)]
