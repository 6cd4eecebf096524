"""Consume-transform-produce: the engine with outputs tied to commits against the same processor without
outputs (``python -m benchmarks.outputs``). Does I/O: a broker, child processes.

One row = one child process (``python -m benchmarks.outputs child ...``) running multilane's engine in
unordered mode at 256 in flight (F=256) with the engine benchmark's 10 ms ``asyncio.sleep`` processor;
with outputs, the processor also sends one output per record (``ctx.produce``, 100 B, keyed by the
input key) and the record completes only once the broker acknowledged it
(:mod:`multilane.worker.outputs`; its delivery reports served on the engine's loop, as in the worker,
or by a poll thread with ``--poll thread``). The two variants are alternated (off, on, off, on, ...)
in one run on one input topic, so that load from other work hits both alike; the goal is the median of
the per-pair ratios ``rate(on) / rate(off)`` (>= 0.8).

``--mode exactly-once`` adds a third variant to each round, ``--outputs exactly-once``
(:mod:`multilane.worker.transactions`: outputs held per record and sent in the input partition's
transaction with the offset and the progress record), on Apache Kafka by default (``--broker``); its row
counts a record when its transaction committed (the committed offset reached the end), the others when
the record completed. Goal: exactly-once / no outputs >= 0.6. The commit interval (``--commit-interval-ms``,
every variant) bounds the latency exactly-once adds to an output; the report names it and the load
average.
"""

from __future__ import annotations

import argparse
import json
import marshal
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks._common import Column, Report, log, main, ratio

IN_FLIGHT = 256
BASE_MS = 10.0
FULL_RECORDS = 60_000
QUICK_RECORDS = 8_000
FULL_PAIRS = 3
QUICK_PAIRS = 2


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--pairs", type=int, default=0, help="alternated off/on pairs (default 3, quick 2)")
    parser.add_argument("--records", type=int, default=0, help="records per row (default 60k, quick 8k)")
    parser.add_argument("--linger-ms", type=float, default=1.0, help="the output producer's linger.ms")
    parser.add_argument("--poll", choices=("thread", "loop"), default="loop",
                        help="delivery reports served on the engine's loop (the worker's way) or by a "
                             "poll thread (the way before)")
    parser.add_argument("--idempotence", choices=("on", "off"), default="on",
                        help="the output producer's idempotence (the worker's --output-idempotence)")
    parser.add_argument("--producer-config", action="append", default=[], metavar="KEY=VALUE",
                        help="extra librdkafka setting of the output producer (the worker's --output-config)")
    parser.add_argument("--mode", choices=("at-least-once", "exactly-once"), default="at-least-once",
                        help="at-least-once: rounds of no outputs / outputs; exactly-once: a third row per "
                             "round with --outputs exactly-once")
    parser.add_argument("--broker", choices=("embedded", "apache", "both"), default=None,
                        help="the broker (default: apache with --mode exactly-once, else embedded); both: "
                             "every round on the embedded broker, then on Apache Kafka, in one table")
    parser.add_argument("--commit-interval-ms", type=int, default=100,
                        help="the engine's commit interval in every row (exactly-once: its transactions)")
    parser.add_argument("--transaction-max-records", type=int, default=10_000,
                        help="exactly-once: a transaction commits after this many records too")


