"""Unit and property tests of the pure ``AssignmentPlanner``."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from multilane.operator.decision.planner import (
    AssignmentPlanner,
    format_partition,
    members_from_status,
    members_to_status,
    parse_partition,
)


def parts(n: int, topic: str = "t") -> list[str]:
    return [format_partition(topic, i) for i in range(n)]


def test_partition_names_round_trip() -> None:
    assert parse_partition("orders/12") == ("orders", 12)
    assert parse_partition(format_partition("a.b-c", 0)) == ("a.b-c", 0)
    for bad in ["orders", "orders/", "/3", "orders/x"]:
        with pytest.raises(ValueError):
            parse_partition(bad)


def test_fresh_assignment_is_balanced_and_all_placements() -> None:
    plan = AssignmentPlanner(max_moves=1).plan({}, ["w-0", "w-1", "w-2"], parts(7))
    assert sorted(len(p) for p in plan.assignment.values()) == [2, 2, 3]
    assert len(plan.moves) == 7 and not plan.live_moves


def test_scale_up_moves_only_what_balance_needs_and_respects_the_limit() -> None:
    current = {"w-0": tuple(parts(4)[:2]), "w-1": tuple(parts(4)[2:])}
    limited = AssignmentPlanner(max_moves=1).plan(current, ["w-0", "w-1", "w-2"], parts(4))
    assert len(limited.live_moves) == 1 and limited.moves[0].target == "w-2"
    unlimited = AssignmentPlanner(max_moves=None).plan(current, ["w-0", "w-1", "w-2"], parts(4))
    # 4 over 3 workers = 2,1,1: exactly one partition must move; it is the same with no limit.
    assert len(unlimited.live_moves) == 1 and unlimited.balanced


def test_dead_worker_partitions_are_placed_regardless_of_limit() -> None:
    current = {"w-0": ("t/0", "t/1"), "w-1": ("t/2", "t/3"), "w-2": ("t/4", "t/5")}
    plan = AssignmentPlanner(max_moves=1).plan(current, ["w-0", "w-1"], parts(6))
    assert plan.balanced
    assert {m.partition for m in plan.moves} == {"t/4", "t/5"}
    assert all(m.source is None for m in plan.moves)
    assert plan.assignment["w-0"][:2] == ("t/0", "t/1")  # sticky


def test_stale_and_duplicate_partitions_are_cleaned() -> None:
    current = {"w-0": ("t/0", "t/9"), "w-1": ("t/0", "t/1")}
    plan = AssignmentPlanner(max_moves=None).plan(current, ["w-0", "w-1"], parts(2))
    owners = [w for w, ps in plan.assignment.items() for p in ps]
    assert sorted(p for ps in plan.assignment.values() for p in ps) == ["t/0", "t/1"]
    assert owners.count("w-0") == 1 and owners.count("w-1") == 1


def test_no_workers_gives_an_empty_plan() -> None:
    assert AssignmentPlanner().plan({"w-0": ("t/0",)}, [], parts(1)).assignment == {}


def test_status_round_trip_orders_workers_numerically() -> None:
    status = members_to_status({"a-10": ("t/1",), "a-2": ("t/0",)})
    assert [m["worker"] for m in status] == ["a-2", "a-10"]
    assert members_from_status(status) == {"a-2": ("t/0",), "a-10": ("t/1",)}


def test_invalid_limit_is_refused() -> None:
    with pytest.raises(ValueError):
        AssignmentPlanner(max_moves=0)


# ---- properties -------------------------------------------------------------------------------

WORKERS = [f"w-{i}" for i in range(8)]


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[dict[str, tuple[str, ...]], list[str], list[str], int | None]:
    n_parts = draw(st.integers(min_value=0, max_value=24))
    partitions = parts(n_parts)
    old_workers = draw(st.lists(st.sampled_from(WORKERS), unique=True, max_size=6))
    current: dict[str, list[str]] = {w: [] for w in old_workers}
    if old_workers:
        for p in partitions:
            owner = draw(st.sampled_from([*old_workers, None]))  # None: a new, unowned partition
            if owner is not None:
                current[owner].append(p)
    # Some stale partitions from a shrunk topic.
    if old_workers and draw(st.booleans()):
        current[old_workers[0]].append("t/99")
    live = draw(st.lists(st.sampled_from(WORKERS), unique=True, min_size=1, max_size=6))
    max_moves = draw(st.one_of(st.none(), st.integers(min_value=1, max_value=4)))
    return {w: tuple(ps) for w, ps in current.items()}, live, partitions, max_moves


def min_live_moves(current: dict[str, tuple[str, ...]], live: list[str], partitions: list[str]) -> int:
    """Brute force over which workers get the larger share: the fewest live-to-live moves."""
    wanted = set(partitions)
    held = {w: len([p for p in current.get(w, ()) if p in wanted]) for w in live}
    base, extra = divmod(len(partitions), len(live))
    best = None
    for big in itertools.combinations(live, extra):
        cost = sum(max(0, held[w] - (base + (1 if w in big else 0))) for w in live)
        best = cost if best is None else min(best, cost)
    assert best is not None
    return best


@settings(max_examples=300, deadline=None)
@given(scenarios())
def test_every_partition_is_assigned_exactly_once_to_a_live_worker(scenario) -> None:  # type: ignore[no-untyped-def]
    current, live, partitions, max_moves = scenario
    plan = AssignmentPlanner(max_moves=max_moves).plan(current, live, partitions)
    assigned = [p for ps in plan.assignment.values() for p in ps]
    assert sorted(assigned) == sorted(partitions)
    assert set(plan.assignment) == set(live)
    # moves are exactly the ownership changes
    before = {p: w for w, ps in current.items() if w in live for p in ps}
    changed = {p for p in partitions if before.get(p) != plan.owner_of(p)}
    assert {m.partition for m in plan.moves} == changed


@settings(max_examples=300, deadline=None)
@given(scenarios())
def test_moves_are_minimal_limited_and_balance_when_within_budget(scenario) -> None:  # type: ignore[no-untyped-def]
    current, live, partitions, max_moves = scenario
    # Disjoint current assignment (duplicates make "minimal" ill-defined): the generator gives that.
    plan = AssignmentPlanner(max_moves=max_moves).plan(current, live, partitions)
    needed = min_live_moves(current, live, partitions)
    if max_moves is None or needed <= max_moves:
        assert plan.balanced
        assert len(plan.live_moves) == needed
    else:
        assert len(plan.live_moves) == max_moves


@settings(max_examples=200, deadline=None)
@given(scenarios())
def test_repeated_plans_converge_to_balance_and_then_stay_put(scenario) -> None:  # type: ignore[no-untyped-def]
    current, live, partitions, max_moves = scenario
    planner = AssignmentPlanner(max_moves=max_moves)
    assignment: dict[str, tuple[str, ...]] = dict(current)
    for _ in range(len(partitions) + 2):
        plan = planner.plan(assignment, live, partitions)
        assignment = dict(plan.assignment)
        if plan.balanced:
            break
    assert plan.balanced
    again = planner.plan(assignment, live, partitions)
    assert again.moves == () and dict(again.assignment) == assignment
