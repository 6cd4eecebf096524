"""Engine benchmark: multilane's worker engine against a raw loop, quixstreams and naive loops.

``python -m benchmarks.engine [--quick] [--json] [--repeats N] [--only 1,2] [--compare REF]
[--loop asyncio|uvloop] [--profile DIR] [--broker embedded|apache|both]``

One broker per run (the embedded one by default; with ``--broker both`` every scenario runs on the
embedded broker, then on Apache Kafka, each with its own freshly produced topics, into one table with
a ``broker`` column); one partition; 100-byte records with keys Zipf(s=1) over 10,000 keys.
Every row runs in its own child process (a fresh interpreter); rates run from the first record to the
last, so start-up and group joins are not counted. Each row runs ``--repeats`` times, in alternation
with the rows it is compared to (round 1: A B, round 2: A B, ...), and is reported as the median with
the range of its runs; a ratio is the median (min..max) of the per-round ratios. CPU µs per record is
the measuring child's own CPU time. ``--compare REF`` runs the multilane rows of scenarios 1 and 2 on
this tree and on git REF in alternation. Every multilane run applies the delivery checkers. Scenarios:

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
import contextlib
import dataclasses
import importlib.util
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks._common import Column, Report, Spread, log, main, ratio
from benchmarks._data import add_broker_argument, broker_passes, broker_session, zipf_top_share
from benchmarks.baselines.workload import latency_s, mean_latency_s
from benchmarks.engine_child import LOOPS
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
    RowResult,
    Runner,
    bare_asyncio,
    compared_build,
    multilane,
    naive_batch,
    profile_tables,
    quix,
    raw_loop,
    this_build,
)

# ------------------------------------------------------------------------------------------ scenarios

RATE = Column("rate", "rec/s, median (min..max)", ",.0f")
CPU = Column("cpu_us", "CPU µs/rec, median (min..max)", ".2f")
MAIN = Column("main_us", "of which main thread", ".2f")


def _ml_label(ctx: Ctx, build: str) -> str:
    """How a build's multilane rows are named (the build's name only when several are compared)."""
    return "multilane" if len(ctx.builds) == 1 else build


def _vs_ref(ctx: Ctx, results: dict[str, RowResult | str], build: str, key: str) -> Spread | None:
    """This build's row ÷ the compared build's row (``--compare``), round by round."""
    if len(ctx.builds) < 2 or build != ctx.builds[0].name:
        return None
    mine = results.get(build)
    return mine.vs(results.get(ctx.builds[1].name), key) if isinstance(mine, RowResult) else None


def scenario_noop(ctx: Ctx) -> None:
    """1. No-op processor: multilane vs quixstreams vs the raw loop (alternated, round by round)."""
    n = ctx.sizes.noop_records
    log(f"scenario 1: no-op, {n:,} records")
    data = ctx.topic(n)
    table = ctx.report.table(
        "noop",
        f"1. No-op processor, {n:,} records, one partition, {ctx.repeat} alternated rounds",
        [
            Column("system"),
            Column("setting"),
            RATE,
            CPU,
            MAIN,
            Column("vs_quix", "÷ quixstreams", ".2f"),
            Column("vs_raw", "÷ raw loop", ".2f"),
            Column("vs_ref", "÷ compared build", ".2f"),
            Column("cpu_vs_ref", "CPU ÷ compared build", ".2f"),
            Column("note"),
        ],
    )
    rows: dict[str, Runner | str] = {"raw": raw_loop(ctx, data.topic, n), "quix": quix(ctx, data.topic, n)}
    settings = {
        "raw": ("raw confluent-kafka loop", "consume(1000), fetch.queue.backoff.ms=10"),
        "quix": ("quixstreams 3.28.1", "sdf.update(no-op), own venv"),
    }
    cases = [("async-noop", f"unordered F={KEY_MODE_F}, async no-op")]
    if ctx.sizes.sync_noop_row:
        cases.append(("sync-noop", f"unordered F={KEY_MODE_F}, sync no-op (thread pool)"))
    for processor, setting in cases:
        for build, runner in multilane(ctx, data.topic, n, "unordered", KEY_MODE_F, processor).items():
            rows[f"{build}/{processor}"] = runner
            settings[f"{build}/{processor}"] = (_ml_label(ctx, build), f"{setting}; loop {ctx.loop}")
    res = ctx.measure(rows)
    for label, r in res.items():
        system, setting = settings[label]
        if isinstance(r, str):
            table.add_unavailable(r, system=system, setting=setting)
            continue
        build, _, processor = label.partition("/")
        same = {b.name: res.get(f"{b.name}/{processor}") for b in ctx.builds}
        table.add(
            system=system, setting=setting, rate=r.rate, cpu_us=r.cpu_us, main_us=r.main_thread_us,
            vs_quix=r.vs(res["quix"]), vs_raw=r.vs(res["raw"]),
            vs_ref=_vs_ref(ctx, same, build, "rate") if processor else None,  # type: ignore[arg-type]
            cpu_vs_ref=_vs_ref(ctx, same, build, "cpu_us_per_record") if processor else None,  # type: ignore[arg-type]
            note="delivery checked" if r.checked else None,
        )  # fmt: skip
    ml = res.get(f"{ctx.builds[0].name}/async-noop")
    if isinstance(ml, RowResult):
        ctx.report.goal("1. multilane no-op ÷ quixstreams no-op", ml.vs(res["quix"]), 3.0)
        ctx.report.goal("1. multilane no-op ÷ raw loop", ml.vs(res["raw"]), 0.3)


def scenario_io(ctx: Ctx) -> None:
    """2. IO-bound processor at several in-flight counts; multilane and the bare loop alternate."""
    log("scenario 2: IO-bound")
    table = ctx.report.table(
        "io",
        f"2. IO-bound processor (sleep {BASE_MS:g} ms per record), efficiency = rec/s ÷ (in flight ÷ "
        f"{BASE_MS / 1000:g} s); event loop {ctx.loop}; {ctx.repeat} alternated rounds; ratios are the "
        "median (min..max) of the per-round ratios",
        [
            Column("in_flight", "in flight"),
            Column("system"),
            Column("records", "records", ","),
            RATE,
            Column("efficiency", "efficiency", ".2f"),
            Column("vs_bare", "÷ bare asyncio", ".2f"),
            CPU,
            MAIN,
            Column("cpu_vs_bare", "CPU ÷ bare", ".2f"),
            Column("vs_ref", "÷ compared build", ".2f"),
            Column("cpu_vs_ref", "CPU ÷ compared build", ".2f"),
            Column("peak", "peak running", ","),
            Column("note"),
        ],
    )
    # quixstreams processes one record at a time: in flight = 1
    n_quix = ctx.sizes.quix_sleep_records
    qx = ctx.measure({"quix": quix(ctx, ctx.topic(n_quix).topic, n_quix, sleep_ms=BASE_MS)})["quix"]
    if isinstance(qx, str):
        table.add_unavailable(qx, in_flight=1, system="quixstreams (time.sleep)", records=n_quix)
    else:
        table.add(
            in_flight=1, system="quixstreams (time.sleep)", records=n_quix, rate=qx.rate,
            efficiency=ratio(qx.median_rate, 1 / (BASE_MS / 1000)), cpu_us=qx.cpu_us,
            note="sync processor: one record at a time",
        )  # fmt: skip
    for in_flight, n in sorted(ctx.sizes.io_records.items()):
        ideal = in_flight / (BASE_MS / 1000)
        data = ctx.topic(n)
        rows: dict[str, Runner | str] = {"bare": bare_asyncio(ctx, n, in_flight)}
        names = {"bare": ("bare asyncio (no Kafka)", "the event loop's ceiling")}
        if in_flight in ctx.sizes.naive_at:
            rows["naive"] = naive_batch(ctx, data.topic, n, in_flight)
            names["naive"] = ("naive batch loop", "")
        ml = multilane(ctx, data.topic, n, "unordered", in_flight, "async-sleep")
        for build, runner in ml.items():
            rows[build] = runner
            names[build] = (f"{_ml_label(ctx, build)} unordered F={in_flight}", "")
        res = ctx.measure(rows)
        bare = res["bare"]
        for label, r in res.items():
            system, note = names[label]
            if isinstance(r, str):
                table.add_unavailable(r, in_flight=in_flight, system=system, records=n)
                continue
            table.add(
                in_flight=in_flight, system=system, records=n, rate=r.rate,
                efficiency=ratio(r.median_rate, ideal), vs_bare=r.vs(bare), cpu_us=r.cpu_us,
                main_us=r.main_thread_us,
                cpu_vs_bare=r.vs(bare, "cpu_us_per_record"),
                vs_ref=_vs_ref(ctx, res, label, "rate"),
                cpu_vs_ref=_vs_ref(ctx, res, label, "cpu_us_per_record"),
                peak=r.get("peak_running"), note=note or ("delivery checked" if r.checked else None),
            )  # fmt: skip
        mine = res.get(ctx.builds[0].name)
        if not isinstance(mine, RowResult):
            continue
        if in_flight <= 256:
            ctx.report.goal(
                f"2. multilane efficiency at {in_flight} in flight", ratio(mine.median_rate, ideal), 0.9
            )
        if in_flight >= 1024:
            ctx.report.goal(f"2. multilane ÷ bare asyncio at {in_flight} in flight", mine.vs(bare), 0.95)
        if in_flight >= 256:
            ctx.report.goal(
                f"2. multilane CPU per record ÷ bare asyncio's at {in_flight} in flight",
                mine.vs(bare, "cpu_us_per_record"),
                1.3,
                "<=",
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
            RATE,
            CPU,
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
        build = ctx.builds[0].name
        rows: dict[str, Runner | str] = {
            mode: multilane(ctx, data.topic, n, mode, KEY_MODE_F, processor)[build]
            for mode in ("unordered", "key")
        }
        res = ctx.measure(rows)
        for mode, r in res.items():
            if isinstance(r, str):
                table.add_unavailable(r, processor=label, mode=mode, records=n)
                continue
            is_key = mode == "key"
            notes = (
                [f"top key {top_actual:.1%}, busiest lane {share:.1%} of the records"]
                if is_key and share
                else []
            )
            if r.checked:
                notes.append("delivery checked")
            table.add(
                processor=label, mode=mode, records=n, rate=r.rate, cpu_us=r.cpu_us,
                key_vs_unordered=r.vs(res["unordered"]) if is_key else None,
                cap_top_key=top_cap if is_key else None, cap_lane=cap if is_key else None,
                of_cap=ratio(r.median_rate, cap) if is_key else None,
                note="; ".join(notes),
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
            RATE,
            Column("efficiency", "efficiency", ".2f"),
            Column("vs_bare", "÷ bare asyncio", ".2f"),
            CPU,
            Column("note"),
        ],
    )
    build = ctx.builds[0].name
    res = ctx.measure(
        {
            "bare": bare_asyncio(ctx, n, HOL_IN_FLIGHT, slow=True),
            "naive": naive_batch(ctx, data.topic, n_naive, HOL_IN_FLIGHT, slow=True),
            "ml": multilane(ctx, data.topic, n, "unordered", HOL_IN_FLIGHT, "async-sleep", slow=True)[build],
        }
    )
    mean_naive = mean_latency_s(data.first_offset, n_naive, BASE_MS / 1000, SLOW_MS / 1000, SLOW_FRACTION)
    naive_bound = naive_efficiency_bound(data.first_offset, n_naive, HOL_IN_FLIGHT, mean_naive)
    for label, system, records, note in [
        ("bare", "bare asyncio (no Kafka)", n, ""),
        ("naive", f"naive batch loop (batch {HOL_IN_FLIGHT})", n_naive,
         f"a batch lasts as long as its slowest record: at best {naive_bound:.2f}"),
        ("ml", f"multilane unordered F={HOL_IN_FLIGHT}", n, ""),
    ]:  # fmt: skip
        r = res[label]
        if isinstance(r, str):
            table.add_unavailable(r, system=system, records=records)
            continue
        row_mean = mean if records == n else mean_naive  # each row against its own records' latencies
        if label == "ml" and r.checked:
            note = "delivery checked"
        table.add(
            system=system, records=records, rate=r.rate,
            efficiency=ratio(r.median_rate, HOL_IN_FLIGHT / row_mean), vs_bare=r.vs(res["bare"]),
            cpu_us=r.cpu_us, note=note,
        )  # fmt: skip
    ml = res["ml"]
    ml_rate = ml.median_rate if isinstance(ml, RowResult) else None
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
    parser.add_argument(
        "--repeats", "--repeat", dest="repeats", type=int, default=None,
        help="alternated rounds: each row runs this many times, reported as median (min..max) "
        "(default 5; 1 with --quick)",
    )  # fmt: skip
    parser.add_argument(
        "--only", default="", help="comma-separated scenario numbers to run (default: all), e.g. 1,2"
    )
    parser.add_argument(
        "--compare", metavar="REF",
        help="also run every multilane row of scenarios 1 and 2 on git REF (commit, branch, tag), "
        "alternating with this tree round by round; prints this ÷ REF with its spread",
    )  # fmt: skip
    parser.add_argument(
        "--loop", choices=LOOPS, default="asyncio",
        help="event loop of multilane and the asyncio baselines (uvloop: pip install multilane[uvloop])",
    )  # fmt: skip
    parser.add_argument(
        "--profile", metavar="DIR",
        help="after each multilane row's first run, run it once more under cProfile (not measured), "
        "write DIR/<row>.prof and print the top functions by own CPU time",
    )  # fmt: skip
    parser.add_argument("--profile-top", type=int, default=15, help="functions per profile table")
    parser.add_argument(
        "--in-flight", default="",
        help="scenario 2: only these in-flight counts (comma-separated, e.g. 256,1024; default: all)",
    )  # fmt: skip
    add_broker_argument(parser)


def _run_scenarios(ctx: Ctx, args: argparse.Namespace, only: set[str]) -> None:
    """The chosen scenarios, in order, against ``ctx``'s broker; then the profiles of this pass."""
    if args.profile:
        ctx.profile_dir = Path(args.profile) / str(ctx.report.stamp.get("broker", ""))
        ctx.profile_dir.mkdir(parents=True, exist_ok=True)
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
    profile_tables(ctx, args.profile_top)


