"""The demo's pure parts: verdicts, processing gaps, the live view and the plain lines."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from multilane.demo.check import Verdict, judge
from multilane.demo.report import (
    DemoSample,
    HandoffPause,
    Timeline,
    live_view,
    plain_line,
    plot,
    processing_gap,
    summary_lines,
)
from multilane.operator.rollout.handoff import HandoffRecord
from multilane.testing.checkers import ProducedRecord
from multilane.testing.processors import ProcessingEvent


def _ev(kind: str, t: float, offset: int, key: bytes, pid: int = 1, seq: int = 0) -> ProcessingEvent:
    return ProcessingEvent(kind, t, pid, "t", 0, offset, key, 1, 0, seq)


def _sample(t: float, phase: str = "active") -> DemoSample:
    return DemoSample(t, 10, 100.0, 90.0, 1, 2, {"t/0": phase, "t/1": "active"}, {"t/0": "a -> b"}, "burst")


def test_judge_counts_lost_and_state() -> None:
    produced = [ProducedRecord("t", 0, i, b"k%d" % (i % 2)) for i in range(4)]
    events = []
    for i in range(3):  # offset 3 never ends
        events += [
            _ev("start", i, i, b"k%d" % (i % 2), seq=2 * i),
            _ev("end", i + 0.5, i, b"k%d" % (i % 2), seq=2 * i + 1),
        ]
    v = judge(produced, events, {b"k0": 2, b"k1": 1})
    assert (v.produced, v.processed, v.lost) == (4, 3, 1)
    assert not v.ok
    assert v.state_ok is False and v.state_mismatches == 1  # k1 was produced twice, counted once
    ok = judge(produced[:3], events, {b"k0": 2, b"k1": 1})
    assert ok.ok and ok.lost == 0 and ok.state_ok


def test_processing_gap_spans_release_to_first_completion_after_promotion() -> None:
    ends = {"p": [1.0, 2.0, 3.0, 5.0, 10.0, 10.2]}
    assert processing_gap(ends, "p", 4.0, 9.0) == 5.0  # 5.0 (source drain) -> 10.0
    assert processing_gap(ends, "p", 3.5, 4.0) == 1.5  # 3.5 -> 5.0
    assert processing_gap(ends, "p", 11.0, 12.0) is None


def test_views_render(tmp_path: Path) -> None:
    timeline = Timeline(
        [_sample(0.0), _sample(1.0, "learning"), _sample(2.0)], [(1.0, "RolloutStarted", "x")]
    )
    record = HandoffRecord("t/0", "a", "b", False, 0.4, 0.6, 10, 0.5, 0.1, 100.0, 100.6)
    timeline.handoffs.append(HandoffPause(record, 2.0, 0.9))
    console = Console(record=True, width=160)
    console.print(live_view(timeline.samples[1], timeline, 123))
    text = console.export_text()
    assert "learning" in text and "a -> b" in text and "RolloutStarted" in text
    assert "moving: t/0:learning(a -> b)" in plain_line(timeline.samples[1])
    png = plot(timeline, tmp_path / "demo.png", "test")
    assert png.stat().st_size > 10_000

    verdict = Verdict(produced=3, processed=3, replayed=0, lost=0, state_ok=True)
    lines = summary_lines(verdict, timeline, 10.0, png, {"replicas": 2, "factor": 8})
    assert any("t/0" in line and "0.60s" in line and "0.90s" in line for line in lines)
    assert lines[-1].endswith("OK")
