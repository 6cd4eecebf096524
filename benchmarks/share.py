"""Share groups (KIP-932) as a rival: the unordered 10 ms workload through confluent-kafka's
``ShareConsumer`` on Apache Kafka, beside multilane's unordered mode at the same concurrency.
Does I/O: an Apache Kafka broker, child processes, files under a temp dir.

``python -m benchmarks.share [--quick] [--json] [--records N] [--consumers P] [--concurrency C]
[--lock-ms MS]``

One topic of one partition (the engine benchmark's 100-byte Zipf-keyed records, produced in batches
of ``--producer-batch`` records: a share fetch acquires whole batches, so with the benchmarks' usual
1 MB batches one consumer would take thousands of records and the others none), consumed by:

1. ``multilane``: the engine in unordered mode at F = P x C in flight (``benchmarks.engine_child``;
   its delivery checkers run in the child).
2. ``share group``: P processes (:mod:`benchmarks.baselines.share_group`), one share consumer each,
   each running its polled batch with at most C records in flight (P x C in flight in all).
3. ``share group, kill -9``: the same, one process killed by SIGKILL once a third of the records
   ended (the one with the most records in flight, as its event file shows). The records it had
   acquired and not acknowledged go back to the group when their acquisition lock expires
   (``share.record.lock.duration.ms``, set on the group to ``--lock-ms``; the broker's minimum is
   lowered to 1 s so a run does not wait Kafka's default 30 s).

Rates run from the first record started to the moment every record had ended; CPU per record is the
consumer processes' own CPU (all of them, from their first polled record to their stop) ÷ records.
Every share-group row applies the delivery checkers (at-least-once; replays) to the processes'
events; redelivered = starts with a delivery count above 1 (the broker's own count).
"""

from __future__ import annotations

import argparse
import json
import marshal
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from benchmarks._common import Column, Report, log, main, ratio

