"""The naive parallel loop: consume a batch of C records, run them concurrently, wait for all, commit.

``python -m benchmarks.baselines.naive_batch --bootstrap H:P --topic T --group G --records N
--concurrency C [--base-ms 10] [--slow-ms 200 --slow-fraction 0.01]``

Each record ``await asyncio.sleep(latency)`` (:mod:`benchmarks.baselines.workload`). The batch waits
for its slowest record before the next batch starts (head-of-line blocking), and the commit after
each batch is synchronous (at-least-once, as a careful naive loop would do it).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time

from benchmarks._children import Meter, emit_child_result
from benchmarks.baselines.kafka import add_consumer_arguments, assigned_consumer
from benchmarks.baselines.workload import latency_s


async def run(args: argparse.Namespace) -> dict[str, object]:
    consumer = assigned_consumer(args)
    base, slow, frac = args.base_ms / 1000, args.slow_ms / 1000, args.slow_fraction
    meter = Meter()
    done = 0
    deadline = time.monotonic() + args.timeout
    try:
        while done < args.records:
            if time.monotonic() > deadline:
                raise TimeoutError(f"naive loop: {done}/{args.records} records after {args.timeout}s")
            want = min(args.concurrency, args.records - done)
            batch = [m for m in consumer.consume(num_messages=want, timeout=1.0) if m.error() is None]
            if not batch:
                continue
            meter.start()
            await asyncio.gather(*(asyncio.sleep(latency_s(m.offset(), base, slow, frac)) for m in batch))
            consumer.commit(asynchronous=False)
            done += len(batch)
        meter.stop()
    finally:
        consumer.close()
    return meter.result(done, concurrency=args.concurrency)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    add_consumer_arguments(parser)
    parser.add_argument("--concurrency", type=int, required=True, help="records per batch (C)")
    parser.add_argument("--base-ms", type=float, default=10.0)
    parser.add_argument("--slow-ms", type=float, default=0.0)
    parser.add_argument("--slow-fraction", type=float, default=0.0)
    emit_child_result(asyncio.run(run(parser.parse_args(argv))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