def body(args: argparse.Namespace, report: Report) -> None:
    """Per broker of ``--broker`` (:func:`_pass`): 1. produce the input topic once. 2. Alternate the
    rows. 3. Notes and goals."""
    from benchmarks._data import broker_passes, broker_session
    from benchmarks.engine_rows import N_KEYS, VALUE_BYTES

    records = args.records or (QUICK_RECORDS if args.quick else FULL_RECORDS)
    pairs = args.pairs or (QUICK_PAIRS if args.quick else FULL_PAIRS)
    eos = args.mode == "exactly-once"
    broker_kind = args.broker or ("apache" if eos else "embedded")
    kinds = broker_passes(report, broker_kind)  # before the table: it leads with a broker column
    variants = ("off", "on", "exactly-once") if eos else ("off", "on")
    report.params.update(records=records, pairs=pairs, in_flight=IN_FLIGHT, base_ms=BASE_MS,
                         value_bytes=VALUE_BYTES, keys=N_KEYS, linger_ms=args.linger_ms, poll=args.poll,
                         idempotence=args.idempotence, producer_config=args.producer_config,
                         mode=args.mode, broker=broker_kind, commit_interval_ms=args.commit_interval_ms,
                         transaction_max_records=args.transaction_max_records,
                         load_average_at_start=[round(x, 2) for x in os.getloadavg()])
    log(f"broker {broker_kind}, commit interval {args.commit_interval_ms} ms, load average {os.getloadavg()}")
    table = report.table("outputs", f"Consume-transform-produce at {IN_FLIGHT} in flight, {BASE_MS:g} ms "
                         "asyncio.sleep per record", [
                             Column("run", "run"), Column("outputs"), Column("records", fmt=","),
                             Column("rate", "rec/s", ",.0f"), Column("efficiency", fmt=".2f"),
                             Column("cpu_us", "CPU us/rec", ",.1f"), Column("note")])
    for kind in kinds:
        with broker_session(kind) as broker, tempfile.TemporaryDirectory(prefix="bench-outputs-") as scratch:
            _pass(args, report, table, broker, Path(scratch), records, pairs, variants, eos)


def _pass(args: argparse.Namespace, report: Report, table: Any, broker: Any, scratch: Path, records: int,
          pairs: int, variants: tuple[str, ...], eos: bool) -> None:
    """Steps 1-3 of :func:`body` on one broker (a pass of ``--broker both``)."""
    from benchmarks._children import ChildError, run_json_child
    from benchmarks._data import produce_zipf
    from benchmarks.engine_rows import N_KEYS, VALUE_BYTES, ZIPF_S

    ideal = IN_FLIGHT / (BASE_MS / 1000)
    eos_ratios: list[float] = []
    # 1.
    topic = f"outputs-in-{int(time.time())}"
    broker.create_topic(topic, 1)
    produced = produce_zipf(broker.bootstrap, topic, records, VALUE_BYTES, N_KEYS, ZIPF_S, seed=1)
    log(f"produced {produced.records:,} records to {topic}")
    keys_file = scratch / "keys.marshal"  # the produced keys, for the children's delivery checkers
    with open(keys_file, "wb") as f:
        marshal.dump(produced.keys, f)
    # 2.
    ratios: list[float] = []
    for i in range(pairs):
        rates: dict[str, float | None] = {}
        for variant in variants:
            out_topic = f"outputs-out-{i}-{variant}-{int(time.time() * 1000)}"
            if variant != "off":
                broker.create_topic(out_topic, 1)
            argv = [sys.executable, "-m", "benchmarks.outputs", "child", "--bootstrap", broker.bootstrap,
                    "--topic", topic, "--group", f"bench-outputs-{i}-{variant}-{time.time_ns()}",
                    "--records", str(records), "--outputs", variant, "--out-topic", out_topic,
                    "--linger-ms", str(args.linger_ms), "--poll", args.poll,
                    "--idempotence", args.idempotence, "--timeout", "240",
                    "--commit-interval-ms", str(args.commit_interval_ms),
                    "--transaction-max-records", str(args.transaction_max_records),
                    "--keys-file", str(keys_file), "--first-offset", str(produced.first_offset)]
            argv += [a for kv in args.producer_config for a in ("--producer-config", kv)]
            try:
                res = run_json_child(argv, timeout=300)
            except ChildError as exc:
                table.add_unavailable(str(exc)[:200], run=i + 1, outputs=variant, records=records)
                rates[variant] = None
                continue
            log(f"  pair {i + 1} outputs={variant}: {res['rate']:,.0f} rec/s")
            rates[variant] = float(res["rate"])
            sent = {"on": f"{res.get('outputs_sent', 0):,} outputs acknowledged",
                    "exactly-once": f"{res.get('transactions', 0):,} transactions committed"
                    }.get(variant, "")
            rtt = ("" if res.get("produce_rtt_ms") is None else
                   f"produce rtt {res['produce_rtt_ms']:.1f} ms (median of the 100 ms windows' means; "
                   f"max {res['produce_rtt_max_ms']:.1f})")
            note = "; ".join(x for x in (sent, rtt, "delivery checked" if res.get("checked") else "") if x)
            table.add(run=i + 1, outputs=variant, records=records, rate=res["rate"],
                      efficiency=res["rate"] / ideal, cpu_us=res["cpu_us_per_record"], note=note)
        r = ratio(rates.get("on"), rates.get("off"))
        if r is not None:
            ratios.append(r)
        r = ratio(rates.get("exactly-once"), rates.get("off"))
        if r is not None:
            eos_ratios.append(r)
    # 3.
    kind = report.stamp.get("broker", "")
    median = statistics.median(ratios) if ratios else None
    report.note(f"{kind}: pair ratios (on/off): " + ", ".join(f"{r:.3f}" for r in ratios))
    report.note(f"{kind}: commit interval {args.commit_interval_ms} ms; load average at the end "
                f"{tuple(round(x, 2) for x in os.getloadavg())}")
    if eos:
        report.note(f"{kind}: ratios (exactly-once/off): " + ", ".join(f"{r:.3f}" for r in eos_ratios))
        report.goal(f"exactly-once rate / same processor without outputs, {IN_FLIGHT} in flight, commit "
                    f"interval {args.commit_interval_ms} ms (median of rounds)",
                    statistics.median(eos_ratios) if eos_ratios else None, 0.6)
    report.goal(f"consume-transform-produce rate / same processor without outputs, {IN_FLIGHT} in flight "
                "(median of alternated pairs)", median, 0.8)

