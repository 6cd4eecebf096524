"""Decaton-style delivery checkers: apply them to every integration test that processes records.

Pure: no I/O (read the event log with :func:`multilane.testing.processors.read_event_log` first).

Inputs are the *produced set* -- ``(topic, partition, offset, key)`` of every record whose delivery
report succeeded (:class:`ProducedRecord`, as returned by ``multilane.testing.loadgen``) -- and the
processing events (:class:`~multilane.testing.processors.ProcessingEvent`) in log order.

An *incarnation* is one life of a worker process: ``(pid, n)`` where ``n`` counts the ``kill`` markers
of that pid seen so far (an in-process recorder marks the end of an incarnation with a kill marker).

- :class:`AtLeastOnceChecker`: every produced record has an ``end`` event; nothing unknown processed.
- :class:`KeyOrderChecker`: per ordering unit (``(topic, partition, key)``; or ``(topic, partition)`` for
  partition mode) the ``start`` events walk the unit's produced offsets in order; each start is the
  same offset again (a retry or replay), the next produced offset of the unit (never skipping one), or
  -- only in a new incarnation -- a rewind to an earlier produced offset, after which the walk continues
  in order from there.
- :class:`ExclusiveKeyChecker`: no two attempts of one unit are open at once, across all processes.
  An attempt opens at ``start`` and closes at its ``end``/``fail``/``cancel``, or at its pid's ``kill``
  marker, or (without a marker) after that pid's last event. (A sync processor cannot be cancelled: an
  abandoned sync attempt stays open until it ends, so a new owner starting the key meanwhile is caught.)
- :class:`ReplayCounter`: how many records were processed (ended) more than once, and started again in
  another incarnation; optionally bounded.

Every checker returns a :class:`CheckResult`; :func:`assert_all` raises one readable AssertionError.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from multilane.testing.processors import ProcessingEvent

__all__ = [
    "AtLeastOnceChecker",
    "CheckResult",
    "ExclusiveKeyChecker",
    "KeyOrderChecker",
    "ProducedRecord",
    "ReplayCounter",
    "assert_all",
    "check_delivery",
]

MAX_VIOLATIONS = 10  # violations kept per result (counts are always complete)


class ProducedRecord(NamedTuple):
    """A record whose delivery report succeeded."""

    topic: str
    partition: int
    offset: int
    key: bytes | None


@dataclass
class CheckResult:
    """Outcome of one checker. Invariant: ``ok`` iff no violation was counted."""

    name: str
    ok: bool
    counts: dict[str, int] = field(default_factory=dict)
    violations: list[str] = field(default_factory=list)  # the first MAX_VIOLATIONS, in log order

    def __str__(self) -> str:
        head = f"{self.name}: {'ok' if self.ok else 'FAILED'} {self.counts}"
        return "\n".join([head, *(f"  - {v}" for v in self.violations)])


class _Violations:
    def __init__(self) -> None:
        self.count = 0
        self.first: list[str] = []

    def add(self, msg: str) -> None:
        self.count += 1
        if len(self.first) < MAX_VIOLATIONS:
            self.first.append(msg)


def _fmt_key(key: bytes | None) -> str:
    if key is None:
        return "<null>"
    try:
        text = key.decode("ascii")
        if text.isprintable():
            return repr(text)
    except UnicodeDecodeError:
        pass
    return "0x" + key.hex()


def _incarnations(events: Sequence[ProcessingEvent]) -> list[tuple[int, int]]:
    """Each event's incarnation ``(pid, kill markers of pid before it)``; a marker gets the one it ends."""
    kills: dict[int, int] = defaultdict(int)
    out: list[tuple[int, int]] = []
    for e in events:
        out.append((e.pid, kills[e.pid]))
        if e.kind == "kill":
            kills[e.pid] += 1
    return out


UnitOf = Callable[[str, int, bytes | None], Hashable | None]


def unit_by_key(topic: str, partition: int, key: bytes | None) -> Hashable | None:
    """Ordering unit of key mode: (topic, partition, key); null keys have no order (None)."""
    return None if key is None else (topic, partition, key)


