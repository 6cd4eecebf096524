"""One share-group consumer process (KIP-932, confluent-kafka's ``ShareConsumer``) running the engine
benchmark's unordered 10 ms workload. Does I/O: Kafka, its event file, stdout.

``python -m benchmarks.baselines.share_group --bootstrap H:P --topic T --group G --events PATH
[--concurrency C] [--base-ms 10]``

The loop (explicit acknowledgement, as a careful user would write it):

1. ``poll()`` returns the records the broker acquired for this member: ``max.poll.records`` = C, a
   soft limit (the broker hands out whole record batches of the topic: KIP-1206's strict
   ``record_limit`` acquire mode is not a setting of librdkafka 2.16).
2. The batch runs on asyncio with at most C records sleeping at once (``asyncio.sleep(latency)``, the
   shared latency model of :mod:`benchmarks.baselines.workload`); each record is acknowledged
   (ACCEPT) as soon as it ends.
3. ``commit_async()`` sends the acknowledgements; then the next poll. The client refuses a poll while
   a record of the previous batch is unacknowledged, so a batch waits for its slowest record.

Every start and end goes to ``--events`` as a line ``s|e offset delivery_count time`` (flushed once a
batch started and when it ended; the parent reads it for the delivery checkers and redelivery counts).
The process runs until SIGTERM, then closes the consumer (leaves the group) and prints one JSON line
with its CPU time from its first polled record on.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import signal
import sys
import time
from typing import Any, TextIO

from benchmarks.baselines.workload import latency_s


def _cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


async def run(args: argparse.Namespace, events: TextIO) -> dict[str, Any]:
    from confluent_kafka import ShareConsumer

    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    consumer = ShareConsumer({
        "bootstrap.servers": args.bootstrap, "group.id": args.group,
        "share.acknowledgement.mode": "explicit", "max.poll.records": args.concurrency, "log_level": 4,
        **dict(item.split("=", 1) for item in args.config),
    })  # fmt: skip
    consumer.subscribe([args.topic])
    base = args.base_ms / 1000
    gate = asyncio.Semaphore(args.concurrency)
    processed = 0
    cpu0: float | None = None  # CPU seconds at the first polled record (the measure starts there)

    async def one(message: Any) -> None:
        async with gate:
            offset, count = message.offset(), message.delivery_count()
            events.write(f"s {offset} {count} {time.time():.6f}\n")
            await asyncio.sleep(latency_s(offset, base))
            events.write(f"e {offset} {count} {time.time():.6f}\n")
            consumer.acknowledge(message)

    try:
        while not stop.is_set():
            # 1. (poll blocks the loop for at most 0.1 s; nothing else runs between batches)
            batch = [m for m in consumer.poll(0.1) if m.error() is None]
            if not batch:
                await asyncio.sleep(0)  # lets the loop run the SIGTERM handler
                continue
            if cpu0 is None:
                cpu0 = _cpu_s()
            # 2.
            tasks = [asyncio.ensure_future(one(m)) for m in batch]
            await asyncio.sleep(0)  # the batch's first starts are written: flush them (the parent's view)
            events.flush()
            await asyncio.gather(*tasks)
            processed += len(batch)
            events.flush()
            # 3.
            consumer.commit_async()
    finally:
        events.flush()
        consumer.close()
    return {"records": processed, "cpu_s": _cpu_s() - cpu0 if cpu0 is not None else 0.0}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--group", required=True)
    parser.add_argument("--events", required=True, help="file the starts and ends are appended to")
    parser.add_argument("--concurrency", type=int, default=64, help="records of a batch sleeping at once")
    parser.add_argument("--base-ms", type=float, default=10.0)
    parser.add_argument("--config", action="append", default=[], metavar="KEY=VALUE",
                        help="extra librdkafka setting of the share consumer")
    args = parser.parse_args(argv)
    with open(args.events, "a", encoding="utf-8", buffering=1 << 16) as events:
        result = asyncio.run(run(args, events))
    sys.stdout.write(json.dumps(result) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
