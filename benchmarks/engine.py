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
import time
from collections import Counter
from collections.abc import Sequence
from typing import Any

from benchmarks._common import Column, Report, log, main, ratio
from benchmarks._data import broker_session, zipf_top_share
from benchmarks.baselines.workload import latency_s, mean_latency_s
from benchmarks.engine_replay import scenario_replay
from benchmarks.engine_rows import (
    BASE_MS,
    FULL,
    HOL_IN_FLIGHT,
    KEY_MODE_F,
    N_KEYS,
    QUICK,
    SLOW_FRACTION,
    SLOW_MS,
    VALUE_BYTES,
    ZIPF_S,
    Ctx,
    bare_asyncio,
    multilane,
    naive_batch,
    quix,
    raw_loop,
    try_row,
)

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
    raw = try_row(table, raw_loop, ctx, data.topic, n)
    qx = try_row(table, quix, ctx, data.topic, n)
    rows: list[tuple[str, str, dict[str, Any] | str]] = [
        ("raw confluent-kafka loop", "consume(1000), fetch.queue.backoff.ms=10", raw),
        ("quixstreams 3.28.1", "sdf.update(no-op), own venv", qx),
    ]
    ml = try_row(table, multilane, ctx, data.topic, n, "unordered", KEY_MODE_F, "async-noop")
    rows.append(("multilane", f"unordered F={KEY_MODE_F}, async no-op", ml))
    if ctx.sizes.sync_noop_row:
        ml_sync = try_row(table, multilane, ctx, data.topic, n, "unordered", KEY_MODE_F, "sync-noop")
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
    qx = try_row(table, quix, ctx, ctx.topic(n_quix).topic, n_quix, sleep_ms=BASE_MS)
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
        bare = try_row(table, bare_asyncio, ctx, n, in_flight)
        results: list[tuple[str, dict[str, Any] | str, str]] = [
            ("bare asyncio (no Kafka)", bare, "the event loop's ceiling"),
        ]
        if in_flight in ctx.sizes.naive_at:
            results.append(
                ("naive batch loop", try_row(table, naive_batch, ctx, data.topic, n, in_flight), "")
            )
        ml = try_row(table, multilane, ctx, data.topic, n, "unordered", in_flight, "async-sleep")
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
    from multilane.formats.keyranges import KeyRangeMap, key_hash

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
            mode: try_row(table, multilane, ctx, data.topic, n, mode, KEY_MODE_F, processor)
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
    bare = try_row(table, bare_asyncio, ctx, n, HOL_IN_FLIGHT, slow=True)
    naive = try_row(table, naive_batch, ctx, data.topic, n_naive, HOL_IN_FLIGHT, slow=True)
    ml = try_row(table, multilane, ctx, data.topic, n, "unordered", HOL_IN_FLIGHT, "async-sleep", slow=True)
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


if __name__ == "__main__":
    raise SystemExit(main("engine", __doc__ or "", body, add_arguments, module="benchmarks.engine"))
