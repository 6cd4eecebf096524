"""Apache Kafka for tests, benchmarks and ``multilane broker --kind apache``: one JVM, owned by PID.

:class:`ApacheKafka` runs the pinned release of ``deps/kafka/pom.xml`` (:data:`KAFKA_VERSION`) as a
single KRaft node (combined broker and controller) on loopback ports, with its data in a temporary
directory removed at stop. It has the same interface as
:class:`multilane.testing.broker.EmbeddedBroker`: ``bootstrap``, ``port``, ``pid``, ``create_topic``,
``start``, ``stop`` and the context manager.

What differs from a production cluster, and why (every other setting is Apache Kafka's default):

1. One node: replication factor and min ISR 1 for the offsets, transaction-state and share-coordinator
   topics (a single broker hangs on the share defaults 3/2); 5 partitions for each of those topics
   instead of 50 (fewer coordinator loads at first use on 2 cores; the protocol is the same).
2. Transactions work as on any cluster; share groups (KIP-932) are on: ``share.version=1`` at format.
3. Test timings: ``group.initial.rebalance.delay.ms=0``; the minimum session timeouts and heartbeat
   intervals are lowered (classic groups 500 ms, as the tests ask for 1-2 s sessions; share and
   consumer-protocol groups heartbeat every 1 s instead of 5 s); the log cleaner looks for work every
   1 s instead of 15 s, so a compacted topic with a short ``segment.ms`` is compacted within seconds.
4. JVM: heap at most 512 MiB, serial GC (2 cores shared by many processes), class-data sharing on.

The JVM dies with the process that started it: ``PR_SET_PDEATHSIG`` when started from the main thread
on Linux, a watchdog process otherwise (the signal follows the thread that forked, not the process).
"""

from __future__ import annotations

import base64
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from types import TracebackType
from xml.sax.saxutils import quoteattr

from multilane.testing.broker import BrokerError, create_topic, free_port, probe_broker
from multilane.testing.child_process import die_with_parent_of, stop_by_pid

__all__ = ["DEFAULT_JVM_OPTIONS", "KAFKA_VERSION", "ApacheKafka", "ApacheKafkaUnavailableError",
           "kafka_jars_dir"]

# The release deps/kafka/pom.xml pins (tests/unit/test_apache_kafka_pins.py checks they agree).
KAFKA_VERSION = "4.4.0"
JARS_SCRIPT = "scripts/kafka-jars.sh"

DEFAULT_JVM_OPTIONS: tuple[str, ...] = (
    "-Xms64m", "-Xmx512m", "-XX:+UseSerialGC", "-Xshare:auto", "-XX:-UsePerfData",
    "-Djava.awt.headless=true",
)
# The format tool is a short-lived JVM: the C1 compiler alone starts it sooner.
_TOOL_JVM_OPTIONS = ("-Xmx256m", "-XX:+UseSerialGC", "-Xshare:auto", "-XX:TieredStopAtLevel=1",
                     "-XX:-UsePerfData")

# Point 1 and 3 of the module docstring; a caller's ``server_config`` overrides any of these.
TEST_BED_SETTINGS: dict[str, str] = {
    "offsets.topic.replication.factor": "1",
    "offsets.topic.num.partitions": "5",
    "transaction.state.log.replication.factor": "1",
    "transaction.state.log.min.isr": "1",
    "transaction.state.log.num.partitions": "5",
    "share.coordinator.state.topic.replication.factor": "1",
    "share.coordinator.state.topic.min.isr": "1",
    "share.coordinator.state.topic.num.partitions": "5",
    "group.initial.rebalance.delay.ms": "0",
    "log.cleaner.backoff.ms": "1000",
    "group.min.session.timeout.ms": "500",
    "group.consumer.min.session.timeout.ms": "1000",
    "group.consumer.min.heartbeat.interval.ms": "500",
    "group.consumer.heartbeat.interval.ms": "1000",
    "group.share.min.session.timeout.ms": "1000",
    "group.share.min.heartbeat.interval.ms": "500",
    "group.share.heartbeat.interval.ms": "1000",
}

_WATCHDOG = (
    "import os, signal, sys, time\n"
    "parent, child = int(sys.argv[1]), int(sys.argv[2])\n"
    "while os.getppid() == parent:\n"
    "    time.sleep(0.5)\n"
    "try:\n"
    "    os.killpg(child, signal.SIGKILL)\n"
    "except ProcessLookupError:\n"
    "    pass\n"
)


class ApacheKafkaUnavailableError(BrokerError):
    """Java or the broker's jars are missing: the message names what to run."""


