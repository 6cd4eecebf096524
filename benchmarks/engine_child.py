"""The engine benchmark's child processes (a fresh interpreter per row). Does I/O: Kafka.

``python -m benchmarks.engine_child run ...``: one multilane measurement through the engine's Python
API, JSON on the last stdout line. ``python -m benchmarks.engine_child worker-ignoring-progress ...``:
``multilane worker`` with progress beyond the committed offset ignored on assignment (scenario 5's
watermark-only baseline).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from benchmarks.baselines.workload import latency_s
from benchmarks.engine_rows import BASE_MS

# ------------------------------------------------------------------------------------------ child


def child_main(argv: Sequence[str]) -> int:
    """``python -m benchmarks.engine_child run ...``: one multilane measurement, JSON on the last line."""
    from benchmarks._children import emit_child_result

    parser = argparse.ArgumentParser(prog="python -m benchmarks.engine_child run")
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

    from benchmarks._children import Meter
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
    written (that costs time, not replays). If the ownership protocol's progress step is gone, this
    fails loudly and the row says so.
    """
    from multilane.cli import main as multilane_main
    from multilane.worker.ownership import Ownership

    if not hasattr(Ownership, "load_progress"):
        print("Ownership.load_progress is gone: cannot ignore progress", file=sys.stderr)
        return 2

    def no_progress(self: Any, tp: Any, committed: Any) -> None:
        return None

    Ownership.load_progress = no_progress  # type: ignore[method-assign]
    return multilane_main(["worker", *argv])


if __name__ == "__main__":
    if sys.argv[1:2] == ["run"]:
        raise SystemExit(child_main(sys.argv[2:]))
    if sys.argv[1:2] == ["worker-ignoring-progress"]:
        raise SystemExit(worker_ignoring_progress(sys.argv[2:]))
    print("usage: python -m benchmarks.engine_child run|worker-ignoring-progress ARGS", file=sys.stderr)
    raise SystemExit(2)
