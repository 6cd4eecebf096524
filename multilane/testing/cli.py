"""``multilane broker``: run a broker for a person in the foreground until interrupted (I/O).

``--kind embedded`` (default) is the embedded Tansu broker; ``--kind apache`` is Apache Kafka
(:mod:`multilane.testing.apache`, jars from ``scripts/kafka-jars.sh``).
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading

from multilane.testing.broker import BrokerError, KafkaBroker


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--kind", choices=("embedded", "apache"), default="embedded",
                        help="embedded: Tansu, memory only (default); apache: Apache Kafka, single KRaft "
                             "node with transactions and share groups")
    parser.add_argument("--port", type=int, default=9092, help="loopback port to listen on")
    parser.add_argument("--topic", action="append", default=[], metavar="NAME:PARTITIONS",
                        help="create a topic after start (repeatable)")
    parser.add_argument("--log", default=None, metavar="FILE",
                        help="the broker's log file (default: a temporary file; apache: removed at stop)")


def run(args: argparse.Namespace) -> int:
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        if args.kind == "apache":
            from multilane.testing.apache import ApacheKafka

            broker: KafkaBroker = ApacheKafka(port=args.port, log_path=args.log).start()
        else:
            from multilane.testing.broker import EmbeddedBroker

            broker = EmbeddedBroker(port=args.port, log_path=args.log).start()
    except BrokerError as exc:
        print(f"multilane broker: {exc}", file=sys.stderr)
        return 1
    try:
        for spec in args.topic:
            name, _, parts = spec.partition(":")
            broker.create_topic(name, int(parts or "1"))
        print(f"{args.kind} broker ready on {broker.bootstrap} (pid {broker.pid}); Ctrl-C to stop",
              flush=True)
        try:
            stop.wait()
        except KeyboardInterrupt:
            pass
    finally:
        broker.stop()
    return 0
