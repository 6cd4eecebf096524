"""``multilane broker``: run the embedded broker in the foreground until interrupted. Does I/O.

Exit codes: 0 stopped by SIGTERM/SIGINT, 1 the broker could not start (one line on stderr: a port in
use, a missing binary, an early exit), 2 a bad ``--topic``. The broker process dies with this one.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading

from multilane.testing.broker import BrokerError, EmbeddedBroker, LogTarget


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--port", type=int, default=9092, help="loopback port to listen on")
    parser.add_argument("--topic", action="append", default=[], metavar="NAME:PARTITIONS",
                        help="create a topic after start (repeatable)")
    parser.add_argument("--log-file", default=None, metavar="PATH",
                        help="append the broker's own log to PATH (default: this command's stderr)")


def parse_topics(specs: list[str]) -> list[tuple[str, int]]:
    """``NAME[:PARTITIONS]`` values as (name, partitions); ValueError (one line) on a bad one."""
    out: list[tuple[str, int]] = []
    for spec in specs:
        name, _, parts = spec.partition(":")
        try:
            count = int(parts or "1")
        except ValueError:
            count = 0
        if not name or count < 1:
            raise ValueError(f"--topic {spec!r} must look like NAME or NAME:PARTITIONS (PARTITIONS >= 1)")
        if any(name == seen for seen, _ in out):
            raise ValueError(f"--topic {name!r} is given twice")
        out.append((name, count))
    return out


def run(args: argparse.Namespace) -> int:
    try:
        topics = parse_topics(args.topic)
    except ValueError as exc:
        print(f"multilane broker: {exc}", file=sys.stderr)
        return 2
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    log: LogTarget = args.log_file if args.log_file else sys.stderr.fileno()
    try:
        with EmbeddedBroker(port=args.port, log=log) as broker:
            for name, partitions in topics:
                try:
                    broker.create_topic(name, partitions)
                except Exception as exc:  # KafkaException: e.g. a name the broker refuses
                    raise BrokerError(f"cannot create topic {name!r}: {exc}") from exc
            print(f"broker ready on {broker.bootstrap} (pid {broker.pid}); Ctrl-C to stop", flush=True)
            try:
                while not stop.wait(0.5):
                    code = broker.exit_code()
                    if code is not None:
                        raise BrokerError(f"the broker (pid {broker.pid}) exited with code {code}")
            except KeyboardInterrupt:
                pass
    except BrokerError as exc:
        print(f"multilane broker: {exc}", file=sys.stderr, flush=True)
        return 1
    return 0
