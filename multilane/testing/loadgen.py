"""Produce synthetic records with Zipf-distributed keys, and know exactly what landed (the library behind
``multilane loadgen``, whose command line is :mod:`multilane.testing.loadgen_cli`).

Does I/O: produces to Kafka (confluent-kafka), optionally creates the topic and writes the produced set
to a file.

Library use (tests and benchmarks)::

    result = produce_records(bootstrap, topic, n=100_000, keys=1000, value_size=100, seed=1)
    result.records  # [ProducedRecord(topic, partition, offset, key), ...] from delivery reports

or paced: ``produce_paced(bootstrap, topic, profile=RateProfile.parse("1000x10,5000x5,0x5"))``.

Keys: ``keys`` distinct keys ``b"key-000000"``... (precomputed); key ``i`` (0-based) is drawn with
probability proportional to ``1 / (i + 1) ** zipf_s`` (``zipf_s = 0`` is uniform; ``keys = 0`` produces
null keys). The key sequence is a function of ``(seed, keys, zipf_s, n)`` and the sampler (numpy's
``default_rng`` when numpy is importable, else Python's ``random.Random``; :attr:`LoadResult.sampler`
says which). Values are ``value_size`` (>= 1) random bytes, cycled from a pool of distinct values larger than
compression windows (so batches do not compress to nothing); never empty.

Every record counts once its delivery report arrives: ``records`` is the exact produced set (offsets
from the reports, never from end offsets, which the embedded broker under-reports).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import math
import random
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, TypedDict, Unpack

from multilane.testing.checkers import ProducedRecord

__all__ = [
    "LoadOptions",
    "LoadResult",
    "RateProfile",
    "RateStep",
    "ZipfKeySampler",
    "produce_paced",
    "produce_records",
    "read_produced",
]

DEFAULT_PRODUCER_CONFIG: dict[str, Any] = {
    "linger.ms": 5,
    "batch.num.messages": 100_000,
    "batch.size": 1_000_000,
    "queue.buffering.max.messages": 2_000_000,
    "queue.buffering.max.kbytes": 1_048_576,
    "compression.type": "lz4",
    "acks": "all",
    # a retried produce request must not write its records twice (seen on Apache Kafka under load:
    # the checkers then count records that were never produced once)
    "enable.idempotence": True,
}
_POLL_EVERY = 1 << 14  # serve delivery reports every 16k records (keeps the local queue bounded)


@dataclass(frozen=True, slots=True)
class RateStep:
    """Produce at ``rate`` records/s for ``duration_s`` seconds. Invariant: both >= 0."""

    rate: float
    duration_s: float

    def __post_init__(self) -> None:
        if self.rate < 0 or self.duration_s < 0:
            raise ValueError(f"rate and duration must be >= 0, got {self.rate} rec/s for {self.duration_s} s")


@dataclass(frozen=True, slots=True)
class RateProfile:
    """A sequence of constant-rate steps (constant load, bursts, lulls). Invariant: at least one step."""

    steps: tuple[RateStep, ...]

    def __post_init__(self) -> None:
        if not self.steps:
            raise ValueError("a rate profile needs at least one step")

    @classmethod
    def constant(cls, rate: float, duration_s: float) -> RateProfile:
        return cls((RateStep(rate, duration_s),))

    @classmethod
    def parse(cls, text: str) -> RateProfile:
        """``"RATExSECONDS,RATExSECONDS,..."``, e.g. ``"1000x10,5000x5,0x5"`` (a burst, then a lull)."""
        steps = []
        for part in text.split(","):
            rate, sep, dur = part.strip().partition("x")
            if not sep:
                raise ValueError(f"rate profile step {part!r} must look like RATExSECONDS, e.g. 1000x10")
            try:
                steps.append(RateStep(float(rate), float(dur)))
            except ValueError as exc:
                raise ValueError(f"rate profile step {part!r}: {exc}") from exc
        return cls(tuple(steps))

    @property
    def duration_s(self) -> float:
        return sum(s.duration_s for s in self.steps)

    @property
    def total_records(self) -> int:
        return int(sum(s.rate * s.duration_s for s in self.steps))

    def due(self, elapsed: float) -> int:
        """How many records should have been produced ``elapsed`` seconds after the start."""
        total = 0.0
        for s in self.steps:
            if elapsed <= s.duration_s:
                return int(total + s.rate * max(0.0, elapsed))
            total += s.rate * s.duration_s
            elapsed -= s.duration_s
        return int(total)


class ZipfKeySampler:
    """Draws key indices from a bounded Zipf distribution; keys are precomputed bytes.

    Invariant: ``keys`` has ``n_keys`` distinct entries; ``_cum`` is the normalised cumulative weight
    (non-decreasing, last element 1.0).
    """

    def __init__(self, n_keys: int, zipf_s: float = 1.1, seed: int = 0) -> None:
        if n_keys < 0:
            raise ValueError(f"number of keys must be >= 0, got {n_keys}")
        if zipf_s < 0:
            raise ValueError(f"zipf exponent must be >= 0, got {zipf_s}")
        self.n_keys = n_keys
        self.zipf_s = zipf_s
        self.seed = seed
        self.keys: list[bytes] = [b"key-%06d" % i for i in range(n_keys)]
        weights = [1.0 / (i + 1) ** zipf_s for i in range(n_keys)]
        total = sum(weights) or 1.0
        self._cum = [c / total for c in itertools.accumulate(weights)]
        if self._cum:
            self._cum[-1] = 1.0
        self.sampler = "none"

    def indices(self, n: int) -> list[int]:
        """``n`` key indices (reproducible for a given seed and sampler)."""
        if self.n_keys == 0:
            self.sampler = "none"
            return []
        try:
            import numpy as np
        except ImportError:
            self.sampler = "python"
            rng = random.Random(self.seed)
            return rng.choices(range(self.n_keys), cum_weights=self._cum, k=n)
        self.sampler = "numpy"
        cum = np.asarray(self._cum)
        draws = np.random.default_rng(self.seed).random(n)
        idx = np.minimum(np.searchsorted(cum, draws, side="right"), self.n_keys - 1)
        return [int(i) for i in idx.tolist()]

    def key_stream(self, n: int) -> Iterator[bytes | None]:
        if self.n_keys == 0:
            return itertools.repeat(None, n)
        keys = self.keys
        return (keys[i] for i in self.indices(n))


@dataclass
class LoadResult:
    """What a load generation run produced. Invariant: ``len(records) == delivered``."""

    topic: str
    records: list[ProducedRecord] = field(default_factory=list)
    failed: int = 0  # delivery reports with an error
    errors: list[str] = field(default_factory=list)  # the first few delivery errors
    elapsed_s: float = 0.0
    sampler: str = "none"
    skipped: int = 0
    """Paced runs: records due that were never produced because the generator fell more than
    ``max_behind_s`` behind its profile (a shortfall of the offered load, reported, never caught up
    in a spike)."""
    delivered_per_s: list[int] = field(default_factory=list)
    """Paced runs: delivery reports received in each second since the start (the achieved rate)."""
    offered_per_s: list[float] = field(default_factory=list)
    """Paced runs: records/s the profile asked for in each second since the start."""
    latency_max_per_s: list[float] = field(default_factory=list)
    """Paced runs: the longest produce -> delivery report time (s) of the reports of each second (the
    broker's side of a shortfall: records produced on time but acknowledged late)."""
    started_monotonic: float = 0.0
    """Paced runs: ``time.monotonic()`` at the profile's second 0 (after the producer was ready); on
    Linux the clock is shared by all processes, so a parent can place the profile on its own clock."""
    ready_s: float = 0.0
    """Paced runs: how long the producer took to become ready before second 0 (metadata, and the
    producer id of an idempotent producer)."""

    @property
    def delivered(self) -> int:
        return len(self.records)

    @property
    def rate(self) -> float:
        return self.delivered / self.elapsed_s if self.elapsed_s > 0 else 0.0

    def summary(self) -> dict[str, Any]:
        return {
            "topic": self.topic,
            "delivered": self.delivered,
            "failed": self.failed,
            "elapsed_s": round(self.elapsed_s, 3),
            "rate": round(self.rate, 1),
            "sampler": self.sampler,
            "skipped": self.skipped,
            "ready_s": round(self.ready_s, 3),
            "errors": self.errors[:5],
        }


VALUE_POOL_BYTES = 4 << 20  # distinct random values cycled through: larger than compressors' windows


def _values(value_size: int, seed: int) -> list[bytes]:
    """A pool of distinct random values, so record batches do not compress to nothing.

    Identical values would let a 1 MiB compressed fetch response expand to hundreds of MiB and make
    memory and throughput measurements meaningless. The pool (>= 4 MiB and >= 16 values) is larger
    than the lz4/snappy windows; values are cycled in order.
    """
    if value_size < 1:
        raise ValueError(f"value size must be >= 1 byte, got {value_size}")
    count = max(16, min(1 << 16, VALUE_POOL_BYTES // value_size))
    blob = random.Random(seed ^ 0x5EED).randbytes(count * value_size)
    return [blob[i * value_size : (i + 1) * value_size] for i in range(count)]


class _Clock:
    """Second 0 of a paced run (``t0``, None until the producer is ready: reports before it count
    in second 0). One owner: :func:`produce_paced` sets ``t0`` once."""

    def __init__(self) -> None:
        self.t0: float | None = None


def _producer(
    bootstrap: str,
    result: LoadResult,
    extra: Mapping[str, Any] | None,
    clock: _Clock | None = None,
    on_stats: Callable[[str], None] | None = None,
) -> Any:
    """A producer whose delivery reports fill ``result`` (with ``clock``: also ``delivered_per_s`` and
    ``latency_max_per_s``, per second since ``clock.t0``)."""
    from confluent_kafka import Producer

    records = result.records
    topic = result.topic
    per_s = result.delivered_per_s
    latency = result.latency_max_per_s

    def on_delivery(err: Any, msg: Any) -> None:
        if err is None:
            records.append(ProducedRecord(topic, msg.partition(), msg.offset(), msg.key()))
            if clock is not None:
                second = 0 if clock.t0 is None else max(0, int(time.monotonic() - clock.t0))
                if second >= len(per_s):
                    per_s.extend([0] * (second + 1 - len(per_s)))
                    latency.extend([0.0] * (second + 1 - len(latency)))
                per_s[second] += 1
                lat = msg.latency() or 0.0
                if lat > latency[second]:
                    latency[second] = lat
        else:
            result.failed += 1
            if len(result.errors) < 10:
                result.errors.append(str(err))

    conf: dict[str, Any] = {"bootstrap.servers": bootstrap, **DEFAULT_PRODUCER_CONFIG, **(extra or {})}
    conf["on_delivery"] = on_delivery
    if on_stats is not None:
        conf.setdefault("statistics.interval.ms", 100)
        conf["stats_cb"] = on_stats
    return Producer(conf)


def _wait_ready(producer: Any, topic: str, idempotent: bool, idemp_state: list[str],
                timeout_s: float) -> None:
    """Step 1b of :func:`produce_paced`: the topic's metadata (every partition with a leader) and, for
    an idempotent producer, its producer id (librdkafka's ``eos.idemp_state`` "Assigned" in the
    statistics; on a fresh Apache Kafka the first one waits for the transaction coordinator to load).
    Raises TimeoutError naming what was missing."""
    deadline = time.monotonic() + timeout_s
    while True:
        left = deadline - time.monotonic()
        meta = None
        with contextlib.suppress(Exception):  # a transient metadata error: ask again
            meta = producer.list_topics(topic, timeout=max(0.1, min(left, 5.0))).topics.get(topic)
        has_leaders = (meta is not None and meta.error is None and bool(meta.partitions)
                       and all(p.leader >= 0 for p in meta.partitions.values()))
        has_pid = not idempotent or idemp_state[-1:] == ["Assigned"]
        if has_leaders and has_pid:
            return
        if time.monotonic() >= deadline:
            missing = [what for what, ok in (("the topic's partition leaders", has_leaders),
                                             ("a producer id", has_pid)) if not ok]
            state = idemp_state[-1] if idemp_state else "unknown"
            raise TimeoutError(f"the producer was not ready within {timeout_s:g} s: no "
                               f"{' and no '.join(missing)} (idempotence state {state})")
        producer.poll(0.05)


def _produce_one(producer: Any, topic: str, value: bytes, key: bytes | None, partition: int | None) -> None:
    while True:
        try:
            if partition is None:
                producer.produce(topic, value, key)
            else:
                producer.produce(topic, value, key, partition)
            return
        except BufferError:  # local queue full: serve delivery reports and retry
            producer.poll(0.05)


class LoadOptions(TypedDict, total=False):
    """The options :func:`produce_records` and :func:`produce_paced` share (keywords; [default])."""

    keys: int  # distinct keys [1000]; 0: null keys
    value_size: int  # bytes of a value, >= 1 [100]
    zipf_s: float  # Zipf exponent of the key popularity [1.1]; 0: uniform
    seed: int  # seed of the values and the key sequence [0]
    partition: int | None  # [None]: the client's partitioner picks by key
    producer_config: Mapping[str, Any] | None  # laid over DEFAULT_PRODUCER_CONFIG [None]
    flush_timeout_s: float  # how long the final flush waits for delivery reports [120.0]


@dataclass(frozen=True)
class _Load:
    """Step 1 of both producers: the options with their defaults, the values and the key sampler."""

    values: list[bytes]
    sampler: ZipfKeySampler
    partition: int | None
    producer_config: Mapping[str, Any] | None
    flush_timeout_s: float

    @classmethod
    def of(cls, options: LoadOptions) -> _Load:
        unknown = sorted(set(options) - LoadOptions.__optional_keys__)
        if unknown:
            raise TypeError(f"unknown load option(s) {', '.join(unknown)} "
                            f"(known: {', '.join(LoadOptions.__annotations__)})")
        seed = options.get("seed", 0)
        return cls(_values(options.get("value_size", 100), seed),
                   ZipfKeySampler(options.get("keys", 1000), options.get("zipf_s", 1.1), seed),
                   options.get("partition"), options.get("producer_config"),
                   options.get("flush_timeout_s", 120.0))


def produce_records(
    bootstrap: str,
    topic: str,
    n: int,
    on_progress: Callable[[int], None] | None = None,
    **options: Unpack[LoadOptions],
) -> LoadResult:
    """Produce ``n`` records as fast as possible and wait for every delivery report (steps 1-3).
    ``on_progress(produced)`` is called every few thousand records.

    1. Precompute the values and the key sequence.
    2. ``produce()`` in a loop (``partition`` None = the client's partitioner picks by key), polling
       for delivery reports every few thousand records.
    3. Flush; records whose report did not arrive in ``flush_timeout_s`` count as neither delivered
       nor failed (``delivered + failed < n`` then).
    """
    if n < 0:
        raise ValueError(f"record count must be >= 0, got {n}")
    # 1.
    load = _Load.of(options)
    values, partition = load.values, load.partition
    n_values = len(values)
    key_seq = load.sampler.key_stream(n)
    result = LoadResult(topic, sampler=load.sampler.sampler)
    producer = _producer(bootstrap, result, load.producer_config)
    t0 = time.monotonic()
    # 2.
    produce = producer.produce
    for i, key in enumerate(key_seq):
        value = values[i % n_values]
        try:
            if partition is None:
                produce(topic, value, key)
            else:
                produce(topic, value, key, partition)
        except BufferError:
            _produce_one(producer, topic, value, key, partition)
        if i % _POLL_EVERY == 0:
            producer.poll(0)
            if on_progress is not None:
                on_progress(i)
    # 3.
    producer.flush(load.flush_timeout_s)
    result.elapsed_s = time.monotonic() - t0
    result.sampler = load.sampler.sampler
    return result


def produce_paced(
    bootstrap: str,
    topic: str,
    profile: RateProfile,
    should_stop: Callable[[], bool] | None = None,
    tick_s: float = 0.005,
    max_behind_s: float = 1.0,
    on_progress: Callable[[int], None] | None = None,
    ready_timeout_s: float = 60.0,
    **options: Unpack[LoadOptions],
) -> LoadResult:
    """Produce following ``profile`` (records/s per step), then wait for every delivery report.
    ``on_progress(seconds)`` is called every tick with the whole seconds of the profile elapsed.

    1. Precompute the values and the whole key sequence (``profile.total_records`` keys); create the
       producer and wait until it is ready (``ready_timeout_s``): the topic's metadata and, for an
       idempotent producer, its producer id. Second 0 of the profile starts then (``started_monotonic``),
       so a slow first round trip (a fresh broker's coordinator, a cold JVM) is not a shortfall of
       the first seconds.
    2. Every ``tick_s``, produce the records that are due by now, and serve delivery reports (the
       achieved rate is what was *delivered*, per second, in ``delivered_per_s``; the longest produce
       -> report time per second in ``latency_max_per_s``). A generator that fell more than
       ``max_behind_s`` of the current rate behind (starved of CPU) skips the excess and counts it in
       ``skipped`` instead of catching up in one spike, so the offered load is never more than the
       profile says. Until the profile ends or ``should_stop()``.
    3. Flush, as in :func:`produce_records`.
    """
    # 1.
    load = _Load.of(options)
    values, partition = load.values, load.partition
    total = profile.total_records
    key_seq = iter(load.sampler.key_stream(total))
    result = LoadResult(topic, sampler=load.sampler.sampler)
    result.offered_per_s = [
        float(profile.due(i + 1) - profile.due(i)) for i in range(math.ceil(profile.duration_s))
    ]
    conf = {**DEFAULT_PRODUCER_CONFIG, **(load.producer_config or {})}
    idempotent = str(conf.get("enable.idempotence", False)).lower() in ("true", "1")
    idemp_state: list[str] = []

    def on_stats(text: str) -> None:  # every 100 ms for the whole run: parsed only until "Assigned"
        if idemp_state[-1:] != ["Assigned"]:
            state = json.loads(text).get("eos", {}).get("idemp_state")
            if state:
                idemp_state[:] = [state]

    clock = _Clock()
    t_ready = time.monotonic()
    producer = _producer(bootstrap, result, load.producer_config, clock,
                         on_stats if idempotent and "stats_cb" not in conf else None)
    if idempotent and "stats_cb" in conf:
        idemp_state.append("Assigned")  # the caller reads the statistics: metadata only
    _wait_ready(producer, topic, idempotent, idemp_state, ready_timeout_s)
    t0 = clock.t0 = time.monotonic()
    result.started_monotonic, result.ready_s = t0, t0 - t_ready
    sent = 0  # records produced or skipped
    # 2.
    while sent < total:
        elapsed = time.monotonic() - t0
        if elapsed > profile.duration_s + 1.0 or (should_stop is not None and should_stop()):
            break
        due = min(total, profile.due(elapsed))
        floor = profile.due(max(0.0, elapsed - max_behind_s))
        if sent < floor:
            result.skipped += floor - sent
            for _ in range(floor - sent):
                next(key_seq)
            sent = floor
        while sent < due:
            _produce_one(producer, topic, values[sent % len(values)], next(key_seq), partition)
            sent += 1
            if sent % 1000 == 0:
                producer.poll(0)
        producer.poll(0)
        if on_progress is not None:
            on_progress(int(elapsed))
        if sent < total:
            time.sleep(tick_s)
    # 3.
    producer.flush(load.flush_timeout_s)
    result.elapsed_s = time.monotonic() - t0
    return result


def read_produced(path: str, topic: str) -> list[ProducedRecord]:
    """Read a produced set written by ``multilane loadgen --output`` (``ValueError`` on a bad line)."""
    out: list[ProducedRecord] = []
    with open(path, encoding="ascii") as f:
        for n, line in enumerate(f, 1):
            parts = line.rstrip("\n").split("\t")
            if len(parts) != 3:
                raise ValueError(f"{path}:{n}: expected 3 tab-separated fields, got {line!r}")
            try:
                key = None if parts[2] == "-" else bytes.fromhex(parts[2])
                out.append(ProducedRecord(topic, int(parts[0]), int(parts[1]), key))
            except ValueError as exc:
                raise ValueError(f"{path}:{n}: {exc}") from exc
    return out
