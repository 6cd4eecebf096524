"""Processors for tests and benchmarks that record what they do, plus the event-log format.

Does I/O: appends to the event log file named by ``MULTILANE_TEST_LOG`` (when set).

Use ``multilane.testing.processors:logging_async`` or ``...:logging_sync`` as the worker's
``--processor``. Per processing attempt they write a ``start`` event, then (after the configured work)
an ``end`` event, or a ``fail`` event just before raising, or (async only) a ``cancel`` event when the
engine cancels the attempt (it stops running there). Knobs, read from the environment once per
process (call :func:`reload_config` to re-read):

- ``MULTILANE_TEST_LOG``: event log path; unset = record nothing (a pure sleep processor).
- ``MULTILANE_TEST_SLEEP_MS``: work per record (float ms); ``asyncio.sleep`` / ``time.sleep``.
- ``MULTILANE_TEST_POISON``: comma-separated keys whose records always raise :class:`PoisonRecordError`.
- ``MULTILANE_TEST_HANG_KEY``: comma-separated keys whose records never finish (until the process dies,
  or until the file named by ``MULTILANE_TEST_HANG_RELEASE_FILE`` exists, if that is set).
- ``MULTILANE_TEST_FLAKY`` / ``MULTILANE_TEST_FLAKY_ATTEMPTS`` (default 1): records with these keys
  raise :class:`FlakyRecordError` on attempts ``<= FLAKY_ATTEMPTS`` and succeed afterwards.
- ``MULTILANE_TEST_SLOW_KEYS`` / ``MULTILANE_TEST_SLOW_MS``: records with these keys take
  ``SLOW_MS`` instead of ``SLEEP_MS``.

A key in these lists is its UTF-8 text, or ``hex:`` followed by its hex bytes.

Event log format: one line per event, tab-separated, written with a single ``os.write`` on an
``O_APPEND`` descriptor so that lines from several processes never interleave and the file order is a
real-time order of the events (used by the checkers as the sequence)::

    kind  time  pid  topic  partition  offset  key_hex  attempt  lane

``kind`` is ``start``, ``end``, ``fail``, ``cancel`` or ``kill`` (a marker written by whoever
SIGKILLs ``pid``: everything that pid had started ends there); ``key_hex`` is ``-`` for a null key.

:class:`EventRecorder` offers the same processors in-process, recording into a list (no files).
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from multilane.api import Context, Record

__all__ = [
    "EVENT_KINDS",
    "EventLogError",
    "EventLogFollower",
    "EventRecorder",
    "FileEventSink",
    "FlakyRecordError",
    "PoisonRecordError",
    "ProcessingEvent",
    "ProcessorConfig",
    "append_kill_marker",
    "format_event",
    "logging_async",
    "logging_sync",
    "parse_event_line",
    "read_event_log",
    "reload_config",
]

EVENT_KINDS = ("start", "end", "fail", "cancel", "kill")


class PoisonRecordError(RuntimeError):
    """Raised by the test processors for records whose key is configured as poison."""


class FlakyRecordError(RuntimeError):
    """Raised by the test processors for the first attempts of records with a flaky key."""


class EventLogError(ValueError):
    """An event log line that does not follow the format."""


@dataclass(frozen=True, slots=True)
class ProcessingEvent:
    """One line of the event log.

    ``seq`` is the line's position in its log (0-based): the order the checkers use. For ``kill``
    markers, topic is ``""`` and partition/offset/lane are -1.
    """

    kind: str  # one of EVENT_KINDS
    time: float  # time.time() when written
    pid: int
    topic: str
    partition: int
    offset: int
    key: bytes | None
    attempt: int  # 1-based; 0 for kill markers
    lane: int
    seq: int = -1

    @property
    def tp(self) -> tuple[str, int]:
        return (self.topic, self.partition)

    @property
    def tpo(self) -> tuple[str, int, int]:
        return (self.topic, self.partition, self.offset)


def format_event(kind: str, pid: int, ctx: Context | None, now: float | None = None) -> bytes:
    """The log line (with newline) of one event; ``ctx`` is None only for ``kill`` markers."""
    t = time.time() if now is None else now
    if ctx is None:
        return f"{kind}\t{t:.6f}\t{pid}\t\t-1\t-1\t-\t0\t-1\n".encode()
    key = "-" if ctx.key is None else ctx.key.hex()
    return (
        f"{kind}\t{t:.6f}\t{pid}\t{ctx.topic}\t{ctx.partition}\t{ctx.offset}\t{key}\t{ctx.attempt}\t{ctx.lane}\n"
    ).encode()


def parse_event_line(line: str, seq: int = -1) -> ProcessingEvent:
    """Parse one log line (without or with its newline); :class:`EventLogError` if malformed."""
    parts = line.rstrip("\n").split("\t")
    if len(parts) != 9:
        raise EventLogError(f"event line {seq}: expected 9 tab-separated fields, got {len(parts)}: {line!r}")
    kind, t, pid, topic, partition, offset, key_hex, attempt, lane = parts
    if kind not in EVENT_KINDS:
        raise EventLogError(f"event line {seq}: unknown kind {kind!r}")
    try:
        key = None if key_hex == "-" else bytes.fromhex(key_hex)
        return ProcessingEvent(
            kind=kind,
            time=float(t),
            pid=int(pid),
            topic=topic,
            partition=int(partition),
            offset=int(offset),
            key=key,
            attempt=int(attempt),
            lane=int(lane),
            seq=seq,
        )
    except ValueError as exc:
        raise EventLogError(f"event line {seq}: {exc}: {line!r}") from exc


def read_event_log(path: str | os.PathLike[str]) -> list[ProcessingEvent]:
    """All events of a log file, in file order (``seq`` = line index). A missing file is an empty log."""
    p = Path(path)
    if not p.exists():
        return []
    with p.open("r", encoding="ascii") as f:
        return [parse_event_line(line, i) for i, line in enumerate(f)]


class EventLogFollower:
    """Reads an event log incrementally while writers append to it (tests poll it for progress).

    Invariant: ``events`` holds every complete line read so far, ``_pos`` is the file offset just past
    the last complete line (a trailing partial line is re-read on the next :meth:`poll`).
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.events: list[ProcessingEvent] = []
        self._pos = 0
        self.ended: set[tuple[str, int, int]] = set()

    def poll(self) -> list[ProcessingEvent]:
        """Read what was appended since the last call; return the new events."""
        if not self.path.exists():
            return []
        with self.path.open("rb") as f:
            f.seek(self._pos)
            data = f.read()
        end = data.rfind(b"\n") + 1
        if end == 0:
            return []
        self._pos += end
        new = [
            parse_event_line(line, len(self.events) + i)
            for i, line in enumerate(data[:end].decode("ascii").splitlines())
        ]
        self.events.extend(new)
        self.ended.update(e.tpo for e in new if e.kind == "end")
        return new

    def ended_count(self) -> int:
        """Distinct records with an ``end`` event so far (after a :meth:`poll`)."""
        self.poll()
        return len(self.ended)


