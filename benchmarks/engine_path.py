"""The engine's per-record path without Kafka: CPU per record of fetch-side dispatch, lane runners,
completion bookkeeping and the committable offset, for measuring cuts to the hot path.

``python -m benchmarks.engine_path [--quick] [--json] [--repeats N] [--compare REF] [--loop uvloop]``

A fresh child process per run builds ``confluent_kafka.Message`` objects in memory (100-byte values,
keys over 10,000 values), then feeds them to a :class:`~multilane.worker.partition.PartitionRuntime`
(unordered, 256 runners) as the fetch loop does: ``accept_run`` for a run, yield to the runners,
``flush`` and ``committable()``, until every record completed (the run fails otherwise). The measure is
the child's process CPU time per record over that loop, with the engine's garbage-collector settings.
No broker, no network, no librdkafka threads: far steadier than ``benchmarks.engine`` on a busy
machine, and blind to everything outside the path (consume, commits, progress records).

Processors: ``noop`` (``async def`` that returns at once) and ``sleep0`` (``await asyncio.sleep(0)``:
every record suspends once, so each runs through the event loop like an IO-bound record).
``--compare REF`` alternates this tree and git REF round by round (see ``benchmarks.engine``).
Does I/O: child processes.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import sys
import time
from typing import Any

from benchmarks._children import emit_child_result, run_json_child
from benchmarks._common import Column, Report, main
from benchmarks.engine_child import LOOPS, use_loop
from benchmarks.engine_rows import Build, RowResult, build_env, compared_build, this_build

PROCESSORS = ("noop", "sleep0")
FACTOR = 256
KEYS = 10_000


def child(argv: list[str]) -> int:
    """``python -m benchmarks.engine_path child --processor P --records N --loop L``: one run."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.engine_path child")
    parser.add_argument("--processor", choices=PROCESSORS, required=True)
    parser.add_argument("--records", type=int, required=True)
    parser.add_argument("--loop", choices=LOOPS, default="asyncio")
    parser.add_argument("--max-in-flight", type=int, default=None, help="default: EngineConfig's")
    args = parser.parse_args(argv)
    use_loop(args.loop)
    emit_child_result(asyncio.run(run_path(args.processor, args.records, args.max_in_flight)))
    return 0


