"""Scenario 5 of the engine benchmark: records replayed after ``kill -9`` while completions continue.

A real ``multilane worker`` process is killed mid-stream and restarted; its test processor's event log
says which records ended before the kill and started again after it. Does I/O: worker processes, Kafka.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from benchmarks._children import ChildError
from benchmarks._common import Column, Table, log, ratio
from benchmarks._data import ProducedTopic
from benchmarks.engine_rows import BASE_MS, Ctx

REPLAY_F = 16
REPLAY_COMMIT_MS = 1000  # the worker's default
REPLAY_PROGRESS_MS = 50  # the worker's default
REPLAY_HUNG_KEYS = 3


@dataclass
class ReplayOutcome:
    """One kill -9 / restart cycle, counted from the test processors' event log."""

    ended_before_kill: int  # records with an ``end`` event from the killed worker
    in_flight_at_kill: int  # started by the killed worker, not ended (must run again)
    committed_at_kill: int | None  # the group's committed offset right after the kill
    replayed: int  # records that ended before the kill and started again after the restart
    derived_watermark_replays: int | None  # ended before the kill at or above the committed offset
    completed_last_interval: int  # ended by the killed worker in the last progress interval before the kill
    oldest_replayed_ms: float | None  # how long before the kill the earliest replayed record ended
    progress_records: int  # progress records the killed worker wrote (progress topic, by timestamp)
    progress_bytes: int  # their value bytes
    progress_s: float  # the killed worker's first progress record to the kill