# ------------------------------------------------------------------------------------------ child


def child_main(argv: list[str]) -> int:
    """One row: the engine with (or without) outputs until N records completed; JSON on the last line."""
    import asyncio
    import threading

    from benchmarks._children import Meter, emit_child_result
    from benchmarks.baselines.kafka import add_consumer_arguments
    from benchmarks.engine_child import EventRecorder, RunningCounter, check_run, make_processor
    from multilane.api import Context, OrderingMode, Record
    from multilane.worker.config import EngineConfig
    from multilane.worker.engine import Engine
    from multilane.worker.outputs import OutputProducer, output_producer_config, with_outputs

    parser = argparse.ArgumentParser(prog="python -m benchmarks.outputs child")
    add_consumer_arguments(parser)
    parser.add_argument("--outputs", choices=("on", "off", "exactly-once"), required=True)
    parser.add_argument("--commit-interval-ms", type=int, default=1000)
    parser.add_argument("--transaction-max-records", type=int, default=10_000)
    parser.add_argument("--out-topic", required=True)
    parser.add_argument("--linger-ms", type=float, default=1.0)
    parser.add_argument("--poll", choices=("thread", "loop"), default="loop")
    parser.add_argument("--idempotence", choices=("on", "off"), default="on")
    parser.add_argument("--producer-config", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--keys-file", help="marshal'ed list of the produced keys (for the checkers)")
    parser.add_argument("--first-offset", type=int, default=0, help="offset of the first produced key")
    args = parser.parse_args(argv)
    args.ordering = "unordered"

    meter = Meter()
    lock = threading.Lock()
    done = 0
    finished = threading.Event()

    eos = args.outputs == "exactly-once"

    def on_done() -> None:
        nonlocal done
        with lock:
            done += 1
            if done == 1:
                meter.start(already=1)
            if done == args.records and not eos:  # exactly-once: when the last transaction committed
                meter.stop()
                finished.set()

    # The completion counter must count a record once its outputs are acknowledged: with outputs the
    # inner processor only sleeps; the count happens after with_outputs returned (outer wrapper).
    recorder = EventRecorder()  # the processor's starts and ends, for the delivery checkers
    sleep = make_processor("async-sleep", BASE_MS, 0.0, 0.0, lambda: None, RunningCounter(), recorder)
    out: OutputProducer | None = None
    out_topic = args.out_topic
    rtts: list[float] = []  # ms, one per statistics window with a produce request (outputs on)

    async def transform(record: Record, ctx: Context) -> None:
        await sleep(record, ctx)
        ctx.produce(out_topic, record.value, key=record.key)

    inner: Any = sleep
    if args.outputs == "on":
        conf = output_producer_config(args.bootstrap, "bench-outputs", args.linger_ms,
                                      idempotent=args.idempotence == "on")
        conf.update(item.split("=", 1) for item in args.producer_config)
        # the produce round trips the client measures (librdkafka statistics: each 100 ms window's
        # mean rtt to the broker), reported beside the rate: is a slow row the broker's acknowledgement?
        conf.setdefault("statistics.interval.ms", 100)
        conf.setdefault("stats_cb", lambda text: rtts.extend(
            b["rtt"]["avg"] / 1000 for b in json.loads(text)["brokers"].values()
            if b.get("nodeid", -1) >= 0 and b["rtt"]["cnt"] > 0))
        from confluent_kafka import Producer

        # Warm up like a worker in its steady state: the idempotent producer has its producer id (its
        # first one takes ~1 s on the embedded broker, and no output leaves before it) and the output
        # topic's metadata. One record, not counted, before the engine starts.
        client = Producer(conf)
        client.produce(out_topic, b"warm-up")
        if client.flush(30):
            raise RuntimeError("the output producer's warm-up record was not acknowledged in 30 s")
        rtts.clear()  # the warm-up record's round trip is not the run's
        out = OutputProducer(client, poll_on_loop=args.poll == "loop")
        inner = with_outputs(transform, out)
    txns: Any = None
    if eos:
        from multilane.worker.transactions import (
            TransactionalOutputs,
            transactional_producer_config,
            with_transactional_outputs,
        )

        txns = TransactionalOutputs.from_config(
            transactional_producer_config(args.bootstrap, "bench-eos", ""), args.group,
            max_records=args.transaction_max_records)
        inner = with_transactional_outputs(transform, txns)

    async def processor(record: Record, ctx: Context) -> None:
        await inner(record, ctx)
        on_done()

    config = EngineConfig(bootstrap_servers=args.bootstrap, group=args.group,
                          assign=((args.topic, args.partition),), operator_mode=True,
                          ordering=OrderingMode.UNORDERED, factor=IN_FLIGHT,
                          commit_interval_ms=args.commit_interval_ms)
    engine = Engine(config, processor, transactions=txns)

    def all_committed() -> bool:
        txn = txns.transaction((args.topic, args.partition)) if txns is not None else None
        return txn is not None and (txn.committed or 0) >= args.records

    async def go() -> None:
        if out is not None:
            out.start(asyncio.get_running_loop())
        await engine.start()
        deadline = time.monotonic() + args.timeout
        try:
            while not finished.is_set():
                if eos and all_committed():
                    meter.stop()
                    finished.set()
                    break
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{done}/{args.records} records after {args.timeout}s")
                await asyncio.sleep(0.005)
        finally:
            await engine.stop()
            if out is not None:
                await asyncio.to_thread(out.close)

    asyncio.run(go())
    failures = check_run(args, recorder)  # at-least-once over the input's records; a failure fails the row
    if failures:
        raise AssertionError("delivery checks failed: " + " / ".join(failures))
    emit_child_result(meter.result(args.records, outputs=args.outputs, checked=True,
                                   outputs_sent=out.sent if out is not None else 0,
                                   transactions=txns.committed_transactions if txns is not None else 0,
                                   produce_rtt_ms=statistics.median(rtts) if rtts else None,
                                   produce_rtt_max_ms=max(rtts, default=None)))
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["child"]:
        raise SystemExit(child_main(sys.argv[2:]))
    raise SystemExit(main("outputs", __doc__ or "", body, add_arguments, module="benchmarks.outputs"))
