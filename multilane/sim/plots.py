"""PNG plots of simulated runs: lag, replicas/pods and factor over time, one column per policy.

Does I/O (writes files); matplotlib is imported lazily with the Agg backend.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from multilane.sim.engine import SimResult

__all__ = ["plot_trace"]


def plot_trace(results: Sequence[SimResult], out_dir: Path) -> Path:
    """One PNG for the runs of one trace (``<out_dir>/<trace>.png``); returns its path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    trace = results[0].trace
    n = len(results)
    fig, axes = plt.subplots(3, n, figsize=(4.5 * n, 7.5), sharex=True, squeeze=False)
    lag_max = max(float(r.lag.max()) for r in results) or 1.0
    for col, r in enumerate(results):
        minutes = r.time_s / 60
        ax = axes[0][col]
        ax.plot(minutes, r.lag, color="tab:red")
        ax.set_title(f"{r.policy}")
        ax.set_ylim(0, lag_max * 1.05)
        ax.set_ylabel("lag (records)" if col == 0 else "")
        ax = axes[1][col]
        ax.step(minutes, r.replicas, where="post", label="replicas asked")
        ax.step(minutes, r.pods, where="post", label="pods alive", alpha=0.6)
        ax.set_ylabel("replicas" if col == 0 else "")
        ax.legend(loc="upper left", fontsize="small")
        ax = axes[2][col]
        ax.step(minutes, r.factor, where="post", color="tab:green")
        ax.set_ylabel("factor (lanes/partition)" if col == 0 else "")
        ax.set_xlabel("minutes")
    fig.suptitle(f"trace: {trace}")
    fig.tight_layout()
    path = out_dir / f"{trace}.png"
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path
