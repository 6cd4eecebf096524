"""Unit tests of the back-pressure bounds (pure)."""

from __future__ import annotations

from multilane.worker.flow import FlowController, FlowCounters


def test_one_partition_may_use_the_whole_process_bound() -> None:
    flow = FlowController(100, 10_000)
    flow.set_partitions(1)
    part = FlowCounters()
    assert flow.budget(part) == (100, 10_000)


def test_partitions_get_fair_shares_so_one_backlog_cannot_starve_the_others() -> None:
    flow = FlowController(100, 10_000)
    flow.set_partitions(4)
    hot, cold = FlowCounters(), FlowCounters()
    rec, _ = flow.budget(hot)
    assert rec == 25
    flow.take(hot, rec, 25 * 100)
    assert not flow.admit(hot, 100)  # the backlogged partition is at its share
    assert flow.admit(cold, 100)  # another partition still gets room
    assert flow.budget(cold)[0] == 24


def test_explicit_partition_bound_wins_when_smaller_and_shares_follow_membership() -> None:
    flow = FlowController(100, 10_000, part_max_records=10)
    flow.set_partitions(2)
    assert flow.part_max_records == 10
    flow.set_partitions(50)
    assert flow.part_max_records == 2
    flow.set_partitions(1000)
    assert flow.part_max_records == 1  # never zero: every partition can make progress
    flow.set_partitions(0)
    assert flow.part_max_records == 10


def test_resume_uses_the_fair_share() -> None:
    flow = FlowController(100, 10_000)
    flow.set_partitions(2)
    part = FlowCounters()
    flow.take(part, 50, 500)
    assert not flow.can_resume(part)
    flow.release_many(part, 26, 260)
    assert flow.can_resume(part)
