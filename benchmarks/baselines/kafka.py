"""Consumer settings and command-line plumbing shared by the Kafka-consuming baseline children.

Fairness: every consuming row (multilane included, where it lets us) uses :data:`CONSUMER_SETTINGS`.
``fetch.queue.backoff.ms=10`` matters most: librdkafka's default (1000 ms) stalls the next fetch for
about a second once the local queue is full, which caps any consumer at 0.2-0.6M rec/s here.
"""

from __future__ import annotations

import argparse
from typing import Any

CONSUMER_SETTINGS: dict[str, str] = {
    "fetch.queue.backoff.ms": "10",
    "auto.offset.reset": "earliest",
    "enable.auto.commit": "false",
    "session.timeout.ms": "6000",
    "heartbeat.interval.ms": "500",
}


def add_consumer_arguments(parser: argparse.ArgumentParser) -> None:
    """``--bootstrap``, ``--topic``, ``--partition``, ``--group``, ``--records`` (all consumer children)."""
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--partition", type=int, default=0)
    parser.add_argument("--group", required=True)
    parser.add_argument("--records", type=int, required=True, help="stop after this many records")
    parser.add_argument("--timeout", type=float, default=300.0, help="give up after this many seconds")


def assigned_consumer(args: argparse.Namespace, extra: dict[str, str] | None = None) -> Any:
    """A consumer with :data:`CONSUMER_SETTINGS`, statically assigned to the partition from offset 0."""
    from confluent_kafka import Consumer, TopicPartition

    config: dict[str, str] = {
        "bootstrap.servers": args.bootstrap,
        "group.id": args.group,
        **CONSUMER_SETTINGS,
    }
    config.update(extra or {})
    consumer = Consumer(config)
    consumer.assign([TopicPartition(args.topic, args.partition, 0)])
    return consumer
