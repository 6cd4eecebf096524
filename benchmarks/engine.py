"""Engine benchmark: multilane's worker engine against a raw loop, quixstreams and naive loops.

``python -m benchmarks.engine [--quick] [--json] [--repeat N]``

One embedded broker per run; one partition; 100-byte records with keys Zipf(s=1) over 10,000 keys.
Every row runs in its own child process (a fresh interpreter); rates run from the first record to the
last, so start-up and group joins are not counted. Scenarios:

1. No-op processor: multilane vs quixstreams vs a raw ``consume()`` loop (the ceiling).
2. IO-bound processor (``await asyncio.sleep(0.010)``) at 16/64/256/1024 in flight: efficiency =
   rec/s / (in_flight / 0.010), beside quixstreams (one at a time), a bare asyncio loop (no Kafka) and
   the naive "consume a batch, gather, commit" loop.
3. Key mode vs unordered on the same Zipf keys (IO-bound at F=256, and no-op), with the theoretical
   cap that hot keys put on key mode.
4. Head-of-line blocking: 1% of records take 200 ms instead of 10 ms, 256 in flight.
5. Records replayed after ``kill -9`` while completions continue: multilane with progress every 50 ms,
   with progress only at commits, and a watermark-only commit; the bound (in flight + completed in the
   last progress interval) and what the progress records cost.

See ``docs/benchmarks.md`` for how to read the tables and for the goals.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from benchmarks._common import (
    ChildError,
    Column,
    ProducedTopic,
    Report,
    Table,
    broker_session,
    log,
    main,
    produce_zipf,
    ratio,
    run_json_child,
    zipf_top_share,
)
from benchmarks.baselines.quix import run_quix
from benchmarks.baselines.workload import latency_s, mean_latency_s

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
    """multilane's engine through its Python API in a child process (see :func:`child_main`).

    The child gives up after ten times a healthy run's rough duration plus 60 s; after
    :data:`MAX_MULTILANE_FAILURES` failed rows in a row the engine is declared unavailable, so a
    broken engine costs minutes, not hours.
    """
    if ctx.multilane_missing:
        raise ChildError(ctx.multilane_missing)
    timeout = 60 + 10 * healthy_duration_s(records, ordering, factor, processor, slow)
    argv = [
        sys.executable, "-m", "benchmarks.engine", "_child", *_consumer_args(ctx, topic, records),
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


def _try(table: Table, fn: Any, *args: Any, **kwargs: Any) -> dict[str, Any] | str:
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


# ------------------------------------------------------------------------------------------ scenarios


def scenario_noop(ctx: Ctx) -> None:
    """1. No-op processor: multilane vs quixstreams vs the raw loop."""
    n = ctx.sizes.noop_records
    log(f"scenario 1: no-op, {n:,} records")
    data = ctx.topic(n)
    table = ctx.report.table(
        "noop",
        f"1. No-op processor, {n:,} records, one partition",
        [
            Column("system"),
            Column("setting"),
            Column("rate", "rec/s", ",.0f"),
            Column("cpu_us", "CPU µs/rec", ".2f"),
            Column("vs_quix", "÷ quixstreams", ".2f"),
            Column("vs_raw", "÷ raw loop", ".2f"),
            Column("note"),
        ],
    )
    raw = _try(table, raw_loop, ctx, data.topic, n)
    qx = _try(table, quix, ctx, data.topic, n)
    rows: list[tuple[str, str, dict[str, Any] | str]] = [
        ("raw confluent-kafka loop", "consume(1000), fetch.queue.backoff.ms=10", raw),
        ("quixstreams 3.28.1", "sdf.update(no-op), own venv", qx),
    ]
    ml = _try(table, multilane, ctx, data.topic, n, "unordered", KEY_MODE_F, "async-noop")
    rows.append(("multilane", f"unordered F={KEY_MODE_F}, async no-op", ml))
    if ctx.sizes.sync_noop_row:
        ml_sync = _try(table, multilane, ctx, data.topic, n, "unordered", KEY_MODE_F, "sync-noop")
        rows.append(("multilane", f"unordered F={KEY_MODE_F}, sync no-op (thread pool)", ml_sync))
    raw_rate = raw.get("rate") if isinstance(raw, dict) else None
    quix_rate = qx.get("rate") if isinstance(qx, dict) else None
    for system, setting, res in rows:
        if isinstance(res, str):
            table.add_unavailable(res, system=system, setting=setting)
            continue
        table.add(
            system=system,
            setting=setting,
            rate=res["rate"],
            cpu_us=res["cpu_us_per_record"],
            vs_quix=ratio(res["rate"], quix_rate),
            vs_raw=ratio(res["rate"], raw_rate),
        )
    ml_rate = ml.get("rate") if isinstance(ml, dict) else None
    ctx.report.goal("1. multilane no-op ÷ quixstreams no-op", ratio(ml_rate, quix_rate), 2.0)


def scenario_io(ctx: Ctx) -> None:
    """2. IO-bound processor at several in-flight counts."""
    log("scenario 2: IO-bound")
    table = ctx.report.table(
        "io",
        f"2. IO-bound processor (sleep {BASE_MS:g} ms per record), efficiency = rec/s ÷ (in flight ÷ "
        f"{BASE_MS / 1000:g} s)",
        [
            Column("in_flight", "in flight"),
            Column("system"),
            Column("records", "records", ","),
            Column("rate", "rec/s", ",.0f"),
            Column("efficiency", "efficiency", ".2f"),
            Column("vs_bare", "÷ bare asyncio", ".2f"),
            Column("cpu_us", "CPU µs/rec", ".1f"),
            Column("peak", "peak running", ","),
            Column("note"),
        ],
    )
    # quixstreams processes one record at a time: in flight = 1
    n_quix = ctx.sizes.quix_sleep_records
    qx = _try(table, quix, ctx, ctx.topic(n_quix).topic, n_quix, sleep_ms=BASE_MS)
    if isinstance(qx, str):
        table.add_unavailable(qx, in_flight=1, system="quixstreams (time.sleep)", records=n_quix)
    else:
        table.add(
            in_flight=1, system="quixstreams (time.sleep)", records=n_quix, rate=qx["rate"],
            efficiency=qx["rate"] / (1 / (BASE_MS / 1000)), cpu_us=qx["cpu_us_per_record"],
            note="sync processor: one record at a time",
        )  # fmt: skip
    for in_flight, n in sorted(ctx.sizes.io_records.items()):
        ideal = in_flight / (BASE_MS / 1000)
        data = ctx.topic(n)
        bare = _try(table, bare_asyncio, ctx, n, in_flight)
        results: list[tuple[str, dict[str, Any] | str, str]] = [
            ("bare asyncio (no Kafka)", bare, "the event loop's ceiling"),
        ]
        if in_flight in ctx.sizes.naive_at:
            results.append(("naive batch loop", _try(table, naive_batch, ctx, data.topic, n, in_flight), ""))
        ml = _try(table, multilane, ctx, data.topic, n, "unordered", in_flight, "async-sleep")
        results.append((f"multilane unordered F={in_flight}", ml, ""))
        bare_rate = bare.get("rate") if isinstance(bare, dict) else None
        for system, res, note in results:
            if isinstance(res, str):
                table.add_unavailable(res, in_flight=in_flight, system=system, records=n)
                continue
            table.add(
                in_flight=in_flight, system=system, records=n, rate=res["rate"],
                efficiency=res["rate"] / ideal, vs_bare=ratio(res["rate"], bare_rate),
                cpu_us=res["cpu_us_per_record"], peak=res.get("peak_running"), note=note,
            )  # fmt: skip
        ml_rate = ml.get("rate") if isinstance(ml, dict) else None
        if in_flight <= 256:
            ctx.report.goal(f"2. multilane efficiency at {in_flight} in flight", ratio(ml_rate, ideal), 0.9)
        else:
            ctx.report.goal(
                f"2. multilane ÷ bare asyncio at {in_flight} in flight", ratio(ml_rate, bare_rate), 0.8
            )


def lane_cap(keys: Sequence[bytes], factor: int, latency_s: float) -> tuple[float, float]:
    """Key mode's throughput cap from the actual keys: (busiest lane's share, cap in rec/s).

    A lane runs one record at a time, so the run takes at least (records in the busiest lane) x
    latency; the cap is records ÷ that time.
    """
    from multilane.worker.keyranges import KeyRangeMap, key_hash

    lanes = KeyRangeMap.even(factor)
    counts: dict[int, int] = {}
    lane_of_key: dict[bytes, int] = {}
    for key in keys:
        lane = lane_of_key.get(key)
        if lane is None:
            lane = lane_of_key[key] = lanes.lane_of(key_hash(key))
        counts[lane] = counts.get(lane, 0) + 1
    busiest = max(counts.values())
    share = busiest / len(keys)
    return share, len(keys) / (busiest * latency_s)


def scenario_key_mode(ctx: Ctx) -> None:
    """3. Key mode vs unordered on the same Zipf keys."""
    log("scenario 3: key mode vs unordered")
    top = zipf_top_share(N_KEYS, ZIPF_S)
    table = ctx.report.table(
        "key_mode",
        f"3. Key mode vs unordered, F={KEY_MODE_F}, Zipf s={ZIPF_S:g} over {N_KEYS:,} keys "
        f"(top key share {top:.1%})",
        [
            Column("processor"),
            Column("mode"),
            Column("records", "records", ","),
            Column("rate", "rec/s", ",.0f"),
            Column("key_vs_unordered", "key ÷ unordered", ".2f"),
            Column("cap_top_key", "cap: top key", ",.0f"),
            Column("cap_lane", "cap: busiest lane", ",.0f"),
            Column("of_cap", "÷ lane cap", ".2f"),
            Column("note"),
        ],
    )
    lat = BASE_MS / 1000
    cases: list[tuple[str, int, str, float | None]] = [
        (f"sleep {BASE_MS:g} ms", ctx.sizes.key_io_records, "async-sleep", lat)
    ]
    if ctx.sizes.key_noop_rows:
        cases.insert(0, ("no-op (async)", ctx.sizes.noop_records, "async-noop", None))
    for label, n, processor, latency in cases:
        data = ctx.topic(n)
        keys = data.keys
        share, cap = lane_cap(keys, KEY_MODE_F, latency) if latency else (None, None)
        top_actual = max(Counter(keys).values()) / len(keys)
        top_cap = 1 / (top_actual * latency) if latency else None
        res = {
            mode: _try(table, multilane, ctx, data.topic, n, mode, KEY_MODE_F, processor)
            for mode in ("unordered", "key")
        }
        unordered_rate = res["unordered"].get("rate") if isinstance(res["unordered"], dict) else None
        for mode, r in res.items():
            if isinstance(r, str):
                table.add_unavailable(r, processor=label, mode=mode, records=n)
                continue
            is_key = mode == "key"
            table.add(
                processor=label, mode=mode, records=n, rate=r["rate"],
                key_vs_unordered=ratio(r["rate"], unordered_rate) if is_key else None,
                cap_top_key=top_cap if is_key else None, cap_lane=cap if is_key else None,
                of_cap=ratio(r["rate"], cap) if is_key else None,
                note=(f"top key {top_actual:.1%}, busiest lane {share:.1%} of the records"
                      if is_key and share else ""),
            )  # fmt: skip
    ctx.report.note(
        f"Key-mode caps: a key's records run one at a time, so with {BASE_MS:g} ms per record the top key "
        f"caps key mode at 1 / (its share x {lat:g} s) (share {top:.1%} in theory at s={ZIPF_S:g}, "
        f"{1 / (top * lat):,.0f} rec/s; the table uses the share in the actual records); the busiest lane "
        f"(several keys hash to one lane of F={KEY_MODE_F}) caps it lower still."
    )


def naive_efficiency_bound(first_offset: int, records: int, batch: int, mean_s: float) -> float:
    """The naive loop's best efficiency: each batch takes its slowest record's latency.

    ``records`` ÷ sum over consecutive batches of max(latency), relative to ``batch`` ÷ ``mean_s``.
    """
    total = 0.0
    for start in range(first_offset, first_offset + records, batch):
        end = min(start + batch, first_offset + records)
        total += max(latency_s(o, BASE_MS / 1000, SLOW_MS / 1000, SLOW_FRACTION) for o in range(start, end))
    return (records / total) / (batch / mean_s)


def scenario_hol(ctx: Ctx) -> None:
    """4. Head-of-line blocking: 1% of records take 200 ms."""
    n, n_naive = ctx.sizes.hol_records, ctx.sizes.hol_naive_records
    log(f"scenario 4: head-of-line blocking, {n:,} records")
    data = ctx.topic(n)
    mean = mean_latency_s(data.first_offset, n, BASE_MS / 1000, SLOW_MS / 1000, SLOW_FRACTION)
    ideal = HOL_IN_FLIGHT / mean
    table = ctx.report.table(
        "hol",
        f"4. Head-of-line blocking: {SLOW_FRACTION:.0%} of records take {SLOW_MS:g} ms instead of "
        f"{BASE_MS:g} ms, {HOL_IN_FLIGHT} in flight; mean latency {mean * 1000:.2f} ms; efficiency = "
        f"rec/s ÷ ({HOL_IN_FLIGHT} ÷ mean latency)",
        [
            Column("system"),
            Column("records", "records", ","),
            Column("rate", "rec/s", ",.0f"),
            Column("efficiency", "efficiency", ".2f"),
            Column("vs_bare", "÷ bare asyncio", ".2f"),
            Column("note"),
        ],
    )
    bare = _try(table, bare_asyncio, ctx, n, HOL_IN_FLIGHT, slow=True)
    naive = _try(table, naive_batch, ctx, data.topic, n_naive, HOL_IN_FLIGHT, slow=True)
    ml = _try(table, multilane, ctx, data.topic, n, "unordered", HOL_IN_FLIGHT, "async-sleep", slow=True)
    bare_rate = bare.get("rate") if isinstance(bare, dict) else None
    mean_naive = mean_latency_s(data.first_offset, n_naive, BASE_MS / 1000, SLOW_MS / 1000, SLOW_FRACTION)
    naive_bound = naive_efficiency_bound(data.first_offset, n_naive, HOL_IN_FLIGHT, mean_naive)
    for system, res, records, note in [
        ("bare asyncio (no Kafka)", bare, n, ""),
        (f"naive batch loop (batch {HOL_IN_FLIGHT})", naive, n_naive,
         f"a batch lasts as long as its slowest record: at best {naive_bound:.2f}"),
        (f"multilane unordered F={HOL_IN_FLIGHT}", ml, n, ""),
    ]:  # fmt: skip
        if isinstance(res, str):
            table.add_unavailable(res, system=system, records=records)
            continue
        row_mean = mean if records == n else mean_naive  # each row against its own records' latencies
        table.add(
            system=system, records=records, rate=res["rate"],
            efficiency=res["rate"] / (HOL_IN_FLIGHT / row_mean), vs_bare=ratio(res["rate"], bare_rate),
            note=note,
        )  # fmt: skip
    ml_rate = ml.get("rate") if isinstance(ml, dict) else None
    ctx.report.goal("4. multilane efficiency with 1% slow records", ratio(ml_rate, ideal), 0.85)


REPLAY_F = 16
REPLAY_COMMIT_MS = 1000  # the worker's default
REPLAY_PROGRESS_MS = 50  # the worker's default
REPLAY_HUNG_KEYS = 3


@dataclass
class ReplayOutcome:
    """One kill -9 / restart cycle, counted from the test processors' event log."""

    ended_before_kill: int  # records with an ``end`` event from the killed worker
    in_flight_at_kill: int  # started by the killed worker, not ended (must run again)
    committed_at_kill: int | None  # the group's committed offset right after the kill
    replayed: int  # records that ended before the kill and started again after the restart
    derived_watermark_replays: int | None  # ended before the kill at or above the committed offset
    completed_last_interval: int  # ended by the killed worker in the last progress interval before the kill
    oldest_replayed_ms: float | None  # how long before the kill the earliest replayed record ended
    progress_records: int  # progress records the killed worker wrote (progress topic, by timestamp)
    progress_bytes: int  # their value bytes
    progress_s: float  # the killed worker's first progress record to the kill


