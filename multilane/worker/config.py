"""Engine configuration: the settings of one worker process and the librdkafka settings derived from them.

Pure: no I/O. :class:`EngineConfig` is validated on construction (bad values raise
:class:`ConfigError` naming the field); :meth:`EngineConfig.consumer_config` derives the consumer's
librdkafka settings, sizing librdkafka's own prefetch queue from the byte bound so that resident memory
stays bounded by the back-pressure limits, not by librdkafka's 64 MiB default.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field

from multilane.api import OrderingMode

__all__ = ["KAFKA_ENV_PREFIX", "OWNED_CLIENT_KEYS", "ConfigError", "EngineConfig", "TopicPartitionId",
           "is_security_key", "kafka_settings_from_environment", "security_settings"]

TopicPartitionId = tuple[str, int]

# Environment variables ``MULTILANE_KAFKA_<key>`` carry client settings, credentials included: the
# operator's StatefulSet fills them from the credentials Secret (``envFrom`` with this prefix; the same
# constant as ``multilane.operator.children.KAFKA_ENV_PREFIX``).
KAFKA_ENV_PREFIX = "MULTILANE_KAFKA_"
# Client settings multilane owns: never taken from the environment or --consumer-config.
OWNED_CLIENT_KEYS = ("bootstrap.servers", "group.id", "enable.auto.commit", "enable.auto.offset.store")
# Settings every Kafka client of the worker shares (consumer, producer, admin, state store clients).
_SECURITY_PREFIXES = ("security.", "sasl.", "ssl.", "ssl_")


class ConfigError(ValueError):
    """An engine setting is invalid; the message names the setting."""


def is_security_key(key: str) -> bool:
    """True for ``security.protocol`` and the ``sasl.*`` / ``ssl.*`` settings (credentials included)."""
    return key.startswith(_SECURITY_PREFIXES)


def security_settings(settings: Mapping[str, str]) -> dict[str, str]:
    """The settings of ``settings`` that every client of the worker needs to reach the cluster."""
    return {k: v for k, v in settings.items() if is_security_key(k)}


def kafka_settings_from_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """Client settings from ``MULTILANE_KAFKA_<key>`` variables (values are never logged or shown).

    ``<key>`` is the Secret's key as written (``MULTILANE_KAFKA_sasl.password`` -> ``sasl.password``:
    Kubernetes allows dots in variable names); a key written in upper case with ``_`` for ``.``
    (``MULTILANE_KAFKA_SASL_PASSWORD``, for shells that cannot set dotted names) is lower-cased and
    its ``_`` become ``.``. ConfigError (naming keys only) for an owned setting or for two variables
    that name the same setting.
    """
    out: dict[str, str] = {}
    source: dict[str, str] = {}
    for name in sorted(environ):
        if not name.startswith(KAFKA_ENV_PREFIX) or len(name) == len(KAFKA_ENV_PREFIX):
            continue
        raw = name[len(KAFKA_ENV_PREFIX):]
        key = raw.lower().replace("_", ".") if raw.isupper() and "." not in raw else raw
        if key in OWNED_CLIENT_KEYS:
            raise ConfigError(f"{name}: {key} is set by multilane and may not come from the environment")
        if key in out:
            raise ConfigError(f"{source[key]} and {name} both set the client setting {key}")
        out[key] = environ[name]
        source[key] = name
    return out


@dataclass(frozen=True)
class EngineConfig:
    """Settings of one worker engine. Defaults suit tests on the embedded broker and production alike."""

    bootstrap_servers: str
    group: str
    topics: tuple[str, ...] = ()  # standalone mode: subscribe() to these (cooperative-sticky)
    assign: tuple[TopicPartitionId, ...] = ()  # operator mode: initial static assignment
    operator_mode: bool = False  # True: assign() only, the assignment changes through the control API
    ordering: OrderingMode = OrderingMode.KEY
    factor: int = 8
    max_in_flight: int = 10_000  # records, per process
    max_in_flight_bytes: int = 64 * 1024 * 1024  # bytes, per process
    max_in_flight_per_partition: int | None = None  # None: the process bound
    max_in_flight_bytes_per_partition: int | None = None
    resume_fraction: float = 0.5  # a paused partition resumes below this fraction of its bounds
    max_retries: int = 3
    retry_backoff_ms: int = 100
    retry_backoff_max_ms: int = 10_000
    # Exception types that are retried (``--retry-on``); others are dead-lettered at once. Never
    # empty. NonRetryable and DecodeError (multilane.api) are never retried.
    retry_on: tuple[type[BaseException], ...] = (Exception,)
    dead_letter_topic: str | None = None  # None: "<topic>.dlq"
    commit_interval_ms: int = 1000
    # Progress records between commits (0 = only with commits): a kill -9 replays at most the records
    # in flight plus those completed in the last progress interval (docs/architecture.md).
    progress_interval_ms: int = 50
    stall_threshold_s: float = 60.0
    worker_id: str = field(default_factory=lambda: f"worker-{uuid.uuid4().hex[:8]}")
    consume_batch: int = 2000  # max records per consume() call
    sync_batch: int = 64  # max records per thread-pool submission (sync processors)
    max_threads: int = 256  # thread pool size bound for sync processors
    yield_every: int = 128  # a lane runner yields to the loop after this many records in a row
    drain_timeout_s: float = 30.0  # shutdown: how long in-flight records may take to finish
    # What a release waits for before its final commit: "running" (the records the processor runs;
    # queued ones go to the next owner through the commit and progress) or "queued" (every fetched
    # record: the behaviour before parallel moves, kept as the burst benchmark's baseline).
    release_drain: str = "running"
    progress_topic: str | None = None  # None: "multilane-progress.<group>"
    # Raise the garbage collector's generation-0 threshold to this and freeze the objects alive at
    # start (0 = leave the collector alone): the engine makes a few short-lived objects per record,
    # and the default (700) makes the collector run every few hundred records, scanning everything
    # in flight. Process-wide.
    gc_threshold: int = 50_000
    # may hold credentials: kept out of repr() so that a logged config never shows them
    consumer_overrides: dict[str, str] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        def positive(name: str, value: float) -> None:
            if value <= 0:
                raise ConfigError(f"{name} must be > 0, got {value!r}")

        if not self.bootstrap_servers:
            raise ConfigError("bootstrap_servers is required")
        if not self.group:
            raise ConfigError("group is required")
        if self.operator_mode and self.topics:
            raise ConfigError("operator mode assigns partitions; it cannot also subscribe to topics")
        if not self.operator_mode and not self.topics:
            raise ConfigError("standalone mode needs at least one topic (or use operator mode)")
        if not isinstance(self.ordering, OrderingMode):
            raise ConfigError(f"ordering must be an OrderingMode, got {self.ordering!r}")
        if self.release_drain not in ("running", "queued"):
            raise ConfigError(f"release_drain must be 'running' or 'queued', got {self.release_drain!r}")
        if not isinstance(self.factor, int) or self.factor < 1 or self.factor > 65536:
            raise ConfigError(f"factor must be an int in [1, 65536], got {self.factor!r}")
        for name in ("max_in_flight", "max_in_flight_bytes", "commit_interval_ms", "consume_batch",
                     "sync_batch", "max_threads", "yield_every", "retry_backoff_max_ms"):
            positive(name, getattr(self, name))
        positive("stall_threshold_s", self.stall_threshold_s)
        if not isinstance(self.progress_interval_ms, int) or self.progress_interval_ms < 0:
            raise ConfigError(f"progress_interval_ms must be an int >= 0 (0 = only with commits), "
                              f"got {self.progress_interval_ms!r}")
        if self.max_retries < 0:
            raise ConfigError(f"max_retries must be >= 0, got {self.max_retries}")
        if not self.retry_on or not all(isinstance(t, type) and issubclass(t, BaseException)
                                        for t in self.retry_on):
            raise ConfigError(f"retry_on must be a non-empty tuple of exception types, got {self.retry_on!r}")
        if self.retry_backoff_ms < 0:
            raise ConfigError(f"retry_backoff_ms must be >= 0, got {self.retry_backoff_ms}")
        if not 0.0 < self.resume_fraction < 1.0:
            raise ConfigError(f"resume_fraction must be in (0, 1), got {self.resume_fraction}")
        for tp in self.assign:
            if not (isinstance(tp, tuple) and len(tp) == 2 and isinstance(tp[1], int) and tp[1] >= 0):
                raise ConfigError(f"assign entries must be (topic, partition >= 0), got {tp!r}")

    # -- derived values ----------------------------------------------------------------------------

    @property
    def partition_max_records(self) -> int:
        return min(self.max_in_flight_per_partition or self.max_in_flight, self.max_in_flight)

    @property
    def partition_max_bytes(self) -> int:
        return min(self.max_in_flight_bytes_per_partition or self.max_in_flight_bytes,
                   self.max_in_flight_bytes)

    @property
    def progress_topic_name(self) -> str:
        return self.progress_topic or f"multilane-progress.{self.group}"

    def dead_letter_topic_for(self, topic: str) -> str:
        return self.dead_letter_topic or f"{topic}.dlq"

    def consumer_config(self) -> dict[str, str | int | bool]:
        """librdkafka consumer settings (overrides from ``consumer_overrides`` win).

        The prefetch queue (``queued.max.messages.kbytes``) and fetch sizes are derived from the byte
        bound: librdkafka holds at most about that much besides the engine's own in-flight records.
        """
        kbytes = max(1024, self.max_in_flight_bytes // 2048)  # half the byte bound, >= 1 MiB
        fetch_max = max(1 << 20, min(50 << 20, self.max_in_flight_bytes // 2))
        conf: dict[str, str | int | bool] = {
            "bootstrap.servers": self.bootstrap_servers,
            "group.id": self.group,
            "client.id": f"multilane-{self.worker_id}",
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "auto.offset.reset": "earliest",
            "fetch.queue.backoff.ms": 10,
            "queued.max.messages.kbytes": kbytes,
            "queued.min.messages": max(1000, min(100_000, self.max_in_flight)),
            "fetch.max.bytes": fetch_max,
            "max.partition.fetch.bytes": min(fetch_max, 1 << 20),
            # receive.message.max.bytes stays at librdkafka's default (100 MB): brokers return at least
            # one whole record batch even when it is larger than the fetch sizes, and a response
            # above this limit fails the connection (measured on the embedded broker).
            "fetch.wait.max.ms": 100,
            "session.timeout.ms": 10_000,
            "heartbeat.interval.ms": 1000,
            "partition.assignment.strategy": "cooperative-sticky",
            "statistics.interval.ms": 0,
        }
        conf.update(self.consumer_overrides)
        # Not overridable: the end-of-partition event carries the consumer's position past transaction
        # markers and compaction gaps at the end; without it the committed offset of a transactional
        # input stays one short of the end for good (multilane.worker.fetch, "Gaps at the end").
        conf["enable.partition.eof"] = True
        return conf

    def producer_config(self) -> dict[str, str | int | bool]:
        """Settings of the producer used for dead letters and progress records."""
        conf: dict[str, str | int | bool] = {
            "bootstrap.servers": self.bootstrap_servers,
            "client.id": f"multilane-{self.worker_id}-producer",
            "linger.ms": 5,
            "acks": "all",
            "enable.idempotence": False,
            "message.timeout.ms": 30_000,
        }
        conf.update(security_settings(self.consumer_overrides))
        if "logger" in self.consumer_overrides:  # the client log through Python logging (the worker CLI)
            conf["logger"] = self.consumer_overrides["logger"]
        return conf
