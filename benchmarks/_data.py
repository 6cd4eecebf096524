"""The benchmarks' data: a broker per run (:func:`broker_session`, stopped by PID; the embedded one or
Apache Kafka, or each in turn with :func:`broker_passes`) and one topic of Zipf-keyed records
(:func:`produce_zipf`, with multilane's loadgen, or a built-in producer
when that is not importable). Does I/O: the broker process and Kafka.
"""

from __future__ import annotations

import argparse
import contextlib
import random
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from benchmarks._common import Column, Report, log

__all__ = ["BROKER_KINDS", "ProducedTopic", "add_broker_argument", "broker_passes", "broker_session",
           "produce_zipf", "zipf_key", "zipf_top_share", "zipf_weights"]

# "embedded": Tansu (multilane.testing.broker.EmbeddedBroker); "apache": Apache Kafka in one JVM
# (multilane.testing.apache.ApacheKafka, jars from scripts/kafka-jars.sh).
BROKER_KINDS = ("embedded", "apache")


def add_broker_argument(parser: argparse.ArgumentParser) -> None:
    """The ``--broker embedded|apache|both`` option (default embedded)."""
    parser.add_argument(
        "--broker", choices=(*BROKER_KINDS, "both"), default="embedded",
        help="the broker the rows run against: the embedded one (Tansu), Apache Kafka, or both in turn "
        "(one table, a 'broker' column; Apache Kafka's jars: bash scripts/kafka-jars.sh)",
    )  # fmt: skip


@contextlib.contextmanager
def broker_session(kind: str = "embedded") -> Iterator[Any]:
    """Start a broker of ``kind`` (:data:`BROKER_KINDS`) for this run; stop it by PID when the block ends."""
    broker: Any
    if kind == "embedded":
        from multilane.testing.broker import EmbeddedBroker

        broker = EmbeddedBroker()
    elif kind == "apache":
        from multilane.testing.apache import ApacheKafka

        broker = ApacheKafka()
    else:
        raise ValueError(f"unknown broker kind {kind!r}; choose from {BROKER_KINDS}")
    broker.start(timeout=300) if kind == "apache" else broker.start()  # a JVM starts slowly under load
    log(f"{kind} broker pid {broker.pid} on {broker.bootstrap}")
    try:
        yield broker
    finally:
        broker.stop()


def broker_passes(report: Report, choice: str) -> Iterator[str]:
    """The broker kinds of ``--broker choice``, each a pass of the body; call before making tables.

    1. Every table made afterwards leads with a ``broker`` column; ``report.params["brokers"]`` lists
       the kinds.
    2. While the caller handles a kind, rows and goals are stamped with it (``report.stamp``).
    3. After the last pass the stamp is cleared.
    """
    kinds = BROKER_KINDS if choice == "both" else (choice,)
    if choice not in (*BROKER_KINDS, "both"):
        raise ValueError(f"--broker {choice!r}: choose from {(*BROKER_KINDS, 'both')}")
    # 1.
    report.params["brokers"] = list(kinds)
    if not any(c.key == "broker" for c in report.stamp_columns):
        report.stamp_columns.insert(0, Column("broker"))
    return _passes(report, kinds)


def _passes(report: Report, kinds: tuple[str, ...]) -> Iterator[str]:
    try:
        for kind in kinds:
            # 2.
            report.stamp["broker"] = kind
            log(f"--- broker: {kind}")
            yield kind
    finally:
        # 3.
        report.stamp.pop("broker", None)


def zipf_weights(n_keys: int, s: float) -> list[float]:
    """Unnormalised Zipf weights ``1 / rank**s`` for ranks 1..n_keys."""
    return [1.0 / (rank**s) for rank in range(1, n_keys + 1)]


def zipf_top_share(n_keys: int, s: float) -> float:
    """The share of records that carry the most frequent key (rank 1) under Zipf(s) over n_keys."""
    w = zipf_weights(n_keys, s)
    return w[0] / sum(w)


def zipf_key(rank: int) -> bytes:
    """The key of Zipf rank ``rank`` (1 = most frequent)."""
    return b"key-%d" % rank


@dataclass(frozen=True)
class ProducedTopic:
    """What :func:`produce_zipf` wrote, from delivery reports (exact offsets, in offset order).

    Invariant: the offsets ``first_offset .. last_offset`` are exactly the produced records.
    """

    topic: str
    records: int
    first_offset: int
    last_offset: int
    seconds: float
    keys: list[bytes]  # keys[i] is the key of the record at offset first_offset + i
    generator: str  # which producer made it: multilane's loadgen or the builtin fallback


