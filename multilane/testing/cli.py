"""``multilane broker``: run the embedded broker in the foreground until interrupted."""

from __future__ import annotations

import argparse
import signal
import threading

from multilane.testing.broker import EmbeddedBroker


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--port", type=int, default=9092, help="loopback port to listen on")
    parser.add_argument("--topic", action="append", default=[], metavar="NAME:PARTITIONS",
                        help="create a topic after start (repeatable)")


def run(args: argparse.Namespace) -> int:
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with EmbeddedBroker(port=args.port) as broker:
        for spec in args.topic:
            name, _, parts = spec.partition(":")
            broker.create_topic(name, int(parts or "1"))
        print(f"broker ready on {broker.bootstrap} (pid {broker.pid}); Ctrl-C to stop", flush=True)
        try:
            stop.wait()
        except KeyboardInterrupt:
            pass
    return 0
