"""Test support for outputs tied to commits: a forwarding test processor, reading an output topic back,
and the outputs checker. Does I/O (the event log, a consumer reading the output topic); the checker
(:func:`check_outputs`) is pure.

- :func:`forwarding_async` / :func:`forwarding_sync`: the test processors of
  :mod:`multilane.testing.processors` (event log, env knobs), then ``MULTILANE_TEST_OUTPUTS`` outputs
  (default 2) per record to ``MULTILANE_TEST_OUTPUT_TOPIC``, keyed by the input key, valued
  ``pid:topic:partition:offset:i``.
- :func:`forwarding_counting_async`: :func:`forwarding_async`, counting each key's records in
  ``ctx.state`` before its sleep (as :func:`multilane.worker.state.examples.count_per_key`; needs
  ``--state-dir``).
- :func:`read_outputs`: every record of an output topic, parsed.
- :func:`check_outputs`: every input has all its outputs (duplicates allowed, none missing), and with
  ``ordered`` no key's outputs go backwards within one worker incarnation (pid) in an output partition;
  with ``exactly_once`` no output appears twice and the order holds across incarnations.
"""

from __future__ import annotations

import os
import time
import uuid
from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import NamedTuple

from multilane.api import Context, Record, needs_state
from multilane.testing.checkers import CheckResult, ProducedRecord
from multilane.testing.processors import _current, _run_async, _run_sync
from multilane.worker.state.examples import count_per_key

__all__ = ["OutputSeen", "check_outputs", "forwarding_async", "forwarding_counting_async", "forwarding_sync",
           "read_outputs"]

MAX_VIOLATIONS = 20


def _outputs(record: Record, ctx: Context) -> None:
    topic = os.environ.get("MULTILANE_TEST_OUTPUT_TOPIC", "")
    n = int(os.environ.get("MULTILANE_TEST_OUTPUTS", "2") or 2)
    pid = os.getpid()
    for i in range(n):
        ctx.produce(topic, f"{pid}:{record.topic}:{record.partition}:{record.offset}:{i}", key=record.key)


async def forwarding_async(record: Record, ctx: Context) -> None:
    """The async test processor, then its outputs (the worker waits for their acknowledgement)."""
    cfg, sink = _current()
    await _run_async(cfg, sink, ctx)
    _outputs(record, ctx)


@needs_state
async def forwarding_counting_async(record: Record, ctx: Context) -> None:
    """The key's counter in ``ctx.state`` (+1), then the async test processor (its sleep: commits come
    while the change is applied but its record not complete), then its outputs: with exactly-once
    outputs the counter's changelog record goes in the transaction of the record's outputs."""
    count_per_key(record, ctx)
    cfg, sink = _current()
    await _run_async(cfg, sink, ctx)
    _outputs(record, ctx)


def forwarding_sync(record: Record, ctx: Context) -> None:
    """The sync test processor, then its outputs."""
    cfg, sink = _current()
    _run_sync(cfg, sink, ctx)
    _outputs(record, ctx)


class OutputSeen(NamedTuple):
    """One output record as read back: where it landed and which input attempt made it."""

    partition: int  # of the output topic
    offset: int  # of the output topic
    key: bytes | None
    pid: int
    topic: str  # input record's
    in_partition: int
    in_offset: int
    out_index: int  # i-th output of the attempt


def read_outputs(bootstrap: str, topic: str, partitions: int, timeout_s: float = 30.0,
                 quiet_s: float = 2.0) -> list[OutputSeen]:
    """Every record of ``topic`` (read until nothing new arrives for ``quiet_s``), in partition order, as
    a ``read_committed`` reader sees them (librdkafka's default, said here: exactly-once is about it)."""
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"read-{uuid.uuid4().hex[:8]}",
                  "enable.auto.commit": False, "auto.offset.reset": "earliest",
                  "isolation.level": "read_committed"})
    out: list[OutputSeen] = []
    try:
        c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        deadline = time.monotonic() + timeout_s
        last = time.monotonic()
        while time.monotonic() < deadline and time.monotonic() - last < quiet_s:
            for m in c.consume(1000, 0.2):
                if m.error() is not None:
                    continue
                pid, in_topic, in_part, in_off, idx = (m.value() or b"").decode().rsplit(":", 4)
                out.append(OutputSeen(m.partition() or 0, m.offset() or 0, m.key(), int(pid), in_topic,
                                      int(in_part), int(in_off), int(idx)))
                last = time.monotonic()
    finally:
        c.close()
    return sorted(out, key=lambda o: (o.partition, o.offset))