def _hung_keys(data: ProducedTopic, kill_after: int, count: int) -> list[bytes]:
    """Keys that occur once in the topic, at offsets spread over the first tenth of the kill point."""
    occurrences: dict[bytes, int] = {}
    for key in data.keys:
        occurrences[key] = occurrences.get(key, 0) + 1
    chosen: list[bytes] = []
    for target in range(count):
        start = max(1, (target + 1) * kill_after // (10 * count))
        for i in range(start, len(data.keys)):
            key = data.keys[i]
            if occurrences[key] == 1 and key not in chosen:
                chosen.append(key)
                break
    return chosen


def _worker_argv(
    ctx: Ctx, topic: str, group: str, extra: Sequence[str], launcher: Sequence[str]
) -> list[str]:
    return [
        *launcher, "--bootstrap-servers", ctx.bootstrap,
        "--group", group, "--processor", "multilane.testing.processors:logging_async",
        "--assign", f"{topic}:0", "--ordering", "unordered", "--factor", str(REPLAY_F),
        "--commit-interval-ms", str(REPLAY_COMMIT_MS), *extra,
    ]  # fmt: skip


def _progress_written(ctx: Ctx, group: str, since: float, until: float) -> tuple[int, int, float | None]:
    """Records and value bytes in the group's progress topic with timestamps in ``[since, until]``, and
    the first such timestamp."""
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    topic = f"multilane-progress.{group}"
    consumer = Consumer({"bootstrap.servers": ctx.bootstrap, "group.id": f"{group}.bench-reader",
                         "enable.auto.commit": False, "enable.partition.eof": True})
    n = nbytes = 0
    first: float | None = None
    try:
        md = consumer.list_topics(topic, timeout=10).topics.get(topic)
        if md is None or md.error is not None:
            return 0, 0, None
        parts = list(md.partitions)
        consumer.assign([TopicPartition(topic, p, 0) for p in parts])
        at_end: set[int] = set()
        deadline = time.monotonic() + 60
        while len(at_end) < len(parts) and time.monotonic() < deadline:
            for m in consumer.consume(1000, timeout=0.5):
                err = m.error()
                if err is not None:
                    part = m.partition()
                    if err.code() == KafkaError._PARTITION_EOF and part is not None:
                        at_end.add(part)
                    continue
                ts = m.timestamp()[1] / 1000.0
                if since <= ts <= until:
                    first = ts if first is None else min(first, ts)
                    n += 1
                    nbytes += len(m.value() or b"")
    finally:
        consumer.close()
    return n, nbytes, first


def _committed_offset(ctx: Ctx, group: str, topic: str) -> int | None:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": ctx.bootstrap, "group.id": group})
    try:
        tp = consumer.committed([TopicPartition(topic, 0)], timeout=10)[0]
        return int(tp.offset) if tp.offset >= 0 else None
    finally:
        consumer.close()


class EventTail:
    """Reads an event log incrementally (only complete new lines), keeping what the replay count needs."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._pos = 0
        self._partial = ""
        self.ended_by_pid: dict[int, int] = {}
        self.ended: set[int] = set()

    def poll(self) -> None:
        from multilane.testing.processors import parse_event_line

        if not os.path.exists(self.path):
            return
        with open(self.path, encoding="ascii") as f:
            f.seek(self._pos)
            chunk = f.read()
            self._pos = f.tell()
        lines = (self._partial + chunk).split("\n")
        self._partial = lines.pop()  # an incomplete last line waits for the next poll
        for line in lines:
            if line:
                e = parse_event_line(line)
                if e.kind == "end":
                    self.ended_by_pid[e.pid] = self.ended_by_pid.get(e.pid, 0) + 1
                    self.ended.add(e.offset)


def _wait_for_ends(
    tail: EventTail, proc: subprocess.Popen[bytes], done: Callable[[EventTail], bool], timeout: float
) -> None:
    """Poll the event log until ``done(tail)``; fail when the worker exits or the deadline passes."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise ChildError(f"worker exited with code {proc.returncode} (see its stderr log)")
        tail.poll()
        if done(tail):
            return
        time.sleep(0.02)
    raise ChildError(f"worker {proc.pid}: records did not end within {timeout:.0f}s")


WORKER = (sys.executable, "-m", "multilane", "worker")
PROGRESS_IGNORING_WORKER = (sys.executable, "-m", "benchmarks.engine", "_worker_ignoring_progress")


def replay_cycle(
    ctx: Ctx, data: ProducedTopic, label: str, extra_args: Sequence[str], launcher: Sequence[str] = WORKER
) -> ReplayOutcome:
    """Run a worker, kill -9 it after N ended records (hung records in flight), restart, count replays.

    1. Start worker A with the hang keys configured; wait until it logged N ``end`` events (records
       keep completing: the kill does not wait for a pause).
    2. SIGKILL it by PID; append a kill marker; read the group's committed offset.
    3. Create the hang release file; start worker B; wait until every produced offset has ended.
    4. SIGKILL worker B (everything is counted from the event log already); count records ended by
       A that B started again, records A ended in the last progress interval before the kill (event
       times), and the progress records A wrote (progress topic, by timestamp).
    """
    from multilane.testing.processors import append_kill_marker, read_event_log

    n, kill_after = data.records, ctx.sizes.replay_kill_after
    workdir = tempfile.mkdtemp(prefix=f"bench-replay-{label}-")
    log_path = os.path.join(workdir, "events.log")
    release = os.path.join(workdir, "release")
    group = ctx.group(f"replay-{label}")
    env = {
        **os.environ,
        "MULTILANE_TEST_LOG": log_path,
        "MULTILANE_TEST_SLEEP_MS": str(BASE_MS),
        "MULTILANE_TEST_HANG_KEY": ",".join(
            "hex:" + k.hex() for k in _hung_keys(data, kill_after, REPLAY_HUNG_KEYS)
        ),
        "MULTILANE_TEST_HANG_RELEASE_FILE": release,
    }
    argv = _worker_argv(ctx, data.topic, group, extra_args, launcher)
    procs: list[subprocess.Popen[bytes]] = []

    def start(name: str) -> subprocess.Popen[bytes]:
        err = open(os.path.join(workdir, f"worker-{name}.stderr"), "wb")  # noqa: SIM115 - child owns it
        proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=err)
        err.close()
        procs.append(proc)
        return proc

    try:
        # 1.
        tail = EventTail(log_path)
        a = start("a")
        _wait_for_ends(tail, a, lambda t: t.ended_by_pid.get(a.pid, 0) >= kill_after, timeout=120)
        # 2.
        killed_at = time.time()
        os.kill(a.pid, signal.SIGKILL)
        a.wait(10)
        append_kill_marker(log_path, a.pid)
        committed = _committed_offset(ctx, group, data.topic)
        # 3.
        open(release, "w").close()
        b = start("b")
        _wait_for_ends(tail, b, lambda t: len(t.ended) >= n, timeout=300)
        # 4.
        b.kill()
        b.wait(10)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
    events = read_event_log(log_path)
    ends_a = {e.offset: e.time for e in events if e.pid == a.pid and e.kind == "end"}
    started_a = {e.offset for e in events if e.pid == a.pid and e.kind == "start"}
    started_b = {e.offset for e in events if e.pid == b.pid and e.kind == "start"}
    a_times = [e.time for e in events if e.pid == a.pid and e.kind in ("start", "end")]
    kill_instant = max([killed_at, *a_times])
    replayed = set(ends_a) & started_b
    window = REPLAY_PROGRESS_MS / 1000
    progress_records, progress_bytes, first_progress = _progress_written(ctx, group, min(a_times),
                                                                         kill_instant)
    return ReplayOutcome(
        ended_before_kill=len(ends_a),
        in_flight_at_kill=len(started_a - set(ends_a)),
        committed_at_kill=committed,
        replayed=len(replayed),
        derived_watermark_replays=None if committed is None else sum(1 for o in ends_a if o >= committed),
        completed_last_interval=sum(1 for t in ends_a.values() if t > kill_instant - window),
        oldest_replayed_ms=max((kill_instant - ends_a[o]) * 1000 for o in replayed) if replayed else None,
        progress_records=progress_records,
        progress_bytes=progress_bytes,
        progress_s=kill_instant - (first_progress if first_progress is not None else kill_instant),
    )


