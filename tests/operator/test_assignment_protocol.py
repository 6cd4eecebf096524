"""The assignment/fencing protocol (multilane.operator.rollout.assignment) over real HTTP.

The workers are the WorkerFleet double (tests/operator/doubles.py): an aiohttp server implementing the
documented worker control HTTP contract (generation fencing with 409, release answers with committed
offsets) and recording every call. The client is the real WorkerControlClient. Liveness is given
directly as WorkerInfo (the Kubernetes Lease side is covered in test_lease.py).
"""

from __future__ import annotations

from typing import Any

import pytest
import pytest_asyncio

from multilane.operator.decision.planner import AssignmentPlanner
from multilane.operator.platform import WorkerInfo
from multilane.operator.rollout.assignment import AssignmentCoordinator, AssignmentState, PendingChange
from multilane.operator.rollout.workers import WorkerControlClient
from tests.operator.conftest import TOKEN
from tests.operator.doubles import WorkerFleet

pytestmark = pytest.mark.asyncio(loop_scope="function")

PARTS = [f"t/{i}" for i in range(4)]


def info(fleet: WorkerFleet, name: str, alive: bool = True, ordinal: int | None = None) -> WorkerInfo:
    return WorkerInfo(
        name=name,
        ordinal=int(name.rsplit("-", 1)[1]) if ordinal is None else ordinal,
        alive=alive,
        control_url=fleet.control_url(None, name),
    )


class Recorder:
    """The persist callback: keeps every state written (what status.assignment would hold)."""

    def __init__(self) -> None:
        self.states: list[dict[str, Any]] = []

    async def __call__(self, state: AssignmentState) -> None:
        self.states.append(state.to_status())

    @property
    def last(self) -> AssignmentState:
        return AssignmentState.from_status(self.states[-1])


@pytest_asyncio.fixture
async def client() -> Any:
    c = WorkerControlClient(TOKEN, timeout_s=3)
    yield c
    await c.close()


async def test_release_happens_before_grant_and_generation_rises(fleet: WorkerFleet, client: Any) -> None:
    for name in ("w-0", "w-1"):
        await fleet.add(name)
    rec = Recorder()
    coord = AssignmentCoordinator(client, AssignmentPlanner(max_moves=1), rec, release_deadline_s=1)
    workers = [info(fleet, "w-0"), info(fleet, "w-1")]
    first = await coord.step(AssignmentState(), workers, PARTS)
    assert first.committed and first.state.generation == 1
    assert fleet.assignment() == {"w-0": {"t/0", "t/2"}, "w-1": {"t/1", "t/3"}}

    await fleet.add("w-2")
    fleet.calls.clear()
    rec.states.clear()
    second = await coord.step(first.state, [*workers, info(fleet, "w-2")], PARTS)
    assert second.committed and second.state.generation == 2 and second.moves == 1
    moved = (set(first.state.members["w-0"]) | set(first.state.members["w-1"])) & fleet.assignment()["w-2"]
    assert len(moved) == 1
    (partition,) = moved
    old_owner = next(w for w, ps in first.state.members.items() if partition in ps)
    # The old owner's push (without the partition) was answered before the new owner's push (with it).
    release = next(
        i for i, c in enumerate(fleet.calls) if c.worker == old_owner and c.path == "/v1/assignment"
    )
    grant = next(i for i, c in enumerate(fleet.calls) if c.worker == "w-2" and c.path == "/v1/assignment")
    assert release < grant
    assert all(c.body["generation"] == 2 for c in fleet.calls if c.path == "/v1/assignment")
    # Intent was persisted before any call of this change, with the release recorded before commit.
    pendings = [s["pending"] for s in rec.states if s.get("pending")]
    assert pendings[0]["generation"] == 2 and pendings[0]["released"] == []
    assert any(p["released"] == [{"partition": partition, "committedOffset": 100}] for p in pendings)
    assert rec.states[-1]["pending"] is None