def check_outputs(inputs: Sequence[ProducedRecord], outputs: Iterable[OutputSeen], per_input: int,
                  ordered: bool, exactly_once: bool = False) -> CheckResult:
    """Outputs checker (pure; steps 1-3).

    1. Complete: every input ``(topic, partition, offset)`` has outputs ``0..per_input-1`` (any pid,
       duplicates allowed unless ``exactly_once``), and every output's key is its input's key.
    2. Ordered (``ordered``): within one output partition, the outputs of one key written by one
       incarnation (pid) never go back to an earlier input offset (a restarted worker may repeat
       outputs from the committed offset: that is a new pid). With ``exactly_once``, across
       incarnations too (nothing is repeated, so nothing may go back).
    3. Exactly once (``exactly_once``, outputs read with ``read_committed``): no output appears twice.
    """
    outs = sorted(outputs, key=lambda o: (o.partition, o.offset))
    violations: list[str] = []
    n_viol = 0

    def add(msg: str) -> None:
        nonlocal n_viol
        n_viol += 1
        if len(violations) < MAX_VIOLATIONS:
            violations.append(msg)

    # 1. complete
    key_of = {(r.topic, r.partition, r.offset): r.key for r in inputs}
    have: dict[tuple[str, int, int], set[int]] = defaultdict(set)
    for o in outs:
        tpo = (o.topic, o.in_partition, o.in_offset)
        have[tpo].add(o.out_index)
        if tpo in key_of and key_of[tpo] != o.key:
            add(f"output {o.partition}@{o.offset} of {tpo} has key {o.key!r}, its input {key_of[tpo]!r}")
    missing = 0
    for tpo in key_of:
        lacking = set(range(per_input)) - have.get(tpo, set())
        if lacking:
            missing += 1
            add(f"input {tpo[0]}/{tpo[1]}@{tpo[2]} lacks outputs {sorted(lacking)}")
    # 2. per key, per pid, per output partition: input offsets never go back
    backwards = 0
    if ordered:
        last: dict[tuple[int, bytes | None, int, str, int], tuple[int, int]] = {}
        for o in outs:
            unit = (o.partition, o.key, 0 if exactly_once else o.pid, o.topic, o.in_partition)
            prev = last.get(unit)
            if prev is not None and o.in_offset < prev[0]:
                backwards += 1
                add(f"key {o.key!r} (pid {o.pid}): output {o.partition}@{o.offset} of input offset "
                    f"{o.in_offset} after output {o.partition}@{prev[1]} of input offset {prev[0]}")
            if prev is None or o.in_offset >= prev[0]:
                last[unit] = (o.in_offset, o.offset)
    duplicates = len(outs) - sum(len(v) for v in have.values())
    # 3. exactly once
    if exactly_once and duplicates:
        seen: set[tuple[str, int, int, int]] = set()
        for o in outs:
            ident = (o.topic, o.in_partition, o.in_offset, o.out_index)
            if ident in seen:
                add(f"output {o.out_index} of input {o.topic}/{o.in_partition}@{o.in_offset} appears again "
                    f"at {o.partition}@{o.offset} (pid {o.pid})")
            seen.add(ident)
    counts = {"inputs": len(key_of), "outputs": len(outs), "missing": missing, "backwards": backwards,
              "duplicates": duplicates}
    return CheckResult("outputs", n_viol == 0, counts, violations)
