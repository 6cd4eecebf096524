"""``multilane check-logs``: the delivery checkers over per-pod event logs (pods of a real cluster)."""

from __future__ import annotations

from pathlib import Path

import pytest

from multilane.cli import main
from multilane.testing.check_logs import PID_SPACE, merge_logs
from multilane.testing.processors import ProcessingEvent

TOPIC = "orders"


def ev(kind: str, t: float, partition: int, offset: int, key: bytes, pid: int = 1) -> ProcessingEvent:
    return ProcessingEvent(kind, t, pid, TOPIC, partition, offset, key, 1, 0)


def line(e: ProcessingEvent) -> str:
    key = "-" if e.key is None else e.key.hex()
    fields = (e.kind, f"{e.time:.6f}", e.pid, e.topic, e.partition, e.offset, key, e.attempt, e.lane)
    return "\t".join(str(f) for f in fields) + "\n"


def write(path: Path, events: list[ProcessingEvent]) -> str:
    path.write_text("".join(line(e) for e in events), encoding="ascii")
    return str(path)


def produced(path: Path, records: list[tuple[int, int, bytes]]) -> str:
    path.write_text("".join(f"{p}\t{o}\t{k.hex()}\n" for p, o, k in records), encoding="ascii")
    return str(path)


# Pod 0: PID 1 starts orders/0@0 (key a) and is killed before it ends; the restarted container (PID 1
# again, same log on the pod's volume) replays it 4 s later. Pod 1: PID 1 too, processes orders/1@0.
POD0 = [
    ev("start", 10.0, 0, 0, b"a"),
    ev("start", 14.0, 0, 0, b"a"),
    ev("end", 14.1, 0, 0, b"a"),
    ev("start", 14.2, 0, 1, b"a"),
    ev("end", 14.3, 0, 1, b"a"),
]
POD1 = [ev("start", 11.0, 1, 0, b"b"), ev("end", 11.5, 1, 0, b"b")]
RECORDS = [(0, 0, b"a"), (0, 1, b"a"), (1, 0, b"b")]


def test_merge_namespaces_pids_orders_by_time_and_places_the_kill_marker(tmp_path: Path) -> None:
    merged = merge_logs([POD0, POD1], kills=[(0, 10.5)])
    assert [e.seq for e in merged] == list(range(len(merged)))
    assert [e.time for e in merged] == sorted(e.time for e in merged)
    assert {e.pid for e in merged if e.kind != "kill"} == {PID_SPACE + 1, 2 * PID_SPACE + 1}
    kills = [i for i, e in enumerate(merged) if e.kind == "kill"]
    assert len(kills) == 1 and merged[kills[0]].pid == PID_SPACE + 1
    # before the restarted container's first event (t=14.0, after 3.5 s of silence in pod 0's log)
    assert merged[kills[0] + 1].time == 14.0 and merged[kills[0] - 1].time == 11.5


def test_a_kill_with_nothing_before_it_adds_no_marker() -> None:
    assert not [e for e in merge_logs([POD0], kills=[(0, 5.0)]) if e.kind == "kill"]


def test_cli_passes_with_the_kill_and_fails_without_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    p0, p1 = write(tmp_path / "orders-0.log", POD0), write(tmp_path / "orders-1.log", POD1)
    tsv = produced(tmp_path / "produced.tsv", RECORDS)
    base = ["check-logs", "--produced", tsv, "--topic", TOPIC, "--events", p0, "--events", p1]
    assert main([*base, "--kill", f"{p0}@10.5"]) == 0
    out = capsys.readouterr().out
    assert "produced 3, processed 3, lost 0, kill markers 1: ok" in out
    # Without the marker the killed attempt stays open while the new container starts the key again.
    assert main(base) == 1
    assert "exclusive-key" in capsys.readouterr().out


def test_cli_reports_a_lost_record(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    p1 = write(tmp_path / "orders-1.log", POD1)
    tsv = produced(tmp_path / "produced.tsv", [*RECORDS[2:], (1, 1, b"b")])
    assert main(["check-logs", "--produced", tsv, "--topic", TOPIC, "--events", p1]) == 1
    assert "lost 1" in capsys.readouterr().out


def test_cli_bad_input_is_exit_2(tmp_path: Path) -> None:
    tsv = produced(tmp_path / "produced.tsv", RECORDS)
    assert main(["check-logs", "--produced", tsv, "--topic", TOPIC, "--events", str(tmp_path / "nope")]) == 2
    p1 = write(tmp_path / "orders-1.log", POD1)
    args = ["check-logs", "--produced", tsv, "--topic", TOPIC, "--events", p1, "--kill", "other.log@1"]
    assert main(args) == 2