def unit_by_partition(topic: str, partition: int, key: bytes | None) -> Hashable | None:
    """Ordering unit of partition mode: (topic, partition)."""
    return (topic, partition)


def _unit_fn(by: str) -> UnitOf:
    if by == "key":
        return unit_by_key
    if by == "partition":
        return unit_by_partition
    raise ValueError(f"by must be 'key' or 'partition', got {by!r}")


class AtLeastOnceChecker:
    """Every produced record has at least one ``end`` event, and no event names an unknown record.

    ``exempt_keys``: records with these keys need not end (e.g. poison records that were dead-lettered).
    """

    def __init__(self, produced: Iterable[ProducedRecord], exempt_keys: Iterable[bytes] = ()) -> None:
        self.produced = {(p.topic, p.partition, p.offset): p.key for p in produced}
        self.exempt = frozenset(exempt_keys)

    def check(self, events: Sequence[ProcessingEvent]) -> CheckResult:
        v = _Violations()
        ended: set[tuple[str, int, int]] = set()
        unknown: set[tuple[str, int, int]] = set()
        for e in events:
            if e.kind == "kill":
                continue
            tpo = e.tpo
            if tpo not in self.produced:
                if tpo not in unknown:
                    unknown.add(tpo)
                    v.add(
                        f"event {e.seq}: {e.kind} of {tpo} (key {_fmt_key(e.key)}), which was never produced"
                    )
                continue
            if self.produced[tpo] != e.key:
                v.add(
                    f"event {e.seq}: {tpo} processed with key {_fmt_key(e.key)}, "
                    f"produced with {_fmt_key(self.produced[tpo])}"
                )
            if e.kind == "end":
                ended.add(tpo)
        missing = sorted(
            tpo for tpo, key in self.produced.items() if tpo not in ended and key not in self.exempt
        )
        for tpo in missing[:MAX_VIOLATIONS]:
            v.add(f"missing: {tpo[0]}/{tpo[1]}@{tpo[2]} (key {_fmt_key(self.produced[tpo])}) never ended")
        v.count += max(0, len(missing) - MAX_VIOLATIONS)
        return CheckResult(
            "at-least-once",
            v.count == 0,
            {
                "produced": len(self.produced),
                "processed": len(ended),
                "missing": len(missing),
                "unknown": len(unknown),
            },
            v.first,
        )


