"""``multilane broker``: run a broker for a person in the foreground until interrupted (I/O).

``--kind embedded`` (default) is the embedded Tansu broker; ``--kind apache`` is Apache Kafka
(:mod:`multilane.testing.apache`, jars from ``scripts/kafka-jars.sh``). Either dies with this command.

Exit codes: 0 stopped by SIGTERM/SIGINT, 1 the broker could not start or stopped by itself (one line on
stderr: a port in use, a missing binary, an early exit), 2 a bad ``--topic``.
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
                        help="append the broker's own log to FILE (default: embedded: this command's "
                             "stderr; apache: a temporary file, removed at stop)")


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


def _start(args: argparse.Namespace) -> KafkaBroker:
    if args.kind == "apache":
        from multilane.testing.apache import ApacheKafka

        return ApacheKafka(port=args.port, log_path=args.log).start()
    from multilane.testing.broker import EmbeddedBroker

    return EmbeddedBroker(port=args.port, log_path=args.log or sys.stderr.fileno()).start()


def _exit_code(broker: KafkaBroker) -> int | None:
    """The broker process's exit code once it ended by itself (None while it runs, or when the kind of
    broker does not tell: :meth:`EmbeddedBroker.exit_code`)."""
    tell = getattr(broker, "exit_code", None)
    return tell() if callable(tell) else None


def run(args: argparse.Namespace) -> int:
    try:
        topics = parse_topics(args.topic)
    except ValueError as exc:
        print(f"multilane broker: {exc}", file=sys.stderr)
        return 2
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        broker = _start(args)
    except BrokerError as exc:
        print(f"multilane broker: {exc}", file=sys.stderr, flush=True)
        return 1
    try:
        for name, partitions in topics:
            try:
                broker.create_topic(name, partitions)
            except Exception as exc:  # KafkaException: e.g. a name the broker refuses
                raise BrokerError(f"cannot create topic {name!r}: {exc}") from exc
        print(f"{args.kind} broker ready on {broker.bootstrap} (pid {broker.pid}); Ctrl-C to stop",
              flush=True)
        try:
            while not stop.wait(0.5):
                code = _exit_code(broker)
                if code is not None:
                    raise BrokerError(f"the broker (pid {broker.pid}) exited with code {code}")
        except KeyboardInterrupt:
            pass
    except BrokerError as exc:
        print(f"multilane broker: {exc}", file=sys.stderr, flush=True)
        return 1
    finally:
        broker.stop()
    return 0
