"""Shared parts of the engine benchmark: the sizes, the run context and the row runners.

Every row runs in a child process (:func:`measure`); a row that fails returns its reason
(:func:`_try`) instead of costing the other rows. Does I/O: starts child processes and produces topics.
"""

from __future__ import annotations

import sys
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from benchmarks._children import ChildError, run_json_child
from benchmarks._common import Report, Table, log
from benchmarks._data import ProducedTopic, produce_zipf, zipf_top_share
from benchmarks.baselines.quix import run_quix

VALUE_BYTES = 100
N_KEYS = 10_000
ZIPF_S = 1.0
BASE_MS = 10.0
SLOW_MS = 200.0
SLOW_FRACTION = 0.01
HOL_IN_FLIGHT = 256
KEY_MODE_F = 256
SEED = 1
MAX_MULTILANE_FAILURES = 3


@dataclass(frozen=True)
class Sizes:
    """Record counts of one run (full or ``--quick``); each is about 2-10 s of work at full speed."""

    noop_records: int
    io_records: dict[int, int]  # in flight -> records
    quix_sleep_records: int  # quixstreams with 10 ms sleeps runs at ~96 rec/s
    key_io_records: int  # key mode is capped by the hot keys (~1k rec/s at F=256)
    hol_records: int
    hol_naive_records: int  # the naive loop runs at ~6% efficiency here: a prefix is enough
    replay_records: int
    replay_kill_after: int  # kill -9 once this many records have ended
    sync_noop_row: bool = True  # also measure multilane with a sync (thread-pool) no-op
    key_noop_rows: bool = True  # scenario 3 also compares the modes with the no-op processor
    naive_at: tuple[int, ...] = field(default=(16, 64, 256, 1024))


FULL = Sizes(
    noop_records=1_000_000,
    io_records={16: 8_000, 64: 32_000, 256: 100_000, 1024: 200_000},
    quix_sleep_records=300,
    key_io_records=20_000,
    hol_records=100_000,
    hol_naive_records=10_000,
    replay_records=20_000,
    replay_kill_after=8_000,
)
QUICK = Sizes(
    noop_records=100_000,
    io_records={16: 2_000, 256: 10_000, 1024: 20_000},
    quix_sleep_records=50,
    key_io_records=2_000,
    hol_records=10_000,
    hol_naive_records=2_000,
    replay_records=3_000,
    replay_kill_after=1_500,
    sync_noop_row=False,
    key_noop_rows=False,
    naive_at=(256,),
)


# ------------------------------------------------------------------------------------------ rows


@dataclass
class Ctx:
    """What every scenario needs: the broker, the report, the sizes, the repeat count."""

    broker: Any  # multilane.testing.broker.EmbeddedBroker
    report: Report
    sizes: Sizes
    repeat: int
    multilane_missing: str | None  # None when the engine is usable, else why not
    topics: dict[int, ProducedTopic] = field(default_factory=dict)
    multilane_failures: int = 0  # multilane rows failed in a row

    def topic(self, records: int) -> ProducedTopic:
        """A one-partition topic holding exactly ``records`` records, produced on first use.

        Every multilane row reads a topic that holds exactly its records, so a run ends when the
        backlog is drained and no record beyond the measured ones competes for lanes. Every topic has
        the same key sequence (same seed): a shorter topic is a prefix of a longer one.
        """
        if records not in self.topics:
            name = f"bench-{records}-{uuid.uuid4().hex[:6]}"
            self.broker.create_topic(name, 1)
            produced = produce_zipf(self.bootstrap, name, records, VALUE_BYTES, N_KEYS, ZIPF_S, seed=SEED)
            log(
                f"produced {produced.records:,} records to {name} in {produced.seconds:.1f}s "
                f"with {produced.generator}"
            )
            self.report.params["producer"] = produced.generator
            self.topics[records] = produced
        return self.topics[records]

    @property
    def bootstrap(self) -> str:
        return str(self.broker.bootstrap)

    def group(self, label: str) -> str:
        return f"bench-{label}-{uuid.uuid4().hex[:6]}"