def produce_zipf(
    bootstrap: str,
    topic: str,
    records: int,
    value_bytes: int = 100,
    n_keys: int = 10_000,
    s: float = 1.0,
    seed: int = 1,
    producer_config: Mapping[str, Any] | None = None,
) -> ProducedTopic:
    """Produce ``records`` records of ``value_bytes`` bytes to partition 0, keys Zipf(s) over ``n_keys``.

    Uses :func:`multilane.testing.loadgen.produce_records` (random, incompressible values) when it
    imports, else a builtin generator. Uncompressed unless ``producer_config`` says otherwise.
    Deterministic for a given seed; for a given seed a shorter run's keys are a prefix of a longer
    run's. Values are never empty (the embedded broker skips empty values). Offsets and keys come from
    delivery reports, never from the broker's (under-reported) end offset.
    """
    config: dict[str, Any] = {"compression.type": "none", **(producer_config or {})}
    try:
        from multilane.testing.loadgen import produce_records
    except ImportError:
        return _produce_zipf_builtin(bootstrap, topic, records, value_bytes, n_keys, s, seed, config)
    result = produce_records(
        bootstrap, topic, records, keys=n_keys, value_size=value_bytes, zipf_s=s, seed=seed, partition=0,
        producer_config=config,
    )  # fmt: skip
    by_offset = {r.offset: r.key or b"" for r in result.records}
    return _produced(topic, records, by_offset, result.elapsed_s, result.errors,
                     f"multilane.testing.loadgen ({result.sampler} sampler)")  # fmt: skip


def _produced(
    topic: str, records: int, by_offset: dict[int, bytes], seconds: float, errors: list[str], generator: str
) -> ProducedTopic:
    """Check that exactly ``records`` contiguous offsets were delivered; the :class:`ProducedTopic`."""
    first, last = (min(by_offset), max(by_offset)) if by_offset else (0, -1)
    if len(by_offset) != records or last - first + 1 != records:
        raise RuntimeError(
            f"produced {len(by_offset)}/{records} records to {topic} (offsets {first}..{last}); "
            f"errors: {errors[:3]}"
        )
    return ProducedTopic(
        topic=topic,
        records=records,
        first_offset=first,
        last_offset=last,
        seconds=seconds,
        keys=[by_offset[o] for o in range(first, last + 1)],
        generator=generator,
    )


def _produce_zipf_builtin(
    bootstrap: str,
    topic: str,
    records: int,
    value_bytes: int,
    n_keys: int,
    s: float,
    seed: int,
    producer_config: Mapping[str, Any],
) -> ProducedTopic:
    """The fallback generator of :func:`produce_zipf` (Python's ``random``, cycled random values)."""
    from confluent_kafka import Producer

    rng = random.Random(seed)
    ranks = rng.choices(range(1, n_keys + 1), weights=zipf_weights(n_keys, s), k=records)
    keys = [zipf_key(r) for r in range(n_keys + 1)]
    size = max(1, value_bytes)
    pool = random.Random(seed ^ 0x5EED).randbytes(size * 4096)
    values = [pool[i * size : (i + 1) * size] for i in range(4096)]
    config: dict[str, Any] = {
        "bootstrap.servers": bootstrap,
        "linger.ms": 20,
        "batch.size": 1_000_000,
        "queue.buffering.max.messages": 1_000_000,
        "queue.buffering.max.kbytes": 1_048_576,
        "acks": 1,
        "enable.idempotence": False,
    }
    config.update(producer_config)
    producer = Producer(config)
    failed: list[str] = []
    by_offset: dict[int, bytes] = {}

    def on_delivery(err: Any, msg: Any) -> None:
        if err is not None:
            failed.append(str(err))
            return
        by_offset[msg.offset()] = msg.key()

    t0 = time.perf_counter()
    for i, rank in enumerate(ranks):
        key, value = keys[rank], values[i % len(values)]
        while True:
            try:
                producer.produce(topic, value=value, key=key, partition=0, on_delivery=on_delivery)
                break
            except BufferError:
                producer.poll(0.05)
        producer.poll(0)
    producer.flush(120)
    return _produced(topic, records, by_offset, time.perf_counter() - t0, failed, "builtin (Python random)")