async def run_path(processor: str, records: int, max_in_flight: int | None = None) -> dict[str, Any]:
    """Feed ``records`` in-memory messages through one partition runtime; CPU per record.

    1. Build the messages and the runtime (unordered, :data:`FACTOR` runners, the engine's bounds).
    2. Apply the engine's garbage-collector settings (``EngineConfig.gc_threshold``, ``gc.freeze``).
    3. Loop like the fetch loop: offer a run of at most ``consume_batch`` messages (``accept_run``),
       yield, flush completions, ask for the committable offset; once everything is offered, wait for
       the rest.
    4. Check that every record completed (the committable offset is the end) and report.
    """
    from confluent_kafka import Message

    from multilane.api import OrderingMode
    from multilane.worker.config import EngineConfig
    from multilane.worker.flow import FlowController
    from multilane.worker.lanes import LaneEnv
    from multilane.worker.metrics import LatencyHistogram
    from multilane.worker.partition import PartitionRuntime, Phase
    from multilane.worker.retry import RetryPolicy

    # 1.
    value = b"v" * 100
    msgs = [
        Message(topic="t", partition=0, offset=i, key=b"key-%d" % (i * 7919 % KEYS), value=value,
                timestamp=(1, 1_700_000_000_000 + i))
        for i in range(records)
    ]  # fmt: skip

    async def noop(rec: Any, ctx: Any) -> None:
        return None

    async def sleep0(rec: Any, ctx: Any) -> None:
        await asyncio.sleep(0)

    cfg = EngineConfig(bootstrap_servers="unused:9092", group="g", assign=(("t", 0),), operator_mode=True)
    env = LaneEnv(noop if processor == "noop" else sleep0, True, None, cfg.yield_every, cfg.sync_batch)
    flow = FlowController(max_in_flight or cfg.max_in_flight, cfg.max_in_flight_bytes)
    flow.set_partitions(1)
    rt = PartitionRuntime("t", 0, OrderingMode.UNORDERED, FACTOR, env, flow, RetryPolicy(), None,  # type: ignore[arg-type]
                          LatencyHistogram(), "g", "w", 0, None)  # fmt: skip
    rt.phase = Phase.ACTIVE
    rt.lanes.start()
    await asyncio.sleep(0)
    # 2.
    if cfg.gc_threshold:
        gc.collect()
        _, g1, g2 = gc.get_threshold()
        gc.set_threshold(cfg.gc_threshold, g1, g2)
        gc.freeze()
    # 3.
    wall0, cpu0 = time.perf_counter(), time.process_time()
    i = 0
    batch = cfg.consume_batch
    while i < records:
        # at most one consume() call's worth a run, as the fetch loop offers them (the per-record loop
        # of accept_run then runs specialised, as in the engine: CPython specialises its bytecode on
        # calls, not on one long first call)
        j, refused = rt.accept_run(msgs[i:i + batch], 0, False)
        i += j
        await asyncio.sleep(0)
        rt.flush()
        rt.tracker.committable()
        while refused and not flow.can_resume(rt.flow_counters):
            await asyncio.sleep(0)
            rt.flush()
    while rt.lanes.running or rt.lanes.queued:  # noqa: ASYNC110 - counters, not an event
        await asyncio.sleep(0)
    rt.flush()
    committed = rt.tracker.committable()
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    rt.lanes.close()
    # 4.
    if committed != records or rt.processed != records:
        raise RuntimeError(f"{rt.processed}/{records} records completed; committable offset {committed}")
    return {"records": records, "seconds": wall, "rate": records / wall, "cpu_s": cpu,
            "cpu_us_per_record": cpu / records * 1e6, "processor": processor}  # fmt: skip


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--repeats", type=int, default=None, help="alternated rounds (default 9; 3 with --quick)"
    )
    parser.add_argument(
        "--compare", metavar="REF", help="also run git REF's multilane, alternated round by round"
    )
    parser.add_argument("--loop", choices=LOOPS, default="asyncio")
    parser.add_argument(
        "--records", type=int, default=None, help="records per run (default 200,000; 50,000 quick)"
    )


def body(args: argparse.Namespace, report: Report) -> None:
    rounds = args.repeats or (3 if args.quick else 9)
    records = args.records or (50_000 if args.quick else 200_000)
    report.params.update(records=records, rounds=rounds, factor=FACTOR, loop=args.loop, ordering="unordered")
    with contextlib.ExitStack() as stack:
        builds: list[Build] = [this_build()]
        if args.compare:
            builds.append(stack.enter_context(compared_build(args.compare)))
            report.params["compare"] = " vs ".join(b.name for b in builds)
        table = report.table(
            "path",
            f"Per-record path without Kafka, {records:,} records, unordered F={FACTOR}, {rounds} alternated "
            "rounds; CPU is the child's process time",
            [
                Column("processor"),
                Column("build"),
                Column("cpu_us", "CPU µs/rec, median (min..max)", ".3f"),
                Column("vs_ref", "÷ compared build (per round)", ".3f"),
                Column("note"),
            ],
        )
        for processor in PROCESSORS:
            from benchmarks._common import alternate

            def run(build: Build, r: int, processor: str = processor) -> dict[str, Any]:
                env, cwd = build_env(build)
                argv = [sys.executable, "-m", "benchmarks.engine_path", "child", "--processor", processor,
                        "--records", str(records), "--loop", args.loop]  # fmt: skip
                return run_json_child(argv, timeout=600, env=env, cwd=cwd)

            alt = alternate(builds, rounds, run)
            results = {b: RowResult(alt.runs[b]) for b in builds if alt.runs[b]}
            for b in builds:
                if b not in results:
                    table.add_unavailable(alt.errors.get(b, "no run"), processor=processor, build=b.name)
                    continue
                res = results[b]
                vs = (
                    res.vs(results.get(builds[1]), "cpu_us_per_record")
                    if len(builds) > 1 and b == builds[0]
                    else None
                )
                table.add(processor=processor, build=b.name, cpu_us=res.cpu_us, vs_ref=vs)


if __name__ == "__main__":
    if sys.argv[1:2] == ["child"]:
        raise SystemExit(child(sys.argv[2:]))
    raise SystemExit(main("engine_path", __doc__ or "", body, add_arguments, module="benchmarks.engine_path"))