async def test_unreachable_owner_blocks_the_handoff_until_known_dead(fleet: WorkerFleet, client: Any) -> None:
    for name in ("w-0", "w-1"):
        await fleet.add(name)
    rec = Recorder()
    coord = AssignmentCoordinator(client, AssignmentPlanner(max_moves=None), rec, release_deadline_s=1)
    state = (await coord.step(AssignmentState(), [info(fleet, "w-0"), info(fleet, "w-1")], PARTS)).state
    await fleet.add("w-2")
    fleet.workers["w-0"].reachable = False
    fleet.workers["w-1"].reachable = False
    fleet.calls.clear()
    workers = [info(fleet, "w-0"), info(fleet, "w-1"), info(fleet, "w-2")]

    blocked = await coord.step(state, workers, PARTS)
    assert blocked.in_progress and not blocked.committed and "w-" in blocked.blocked
    assert fleet.assignment()["w-2"] == set()  # nothing granted while an owner may still process
    assert not [c for c in fleet.calls if c.worker == "w-2"]
    assert rec.last.pending is not None

    # w-0's Lease expired (known dead): its partitions count as released; w-1 answers again.
    fleet.workers["w-1"].reachable = True
    done = await coord.step(
        rec.last, [info(fleet, "w-0", alive=False), info(fleet, "w-1"), info(fleet, "w-2")], PARTS
    )
    assert done.committed
    assert set(done.state.members) == {"w-1", "w-2"}
    assert sorted(p for ps in done.state.members.values() for p in ps) == PARTS
    assert not [c for c in fleet.calls if c.worker == "w-0" and c.status == 200]


async def test_fenced_worker_makes_the_coordinator_jump_its_generation(
    fleet: WorkerFleet, client: Any
) -> None:
    for name in ("w-0", "w-1"):
        await fleet.add(name)
    fleet.workers["w-1"].generation = 10  # it saw generation 10 (e.g. from an operator whose status was lost)
    rec = Recorder()
    coord = AssignmentCoordinator(client, AssignmentPlanner(), rec, release_deadline_s=1)
    workers = [info(fleet, "w-0"), info(fleet, "w-1")]
    fenced = await coord.step(AssignmentState(), workers, PARTS)
    assert fenced.fenced and fenced.state.generation >= 10 and fenced.state.pending is None
    again = await coord.step(fenced.state, workers, PARTS)
    assert again.committed and again.state.generation == 11
    assert {w.generation for w in fleet.workers.values()} == {11}


async def test_resume_from_persisted_pending_keeps_its_generation(fleet: WorkerFleet, client: Any) -> None:
    """A new coordinator (a restarted operator) finishes the change it finds in status."""
    for name in ("w-0", "w-1"):
        await fleet.add(name)
    persisted = AssignmentState(
        generation=4,
        members={"w-0": ("t/0", "t/1", "t/2", "t/3")},
        pending=PendingChange(
            generation=5,
            target={"w-0": ("t/0", "t/1"), "w-1": ("t/2", "t/3")},
            released={"t/2": 100},  # t/2 was released before the restart; t/3 was not
        ),
    ).to_status()
    fleet.workers["w-0"].generation = 5
    fleet.workers["w-0"].partitions = {"t/0", "t/1", "t/3"}
    rec = Recorder()
    coord = AssignmentCoordinator(client, AssignmentPlanner(), rec, release_deadline_s=1)
    result = await coord.step(
        AssignmentState.from_status(persisted), [info(fleet, "w-0"), info(fleet, "w-1")], PARTS
    )
    assert result.committed and result.state.generation == 5
    assert fleet.assignment() == {"w-0": {"t/0", "t/1"}, "w-1": {"t/2", "t/3"}}
    assert all(c.body["generation"] == 5 for c in fleet.calls if c.path == "/v1/assignment")


async def test_sync_repushes_to_a_restarted_worker_and_sets_the_factor(
    fleet: WorkerFleet, client: Any
) -> None:
    await fleet.add("w-0")
    rec = Recorder()
    coord = AssignmentCoordinator(client, AssignmentPlanner(), rec, release_deadline_s=1)
    state = (await coord.step(AssignmentState(), [info(fleet, "w-0")], PARTS)).state
    fleet.workers["w-0"].generation = 0  # restarted: lost its assignment
    fleet.workers["w-0"].partitions = set()
    report = await coord.sync(state, [info(fleet, "w-0")], factor=5)
    assert report.problems == [] and report.breakers == []
    assert fleet.assignment()["w-0"] == set(PARTS) and fleet.workers["w-0"].generation == state.generation
    assert fleet.workers["w-0"].factor == 5


async def test_wrong_token_is_refused_by_the_contract(fleet: WorkerFleet) -> None:
    await fleet.add("w-0")
    bad = WorkerControlClient("wrong-token-" + "x" * 30, timeout_s=3)
    try:
        with pytest.raises(Exception, match="401"):
            await bad.status(fleet.control_url(None, "w-0"))
    finally:
        await bad.close()
