"""``multilane check-logs``: the delivery checkers over event logs collected from pods. Does I/O (reads
the files it is given, prints a report).

For a real cluster, where each pod's processor writes its own event log
(``MULTILANE_TEST_LOG`` on the pod's volume) and a container's process usually has the same small PID
in every pod and after every restart. Steps, numbered as in :func:`merge_logs`:

1. Read each log; its PIDs get a namespace of their own (``(index + 1) * 10_000_000 + pid``), so
   that PID 1 of two pods is two processes.
2. Kill markers: for each ``--kill LOG@EPOCH`` (the time a script force-deleted or SIGKILLed that
   log's pod), a ``kill`` marker for the log's process goes before the first event written after
   EPOCH that follows at least ``--restart-gap`` seconds of silence in that log -- the restarted
   container's first event (a new pod takes seconds to start; a busy process writes every few ms).
   Without events after EPOCH the marker goes at the end. It ends the old incarnation, as a test's
   ``append_kill_marker`` does.
3. Merge every log by event time (one node's clock on kind; ties keep file order) and renumber.

Then :func:`multilane.testing.checkers.check_delivery` against the produced set (``multilane loadgen
--output``): at-least-once, per-key order (a rewind within one incarnation allowed, as
:func:`multilane.demo.check.judge` allows: a partition can come back to a worker), exclusive key,
replays. Exit code 0 when every check passed, 1 when one failed, 2 on unreadable input.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from multilane.testing.checkers import check_delivery
from multilane.testing.loadgen import read_produced
from multilane.testing.processors import EventLogError, ProcessingEvent, read_event_log

__all__ = ["add_arguments", "merge_logs", "run"]

PID_SPACE = 10_000_000


def add_arguments(parser: argparse.ArgumentParser) -> None:
    a = parser.add_argument
    a("--produced", required=True, help="the produced set: the TSV of `multilane loadgen --output`")
    a("--topic", required=True, help="the topic the produced set was written to")
    a("--events", action="append", required=True, metavar="LOG", help="an event log (repeat per pod)")
    a(
        "--kill",
        action="append",
        default=[],
        metavar="LOG@EPOCH",
        help="LOG's process was killed at EPOCH (seconds, wall clock); repeatable",
    )
    a("--restart-gap", type=float, default=1.0, help="silence (s) before a restarted process's first event")
    a("--mode", choices=["key", "partition", "unordered"], default="key", help="the consumer's ordering")
    a("--strict-order", action="store_true", help="no rewind within one incarnation")


def _marker(pid: int, at: float) -> ProcessingEvent:
    return ProcessingEvent("kill", at, pid, "", -1, -1, None, 0, -1)


def merge_logs(
    logs: Sequence[Sequence[ProcessingEvent]],
    kills: Sequence[tuple[int, float]] = (),
    restart_gap_s: float = 1.0,
) -> list[ProcessingEvent]:
    """Steps 1-3 of the module docstring (pure). ``kills``: ``(index of the log, epoch)``."""
    merged: list[tuple[float, int, int, ProcessingEvent]] = []  # (time, log, position, event)
    for index, events in enumerate(logs):
        # 1. a PID namespace per log
        base = (index + 1) * PID_SPACE
        own = [replace(e, pid=base + e.pid) for e in events]
        # 2. kill markers, before the first event after a silence that follows the kill
        for _, at in sorted(k for k in kills if k[0] == index):
            before = [e for e in own if e.time <= at and e.kind != "kill"]
            if not before:
                continue  # nothing ran before the kill: no incarnation to end
            pid = before[-1].pid
            position = len(own)
            previous = max(e.time for e in before)
            for i, e in enumerate(own):
                if e.time <= at or e.kind == "kill":
                    continue
                if e.time - previous >= restart_gap_s:
                    position = i
                    break
                previous = e.time
            stamp = own[position - 1].time if position == len(own) else own[position].time
            own.insert(position, _marker(pid, stamp))
        merged.extend((e.time, index, i, e) for i, e in enumerate(own))
    # 3. one real-time order
    merged.sort(key=lambda x: (x[0], x[1], x[2]))
    return [replace(e, seq=i) for i, (_t, _log, _pos, e) in enumerate(merged)]


def _kills(specs: Sequence[str], logs: Sequence[str]) -> list[tuple[int, float]]:
    out: list[tuple[int, float]] = []
    for spec in specs:
        path, sep, epoch = spec.rpartition("@")
        if not sep or path not in logs:
            raise ValueError(f"--kill {spec!r}: expected LOG@EPOCH with LOG one of the --events")
        out.append((logs.index(path), float(epoch)))
    return out


def run(args: argparse.Namespace) -> int:
    try:
        missing = [p for p in args.events if not Path(p).exists()]
        if missing:
            raise ValueError(f"no such event log: {', '.join(missing)}")
        produced = read_produced(args.produced, args.topic)
        logs = [read_event_log(path) for path in args.events]
        kills = _kills(args.kill, args.events)
    except (OSError, ValueError, EventLogError) as exc:
        print(f"multilane check-logs: {exc}", file=sys.stderr)
        return 2
    events = merge_logs(logs, kills, args.restart_gap)
    results = check_delivery(
        produced, events, mode=args.mode, rewind_within_incarnation=not args.strict_order
    )
    wanted = {(r.topic, r.partition, r.offset) for r in produced}
    ended = {e.tpo for e in events if e.kind == "end" and e.tpo in wanted}
    for path, log in zip(args.events, logs, strict=True):
        print(f"log {path}: {len(log)} events")
    for result in results:
        print(result)
    ok = all(r.ok for r in results)
    print(
        f"produced {len(wanted)}, processed {len(ended)}, lost {len(wanted - ended)}, "
        f"kill markers {len(kills)}: {'ok' if ok else 'FAILED'}"
    )
    return 0 if ok else 1