def body(args: argparse.Namespace, report: Report) -> None:
    sizes = QUICK if args.quick else FULL
    if args.in_flight:
        wanted = {int(x) for x in args.in_flight.split(",") if x.strip()}
        unknown = wanted - set(sizes.io_records)
        if unknown:
            raise ValueError(
                f"--in-flight {sorted(unknown)}: not a row; choose from {sorted(sizes.io_records)}"
            )
        sizes = dataclasses.replace(
            sizes, io_records={k: v for k, v in sizes.io_records.items() if k in wanted}
        )
    if args.compare:  # the naive loop is no goal and does not depend on the build: spend the time on rounds
        sizes = dataclasses.replace(sizes, naive_at=())
    repeats = args.repeats if args.repeats is not None else (1 if args.quick else 5)
    only = {s.strip() for s in args.only.split(",") if s.strip()}
    report.params.update(
        partitions=1, value_bytes=VALUE_BYTES, keys=N_KEYS, zipf_s=ZIPF_S, rounds=max(1, repeats),
        noop_records=sizes.noop_records, compression="none", loop=args.loop,
    )  # fmt: skip
    missing = engine_missing()
    if missing:
        report.note(f"multilane: not available ({missing})")
    if args.loop == "uvloop" and importlib.util.find_spec("uvloop") is None:
        raise RuntimeError("--loop uvloop: uvloop is not installed (pip install 'multilane[uvloop]')")
    builds: list[Any] = []
    with contextlib.ExitStack() as stack:
        if args.compare:
            builds = [this_build(), stack.enter_context(compared_build(args.compare))]
            report.params["compare"] = " vs ".join(b.name for b in builds)
            only = only or {"1", "2"}
        for kind in broker_passes(report, args.broker):
            with broker_session(kind) as broker, tempfile.TemporaryDirectory(prefix="multilane-bench-") as wd:
                ctx = Ctx(broker, report, sizes, max(1, repeats), missing, loop=args.loop, workdir=Path(wd))
                if builds:
                    ctx.builds = builds
                _run_scenarios(ctx, args, only)
        report.note(
            "Every multilane run applies the delivery checkers (at-least-once; in key mode also per-key "
            "order and no concurrent work on a key) to its processing events; a failed check fails the row. "
            "CPU µs/rec is the measuring child process's own CPU (all its threads, librdkafka's included; "
            "not the broker's) from the first record to the last, per record."
        )


if __name__ == "__main__":
    raise SystemExit(main("engine", __doc__ or "", body, add_arguments, module="benchmarks.engine"))
