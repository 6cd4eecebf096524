"""Fault injection for the state crash tests: run ``multilane worker`` with the state manager killing
the process with SIGKILL at a chosen point. Test tooling only: it lives under ``tests/``, which the product
never imports (an import-linter contract in pyproject.toml holds it). Does I/O.

``python -m tests.support.faults --kill-after-flush N -- <multilane worker arguments>``
kills the worker right after the N-th ``before_commit`` returned, i.e. after the changelog flush and
before the engine commits the offset -- the window the durability order has to survive.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from collections.abc import Sequence

from multilane.worker.state.manager import StateManager

__all__ = ["install_kill_after_flush", "main"]


def install_kill_after_flush(n: int) -> None:
    """Patch :meth:`StateManager.before_commit` to SIGKILL this process after its ``n``-th return."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    original = StateManager.before_commit
    lock = threading.Lock()
    calls = [0]

    def before_commit(self: StateManager, topic: str, partition: int, offset: int) -> None:
        original(self, topic, partition, offset)
        with lock:
            calls[0] += 1
            if calls[0] >= n:
                print(
                    f"faults: SIGKILL after flush #{calls[0]} ({topic}[{partition}] offset {offset})",
                    file=sys.stderr,
                    flush=True,
                )
                os.kill(os.getpid(), signal.SIGKILL)

    StateManager.before_commit = before_commit  # type: ignore[method-assign]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.support.faults")
    parser.add_argument("--kill-after-flush", type=int, required=True)
    parser.add_argument("worker_args", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    worker_args = [a for a in args.worker_args if a != "--"]
    install_kill_after_flush(args.kill_after_flush)
    from multilane.worker import cli

    wparser = argparse.ArgumentParser(prog="multilane worker")
    cli.add_arguments(wparser)
    return cli.run(wparser.parse_args(worker_args))


if __name__ == "__main__":
    raise SystemExit(main())