def append_kill_marker(path: str | os.PathLike[str], pid: int) -> None:
    """Append a ``kill`` marker for ``pid`` (call right after SIGKILLing it, before restarting anything)."""
    FileEventSink(os.fspath(path)).write(format_event("kill", pid, None))


# -- configuration ----------------------------------------------------------------------------------


def _parse_keys(raw: str | None) -> frozenset[bytes]:
    if not raw:
        return frozenset()
    out: set[bytes] = set()
    for item in raw.split(","):
        if not item:
            continue
        if item.startswith("hex:"):
            try:
                out.add(bytes.fromhex(item[4:]))
            except ValueError as exc:
                raise ValueError(f"bad hex key {item!r} in test processor config") from exc
        else:
            out.add(item.encode())
    return frozenset(out)


@dataclass(frozen=True, slots=True)
class ProcessorConfig:
    """What the test processors do; see the module docstring for the environment variables."""

    log_path: str | None = None
    sleep_s: float = 0.0  # >= 0
    poison: frozenset[bytes] = frozenset()
    hang: frozenset[bytes] = frozenset()
    hang_release_file: str | None = None
    flaky: frozenset[bytes] = frozenset()
    flaky_attempts: int = 1  # >= 0
    slow: frozenset[bytes] = frozenset()  # keys whose records take slow_s instead of sleep_s
    slow_s: float = 0.0  # >= 0

    def __post_init__(self) -> None:
        if self.sleep_s < 0:
            raise ValueError(f"sleep must be >= 0, got {self.sleep_s}")
        if self.slow_s < 0:
            raise ValueError(f"slow-key time must be >= 0, got {self.slow_s}")
        if self.flaky_attempts < 0:
            raise ValueError(f"flaky attempts must be >= 0, got {self.flaky_attempts}")

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> ProcessorConfig:
        e = os.environ if env is None else env
        try:
            sleep_ms = float(e.get("MULTILANE_TEST_SLEEP_MS", "0") or 0)
            flaky_attempts = int(e.get("MULTILANE_TEST_FLAKY_ATTEMPTS", "1") or 1)
            slow_ms = float(e.get("MULTILANE_TEST_SLOW_MS", "0") or 0)
        except ValueError as exc:
            raise ValueError(f"bad number in MULTILANE_TEST_* environment: {exc}") from exc
        return cls(
            log_path=e.get("MULTILANE_TEST_LOG") or None,
            sleep_s=sleep_ms / 1000.0,
            poison=_parse_keys(e.get("MULTILANE_TEST_POISON")),
            hang=_parse_keys(e.get("MULTILANE_TEST_HANG_KEY")),
            hang_release_file=e.get("MULTILANE_TEST_HANG_RELEASE_FILE") or None,
            flaky=_parse_keys(e.get("MULTILANE_TEST_FLAKY")),
            flaky_attempts=flaky_attempts,
            slow=_parse_keys(e.get("MULTILANE_TEST_SLOW_KEYS")),
            slow_s=slow_ms / 1000.0,
        )

    def to_env(self) -> dict[str, str]:
        """The environment variables that reproduce this config in a worker process."""

        def keys(ks: Iterable[bytes]) -> str:
            return ",".join("hex:" + k.hex() for k in sorted(ks))

        env = {
            "MULTILANE_TEST_SLEEP_MS": repr(self.sleep_s * 1000.0),
            "MULTILANE_TEST_POISON": keys(self.poison),
            "MULTILANE_TEST_HANG_KEY": keys(self.hang),
            "MULTILANE_TEST_FLAKY": keys(self.flaky),
            "MULTILANE_TEST_FLAKY_ATTEMPTS": str(self.flaky_attempts),
            "MULTILANE_TEST_SLOW_KEYS": keys(self.slow),
            "MULTILANE_TEST_SLOW_MS": repr(self.slow_s * 1000.0),
        }
        if self.log_path:
            env["MULTILANE_TEST_LOG"] = self.log_path
        if self.hang_release_file:
            env["MULTILANE_TEST_HANG_RELEASE_FILE"] = self.hang_release_file
        return env


