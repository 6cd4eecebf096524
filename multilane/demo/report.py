"""What the demo shows: the timeline it samples, the live table (rich), plain progress lines for logs,
the summary and the PNG plot. Pure apart from :func:`plot` (writes a PNG) and the rich rendering.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Group
from rich.table import Table
from rich.text import Text

from multilane.operator.rollout.handoff import HandoffRecord

__all__ = [
    "BurstFigures",
    "DemoSample",
    "HandoffPause",
    "Timeline",
    "burst_figures",
    "live_view",
    "plain_line",
    "plot",
    "summary_lines",
]


@dataclass(frozen=True)
class DemoSample:
    """One look at the system. ``t``: seconds since the demo started."""

    t: float
    lag: int
    input_rate: float
    processing_rate: float
    replicas: int  # alive workers
    factor: int
    phases: Mapping[str, str]  # partition -> active | learning | releasing | promoting | pending
    owners: Mapping[str, str]  # partition -> owner (or "A -> B" during a move)
    load: str  # which step of the load profile runs

    @classmethod
    def from_status(
        cls,
        now: float,
        metrics: Any,
        status: Mapping[str, Any],
        alive: int,
        partitions: Sequence[str],
        load: str,
    ) -> DemoSample:
        """A sample from a control-plane status (``assignment`` members, ``rollout`` moves, ``factor``)
        and a metric sample (``total_lag``, ``input_rate``, ``processing_rate``; None: not measured)."""
        assigned = (status.get("assignment") or {}).get("members") or []
        members = {p: w["worker"] for w in assigned for p in w["partitions"]}
        phases = {p: "active" if p in members else "unassigned" for p in partitions}
        owners = dict(members)
        for mv in (status.get("rollout") or {}).get("moves") or []:
            if mv.get("phase") in ("learning", "releasing", "promoting", "pending"):
                phases[mv["partition"]] = mv["phase"]
                owners[mv["partition"]] = f"{mv.get('source') or '-'} -> {mv['target']}"
        m = metrics
        return cls(
            t=now,
            lag=0 if m is None else m.total_lag,
            input_rate=0.0 if m is None or m.input_rate is None else m.input_rate,
            processing_rate=0.0 if m is None or m.processing_rate is None else m.processing_rate,
            replicas=alive,
            factor=int(status.get("factor") or 1),
            phases=phases,
            owners=owners,
            load=load,
        )


@dataclass(frozen=True)
class HandoffPause:
    """A completed move with its pause measured two ways: by the control plane (release call to end of
    the promotion call) and from the processing log (longest gap between completions of the partition
    around the handoff)."""

    record: HandoffRecord
    at: float  # seconds since start, when the move completed
    processing_gap_s: float | None


@dataclass
class Timeline:
    samples: list[DemoSample] = field(default_factory=list)
    events: list[tuple[float, str, str]] = field(default_factory=list)  # (t, reason, message)
    handoffs: list[HandoffPause] = field(default_factory=list)
    offered_per_s: list[float] = field(default_factory=list)  # the load profile, per second
    delivered_per_s: list[int] = field(default_factory=list)  # what the generator achieved


@dataclass(frozen=True)
class BurstFigures:
    """How the control plane met a burst (seconds are relative to the burst's onset).

    ``reaction_s``: onset -> the first scale decision. ``recovery_s``: onset -> the first of
    ``sustain`` consecutive samples in which processing reached 95 % of the burst's achieved input
    rate. None: it did not happen within the run.
    """

    onset_s: float
    end_s: float
    offered_rate: float  # mean records/s the profile asked for during the burst
    achieved_rate: float  # mean records/s delivered during the burst
    reaction_s: float | None
    recovery_s: float | None
    peak_lag: int
    lag_seconds: float  # integral of the lag over the whole run (records x s)
    scale_actions: int  # scale-ups and scale-downs, whole run (a factor-follows completes its scale-up)
    size_changes: int  # every decision that changed replicas or factor, whole run
    scale_downs_in_burst: int  # decisions that shrank the group between onset and end
    scale_ups: int = 0  # scale actions that raised replicas or factor, whole run (factor-follows excluded)
    scale_downs: int = 0  # scale actions that lowered both (or one, the other unchanged), whole run

    def lines(self) -> list[str]:
        def secs(x: float | None) -> str:
            return "not within the run" if x is None else f"{x:.1f} s"

        short = 1.0 - self.achieved_rate / self.offered_rate if self.offered_rate > 0 else 0.0
        return [
            f"burst               t={self.onset_s:.0f}-{self.end_s:.0f}s: "
            f"offered {self.offered_rate:,.0f} rec/s, "
            f"achieved {self.achieved_rate:,.0f} rec/s"
            + (f" (shortfall {short:.0%})" if short > 0.02 else ""),
            f"reaction            {secs(self.reaction_s)}   (onset -> first scale decision)",
            f"recovery            {secs(self.recovery_s)}   (onset -> processing >= 95% of the input)",
            f"peak lag            {self.peak_lag:,}   lag-seconds {self.lag_seconds:,.0f}",
            f"scaling actions     {self.scale_actions}   ({self.scale_ups} up, {self.scale_downs} down; "
            f"{self.size_changes} size changes; scale-downs during the burst: {self.scale_downs_in_burst})",
        ]


def burst_figures(
    samples: Sequence[DemoSample],
    events: Sequence[tuple[float, str, str]],
    onset_s: float,
    end_s: float,
    offered_per_s: Sequence[float],
    delivered_per_s: Sequence[float],
    sustain: int = 3,
    clock_offset_s: float = 0.0,
) -> BurstFigures:
    """Reaction, recovery, peak lag, lag-seconds and scaling actions of one burst (pure).

    ``samples`` and ``events`` are on the demo's clock; ``offered_per_s``/``delivered_per_s`` are per
    second of the load generator's clock, which started ``clock_offset_s`` later.
    """
    lo, hi = int(onset_s - clock_offset_s), int(end_s - clock_offset_s)
    offered = list(offered_per_s[max(lo, 0) : max(hi, 0)])
    delivered = list(delivered_per_s[max(lo, 0) : max(hi, 0)])
    offered_rate = sum(offered) / len(offered) if offered else 0.0
    achieved = sum(delivered) / len(offered) if offered else 0.0
    decisions = [(t, m) for t, reason, m in events if reason == "ScalingDecision" and m.startswith("scale ")]
    reaction = next((t - onset_s for t, _ in decisions if t >= onset_s), None)
    recovery = None
    run = 0
    for smp in samples:
        if smp.t < onset_s:
            continue
        run = run + 1 if smp.processing_rate >= 0.95 * achieved > 0 else 0
        if run >= sustain:
            recovery = samples[samples.index(smp) - sustain + 1].t - onset_s
            break
    lag_seconds = sum((b.t - a.t) * (a.lag + b.lag) / 2 for a, b in itertools.pairwise(samples))
    downs = 0
    for t, m in decisions:
        if onset_s <= t <= end_s and "scale down" in m:
            downs += 1
    actions = [m for _, m in decisions if not m.startswith("scale [factor-follows]")]
    ups = sum(1 for m in actions if _grows(m))
    return BurstFigures(
        onset_s=onset_s,
        end_s=end_s,
        offered_rate=offered_rate,
        achieved_rate=achieved,
        reaction_s=reaction,
        recovery_s=recovery,
        peak_lag=max((smp.lag for smp in samples if smp.t >= onset_s), default=0),
        lag_seconds=lag_seconds,
        scale_actions=sum(1 for _, m in decisions if not m.startswith("scale [factor-follows]")),
        size_changes=len(decisions),
        scale_downs_in_burst=downs,
        scale_ups=ups,
        scale_downs=len(actions) - ups,
    )


_SIZE_CHANGE = re.compile(r"replicas (\d+)->(\d+), factor (\d+)->(\d+)")


def _grows(message: str) -> bool:
    """True when a ScalingDecision message (``replicas A->B, factor C->D``) raises either dimension."""
    m = _SIZE_CHANGE.search(message)
    if m is None:
        return "scale up" in message
    r0, r1, f0, f1 = (int(x) for x in m.groups())
    return r1 > r0 or f1 > f0


_PHASE_STYLE = {
    "active": "green",
    "learning": "yellow",
    "releasing": "magenta",
    "promoting": "cyan",
    "pending": "dim",
}


def live_view(s: DemoSample, timeline: Timeline, produced: int) -> Group:
    """The live terminal view: headline figures, one row per partition, the latest events."""
    head = Table.grid(padding=(0, 3))
    for _ in range(7):
        head.add_column()
    head.add_row(
        f"t={s.t:5.0f}s",
        f"load: {s.load}",
        f"lag: {s.lag:,}",
        f"in: {s.input_rate:,.0f} rec/s",
        f"processed: {s.processing_rate:,.0f} rec/s",
        f"replicas: {s.replicas}",
        f"factor: {s.factor}",
    )
    parts = Table(title=f"partitions (produced so far ~{produced:,})", expand=False)
    parts.add_column("partition")
    parts.add_column("phase")
    parts.add_column("owner")
    for p in sorted(s.phases, key=lambda x: (x.rpartition("/")[0], int(x.rpartition("/")[2]))):
        phase = s.phases[p]
        parts.add_row(p, Text(phase, style=_PHASE_STYLE.get(phase, "")), s.owners.get(p, "-"))
    events = Table(title="events", show_header=False, expand=False)
    events.add_column("t", justify="right")
    events.add_column("event")
    for t, reason, message in timeline.events[-8:]:
        events.add_row(f"{t:.0f}s", f"{reason}: {message}"[:140])
    return Group(head, parts, events)


def plain_line(s: DemoSample) -> str:
    """One progress line for logs (stdout is not a TTY)."""
    moving = {p: ph for p, ph in s.phases.items() if ph != "active"}
    moves = " ".join(f"{p}:{ph}({s.owners.get(p, '-')})" for p, ph in sorted(moving.items()))
    return (
        f"t={s.t:5.0f}s load={s.load:<6} lag={s.lag:>7,} in={s.input_rate:>6,.0f}/s "
        f"processed={s.processing_rate:>6,.0f}/s replicas={s.replicas} factor={s.factor}"
        + (f" moving: {moves}" if moves else "")
    )


def summary_lines(
    verdict: Any,
    timeline: Timeline,
    elapsed_s: float,
    png: Path | None,
    peak: Mapping[str, int],
    burst: BurstFigures | None = None,
) -> list[str]:
    """The end-of-run summary (``verdict``: :class:`multilane.demo.check.Verdict`)."""
    out = [
        "",
        "=== multilane demo: summary ===",
        f"duration            {elapsed_s:.0f} s",
        *(burst.lines() if burst is not None else []),
        f"produced            {verdict.produced:,}",
        f"processed           {verdict.processed:,}",
        f"replayed            {verdict.replayed:,}   (at-least-once: processed again after a handoff)",
        f"lost                {verdict.lost:,}",
        f"peak replicas       {peak.get('replicas', 0)}   peak factor {peak.get('factor', 0)}",
    ]
    for c in verdict.checks:
        out.append(f"check {c.name:<14}{'ok' if c.ok else 'FAILED'}  {c.counts}")
        out.extend(f"    {v}" for v in c.violations[:3])
    if verdict.state_ok is not None:
        out.append(f"state vs produced   {'ok' if verdict.state_ok else 'MISMATCH'}  {verdict.state_detail}")
    out.append(f"handoffs            {len(timeline.handoffs)}")
    for h in timeline.handoffs:
        r = h.record
        gap = "n/a (no record after it)" if h.processing_gap_s is None else f"{h.processing_gap_s:.2f}s"
        out.append(
            f"  t={h.at:4.0f}s {r.partition:<12} {r.source or '-'} -> {r.target}  warm-up {r.learn_s:.2f}s  "
            f"pause {r.pause_s:.2f}s (control plane), longest gap in processing {gap}"
            + ("  [eager fallback]" if r.eager else "")
        )
    if timeline.handoffs:
        worst = max(h.record.pause_s for h in timeline.handoffs)
        out.append(f"longest handoff pause {worst:.2f}s")
    if png is not None:
        out.append(f"plot                {png}")
    out.append("result              " + ("OK" if verdict.ok else "FAILED"))
    return out


def plot(timeline: Timeline, path: Path, title: str) -> Path:
    """Lag, rates, replicas and factor over time, handoffs marked; writes a PNG (matplotlib, Agg)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    samples = timeline.samples
    t = [s.t for s in samples]
    fig, axes = plt.subplots(3, 1, figsize=(11, 8.5), sharex=True, constrained_layout=True)
    ax_lag, ax_rate, ax_size = axes
    ax_lag.plot(t, [s.lag for s in samples], color="tab:red", label="lag (records)")
    ax_lag.set_ylabel("lag (records)")
    ax_lag.set_title(title)
    if timeline.offered_per_s:
        start = t[0] if t else 0.0
        secs = [start + i + 0.5 for i in range(len(timeline.offered_per_s))]
        ax_rate.step(secs, timeline.offered_per_s, where="mid", color="black", alpha=0.5, linestyle="--",
                     label="offered (load profile)")  # fmt: skip
        got = list(timeline.delivered_per_s[: len(secs)])
        ax_rate.plot(secs[: len(got)], got, color="tab:gray", alpha=0.7, label="achieved (delivered)")
    ax_rate.plot(t, [s.input_rate for s in samples], color="tab:blue", label="input rate (measured)")
    ax_rate.plot(t, [s.processing_rate for s in samples], color="tab:green", label="processing rate")
    ax_rate.set_ylabel("records/s")
    ax_size.step(t, [s.replicas for s in samples], where="post", color="tab:purple", label="replicas (alive)")
    ax_size.set_ylabel("replicas")
    ax_f = ax_size.twinx()
    ax_f.step(
        t, [s.factor for s in samples], where="post", color="tab:orange", label="factor (lanes/partition)"
    )
    ax_f.set_ylabel("factor")
    ax_size.set_xlabel("seconds since start")
    for h in timeline.handoffs:
        for ax in axes:
            ax.axvline(h.at, color="grey", alpha=0.35, linewidth=1)
    for a, b in itertools.pairwise(samples):
        if any(ph not in ("active", "unassigned") for ph in a.phases.values()):
            for ax in axes:
                ax.axvspan(a.t, b.t, color="gold", alpha=0.2, linewidth=0)
        if a.load == "burst":
            ax_rate.axvspan(a.t, b.t, color="tab:blue", alpha=0.05, linewidth=0)
    for ax in (ax_lag, ax_rate):
        ax.legend(loc="upper right")
        ax.grid(alpha=0.3)
    lines = ax_size.get_legend_handles_labels()
    lines_f = ax_f.get_legend_handles_labels()
    ax_size.legend(lines[0] + lines_f[0], lines[1] + lines_f[1], loc="upper right")
    ax_size.grid(alpha=0.3)
    ax_size.set_ylim(0, max([s.replicas for s in samples] + [1]) + 1)
    from matplotlib.ticker import MaxNLocator

    ax_size.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax_f.set_ylim(0, max([s.factor for s in samples] + [1]) * 1.2 + 1)
    ax_lag.text(
        0.01,
        0.95,
        "gold: partitions moving (learning / releasing / promoting); grey lines: handoffs done; "
        "light blue: load burst",
        transform=ax_lag.transAxes,
        fontsize=8,
        va="top",
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def processing_gap(
    ends_by_partition: Mapping[str, Sequence[float]], partition: str, released_at: float, promoted_at: float
) -> float | None:
    """The partition's longest stretch without a completed record during the handoff: from the start
    of the release to the first completion after the promotion returned (completions of the draining
    source in between split it). None when nothing completed after the promotion."""
    times = sorted(ends_by_partition.get(partition) or [])
    after = [x for x in times if x >= promoted_at]
    if not after:
        return None
    points = [released_at, *(x for x in times if released_at < x < after[0]), after[0]]
    return max(b - a for a, b in itertools.pairwise(points))