def _hung_keys(data: ProducedTopic, kill_after: int, count: int) -> list[bytes]:
    """Keys that occur once in the topic, at offsets spread over the first tenth of the kill point."""
    occurrences: dict[bytes, int] = {}
    for key in data.keys:
        occurrences[key] = occurrences.get(key, 0) + 1
    chosen: list[bytes] = []
    for target in range(count):
        start = max(1, (target + 1) * kill_after // (10 * count))
        for i in range(start, len(data.keys)):
            key = data.keys[i]
            if occurrences[key] == 1 and key not in chosen:
                chosen.append(key)
                break
    return chosen


def _worker_argv(
    ctx: Ctx, topic: str, group: str, extra: Sequence[str], launcher: Sequence[str]
) -> list[str]:
    return [
        *launcher, "--bootstrap-servers", ctx.bootstrap,
        "--group", group, "--processor", "multilane.testing.processors:logging_async",
        "--assign", f"{topic}:0", "--ordering", "unordered", "--factor", str(REPLAY_F),
        "--commit-interval-ms", str(REPLAY_COMMIT_MS), *extra,
    ]  # fmt: skip


def _progress_written(ctx: Ctx, group: str, since: float, until: float) -> tuple[int, int, float | None]:
    """Records and value bytes in the group's progress topic with timestamps in ``[since, until]``, and
    the first such timestamp."""
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    topic = f"multilane-progress.{group}"
    consumer = Consumer(
        {
            "bootstrap.servers": ctx.bootstrap,
            "group.id": f"{group}.bench-reader",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    n = nbytes = 0
    first: float | None = None
    try:
        md = consumer.list_topics(topic, timeout=10).topics.get(topic)
        if md is None or md.error is not None:
            return 0, 0, None
        parts = list(md.partitions)
        consumer.assign([TopicPartition(topic, p, 0) for p in parts])
        at_end: set[int] = set()
        deadline = time.monotonic() + 60
        while len(at_end) < len(parts) and time.monotonic() < deadline:
            for m in consumer.consume(1000, timeout=0.5):
                err = m.error()
                if err is not None:
                    part = m.partition()
                    if err.code() == KafkaError._PARTITION_EOF and part is not None:
                        at_end.add(part)
                    continue
                ts = m.timestamp()[1] / 1000.0
                if since <= ts <= until:
                    first = ts if first is None else min(first, ts)
                    n += 1
                    nbytes += len(m.value() or b"")
    finally:
        consumer.close()
    return n, nbytes, first


def _committed_offset(ctx: Ctx, group: str, topic: str) -> int | None:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": ctx.bootstrap, "group.id": group})
    try:
        tp = consumer.committed([TopicPartition(topic, 0)], timeout=10)[0]
        return int(tp.offset) if tp.offset >= 0 else None
    finally:
        consumer.close()


class EventTail:
    """Reads an event log incrementally (only complete new lines), keeping what the replay count needs."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._pos = 0
        self._partial = ""
        self.ended_by_pid: dict[int, int] = {}
        self.ended: set[int] = set()

    def poll(self) -> None:
        from multilane.testing.processors import parse_event_line

        if not os.path.exists(self.path):
            return
        with open(self.path, encoding="ascii") as f:
            f.seek(self._pos)
            chunk = f.read()
            self._pos = f.tell()
        lines = (self._partial + chunk).split("\n")
        self._partial = lines.pop()  # an incomplete last line waits for the next poll
        for line in lines:
            if line:
                e = parse_event_line(line)
                if e.kind == "end":
                    self.ended_by_pid[e.pid] = self.ended_by_pid.get(e.pid, 0) + 1
                    self.ended.add(e.offset)


def _wait_for_ends(
    tail: EventTail, proc: subprocess.Popen[bytes], done: Callable[[EventTail], bool], timeout: float
) -> None:
    """Poll the event log until ``done(tail)``; fail when the worker exits or the deadline passes."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise ChildError(f"worker exited with code {proc.returncode} (see its stderr log)")
        tail.poll()
        if done(tail):
            return
        time.sleep(0.02)
    raise ChildError(f"worker {proc.pid}: records did not end within {timeout:.0f}s")


WORKER = (sys.executable, "-m", "multilane", "worker")
PROGRESS_IGNORING_WORKER = (sys.executable, "-m", "benchmarks.engine_child", "worker-ignoring-progress")


def replay_cycle(
    ctx: Ctx, data: ProducedTopic, label: str, extra_args: Sequence[str], launcher: Sequence[str] = WORKER
) -> ReplayOutcome:
    """Run a worker, kill -9 it after N ended records (hung records in flight), restart, count replays.

    1. Start worker A with the hang keys configured; wait until it logged N ``end`` events (records
       keep completing: the kill does not wait for a pause).
    2. SIGKILL it by PID; append a kill marker; read the group's committed offset.
    3. Create the hang release file; start worker B; wait until every produced offset has ended.
    4. SIGKILL worker B (everything is counted from the event log already); count records ended by
       A that B started again, records A ended in the last progress interval before the kill (event
       times), and the progress records A wrote (progress topic, by timestamp).
    """
    from multilane.testing.processors import append_kill_marker, read_event_log

    n, kill_after = data.records, ctx.sizes.replay_kill_after
    workdir = tempfile.mkdtemp(prefix=f"bench-replay-{label}-")
    log_path = os.path.join(workdir, "events.log")
    release = os.path.join(workdir, "release")
    group = ctx.group(f"replay-{label}")
    env = {
        **os.environ,
        "MULTILANE_TEST_LOG": log_path,
        "MULTILANE_TEST_SLEEP_MS": str(BASE_MS),
        "MULTILANE_TEST_HANG_KEY": ",".join(
            "hex:" + k.hex() for k in _hung_keys(data, kill_after, REPLAY_HUNG_KEYS)
        ),
        "MULTILANE_TEST_HANG_RELEASE_FILE": release,
    }
    argv = _worker_argv(ctx, data.topic, group, extra_args, launcher)
    procs: list[subprocess.Popen[bytes]] = []

    def start(name: str) -> subprocess.Popen[bytes]:
        err = open(os.path.join(workdir, f"worker-{name}.stderr"), "wb")  # noqa: SIM115 - child owns it
        proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=err)
        err.close()
        procs.append(proc)
        return proc

    try:
        # 1.
        tail = EventTail(log_path)
        a = start("a")
        _wait_for_ends(tail, a, lambda t: t.ended_by_pid.get(a.pid, 0) >= kill_after, timeout=120)
        # 2.
        killed_at = time.time()
        os.kill(a.pid, signal.SIGKILL)
        a.wait(10)
        append_kill_marker(log_path, a.pid)
        committed = _committed_offset(ctx, group, data.topic)
        # 3.
        open(release, "w").close()
        b = start("b")
        _wait_for_ends(tail, b, lambda t: len(t.ended) >= n, timeout=300)
        # 4.
        b.kill()
        b.wait(10)
    except BaseException:
        shutil.rmtree(workdir, ignore_errors=True)
        raise
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
    events = read_event_log(log_path)
    shutil.rmtree(workdir, ignore_errors=True)
    ends_a = {e.offset: e.time for e in events if e.pid == a.pid and e.kind == "end"}
    started_a = {e.offset for e in events if e.pid == a.pid and e.kind == "start"}
    started_b = {e.offset for e in events if e.pid == b.pid and e.kind == "start"}
    a_times = [e.time for e in events if e.pid == a.pid and e.kind in ("start", "end")]
    kill_instant = max([killed_at, *a_times])
    replayed = set(ends_a) & started_b
    window = REPLAY_PROGRESS_MS / 1000
    progress_records, progress_bytes, first_progress = _progress_written(
        ctx, group, min(a_times), kill_instant
    )
    return ReplayOutcome(
        ended_before_kill=len(ends_a),
        in_flight_at_kill=len(started_a - set(ends_a)),
        committed_at_kill=committed,
        replayed=len(replayed),
        derived_watermark_replays=None if committed is None else sum(1 for o in ends_a if o >= committed),
        completed_last_interval=sum(1 for t in ends_a.values() if t > kill_instant - window),
        oldest_replayed_ms=max((kill_instant - ends_a[o]) * 1000 for o in replayed) if replayed else None,
        progress_records=progress_records,
        progress_bytes=progress_bytes,
        progress_s=kill_instant - (first_progress if first_progress is not None else kill_instant),
    )


def progress_flag_missing() -> tuple[list[str], str | None]:
    """The worker's flag that disables progress persistence, or why there is none."""
    try:
        out = subprocess.run(
            [sys.executable, "-m", "multilane", "worker", "--help"],
            capture_output=True,
            text=True,
            timeout=60,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return [], f"multilane worker --help failed: {exc}"
    if out.returncode != 0:
        return [], f"multilane worker --help exited {out.returncode}: {_short(out.stderr)}"
    for flag in ("--no-progress", "--watermark-only", "--no-progress-persistence"):
        if flag in out.stdout:
            return [flag], None
    return [], "the worker has no flag to disable progress persistence (looked for --no-progress)"


def _short(text: str) -> str:
    lines = text.strip().splitlines()
    return lines[-1][:200] if lines else "(no output)"


def _replay_row(table: Table, system: str, o: ReplayOutcome, base: int | None, **extra: Any) -> None:
    bound = o.in_flight_at_kill + o.completed_last_interval
    table.add(
        system=system, ended=o.ended_before_kill, in_flight=o.in_flight_at_kill,
        committed=o.committed_at_kill, completed_last=o.completed_last_interval,
        bound=bound, replayed=o.replayed,
        holds=o.replayed + o.in_flight_at_kill <= bound, oldest_ms=o.oldest_replayed_ms,
        progress_rps=o.progress_records / o.progress_s if o.progress_s > 0 else None,
        progress_bps=o.progress_bytes / o.progress_s if o.progress_s > 0 else None,
        vs_progress=ratio(o.replayed, base), **extra,
    )  # fmt: skip


def scenario_replay(ctx: Ctx) -> None:
    """5. Records replayed after kill -9 while completions continue: progress every 50 ms, progress
    only at commits, watermark-only; the bound and the cost of the progress records."""
    n, kill_after = ctx.sizes.replay_records, ctx.sizes.replay_kill_after
    log(f"scenario 5: replay after kill -9, {n:,} records, kill after {kill_after:,}")
    table = ctx.report.table(
        "replay",
        f"5. Records replayed after kill -9 ({n:,} records, unordered F={REPLAY_F}, {BASE_MS:g} ms each, "
        f"{REPLAY_HUNG_KEYS} records hung until the restart, kill after {kill_after:,} ended while records "
        f"keep completing, commit interval {REPLAY_COMMIT_MS} ms); bound = in flight + completed in the "
        f"last progress interval ({REPLAY_PROGRESS_MS} ms)",
        [
            Column("system"),
            Column("ended", "ended before kill", ","),
            Column("in_flight", "in flight at kill", ","),
            Column("committed", "committed offset", ","),
            Column("completed_last", f"completed in the last {REPLAY_PROGRESS_MS} ms", ","),
            Column("bound", "bound", ","),
            Column("replayed", "replayed (ended, run again)", ","),
            Column("holds", "replayed + in flight <= bound"),
            Column("oldest_ms", "oldest replayed, ms before kill", ".0f"),
            Column("progress_rps", "progress records/s", ".1f"),
            Column("progress_bps", "progress bytes/s", ",.0f"),
            Column("vs_progress", "÷ with progress", ".1f"),
            Column("note"),
        ],
    )
    interval_name = f"multilane, progress every {REPLAY_PROGRESS_MS} ms"
    commits_name = "multilane, progress only at commits"
    if ctx.multilane_missing:
        for name in (interval_name, commits_name, "multilane watermark-only"):
            table.add_unavailable(ctx.multilane_missing, system=name)
        return
    data = ctx.topic(n)
    runs: dict[str, ReplayOutcome | str] = {}
    for name, interval in ((interval_name, REPLAY_PROGRESS_MS), (commits_name, 0)):
        try:
            runs[name] = replay_cycle(
                ctx, data, f"progress-{interval}", ["--progress-interval-ms", str(interval)]
            )
        except (ChildError, OSError) as exc:
            runs[name] = str(exc)
    # the watermark-only worker: the worker's own flag when it has one, else the same worker with
    # progress ignored on restart (see worker_ignoring_progress)
    flag, flag_missing = progress_flag_missing()
    watermark: ReplayOutcome | str
    if flag_missing:
        ctx.report.note(
            f"Scenario 5: {flag_missing}; the watermark-only row runs the same worker with "
            "`Ownership.load_progress` patched to return None (`python -m benchmarks.engine_child "
            "worker-ignoring-progress`)."
        )
        watermark_name = "multilane, progress ignored on restart"
        launcher: Sequence[str] = PROGRESS_IGNORING_WORKER
    else:
        watermark_name = f"multilane {' '.join(flag)}"
        launcher = WORKER
    try:
        watermark = replay_cycle(ctx, data, "watermark", flag, launcher)
    except (ChildError, OSError) as exc:
        watermark = str(exc)
    main_run = runs[interval_name]
    base = main_run.replayed if isinstance(main_run, ReplayOutcome) else None
    for name, o in runs.items():
        if isinstance(o, ReplayOutcome):
            _replay_row(table, name, o, base)
        else:
            table.add_unavailable(o, system=name)
    if isinstance(main_run, ReplayOutcome):
        o = main_run
        if o.derived_watermark_replays is not None:
            table.add(
                system="watermark-only (derived)", ended=o.ended_before_kill, in_flight=o.in_flight_at_kill,
                committed=o.committed_at_kill,
                replayed=o.derived_watermark_replays, vs_progress=ratio(o.derived_watermark_replays, base),
                note=f"same run as '{interval_name}': records that ended before the kill at or above the "
                     "committed offset",
            )  # fmt: skip
        ctx.report.goal(
            "5. replayed ÷ completed in the last progress interval",
            ratio(o.replayed, o.completed_last_interval),
            1.0,
            "<=",
        )
    if isinstance(watermark, ReplayOutcome):
        _replay_row(table, watermark_name, watermark, base)
    else:
        table.add_unavailable(watermark, system=watermark_name)