class KeyOrderChecker:
    """Per ordering unit, starts walk the produced offsets in order (see the module docstring).

    1. Collect each unit's produced offsets, sorted.
    2. For each ``start`` (log order) of a unit, with the unit's previous start ``prev`` (offset and
       incarnation), accept: the first start of the unit at its first produced offset (or anywhere
       with ``allow_late_start``); the same offset as ``prev``; the produced offset right after ``prev``;
       an earlier produced offset when the incarnation changed (a rewind).
    3. Anything else is a violation: a skip forward (naming the skipped offsets), a rewind within
       one incarnation, or an offset that was never produced for this unit.
    """

    def __init__(
        self,
        produced: Iterable[ProducedRecord],
        by: str = "key",
        allow_late_start: bool = False,
        rewind_within_incarnation: bool = False,
    ) -> None:
        self.unit_of = _unit_fn(by)
        self.by = by
        self.allow_late_start = allow_late_start
        self.rewind_within_incarnation = rewind_within_incarnation
        # 1. each unit's produced offsets, sorted (invariant: strictly increasing lists)
        offsets: dict[Hashable, list[int]] = defaultdict(list)
        for p in produced:
            unit = self.unit_of(p.topic, p.partition, p.key)
            if unit is not None:
                offsets[unit].append(p.offset)
        self.offsets = {u: sorted(set(os)) for u, os in offsets.items()}

    def check(self, events: Sequence[ProcessingEvent]) -> CheckResult:
        v = _Violations()
        inc = _incarnations(events)
        prev: dict[Hashable, tuple[int, tuple[int, int]]] = {}  # unit -> (index into offsets, incarnation)
        starts = rewinds = 0
        for e, incarnation in zip(events, inc, strict=True):
            if e.kind != "start":
                continue
            unit = self.unit_of(e.topic, e.partition, e.key)
            if unit is None:
                continue
            starts += 1
            offs = self.offsets.get(unit, [])
            i = bisect.bisect_left(offs, e.offset)
            where = f"event {e.seq} (pid {e.pid}): {self.by} {self._describe(unit)} offset {e.offset}"
            if i == len(offs) or offs[i] != e.offset:
                v.add(f"{where} was never produced for this {self.by}")
                continue
            # 2. accept or reject relative to the previous start of the unit
            p = prev.get(unit)
            if p is None:
                if i != 0 and not self.allow_late_start:
                    v.add(f"{where}: first start of the {self.by} skips {self._skipped(offs, -1, i)}")
            else:
                pi, pinc = p
                if i == pi or i == pi + 1:
                    pass
                elif i < pi:
                    if pinc == incarnation and not self.rewind_within_incarnation:
                        v.add(f"{where}: goes back from offset {offs[pi]} within one incarnation")
                    else:
                        rewinds += 1
                else:
                    # 3. a skip forward
                    v.add(f"{where}: after offset {offs[pi]} skips {self._skipped(offs, pi, i)}")
            prev[unit] = (i, incarnation)
        return CheckResult(
            f"{self.by}-order",
            v.count == 0,
            {"units": len(self.offsets), "starts": starts, "rewinds": rewinds, "violations": v.count},
            v.first,
        )

    @staticmethod
    def _skipped(offs: list[int], after: int, upto: int) -> str:
        skipped = offs[after + 1 : upto]
        shown = ", ".join(map(str, skipped[:5]))
        return f"produced offset(s) {shown}{' ...' if len(skipped) > 5 else ''} ({len(skipped)} in all)"

    @staticmethod
    def _describe(unit: Hashable) -> str:
        if isinstance(unit, tuple) and len(unit) == 3:
            return f"{unit[0]}/{unit[1]} key {_fmt_key(unit[2])}"
        if isinstance(unit, tuple) and len(unit) == 2:
            return f"{unit[0]}/{unit[1]}"
        return repr(unit)


class ExclusiveKeyChecker:
    """No two attempts of one ordering unit are open at the same time, across all processes.

    1. Find each pid's last event index (where its unmarked open attempts close).
    2. Walk the log: ``kill`` closes the pid's open attempts; ``start`` opens an attempt of its unit
       and is a violation if another attempt of the unit is still open; ``end``/``fail``/``cancel``
       close the attempt they belong to (a close with no matching open attempt is a violation too).
    """

    def __init__(self, by: str = "key") -> None:
        self.unit_of = _unit_fn(by)
        self.by = by

    def check(self, events: Sequence[ProcessingEvent]) -> CheckResult:
        v = _Violations()
        # 1. last event of each pid
        last_seq: dict[int, int] = {}
        for idx, e in enumerate(events):
            last_seq[e.pid] = idx
        inc = _incarnations(events)
        # open attempts: unit -> list of (pid, incarnation, offset, attempt, index of the start)
        open_: dict[Hashable, list[tuple[int, tuple[int, int], int, int, int]]] = defaultdict(list)
        overlaps = 0
        # 2. walk
        for idx, (e, incarnation) in enumerate(zip(events, inc, strict=True)):
            if e.kind == "kill":
                for unit in list(open_):
                    open_[unit] = [a for a in open_[unit] if a[1] != incarnation]
                continue
            unit = self.unit_of(e.topic, e.partition, e.key)
            if unit is None:
                continue
            attempts = open_[unit]
            # attempts of pids without a kill marker close after their pid's last event
            attempts[:] = [a for a in attempts if last_seq[a[0]] >= idx]
            if e.kind == "start":
                for pid, _inc, off, att, sidx in attempts:
                    overlaps += 1
                    v.add(
                        f"event {e.seq}: pid {e.pid} starts {e.topic}/{e.partition}@{e.offset} "
                        f"(key {_fmt_key(e.key)}, attempt {e.attempt}) while pid {pid} still runs "
                        f"@{off} attempt {att} (started at event {events[sidx].seq})"
                    )
                attempts.append((e.pid, incarnation, e.offset, e.attempt, idx))
            else:  # end / fail / cancel
                for j, a in enumerate(attempts):
                    if a[1] == incarnation and a[2] == e.offset and a[3] == e.attempt:
                        del attempts[j]
                        break
                else:
                    v.add(
                        f"event {e.seq}: {e.kind} of {e.topic}/{e.partition}@{e.offset} attempt {e.attempt} "
                        f"(pid {e.pid}) without a matching start"
                    )
        return CheckResult(f"exclusive-{self.by}", v.count == 0, {"overlaps": overlaps}, v.first)


