"""A bare asyncio loop with no Kafka: N sleeps at concurrency C, the event loop's ceiling.

``python -m benchmarks.baselines.bare_asyncio --records N --concurrency C [--base-ms 10]
[--slow-ms 200 --slow-fraction 0.01]``

C worker coroutines take the next "offset" from a shared counter and sleep its latency
(:mod:`benchmarks.baselines.workload`), so exactly C sleeps are pending at any moment, as with an
ideal consumer that always has C records in flight and spends no time on Kafka.
"""

from __future__ import annotations

import argparse
import asyncio
import sys

from benchmarks._children import Meter, emit_child_result
from benchmarks.baselines.workload import latency_s


async def run(args: argparse.Namespace) -> dict[str, object]:
    base, slow, frac = args.base_ms / 1000, args.slow_ms / 1000, args.slow_fraction
    next_offset = 0

    async def worker() -> None:
        nonlocal next_offset
        while next_offset < args.records:
            offset = next_offset
            next_offset += 1
            await asyncio.sleep(latency_s(offset, base, slow, frac))

    meter = Meter()
    meter.start()
    await asyncio.gather(*(worker() for _ in range(args.concurrency)))
    meter.stop()
    return meter.result(args.records, concurrency=args.concurrency)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--records", type=int, required=True)
    parser.add_argument("--concurrency", type=int, required=True)
    parser.add_argument("--base-ms", type=float, default=10.0)
    parser.add_argument("--slow-ms", type=float, default=0.0)
    parser.add_argument("--slow-fraction", type=float, default=0.0)
    emit_child_result(asyncio.run(run(parser.parse_args(argv))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
