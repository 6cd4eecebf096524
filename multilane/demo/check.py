"""The demo's (and the handoff tests') verdict: nothing lost, order and exclusivity kept, state right.
Does I/O (reads the event log; restores each partition's state from its changelog into a scratch
directory; reads committed offsets from Kafka).

The state check restores every partition the way a new owner would (``StateManager.open_partition``
at the group's committed offset: only changes of committed records apply) and compares the per-key
counters of :func:`multilane.demo.processors.stateful_io` with the counts of the produced set.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from multilane.testing.checkers import CheckResult, ProducedRecord, check_delivery
from multilane.testing.processors import ProcessingEvent
from multilane.worker.state.examples import decode_count, reference_counts

__all__ = ["Verdict", "judge", "read_counts"]


def read_counts(
    bootstrap: str, group: str, topic: str, partitions: Iterable[int]
) -> tuple[dict[bytes, int], dict[int, int]]:
    """Per-key counters restored from the changelog at the committed offsets, and those offsets."""
    from multilane.worker.state.committed import CommittedOffsetReader
    from multilane.worker.state.manager import StateManager

    counts: dict[bytes, int] = {}
    committed: dict[int, int] = {}
    reader = CommittedOffsetReader(bootstrap, group)
    try:
        with (
            tempfile.TemporaryDirectory(prefix="multilane-check-") as tmp,
            StateManager(tmp, bootstrap, group) as sm,
        ):
            for p in partitions:
                committed[p] = reader.committed(topic, p)
                sm.open_partition(topic, p, committed[p], None)
                for key, value in sm.store(topic, p).items():
                    counts[key] = decode_count(value)
                sm.close_partition(topic, p, clean=False)
    finally:
        reader.close()
    return counts, committed


@dataclass
class Verdict:
    """Invariant: ``ok`` iff every check passed and nothing was lost."""

    produced: int
    processed: int  # distinct produced records with an ``end`` event
    replayed: int  # records that ended more than once
    lost: int  # produced records without an ``end`` event
    checks: list[CheckResult] = field(default_factory=list)
    state_ok: bool | None = None  # None: not checked
    state_mismatches: int = 0
    state_detail: str = ""

    @property
    def ok(self) -> bool:
        return self.lost == 0 and all(c.ok for c in self.checks) and self.state_ok is not False


def judge(
    produced: Sequence[ProducedRecord],
    events: Sequence[ProcessingEvent],
    counts: dict[bytes, int] | None,
    rewind_within_incarnation: bool = True,
) -> Verdict:
    """Apply the delivery checkers and compare the state with the reference counts (pure)."""
    checks = check_delivery(produced, events, mode="key", rewind_within_incarnation=rewind_within_incarnation)
    wanted = {(r.topic, r.partition, r.offset) for r in produced}
    ended: dict[tuple[str, int, int], int] = {}
    for e in events:
        if e.kind == "end" and e.tpo in wanted:
            ended[e.tpo] = ended.get(e.tpo, 0) + 1
    verdict = Verdict(
        produced=len(wanted),
        processed=len(ended),
        replayed=sum(1 for n in ended.values() if n > 1),
        lost=len(wanted) - len(ended),
        checks=checks,
    )
    if counts is not None:
        reference = reference_counts(r.key for r in produced)
        bad = [k for k in set(reference) | set(counts) if reference.get(k, 0) != counts.get(k, 0)]
        verdict.state_ok = not bad
        verdict.state_mismatches = len(bad)
        if bad:
            k = sorted(bad)[0]
            verdict.state_detail = (
                f"{len(bad)} keys differ, e.g. {k!r}: "
                f"state {counts.get(k, 0)} vs produced {reference.get(k, 0)}"
            )
        else:
            verdict.state_detail = f"{len(reference)} keys, {sum(reference.values())} counted records"
    return verdict
