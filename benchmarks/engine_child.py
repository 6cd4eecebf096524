"""The engine benchmark's child processes (a fresh interpreter per row). Does I/O: Kafka.

``python -m benchmarks.engine_child run ...``: one multilane measurement through the engine's Python
API, JSON on the last stdout line, after the delivery checkers ran over the run's processing events
(``--keys-file``: the produced keys); ``--loop uvloop`` runs it on uvloop, ``--profile PATH`` under
cProfile (stats written to PATH). ``python -m benchmarks.engine_child baseline --loop L MODULE ARGS``:
a baseline child module (``bare_asyncio``, ``naive_batch``) on event loop L.
``python -m benchmarks.engine_child worker-ignoring-progress ...``: ``multilane worker`` with progress
beyond the committed offset ignored on assignment (scenario 5's watermark-only baseline).
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
    parser.add_argument("--loop", choices=LOOPS, default="asyncio")
    parser.add_argument("--keys-file", help="marshal'ed list of the produced keys (for the checkers)")
    parser.add_argument("--first-offset", type=int, default=0, help="offset of the first produced key")
    parser.add_argument("--profile", metavar="PATH", help="run under cProfile; write its stats to PATH")
    args = parser.parse_args(argv)
    use_loop(args.loop)
    profiler = None
    if args.profile:
        import cProfile

        profiler = cProfile.Profile()
    result = run_multilane_child(args, profiler)
    if profiler is not None:
        profiler.dump_stats(args.profile)
    emit_child_result(result)
    return 0


LOOPS = ("asyncio", "uvloop")


def use_loop(name: str) -> None:
    """Make ``asyncio.run`` use the named event loop (``uvloop``: its policy; needs the package)."""
    if name == "uvloop":
        import asyncio

        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())


def baseline_main(argv: Sequence[str]) -> int:
    """``engine_child baseline --loop L MODULE ARGS``: run a baseline child's ``main(ARGS)`` on loop L."""
    import importlib

    parser = argparse.ArgumentParser(prog="python -m benchmarks.engine_child baseline")
    parser.add_argument("--loop", choices=LOOPS, default="asyncio")
    parser.add_argument(
        "module", choices=("benchmarks.baselines.bare_asyncio", "benchmarks.baselines.naive_batch")
    )
    args, rest = parser.parse_known_args(argv)
    use_loop(args.loop)
    return int(importlib.import_module(args.module).main(rest))


class EventRecorder:
    """The processor's starts and ends, in order, as one list of ints (cheap on the hot path).

    ``log`` holds ``offset`` for a start and ``-1 - offset`` for an end; :meth:`events` turns it into the
    checkers' :class:`~multilane.testing.processors.ProcessingEvent` list after the run.
    """

    def __init__(self) -> None:
        self.log: list[int] = []

    def events(self, topic: str, partition: int, key_of: Callable[[int], bytes | None]) -> list[Any]:
        import os

        from multilane.testing.processors import ProcessingEvent

        pid = os.getpid()
        out = []
        for seq, x in enumerate(self.log):
            kind, offset = ("start", x) if x >= 0 else ("end", -1 - x)
            out.append(ProcessingEvent(kind, 0.0, pid, topic, partition, offset, key_of(offset), 1, -1, seq))
        return out