def kafka_jars_dir() -> Path:
    """The directory of the broker's jars: ``$MULTILANE_KAFKA_JARS``, else the cache the script fills.

    Raises :class:`ApacheKafkaUnavailableError` naming ``scripts/kafka-jars.sh`` when it is not complete.
    """
    explicit = os.environ.get("MULTILANE_KAFKA_JARS")
    if explicit:
        path = Path(explicit)
        if not (path / f"kafka_2.13-{KAFKA_VERSION}.jar").is_file():
            raise ApacheKafkaUnavailableError(
                f"MULTILANE_KAFKA_JARS={explicit!r} holds no kafka_2.13-{KAFKA_VERSION}.jar")
        return path
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    path = cache / "multilane" / "kafka" / KAFKA_VERSION
    if not (path / ".complete").is_file():
        raise ApacheKafkaUnavailableError(
            f"Apache Kafka {KAFKA_VERSION}'s jars are not in {path}: run `bash {JARS_SCRIPT}` "
            "(or `bash scripts/bootstrap.sh`) from a multilane checkout")
    return path


def find_java() -> str:
    """``$JAVA_HOME/bin/java`` if set, else ``java`` on PATH; :class:`ApacheKafkaUnavailableError` if none."""
    home = os.environ.get("JAVA_HOME")
    if home and Path(home, "bin", "java").is_file():
        return str(Path(home, "bin", "java"))
    java = shutil.which("java")
    if java is None:
        raise ApacheKafkaUnavailableError(
            f"Apache Kafka {KAFKA_VERSION} needs Java 17+ and `java` is not on PATH: "
            f"run `bash scripts/bootstrap.sh` (it installs a JRE and runs {JARS_SCRIPT})")
    return java


def new_cluster_id() -> str:
    """A KRaft cluster id, as ``kafka-storage random-uuid`` prints one (URL-safe base64, no padding)."""
    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not text.startswith("-"):  # Kafka's Uuid.randomUuid() refuses these too
            return text