def progress_flag_missing() -> tuple[list[str], str | None]:
    """The worker's flag that disables progress persistence, or why there is none."""
    try:
        out = subprocess.run(
            [sys.executable, "-m", "multilane", "worker", "--help"],
            capture_output=True,
            text=True,
            timeout=60,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return [], f"multilane worker --help failed: {exc}"
    if out.returncode != 0:
        return [], f"multilane worker --help exited {out.returncode}: {_short(out.stderr)}"
    for flag in ("--no-progress", "--watermark-only", "--no-progress-persistence"):
        if flag in out.stdout:
            return [flag], None
    return [], "the worker has no flag to disable progress persistence (looked for --no-progress)"


def _short(text: str) -> str:
    lines = text.strip().splitlines()
    return lines[-1][:200] if lines else "(no output)"


def _replay_row(table: Table, system: str, o: ReplayOutcome, base: int | None, **extra: Any) -> None:
    bound = o.in_flight_at_kill + o.completed_last_interval
    table.add(
        system=system, ended=o.ended_before_kill, in_flight=o.in_flight_at_kill,
        committed=o.committed_at_kill, completed_last=o.completed_last_interval,
        bound=bound, replayed=o.replayed,
        holds=o.replayed + o.in_flight_at_kill <= bound, oldest_ms=o.oldest_replayed_ms,
        progress_rps=o.progress_records / o.progress_s if o.progress_s > 0 else None,
        progress_bps=o.progress_bytes / o.progress_s if o.progress_s > 0 else None,
        vs_progress=ratio(o.replayed, base), **extra,
    )  # fmt: skip


def scenario_replay(ctx: Ctx) -> None:
    """5. Records replayed after kill -9 while completions continue: progress every 50 ms, progress
    only at commits, watermark-only; the bound and the cost of the progress records."""
    n, kill_after = ctx.sizes.replay_records, ctx.sizes.replay_kill_after
    log(f"scenario 5: replay after kill -9, {n:,} records, kill after {kill_after:,}")
    table = ctx.report.table(
        "replay",
        f"5. Records replayed after kill -9 ({n:,} records, unordered F={REPLAY_F}, {BASE_MS:g} ms each, "
        f"{REPLAY_HUNG_KEYS} records hung until the restart, kill after {kill_after:,} ended while records "
        f"keep completing, commit interval {REPLAY_COMMIT_MS} ms); bound = in flight + completed in the "
        f"last progress interval ({REPLAY_PROGRESS_MS} ms)",
        [
            Column("system"),
            Column("ended", "ended before kill", ","),
            Column("in_flight", "in flight at kill", ","),
            Column("committed", "committed offset", ","),
            Column("completed_last", f"completed in the last {REPLAY_PROGRESS_MS} ms", ","),
            Column("bound", "bound", ","),
            Column("replayed", "replayed (ended, run again)", ","),
            Column("holds", "replayed + in flight <= bound"),
            Column("oldest_ms", "oldest replayed, ms before kill", ".0f"),
            Column("progress_rps", "progress records/s", ".1f"),
            Column("progress_bps", "progress bytes/s", ",.0f"),
            Column("vs_progress", "÷ with progress", ".1f"),
            Column("note"),
        ],
    )
    interval_name = f"multilane, progress every {REPLAY_PROGRESS_MS} ms"
    commits_name = "multilane, progress only at commits"
    if ctx.multilane_missing:
        for name in (interval_name, commits_name, "multilane watermark-only"):
            table.add_unavailable(ctx.multilane_missing, system=name)
        return
    data = ctx.topic(n)
    runs: dict[str, ReplayOutcome | str] = {}
    for name, interval in ((interval_name, REPLAY_PROGRESS_MS), (commits_name, 0)):
        try:
            runs[name] = replay_cycle(ctx, data, f"progress-{interval}",
                                      ["--progress-interval-ms", str(interval)])
        except (ChildError, OSError) as exc:
            runs[name] = str(exc)
    # the watermark-only worker: the worker's own flag when it has one, else the same worker with
    # progress ignored on restart (see worker_ignoring_progress)
    flag, flag_missing = progress_flag_missing()
    watermark: ReplayOutcome | str
    if flag_missing:
        ctx.report.note(
            f"Scenario 5: {flag_missing}; the watermark-only row runs the same worker with "
            "`Engine._load_progress` patched to return None (benchmarks.engine, "
            "`_worker_ignoring_progress`)."
        )
        watermark_name = "multilane, progress ignored on restart"
        launcher: Sequence[str] = PROGRESS_IGNORING_WORKER
    else:
        watermark_name = f"multilane {' '.join(flag)}"
        launcher = WORKER
    try:
        watermark = replay_cycle(ctx, data, "watermark", flag, launcher)
    except (ChildError, OSError) as exc:
        watermark = str(exc)
    main_run = runs[interval_name]
    base = main_run.replayed if isinstance(main_run, ReplayOutcome) else None
    for name, o in runs.items():
        if isinstance(o, ReplayOutcome):
            _replay_row(table, name, o, base)
        else:
            table.add_unavailable(o, system=name)
    if isinstance(main_run, ReplayOutcome):
        o = main_run
        if o.derived_watermark_replays is not None:
            table.add(
                system="watermark-only (derived)", ended=o.ended_before_kill, in_flight=o.in_flight_at_kill,
                committed=o.committed_at_kill,
                replayed=o.derived_watermark_replays, vs_progress=ratio(o.derived_watermark_replays, base),
                note=f"same run as '{interval_name}': records that ended before the kill at or above the "
                     "committed offset",
            )  # fmt: skip
        ctx.report.goal(
            "5. replayed ÷ completed in the last progress interval",
            ratio(o.replayed, o.completed_last_interval), 1.0, "<=",
        )
    if isinstance(watermark, ReplayOutcome):
        _replay_row(table, watermark_name, watermark, base)
    else:
        table.add_unavailable(watermark, system=watermark_name)


# ------------------------------------------------------------------------------------------ body


def engine_missing() -> str | None:
    """Why multilane's engine cannot be benchmarked, or None when its Python API is there."""
    try:
        from multilane.worker import engine as engine_module
    except Exception as exc:  # a half-written engine may raise anything on import
        return f"multilane.worker.engine does not import: {type(exc).__name__}: {exc}"
    if not hasattr(engine_module, "Engine"):
        return "multilane.worker.engine has no Engine"
    return None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--repeat", type=int, default=1, help="runs per row; the fastest is reported")
    parser.add_argument(
        "--only", default="", help="comma-separated scenario numbers to run (default: all), e.g. 1,2"
    )


def body(args: argparse.Namespace, report: Report) -> None:
    sizes = QUICK if args.quick else FULL
    only = {s.strip() for s in args.only.split(",") if s.strip()}
    report.params.update(
        partitions=1, value_bytes=VALUE_BYTES, keys=N_KEYS, zipf_s=ZIPF_S, repeat=args.repeat,
        noop_records=sizes.noop_records, compression="none",
    )  # fmt: skip
    missing = engine_missing()
    if missing:
        report.note(f"multilane: not available ({missing})")
    with broker_session() as broker:
        ctx = Ctx(broker, report, sizes, max(1, args.repeat), missing)
        scenarios = {
            "1": scenario_noop,
            "2": scenario_io,
            "3": scenario_key_mode,
            "4": scenario_hol,
            "5": scenario_replay,
        }
        for number, scenario in scenarios.items():
            if not only or number in only:
                t0 = time.monotonic()
                scenario(ctx)
                log(f"scenario {number} took {time.monotonic() - t0:.1f}s")


# ------------------------------------------------------------------------------------------ child


def child_main(argv: Sequence[str]) -> int:
    """``python -m benchmarks.engine _child ...``: one multilane measurement, JSON on the last line."""
    from benchmarks._common import emit_child_result

    parser = argparse.ArgumentParser(prog="python -m benchmarks.engine _child")
    from benchmarks.baselines.kafka import add_consumer_arguments

    add_consumer_arguments(parser)
    parser.add_argument("--ordering", choices=("key", "unordered", "partition"), required=True)
    parser.add_argument("--factor", type=int, required=True)
    parser.add_argument("--processor", choices=("async-noop", "sync-noop", "async-sleep"), required=True)
    parser.add_argument("--base-ms", type=float, default=BASE_MS)
    parser.add_argument("--slow-ms", type=float, default=0.0)
    parser.add_argument("--slow-fraction", type=float, default=0.0)
    args = parser.parse_args(argv)
    emit_child_result(run_multilane_child(args))
    return 0


@dataclass
class RunningCounter:
    """Records inside the processor right now, and the most ever (async processors: one thread)."""

    now: int = 0
    peak: int = 0


def make_processor(
    kind: str,
    base_ms: float,
    slow_ms: float,
    slow_fraction: float,
    on_done: Callable[[], None],
    running: RunningCounter,
) -> Any:
    """The measured processor: a no-op (async or sync) or the shared latency model, then ``on_done``."""
    import asyncio

    base, slow = base_ms / 1000, slow_ms / 1000

    async def async_noop(record: Any, ctx: Any) -> None:
        on_done()

    def sync_noop(record: Any, ctx: Any) -> None:
        on_done()

    async def async_sleep(record: Any, ctx: Any) -> None:
        running.now += 1
        running.peak = max(running.peak, running.now)
        await asyncio.sleep(latency_s(record.offset, base, slow, slow_fraction))
        running.now -= 1
        on_done()

    return {"async-noop": async_noop, "sync-noop": sync_noop, "async-sleep": async_sleep}[kind]


def run_multilane_child(args: argparse.Namespace) -> dict[str, Any]:
    """Run multilane's engine (operator mode: ``assign()``, no group join) until N records completed.

    1. Build the engine through its Python API with the processor wrapped in a completion counter.
    2. Start it; the meter starts at the first completion and stops at the N-th.
    3. Stop the engine (drain, final commit) after the measurement; that is not timed.
    """
    import asyncio
    import threading

    from benchmarks._common import Meter
    from multilane.api import OrderingMode
    from multilane.worker.config import EngineConfig
    from multilane.worker.engine import Engine

    meter = Meter()
    lock = threading.Lock()  # sync processors complete on the engine's thread pool
    done = 0
    finished = threading.Event()

    def on_done() -> None:
        nonlocal done
        with lock:
            done += 1
            if done == 1:
                meter.start(already=1)
            if done == args.records:
                meter.stop()
                finished.set()

    # 1.
    config = EngineConfig(
        bootstrap_servers=args.bootstrap,
        group=args.group,
        assign=((args.topic, args.partition),),
        operator_mode=True,
        ordering=OrderingMode(args.ordering),
        factor=args.factor,
    )
    running = RunningCounter()
    engine = Engine(
        config,
        make_processor(args.processor, args.base_ms, args.slow_ms, args.slow_fraction, on_done, running),
    )

    async def go() -> None:
        # 2.
        await engine.start()
        deadline = time.monotonic() + args.timeout
        try:
            while not finished.is_set():
                if time.monotonic() > deadline:
                    raise TimeoutError(f"multilane: {done}/{args.records} records after {args.timeout}s")
                await asyncio.sleep(0.005)
        finally:
            # 3.
            await engine.stop()

    asyncio.run(go())
    return meter.result(
        args.records, ordering=args.ordering, factor=args.factor, processor=args.processor,
        peak_running=running.peak,  # diagnostic: did the engine ever run F records at once?
    )  # fmt: skip


def worker_ignoring_progress(argv: Sequence[str]) -> int:
    """``multilane worker ARGS`` with progress beyond the committed offset ignored on assignment.

    The watermark-only baseline of scenario 5 when the worker has no flag for it: the same engine,
    whose restart then replays everything from the committed offset. Progress records are still
    written (that costs time, not replays). If the engine's private hook is gone, this fails loudly
    and the row says so.
    """
    from multilane.cli import main as multilane_main
    from multilane.worker.engine import Engine

    if not hasattr(Engine, "_load_progress"):
        print("Engine._load_progress is gone: cannot ignore progress", file=sys.stderr)
        return 2

    def no_progress(self: Any, tp: Any, committed: Any) -> None:
        return None

    Engine._load_progress = no_progress  # type: ignore[method-assign]
    return multilane_main(["worker", *argv])


if __name__ == "__main__":
    if sys.argv[1:2] == ["_child"]:
        raise SystemExit(child_main(sys.argv[2:]))
    if sys.argv[1:2] == ["_worker_ignoring_progress"]:
        raise SystemExit(worker_ignoring_progress(sys.argv[2:]))
    raise SystemExit(main("engine", __doc__ or "", body, add_arguments, module="benchmarks.engine"))
