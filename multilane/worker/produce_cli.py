"""``multilane produce``: send records from a file or stdin to a topic, for trying an app out. Does I/O.

One record per non-empty line. The value is the line itself (without its line end). With
``--key-field F`` every line must be a JSON object, and the key is its field ``F`` (a string as is,
anything else as JSON); without it records have no key, or the ``--key`` given. The whole input is read
and checked before anything is sent, so a bad line (named by its number, one line on stderr, exit 2)
sends nothing. Prints ``{"topic": ..., "produced": N}`` once every record is acknowledged; exit 1 when a
record could not be delivered.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable
from typing import IO

__all__ = ["LineError", "add_arguments", "parse_lines", "run"]


class LineError(ValueError):
    """An input line that cannot become a record (its number and why)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    a = parser.add_argument
    a("--bootstrap-servers", required=True, help="Kafka bootstrap servers, HOST:PORT[,...] (required)")
    a("--topic", required=True, help="the topic to send to (required)")
    a("--input", default="-", metavar="FILE", help="read lines from FILE ('-' = stdin)")
    a("--key-field", default=None, metavar="FIELD",
      help="lines are JSON objects; the key is this field (a string as is, anything else as JSON)")
    a("--key", default=None, help="the same key for every record (without --key-field)")
    a("--partition", type=int, default=None, help="send to this partition (None: by key)")
    a("--create-partitions", type=int, default=0,
      help="create the topic with this many partitions first, if it does not exist (0 = no)")


def parse_lines(lines: Iterable[str], key_field: str | None = None,
                key: str | None = None) -> list[tuple[bytes | None, bytes]]:
    """``(key, value)`` per non-empty line; :class:`LineError` naming the first bad line. Pure."""
    out: list[tuple[bytes | None, bytes]] = []
    fixed = key.encode() if key is not None else None
    for number, line in enumerate(lines, 1):
        text = line.rstrip("\r\n")
        if not text.strip():
            continue
        if key_field is None:
            out.append((fixed, text.encode()))
            continue
        try:
            obj = json.loads(text)
        except ValueError as exc:
            raise LineError(f"line {number}: not JSON ({exc}); --key-field needs JSON objects") from None
        if not isinstance(obj, dict):
            raise LineError(f"line {number}: a JSON {type(obj).__name__}, not an object")
        if key_field not in obj:
            raise LineError(f"line {number}: no field {key_field!r}")
        k = obj[key_field]
        out.append(((k if isinstance(k, str) else json.dumps(k)).encode(), text.encode()))
    return out


def _read(path: str) -> list[str]:
    if path == "-":
        return sys.stdin.readlines()
    with open(path, encoding="utf-8") as f:
        return f.readlines()


def _send(bootstrap: str, topic: str, records: list[tuple[bytes | None, bytes]],
          partition: int | None) -> int:
    """Produce ``records`` in order; the number acknowledged."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "enable.idempotence": True})
    delivered = 0
    failed: list[str] = []

    def done(err: object, _msg: object) -> None:
        nonlocal delivered
        if err is None:
            delivered += 1
        else:
            failed.append(str(err))

    for key, value in records:
        while True:
            try:
                if partition is None:
                    producer.produce(topic, value=value, key=key, on_delivery=done)
                else:
                    producer.produce(topic, value=value, key=key, partition=partition, on_delivery=done)
                break
            except BufferError:
                producer.poll(0.05)
        producer.poll(0)
    remaining = producer.flush(60)
    if failed or remaining:
        print(f"multilane produce: {len(failed) + remaining} record(s) not delivered"
              f"{': ' + failed[0] if failed else ''}", file=sys.stderr)
    return delivered


def _create_topic(bootstrap: str, topic: str, partitions: int) -> None:
    """Create ``topic``; an existing one is kept as it is. (No metadata request first: a broker that
    auto-creates topics would create it on that request, with its default partition count.)"""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    fut = admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=-1)])[topic]
    try:
        fut.result(30)
    except KafkaException as exc:
        if "already exists" not in str(exc).lower() and "TOPIC_ALREADY_EXISTS" not in str(exc):
            raise


def run(args: argparse.Namespace, stdout: IO[str] | None = None) -> int:
    out = stdout or sys.stdout
    if args.key is not None and args.key_field is not None:
        print("multilane produce: use either --key or --key-field", file=sys.stderr)
        return 2
    try:
        records = parse_lines(_read(args.input), args.key_field, args.key)
    except (LineError, OSError, UnicodeDecodeError) as exc:
        print(f"multilane produce: {args.input}: {exc}", file=sys.stderr)
        return 2
    if args.create_partitions > 0:
        _create_topic(args.bootstrap_servers, args.topic, args.create_partitions)
    delivered = _send(args.bootstrap_servers, args.topic, records, args.partition)
    print(json.dumps({"topic": args.topic, "produced": delivered}), file=out, flush=True)
    return 0 if delivered == len(records) else 1