def check_run(args: argparse.Namespace, recorder: EventRecorder) -> list[str]:
    """The delivery checkers over the run's events (its ordering mode's set); the failures, as text.

    The produced set is the first ``--records`` records of ``--keys-file``. Records the engine started
    after the measured ones (it keeps fetching until stopped) are outside the produced set only when the
    topic holds more records; the benchmark's topics hold exactly ``--records``.
    """
    import marshal

    from multilane.testing.checkers import ProducedRecord, check_delivery

    if not args.keys_file:
        return ["no --keys-file: delivery not checked"]
    with open(args.keys_file, "rb") as f:
        keys: list[bytes] = marshal.load(f)
    first = args.first_offset
    keys = keys[: args.records]
    produced = [ProducedRecord(args.topic, args.partition, first + i, k) for i, k in enumerate(keys)]

    def key_of(offset: int) -> bytes | None:
        i = offset - first
        return keys[i] if 0 <= i < len(keys) else None

    events = recorder.events(args.topic, args.partition, key_of)
    results = check_delivery(produced, events, mode=args.ordering)
    return [str(r) for r in results if not r.ok]


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
    recorder: EventRecorder,
) -> Any:
    """The measured processor: a no-op (async or sync) or the shared latency model, then ``on_done``.

    Every attempt's start and end go to ``recorder`` (for the delivery checkers after the run).
    """
    import asyncio

    base, slow = base_ms / 1000, slow_ms / 1000
    note = recorder.log.append

    async def async_noop(record: Any, ctx: Any) -> None:
        offset = record.offset
        note(offset)
        note(-1 - offset)
        on_done()

    def sync_noop(record: Any, ctx: Any) -> None:
        offset = record.offset
        note(offset)
        note(-1 - offset)
        on_done()

    async def async_sleep(record: Any, ctx: Any) -> None:
        offset = record.offset
        note(offset)
        running.now += 1
        if running.now > running.peak:
            running.peak = running.now
        await asyncio.sleep(latency_s(offset, base, slow, slow_fraction))
        running.now -= 1
        note(-1 - offset)
        on_done()

    return {"async-noop": async_noop, "sync-noop": sync_noop, "async-sleep": async_sleep}[kind]


def run_multilane_child(args: argparse.Namespace, profiler: Any = None) -> dict[str, Any]:
    """Run multilane's engine (operator mode: ``assign()``, no group join) until N records completed.

    1. Build the engine through its Python API with the processor wrapped in a completion counter.
    2. Start it; the meter starts at the first completion and stops at the N-th.
    3. Stop the engine (drain, final commit) after the measurement; that is not timed.
    4. Apply the delivery checkers to the processing events; a failed check fails the row.

    ``profiler`` (a ``cProfile.Profile``) runs from the first completion to the N-th, like the meter:
    it sees the loop thread only (a sync processor's pool threads are not profiled).
    The meter counts this process's CPU (every thread, librdkafka's included); the broker is another
    process and is not counted.
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
    records = args.records

    def count() -> None:
        nonlocal done
        done += 1
        if done == 1:
            meter.start(already=1)
            if profiler is not None:
                profiler.enable()
        if done == records:
            if profiler is not None:
                profiler.disable()
            meter.stop()
            finished.set()

    def count_locked() -> None:
        with lock:
            count()

    # async processors complete on the loop thread only: no lock needed (the bare loop takes none)
    on_done = count_locked if args.processor.startswith("sync") else count
    recorder = EventRecorder()

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
        make_processor(
            args.processor, args.base_ms, args.slow_ms, args.slow_fraction, on_done, running, recorder
        ),
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
    result = meter.result(
        args.records, ordering=args.ordering, factor=args.factor, processor=args.processor, loop=args.loop,
        peak_running=running.peak,  # diagnostic: did the engine ever run F records at once?
    )  # fmt: skip
    # 4.
    failures = check_run(args, recorder)
    if failures and args.keys_file:
        raise AssertionError("delivery checks failed: " + " / ".join(failures))
    result["checked"] = not failures
    return result


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

    def no_progress(self: Any, tp: Any, committed: Any, hint: Any = None) -> None:
        return None

    Ownership.load_progress = no_progress  # type: ignore[method-assign]
    return multilane_main(["worker", *argv])


if __name__ == "__main__":
    if sys.argv[1:2] == ["run"]:
        raise SystemExit(child_main(sys.argv[2:]))
    if sys.argv[1:2] == ["baseline"]:
        raise SystemExit(baseline_main(sys.argv[2:]))
    if sys.argv[1:2] == ["worker-ignoring-progress"]:
        raise SystemExit(worker_ignoring_progress(sys.argv[2:]))
    print(
        "usage: python -m benchmarks.engine_child run|baseline|worker-ignoring-progress ARGS", file=sys.stderr
    )
    raise SystemExit(2)