def _best(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The fastest of repeated runs (interference from other processes only ever slows a run down)."""
    return max(runs, key=lambda r: float(r["rate"]))


def measure(ctx: Ctx, label: str, argv: list[str], timeout: float) -> dict[str, Any]:
    """Run a measurement child ``ctx.repeat`` times (fresh group each time); the best result."""
    runs = []
    for i in range(ctx.repeat):
        full = [a.replace("{group}", ctx.group(label)) for a in argv]
        t0 = time.monotonic()
        result = run_json_child(full, timeout=timeout)
        log(f"  {label} [{i + 1}/{ctx.repeat}]: {result['rate']:,.0f} rec/s ({time.monotonic() - t0:.1f}s)")
        runs.append(result)
    return _best(runs)


def _consumer_args(ctx: Ctx, topic: str, records: int) -> list[str]:
    return ["--bootstrap", ctx.bootstrap, "--topic", topic, "--group", "{group}", "--records", str(records)]


def raw_loop(ctx: Ctx, topic: str, records: int) -> dict[str, Any]:
    argv = [sys.executable, "-m", "benchmarks.baselines.raw_loop", *_consumer_args(ctx, topic, records)]
    return measure(ctx, "raw", argv, timeout=120)


def naive_batch(ctx: Ctx, topic: str, records: int, in_flight: int, slow: bool = False) -> dict[str, Any]:
    argv = [
        sys.executable, "-m", "benchmarks.baselines.naive_batch", *_consumer_args(ctx, topic, records),
        "--concurrency", str(in_flight), "--base-ms", str(BASE_MS), *_slow_args(slow),
    ]  # fmt: skip
    return measure(ctx, f"naive-{in_flight}", argv, timeout=300)


def bare_asyncio(ctx: Ctx, records: int, in_flight: int, slow: bool = False) -> dict[str, Any]:
    argv = [
        sys.executable, "-m", "benchmarks.baselines.bare_asyncio", "--records", str(records),
        "--concurrency", str(in_flight), "--base-ms", str(BASE_MS), *_slow_args(slow),
    ]  # fmt: skip
    return measure(ctx, f"bare-{in_flight}", argv, timeout=300)


def quix(ctx: Ctx, topic: str, records: int, sleep_ms: float = 0.0) -> dict[str, Any]:
    runs = []
    for _ in range(ctx.repeat):
        result = run_quix(ctx.bootstrap, topic, ctx.group("quix"), records, sleep_ms=sleep_ms, timeout=300)
        log(f"  quix sleep={sleep_ms}: {result['rate']:,.0f} rec/s")
        runs.append(result)
    return _best(runs)


def multilane(
    ctx: Ctx,
    topic: str,
    records: int,
    ordering: str,
    factor: int,
    processor: str,
    slow: bool = False,
) -> dict[str, Any]:
    """multilane's engine through its Python API in a child process (``benchmarks.engine_child``).

    The child gives up after ten times a healthy run's rough duration plus 60 s; after
    :data:`MAX_MULTILANE_FAILURES` failed rows in a row the engine is declared unavailable, so a
    broken engine costs minutes, not hours.
    """
    if ctx.multilane_missing:
        raise ChildError(ctx.multilane_missing)
    timeout = 60 + 10 * healthy_duration_s(records, ordering, factor, processor, slow)
    argv = [
        sys.executable, "-m", "benchmarks.engine_child", "run", *_consumer_args(ctx, topic, records),
        "--ordering", ordering, "--factor", str(factor), "--processor", processor,
        "--base-ms", str(BASE_MS), *_slow_args(slow), "--timeout", f"{timeout:.0f}",
    ]  # fmt: skip
    try:
        result = measure(ctx, f"multilane-{ordering}-{factor}-{processor}", argv, timeout=timeout + 60)
    except ChildError as exc:
        ctx.multilane_failures += 1
        if ctx.multilane_failures >= MAX_MULTILANE_FAILURES:
            ctx.multilane_missing = f"{ctx.multilane_failures} rows failed in a row; last: {exc}"[:300]
            ctx.report.note(f"multilane: not available ({ctx.multilane_missing})")
        raise
    ctx.multilane_failures = 0
    return result


def healthy_duration_s(records: int, ordering: str, factor: int, processor: str, slow: bool) -> float:
    """A rough duration of a healthy run, for timeouts: no-op at quixstreams' rate, or the sleeps at full
    concurrency; in key mode the hot key's records run one at a time (top key share x records x latency).
    """
    if processor != "async-sleep":
        return records / 100_000
    latency = (SLOW_FRACTION * SLOW_MS + (1 - SLOW_FRACTION) * BASE_MS) / 1000 if slow else BASE_MS / 1000
    bound = records * latency / factor
    if ordering == "key":
        bound = max(bound, zipf_top_share(N_KEYS, ZIPF_S) * records * BASE_MS / 1000)
    return bound


def _slow_args(slow: bool) -> list[str]:
    return ["--slow-ms", str(SLOW_MS), "--slow-fraction", str(SLOW_FRACTION)] if slow else []


def try_row(table: Table, fn: Any, *args: Any, **kwargs: Any) -> dict[str, Any] | str:
    """Call a row function; on failure return the reason (the caller adds a 'not available' row).

    A row is the unit of failure: whatever goes wrong in one (a child that crashed, timed out or
    printed nonsense, a venv that would not install) must not cost the other rows.
    """
    try:
        return dict(fn(*args, **kwargs))
    except Exception as exc:
        reason = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else type(exc).__name__
        log(f"  {table.name}: row failed: {reason}")
        return reason