class ApacheKafka:
    """A single-node Apache Kafka (KRaft) on 127.0.0.1, owned by this object.

    Invariant: while ``self._proc`` is not None, the JVM it names was started by this object and has
    not been reaped, and ``self._workdir`` is its data and config directory; ``stop()`` kills it by PID,
    waits for it and removes ``self._workdir``.
    """

    def __init__(
        self,
        port: int | None = None,
        log_path: str | None = None,
        server_config: dict[str, str] | None = None,
        jvm_options: tuple[str, ...] = DEFAULT_JVM_OPTIONS,
    ) -> None:
        self._fixed_port = port
        self.port: int = port or free_port()
        self.controller_port: int = 0
        self.bootstrap: str = f"127.0.0.1:{self.port}"
        # The caller's log file is theirs to keep; without one the log lives in the work dir.
        self._log_path = log_path
        self.log_path: str | None = log_path
        self._server_config = dict(server_config or {})
        self._jvm_options = jvm_options
        self._workdir: str | None = None
        self._log_file: object | None = None
        self._log_offset = 0
        self._proc: subprocess.Popen[bytes] | None = None
        self._watchdog: subprocess.Popen[bytes] | None = None
        self.start_seconds: float | None = None  # format + JVM start until the first metadata answer

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def start(self, timeout: float = 120.0) -> ApacheKafka:
        """Format a data directory and start the broker; wait until it answers (steps 1-5).

        1. Find java and the jars (:class:`ApacheKafkaUnavailableError` names the script to run).
        2. Make a work directory: ``server.properties``, the log4j2 config, the data directory.
        3. Format it: a new cluster id, ``--standalone``, ``--feature share.version=1``.
        4. Spawn the broker in its own session, bound to this process's life, logging to the file.
        5. Poll until a metadata request lists the broker. If the JVM exits first on a port taken in
           the meantime (ports free a moment ago) and the caller chose no port, go again from step 2 on
           new ports, at most twice; otherwise stop and raise :class:`BrokerError` with the log's tail.
        """
        # 1. java and jars
        java = find_java()
        classpath = str(kafka_jars_dir() / "*")
        began = time.monotonic()
        deadline = began + timeout
        for attempt in range(3):
            try:
                self._start_once(java, classpath, deadline)
                self.start_seconds = time.monotonic() - began
                return self
            except _PortTakenError:
                self.stop()
                if self._fixed_port is not None or attempt == 2:
                    raise BrokerError(f"port {self.port} or {self.controller_port} is taken") from None
                self.port = free_port()
                self.bootstrap = f"127.0.0.1:{self.port}"
        raise AssertionError("unreachable")

    def _start_once(self, java: str, classpath: str, deadline: float) -> None:
        # 2. work directory
        self.controller_port = free_port()
        workdir = self._workdir = tempfile.mkdtemp(prefix="multilane-kafka-")
        properties = Path(workdir, "server.properties")
        properties.write_text(self._server_properties(Path(workdir, "data")))
        log4j = Path(workdir, "log4j2.xml")
        log4j.write_text(_LOG4J2)
        self.log_path = self._log_path or str(Path(workdir, "server.log"))
        log = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
        self._log_file = log
        self._log_offset = log.tell()  # where this attempt's lines begin (a caller's log is appended to)
        # the JVM's temp files (lz4-java's extracted native library) go with the work dir: a killed
        # JVM never runs the deleteOnExit hooks that would remove them from /tmp
        jvm_tmp = Path(workdir, "tmp")
        jvm_tmp.mkdir()
        jvm = [java, *self._jvm_options, f"-Djava.io.tmpdir={jvm_tmp}", f"-Dlog4j2.configurationFile={log4j}",
               "-cp", classpath]
        # 3. format
        fmt = subprocess.run(
            [java, *_TOOL_JVM_OPTIONS, f"-Dlog4j2.configurationFile={log4j}", "-cp", classpath,
             "kafka.tools.StorageTool", "format", "-t", new_cluster_id(), "-c", str(properties),
             "--standalone", "--feature", "share.version=1"],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            timeout=max(1.0, deadline - time.monotonic()), check=False,
        )
        if fmt.returncode != 0:
            tail = self._log_tail()
            self.stop()
            raise BrokerError(f"formatting Kafka's data directory failed ({fmt.returncode}): {tail}")
        # 4. spawn
        on_main = threading.current_thread() is threading.main_thread() and sys.platform == "linux"
        self._proc = subprocess.Popen(
            [*jvm, "kafka.Kafka", str(properties)],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True, preexec_fn=die_with_parent_of(os.getpid()) if on_main else None,
        )
        if not on_main:
            self._watchdog = subprocess.Popen(
                [sys.executable, "-c", _WATCHDOG, str(os.getpid()), str(self._proc.pid)],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, start_new_session=True,
            )
        # 5. wait until it answers
        last_error = "no answer"
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                code = self._proc.returncode
                tail = self._log_tail()
                if "Address already in use" in self._log_text():
                    raise _PortTakenError
                self.stop()
                raise BrokerError(f"Apache Kafka exited with code {code}: {tail}")
            try:
                probe_broker(self.port, self.bootstrap)
                return
            except Exception as exc:  # any failure means "not ready yet"
                last_error = str(exc)
                time.sleep(0.1)
        tail = self._log_tail()
        self.stop()
        raise BrokerError(f"Apache Kafka on {self.bootstrap} not ready in time: {last_error}; log: {tail}")

    def _server_properties(self, data_dir: Path) -> str:
        settings = {
            "process.roles": "broker,controller",
            "node.id": "1",
            "controller.quorum.bootstrap.servers": f"127.0.0.1:{self.controller_port}",
            "listeners": f"PLAINTEXT://127.0.0.1:{self.port},CONTROLLER://127.0.0.1:{self.controller_port}",
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{self.port}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "log.dirs": str(data_dir),
            **TEST_BED_SETTINGS,
            **self._server_config,
        }
        return "".join(f"{k}={v}\n" for k, v in settings.items())

    def _log_text(self) -> str:
        """This attempt's part of the log ('' if there is none)."""
        if self.log_path is None:
            return ""
        try:
            with open(self.log_path, "rb") as f:
                f.seek(self._log_offset)
                return f.read().decode(errors="replace")
        except OSError:
            return ""

    def _log_tail(self, lines: int = 15) -> str:
        return "\n".join(self._log_text().splitlines()[-lines:]) or "(empty log)"

    def stop(self) -> None:
        """Kill the JVM by PID (SIGTERM, then SIGKILL after 15 s), wait, remove the work directory."""
        proc, self._proc = self._proc, None
        if proc is not None:
            stop_by_pid(proc, 15, group=True, reap_s=10)
        watchdog, self._watchdog = self._watchdog, None
        if watchdog is not None:
            watchdog.kill()
            watchdog.wait(timeout=10)
        log, self._log_file = self._log_file, None
        if log is not None:
            log.close()  # type: ignore[attr-defined]
        workdir, self._workdir = self._workdir, None
        if workdir is not None:
            shutil.rmtree(workdir, ignore_errors=True)
        if self._log_path is None:
            self.log_path = None

    def create_topic(
        self, name: str, partitions: int = 1, config: dict[str, str] | None = None, timeout: float = 10.0
    ) -> None:
        """Create a topic and wait until its metadata shows every partition."""
        create_topic(self.bootstrap, name, partitions, config, timeout)

    def __enter__(self) -> ApacheKafka:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


class _PortTakenError(Exception):
    """The JVM could not bind a port chosen as free a moment earlier."""


# Everything to stdout, which start() sends to the log file (with the JVM's own errors).
_LOG4J2 = f"""<?xml version="1.0" encoding="UTF-8"?>
<Configuration status="warn">
  <Appenders>
    <Console name="out" target="SYSTEM_OUT">
      <PatternLayout pattern={quoteattr("[%d] %p %m (%c)%n")}/>
    </Console>
  </Appenders>
  <Loggers>
    <Logger name="kafka.request.logger" level="warn"/>
    <Logger name="state.change.logger" level="warn"/>
    <Logger name="kafka.authorizer.logger" level="warn"/>
    <Root level="info"><AppenderRef ref="out"/></Root>
  </Loggers>
</Configuration>
"""
