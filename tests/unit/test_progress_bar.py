"""``ProgressBar``: shown on a terminal, silent elsewhere, so that piped CLI output stays clean."""

from __future__ import annotations

import io
import subprocess
import sys

import pytest
from rich.console import Console

from multilane.progress_bar import ProgressBar


def test_not_a_terminal_writes_nothing() -> None:
    out = io.StringIO()
    with ProgressBar("simulating", total=4, console=Console(file=out)) as bar:
        assert not bar.shown
        for i in range(1, 5):
            bar.update(i)
    assert out.getvalue() == ""


def test_terminal_shows_the_bar_and_clears_it() -> None:
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=100)
    with ProgressBar("simulating", total=4, console=console) as bar:
        assert bar.shown
        bar.update(3)
        bar.update(99)  # past the total: capped
    text = out.getvalue()
    assert "simulating" in text
    assert "4/4" in text  # the final render before the transient bar is erased
    assert not bar.shown


def test_negative_total_is_refused() -> None:
    with pytest.raises(ValueError, match="total must be >= 0"):
        ProgressBar("x", total=-1)


def test_simulate_piped_prints_no_bar() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "multilane", "simulate", "--trace", "step", "--duration", "120", "--json"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "simulating" not in proc.stderr
    assert proc.stdout.lstrip().startswith("{")