class ReplayCounter:
    """Counts records processed more than once.

    - ``ended_more_than_once``: records with two or more ``end`` events (completed work redone);
    - ``extra_ends``: ``end`` events beyond the first per record;
    - ``started_in_several_incarnations``: records started by more than one incarnation (includes
      records that were in flight at a kill and had to be redone).

    ``max_replays`` (optional) bounds ``ended_more_than_once``; ``max_restarted`` bounds
    ``started_in_several_incarnations``. Without bounds the result is always ok (a measurement).
    """

    def __init__(self, max_replays: int | None = None, max_restarted: int | None = None) -> None:
        self.max_replays = max_replays
        self.max_restarted = max_restarted

    def check(self, events: Sequence[ProcessingEvent]) -> CheckResult:
        ends: dict[tuple[str, int, int], int] = defaultdict(int)
        incs: dict[tuple[str, int, int], set[tuple[int, int]]] = defaultdict(set)
        for e, incarnation in zip(events, _incarnations(events), strict=True):
            if e.kind == "end":
                ends[e.tpo] += 1
            elif e.kind == "start":
                incs[e.tpo].add(incarnation)
        replayed = sorted(t for t, n in ends.items() if n > 1)
        restarted = sorted(t for t, s in incs.items() if len(s) > 1)
        counts = {
            "records": len(incs),
            "ended_more_than_once": len(replayed),
            "extra_ends": sum(n - 1 for n in ends.values() if n > 1),
            "started_in_several_incarnations": len(restarted),
        }
        v = _Violations()
        if self.max_replays is not None and len(replayed) > self.max_replays:
            v.add(
                f"{len(replayed)} records ended more than once (bound {self.max_replays}); first: "
                + ", ".join(f"{t}/{p}@{o}" for t, p, o in replayed[:5])
            )
        if self.max_restarted is not None and len(restarted) > self.max_restarted:
            v.add(
                f"{len(restarted)} records started in several incarnations (bound {self.max_restarted}); "
                "first: " + ", ".join(f"{t}/{p}@{o}" for t, p, o in restarted[:5])
            )
        return CheckResult("replays", v.count == 0, counts, v.first)


def check_delivery(
    produced: Sequence[ProducedRecord],
    events: Sequence[ProcessingEvent],
    mode: str = "key",
    exempt_keys: Iterable[bytes] = (),
    allow_late_start: bool = False,
    rewind_within_incarnation: bool = False,
) -> list[CheckResult]:
    """The checkers that apply to an ordering mode (``key``, ``partition`` or ``unordered``)."""
    results = [AtLeastOnceChecker(produced, exempt_keys).check(events)]
    if mode in ("key", "partition"):
        results.append(
            KeyOrderChecker(
                produced,
                by=mode,
                allow_late_start=allow_late_start,
                rewind_within_incarnation=rewind_within_incarnation,
            ).check(events)
        )
        results.append(ExclusiveKeyChecker(by=mode).check(events))
    elif mode != "unordered":
        raise ValueError(f"unknown ordering mode {mode!r}")
    results.append(ReplayCounter().check(events))
    return results


def assert_all(*results: CheckResult | Iterable[CheckResult]) -> None:
    """Raise one AssertionError listing every failed result (with its first violations)."""
    flat: list[CheckResult] = []
    for r in results:
        if isinstance(r, CheckResult):
            flat.append(r)
        else:
            flat.extend(r)
    failed = [r for r in flat if not r.ok]
    if failed:
        raise AssertionError("delivery checks failed:\n" + "\n".join(str(r) for r in failed))
