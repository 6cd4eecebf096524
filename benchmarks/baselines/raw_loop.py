"""A raw confluent-kafka ``consume()`` loop that does nothing with its records: the ceiling.

``python -m benchmarks.baselines.raw_loop --bootstrap H:P --topic T --group G --records N``
prints one JSON result line (see :mod:`benchmarks.baselines`).
"""

from __future__ import annotations

import argparse
import sys
import time

from benchmarks._children import Meter, emit_child_result
from benchmarks.baselines.kafka import add_consumer_arguments, assigned_consumer


def run(args: argparse.Namespace) -> dict[str, object]:
    consumer = assigned_consumer(args)
    meter = Meter()
    done = 0
    deadline = time.monotonic() + args.timeout
    try:
        while done < args.records:
            if time.monotonic() > deadline:
                raise TimeoutError(f"raw loop: {done}/{args.records} records after {args.timeout}s")
            batch = consumer.consume(num_messages=args.batch, timeout=1.0)
            got = sum(1 for m in batch if m.error() is None)
            if got and meter.started_at is None:
                meter.start(already=got)
            done += got
        meter.stop()
    finally:
        consumer.close()
    return meter.result(done, batch=args.batch)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    add_consumer_arguments(parser)
    parser.add_argument("--batch", type=int, default=1000, help="num_messages per consume() call")
    emit_child_result(run(parser.parse_args(argv)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