# -- sinks ------------------------------------------------------------------------------------------


class EventSink(Protocol):
    def emit(self, kind: str, ctx: Context) -> None: ...


class FileEventSink:
    """Appends event lines to a file: one ``os.write`` per line on an ``O_APPEND`` descriptor.

    Invariant: ``_fd`` is opened lazily once per process (``_pid`` records which process opened it, so
    a forked child reopens instead of sharing the parent's descriptor).
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self._fd: int | None = None
        self._pid = -1
        self._lock = threading.Lock()

    def _descriptor(self) -> int:
        pid = os.getpid()
        if self._fd is None or self._pid != pid:
            with self._lock:
                if self._fd is None or self._pid != pid:
                    self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
                    self._pid = pid
        return self._fd

    def write(self, line: bytes) -> None:
        fd = self._descriptor()
        n = os.write(fd, line)
        if n != len(line):  # regular files never write short below the size limit; be loud if they do
            raise OSError(f"short write to event log {self.path}: {n} of {len(line)} bytes")

    def emit(self, kind: str, ctx: Context) -> None:
        self.write(format_event(kind, os.getpid(), ctx))


class _NullSink:
    def emit(self, kind: str, ctx: Context) -> None:
        return None


# -- the processing logic, shared by the sync/async and file/in-memory variants ---------------------


def _pre_work(cfg: ProcessorConfig, sink: EventSink, ctx: Context) -> bool:
    """Log ``start`` and raise for poison/flaky keys; True when this record must hang."""
    sink.emit("start", ctx)
    key = ctx.key
    if key is not None:
        if key in cfg.poison:
            sink.emit("fail", ctx)
            raise PoisonRecordError(f"poison key {key!r} at {ctx.topic}/{ctx.partition}@{ctx.offset}")
        if key in cfg.flaky and ctx.attempt <= cfg.flaky_attempts:
            sink.emit("fail", ctx)
            raise FlakyRecordError(
                f"flaky key {key!r} at {ctx.topic}/{ctx.partition}@{ctx.offset}, attempt {ctx.attempt}"
            )
        return key in cfg.hang
    return False


def _work_s(cfg: ProcessorConfig, ctx: Context) -> float:
    return cfg.slow_s if ctx.key is not None and ctx.key in cfg.slow else cfg.sleep_s


def _released(cfg: ProcessorConfig) -> bool:
    return cfg.hang_release_file is not None and os.path.exists(cfg.hang_release_file)


def _run_sync(cfg: ProcessorConfig, sink: EventSink, ctx: Context) -> None:
    if _pre_work(cfg, sink, ctx):
        while not _released(cfg):
            time.sleep(0.05)
    work_s = _work_s(cfg, ctx)
    if work_s:
        time.sleep(work_s)
    sink.emit("end", ctx)


async def _run_async(cfg: ProcessorConfig, sink: EventSink, ctx: Context) -> None:
    hang = _pre_work(cfg, sink, ctx)
    try:
        if hang:
            while not _released(cfg):  # noqa: ASYNC110 - the release is a file from another process
                await asyncio.sleep(0.05)
        work_s = _work_s(cfg, ctx)
        if work_s:
            await asyncio.sleep(work_s)
    except asyncio.CancelledError:
        # the engine abandoned this attempt (e.g. on a revoke): it stops running here
        sink.emit("cancel", ctx)
        raise
    sink.emit("end", ctx)


_runtime_lock = threading.Lock()
_runtime: tuple[ProcessorConfig, EventSink] | None = None


def reload_config(env: Mapping[str, str] | None = None) -> ProcessorConfig:
    """(Re)read the knobs from the environment; the module-level processors use the result."""
    global _runtime
    cfg = ProcessorConfig.from_env(env)
    sink: EventSink = FileEventSink(cfg.log_path) if cfg.log_path else _NullSink()
    with _runtime_lock:
        _runtime = (cfg, sink)
    return cfg


def _current() -> tuple[ProcessorConfig, EventSink]:
    rt = _runtime
    if rt is None:
        reload_config()
        rt = _runtime
        assert rt is not None
    return rt


async def logging_async(record: Record, ctx: Context) -> None:
    """Async test processor: logs start/end to ``MULTILANE_TEST_LOG``, applies the env knobs."""
    cfg, sink = _current()
    await _run_async(cfg, sink, ctx)


def logging_sync(record: Record, ctx: Context) -> None:
    """Sync test processor (runs on the engine's thread pool): same behaviour as :func:`logging_async`."""
    cfg, sink = _current()
    _run_sync(cfg, sink, ctx)


# -- in-process recorder ----------------------------------------------------------------------------


@dataclass
class EventRecorder:
    """Records events in memory, for engine tests that run in the test process.

    ``recorder.async_processor`` / ``recorder.sync_processor`` behave like :func:`logging_async` /
    :func:`logging_sync` with ``config`` (its ``log_path`` is ignored). ``events`` holds every event in
    the order it happened, with ``seq`` set; appends are serialised by a lock, so it is safe to use
    from the engine's thread pool. Invariant: ``events[i].seq == i``.
    """

    config: ProcessorConfig = field(default_factory=ProcessorConfig)
    events: list[ProcessingEvent] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def emit(self, kind: str, ctx: Context) -> None:
        now = time.time()
        pid = os.getpid()
        with self._lock:
            self.events.append(
                ProcessingEvent(
                    kind=kind,
                    time=now,
                    pid=pid,
                    topic=ctx.topic,
                    partition=ctx.partition,
                    offset=ctx.offset,
                    key=ctx.key,
                    attempt=ctx.attempt,
                    lane=ctx.lane,
                    seq=len(self.events),
                )
            )

    def mark_incarnation_end(self, pid: int | None = None) -> None:
        """Record a ``kill`` marker: whatever ``pid`` (default: this process) had started ends here."""
        p = os.getpid() if pid is None else pid
        with self._lock:
            self.events.append(
                ProcessingEvent("kill", time.time(), p, "", -1, -1, None, 0, -1, seq=len(self.events))
            )

    async def async_processor(self, record: Record, ctx: Context) -> None:
        await _run_async(self.config, self, ctx)

    def sync_processor(self, record: Record, ctx: Context) -> None:
        _run_sync(self.config, self, ctx)

    def snapshot(self) -> list[ProcessingEvent]:
        with self._lock:
            return list(self.events)