BASE_MS = 10.0
QUICK_RECORDS = 10_000
FULL_RECORDS = 40_000
# The broker settings of this benchmark (on top of ApacheKafka's test-bed settings): a kill -9 run
# waits for the acquisition lock, so its floor is lowered from 15 s to 1 s.
SERVER_CONFIG = {"group.share.min.record.lock.duration.ms": "1000"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--records", type=int, default=0, help="records (default 40k, quick 10k)")
    parser.add_argument("--consumers", type=int, default=4, help="share-consumer processes (P)")
    parser.add_argument("--concurrency", type=int, default=64, help="records in flight per process (C)")
    parser.add_argument("--lock-ms", type=int, default=5000, help="the group's acquisition lock (ms)")
    parser.add_argument("--share-config", action="append", default=[], metavar="KEY=VALUE",
                        help="extra librdkafka setting of every share consumer (e.g. fetch.wait.max.ms=10)")
    parser.add_argument("--producer-batch", type=int, default=64,
                        help="records per produced batch (batch.num.messages): a share fetch acquires whole "
                             "batches, so this bounds what one consumer takes at a time")


def _set_group_config(bootstrap: str, group: str, lock_ms: int) -> None:
    """Share groups start at the latest offset unless told: earliest, and the acquisition lock."""
    from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource

    admin = AdminClient({"bootstrap.servers": bootstrap})
    entries = [
        ConfigEntry("share.auto.offset.reset", "earliest", incremental_operation=AlterConfigOpType.SET),
        ConfigEntry("share.record.lock.duration.ms", str(lock_ms),
                    incremental_operation=AlterConfigOpType.SET),
    ]
    resource = ConfigResource(ConfigResource.Type.GROUP, group, incremental_configs=entries)
    for future in admin.incremental_alter_configs([resource]).values():
        future.result(timeout=60)


def _proc_cpu_s(pid: int) -> float | None:
    """A live process's CPU seconds (utime + stime from /proc), or None."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


class _EventTail:
    """The share-group processes' event files, read as they grow. Owner of ``events`` (all lines so
    far, as (time, kind, pid, offset, delivery_count)) and ``ended`` (offsets with an end)."""

    def __init__(self) -> None:
        self.files: dict[int, tuple[Path, int]] = {}
        self.events: list[tuple[float, str, int, int, int]] = []
        self.ended: dict[int, float] = {}  # offset -> time of its first end
        self.running: dict[int, set[int]] = {}  # pid -> offsets started and not ended (as far as written)

    def watch(self, pid: int, path: Path) -> None:
        self.files[pid] = (path, 0)

    def read(self) -> None:
        for pid, (path, pos) in list(self.files.items()):
            try:
                with open(path, encoding="utf-8") as f:
                    f.seek(pos)
                    chunk = f.read()
            except FileNotFoundError:
                continue
            complete = chunk[: chunk.rfind("\n") + 1]
            self.files[pid] = (path, pos + len(complete))
            for line in complete.splitlines():
                kind, offset, count, t = line.split()
                o, when = int(offset), float(t)
                self.events.append((when, "start" if kind == "s" else "end", pid, o, int(count)))
                running = self.running.setdefault(pid, set())
                if kind == "s":
                    running.add(o)
                else:
                    running.discard(o)
                if kind == "e" and o not in self.ended:
                    self.ended[o] = when


def run_share_group(
    bootstrap: str, topic: str, produced: Any, args: argparse.Namespace, scratch: Path, kill: bool
) -> dict[str, Any]:
    """One share-group row (steps 2 and 3 of the module docstring); its figures and checks."""
    from multilane.testing.checkers import ProducedRecord, check_delivery
    from multilane.testing.processors import ProcessingEvent

    group = f"bench-share-{uuid.uuid4().hex[:8]}"
    _set_group_config(bootstrap, group, args.lock_ms)
    n = produced.records
    tail = _EventTail()
    procs: list[subprocess.Popen[bytes]] = []
    killed: dict[int, float] = {}  # pid -> CPU seconds just before the kill
    kill_time: float | None = None
    try:
        for i in range(args.consumers):
            path = scratch / f"{group}-{i}.events"
            proc = subprocess.Popen(
                [sys.executable, "-m", "benchmarks.baselines.share_group", "--bootstrap", bootstrap,
                 "--topic", topic, "--group", group, "--events", str(path),
                 "--concurrency", str(args.concurrency), "--base-ms", str(BASE_MS),
                 *(a for kv in args.share_config for a in ("--config", kv))],
                stdout=subprocess.PIPE, stderr=open(scratch / f"{group}-{i}.log", "wb"),  # noqa: SIM115
            )  # fmt: skip
            procs.append(proc)
            tail.watch(proc.pid, path)
        deadline = time.monotonic() + 120 + n / 100
        while len(tail.ended) < n:
            if time.monotonic() > deadline:
                raise TimeoutError(f"share group: {len(tail.ended)}/{n} records ended in time")
            for proc in procs:
                if proc.poll() is not None and proc.pid not in killed:
                    raise RuntimeError(f"share consumer {proc.pid} exited with {proc.returncode}")
            time.sleep(0.1)
            tail.read()
            if kill and not killed and len(tail.ended) >= n // 3:
                # the process holding the most records in flight (acquired, not acknowledged)
                tail.read()
                victim = max(procs, key=lambda p: len(tail.running.get(p.pid, ())))
                if not tail.running.get(victim.pid):
                    continue
                killed[victim.pid] = _proc_cpu_s(victim.pid) or 0.0
                victim.send_signal(signal.SIGKILL)
                victim.wait()
                kill_time = time.time()
                log(f"  killed share consumer {victim.pid} at {len(tail.ended):,}/{n:,} records")
        cpu = sum(killed.values())
        for proc in procs:
            if proc.pid not in killed:
                proc.send_signal(signal.SIGTERM)
        for proc in procs:
            if proc.pid in killed:
                continue
            out, _ = proc.communicate(timeout=120)
            cpu += float(json.loads(out.decode().strip().splitlines()[-1])["cpu_s"])
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    tail.read()
    # records in flight at the kill: the victim's starts without its end (read after the fact: the
    # parent's view during the run lags by up to one poll of the files)
    held = sum(len(tail.running.get(pid, ())) for pid in killed)
    # the checkers' view: every process's starts and ends in time order, the kill as a marker
    rows = sorted(tail.events)
    if kill_time is not None:
        rows.append((kill_time, "kill", next(iter(killed)), -1, 0))
        rows.sort()
    first = produced.first_offset
    keys = produced.keys
    events = [
        ProcessingEvent(kind, t, pid, "" if kind == "kill" else topic, -1 if kind == "kill" else 0, o,
                        keys[o - first] if 0 <= o - first < n else None, count, -1, seq)
        for seq, (t, kind, pid, o, count) in enumerate(rows)
    ]  # fmt: skip
    produced_records = [ProducedRecord(topic, 0, first + i, k) for i, k in enumerate(keys)]
    results = check_delivery(produced_records, events, mode="unordered")
    failures = [str(r) for r in results if not r.ok]
    if failures:
        raise AssertionError("delivery checks failed: " + " / ".join(failures))
    replays = next(r for r in results if r.name == "replays").counts
    t0 = min(t for t, kind, *_ in rows if kind == "start")
    t_end = max(tail.ended.values())
    starts = [r for r in rows if r[1] == "start"]
    return {
        "rate": n / max(t_end - t0, 1e-9),
        "cpu_us": cpu / n * 1e6,
        "redelivered": sum(1 for r in starts if r[4] > 1),
        "replayed": replays["ended_more_than_once"],
        "recovery_s": (t_end - kill_time) if kill_time is not None else None,
        "held": held if kill_time is not None else None,
        "lost": 0,
        "shares": sorted((sum(1 for r in rows if r[1] == "end" and r[2] == proc.pid) for proc in procs),
                         reverse=True),
    }


def body(args: argparse.Namespace, report: Report) -> None:
    """1. Start Apache Kafka, produce the topic. 2. multilane row. 3. Share-group rows. 4. Ratios."""
    from multilane.testing.apache import ApacheKafka

    n = args.records or (QUICK_RECORDS if args.quick else FULL_RECORDS)
    in_flight = args.consumers * args.concurrency
    report.params.update(broker="apache", records=n, consumers=args.consumers, concurrency=args.concurrency,
                         in_flight=in_flight, base_ms=BASE_MS, lock_ms=args.lock_ms,
                         producer_batch=args.producer_batch, share_config=args.share_config, **SERVER_CONFIG)
    table = report.table("share", f"Unordered, {BASE_MS:g} ms asyncio.sleep per record, {in_flight} in "
                         "flight, Apache Kafka, one partition", [
                             Column("system"), Column("setting"), Column("records", fmt=","),
                             Column("rate", "rec/s", ",.0f"), Column("efficiency", fmt=".2f"),
                             Column("cpu_us", "CPU µs/rec", ",.1f"),
                             Column("held", "started, not ended, in the killed process", ","),
                             Column("redelivered", "redelivered", ","),
                             Column("replayed", "ended twice", ","),
                             Column("recovery_s", "kill -> all ended (s)", ".1f"), Column("lost"),
                             Column("note")])  # fmt: skip
    rates: dict[str, float] = {}
    # 1.
    broker = ApacheKafka(server_config=SERVER_CONFIG).start(timeout=300)  # a loaded machine starts it slowly
    try:
        _rows(broker, n, in_flight, args, table, rates)
    finally:
        broker.stop()
    # 4.
    report.goal("multilane ÷ share group, same in flight (rec/s)",
                ratio(rates.get("multilane"), rates.get("share group")), 1.0)
    report.note("efficiency = rec/s ÷ (in flight ÷ 10 ms). redelivered = starts whose delivery count "
                "(the broker's) was above 1; ended twice = records with two ends (the replays checker). "
                "multilane's replays after kill -9 are measured by `python -m benchmarks.engine --only 5`.")


def _rows(
    broker: Any, n: int, in_flight: int, args: argparse.Namespace, table: Any, rates: dict[str, float]
) -> None:
    """Steps 1-3 of :func:`body` on a running broker."""
    from benchmarks._children import ChildError, run_json_child
    from benchmarks._data import produce_zipf
    from benchmarks.engine_rows import N_KEYS, VALUE_BYTES, ZIPF_S

    ideal = in_flight / (BASE_MS / 1000)
    with tempfile.TemporaryDirectory(prefix="bench-share-") as tmp:
        scratch = Path(tmp)
        topic = f"share-in-{uuid.uuid4().hex[:8]}"
        broker.create_topic(topic, 1)
        produced = produce_zipf(broker.bootstrap, topic, n, VALUE_BYTES, N_KEYS, ZIPF_S, seed=1,
                                producer_config={"batch.num.messages": args.producer_batch})
        keys_file = scratch / "keys.marshal"
        with open(keys_file, "wb") as f:
            marshal.dump(produced.keys, f)
        log(f"produced {n:,} records to {topic} on Apache Kafka {broker.bootstrap}")
        # 2.
        argv = [sys.executable, "-m", "benchmarks.engine_child", "run", "--bootstrap", broker.bootstrap,
                "--topic", topic, "--group", f"bench-share-ml-{uuid.uuid4().hex[:8]}", "--records", str(n),
                "--ordering", "unordered", "--factor", str(in_flight), "--processor", "async-sleep",
                "--base-ms", str(BASE_MS), "--timeout", "600", "--keys-file", str(keys_file),
                "--first-offset", str(produced.first_offset)]  # fmt: skip
        ml_setting = f"unordered F={in_flight}, one process"
        try:
            res = run_json_child(argv, timeout=660)
            rates["multilane"] = float(res["rate"])
            log(f"  multilane: {res['rate']:,.0f} rec/s")
            table.add(system="multilane", setting=ml_setting, records=n, rate=res["rate"],
                      efficiency=res["rate"] / ideal, cpu_us=res["cpu_us_per_record"], lost=0,
                      note="delivery checked" if res.get("checked") else "")  # fmt: skip
        except ChildError as exc:
            table.add_unavailable(str(exc)[:300], system="multilane", setting=ml_setting, records=n)
        # 3.
        share_setting = f"{args.consumers} processes x 1 ShareConsumer, <= {args.concurrency} in flight each"
        for kill in (False, True):
            system = "share group, kill -9 of 1 process" if kill else "share group"
            try:
                r = run_share_group(broker.bootstrap, topic, produced, args, scratch, kill)
            except Exception as exc:  # a row fails alone
                table.add_unavailable(f"{type(exc).__name__}: {str(exc)[:300]}", system=system,
                                      setting=share_setting, records=n)
                continue
            rates[system] = r["rate"]
            log(f"  {system}: {r['rate']:,.0f} rec/s")
            shares = "/".join(f"{x:,}" for x in r.pop("shares"))
            table.add(system=system, setting=share_setting, records=n, efficiency=r["rate"] / ideal,
                      note=f"delivery checked; lock {args.lock_ms} ms; records ended per process {shares}",
                      **r)  # fmt: skip


if __name__ == "__main__":
    raise SystemExit(main("share", __doc__ or "", body, add_arguments, module="benchmarks.share"))
