"""Shared plumbing for multilane's benchmarks (``python -m benchmarks.<name>``).

Every benchmark (``engine``, ``state``, ``handoff``, ``snapshot``, ...) follows the same conventions,
and this module implements them so that each benchmark only writes its measurements:

* **Command line.** ``--quick`` (smaller sizes, fewer rows; must finish in under a minute),
  ``--json`` (the LAST line of stdout is one JSON object holding the whole report), ``--out PATH``
  (also write that JSON object to a file). A benchmark adds its own options with ``add_arguments``.
* **Output.** Tables are printed to stdout as Markdown pipe tables (paste them into
  ``docs/benchmarks.md`` as they are), after a header naming the machine and the command. Progress and
  logs go to stderr (:func:`log`), so ``stdout`` stays clean.
* **Ratios, not absolutes.** The machine is shared and noisy: every figure that is compared with
  another is a ratio of two numbers measured in the same run (:func:`ratio`), and goals are checked on
  those ratios (:meth:`Report.goal`).
* **Medians with their spread.** A row is run several times (``--repeats``) and reported as the median
  and the range of its runs (:class:`Spread`, :func:`spread`); rows that are compared run in
  alternation, round by round (:func:`alternate`: A B A B ...), and their ratio is the spread of the
  per-round ratios (:func:`paired_ratios`), so a slow minute of the machine hits both sides.
* **Never crash on a missing part.** A row that cannot be measured is added with
  :meth:`Table.add_unavailable`, which prints ``not available (<reason>)`` in its place; goals whose
  value is missing are reported as ``not measured``.
* **Own broker.** Each run starts its own embedded broker (``benchmarks._data.broker_session``) and
  stops it by PID at the end; data is produced once per scenario (``benchmarks._data.produce_zipf``).
* **Subprocess rows.** A row measured in a child process (a fresh interpreter: no threads or caches
  left over from earlier rows) prints one JSON object as its last stdout line;
  ``benchmarks._children.run_json_child`` runs it and returns that object;
  ``benchmarks._children.emit_child_result`` is the child's side.

A benchmark module looks like this::

    from benchmarks._common import Column, Report, main

    def body(args: argparse.Namespace, report: Report) -> None:
        table = report.table("restore", "Restore time", [Column("system"), Column("seconds", fmt=".2f")])
        table.add(system="multilane", seconds=1.23)
        report.goal("restore faster than replay", value=2.5, target=2.0)

    if __name__ == "__main__":
        raise SystemExit(main("state", "State store benchmark.", body))

JSON object (``schema`` 1)::

    {"benchmark": str, "schema": 1, "date": ISO-8601 UTC, "command": str, "quick": bool,
     "ok": bool, "elapsed_s": float, "machine": {...}, "params": {...},
     "tables": [{"name", "title", "columns": [{"key", "header"}], "rows": [{key: value}]}],
     "goals": [{"name", "value", "target", "op", "passed"}], "notes": [str], "errors": [str]}

Non-finite floats become ``null``; ``ok`` is false when the body raised (its error is in ``errors``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import shlex
import statistics
import sys
import time
import traceback
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Generic, TypeVar

__all__ = [
    "Alternation",
    "Column",
    "Goal",
    "Report",
    "Spread",
    "Table",
    "alternate",
    "log",
    "machine_info",
    "main",
    "paired_ratios",
    "ratio",
    "spread",
]

SCHEMA_VERSION = 1
NOT_AVAILABLE = "not available"


def log(*parts: object) -> None:
    """Progress message on stderr (stdout is reserved for the tables and the JSON line)."""
    print(*parts, file=sys.stderr, flush=True)


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    """``numerator / denominator``, or None when either is missing or the denominator is not > 0."""
    if numerator is None or denominator is None or not denominator > 0:
        return None
    return numerator / denominator


def json_safe(value: Any) -> Any:
    """Replace non-finite floats by None (JSON has no NaN), make tuples lists and a :class:`Spread` a
    dict, recursively."""
    if isinstance(value, Spread):
        return json_safe(value.to_json())
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    return value


# --------------------------------------------------------------------------------------------- statistics


@dataclass(frozen=True)
class Spread:
    """Median and range (``lo`` = min, ``hi`` = max) of ``n`` repeated measurements.

    Invariant: ``lo <= median <= hi`` and ``n >= 1``.
    """

    median: float
    lo: float
    hi: float
    n: int

    @property
    def relative(self) -> float:
        """(max - min) / median: how far apart the runs were (0 for one run)."""
        return (self.hi - self.lo) / self.median if self.median else math.inf

    def render(self, fmt: str = "") -> str:
        """``median (min..max)``, or the median alone for a single run."""
        m = format(self.median, fmt)
        return m if self.n == 1 else f"{m} ({format(self.lo, fmt)}..{format(self.hi, fmt)})"

    def to_json(self) -> dict[str, Any]:
        return {"median": self.median, "min": self.lo, "max": self.hi, "n": self.n}


def spread(values: Iterable[float | None]) -> Spread | None:
    """The :class:`Spread` of the finite values (None and NaN are dropped); None when none is left."""
    xs = sorted(float(v) for v in values if v is not None and math.isfinite(v))
    if not xs:
        return None
    return Spread(median=statistics.median(xs), lo=xs[0], hi=xs[-1], n=len(xs))


def paired_ratios(
    numerators: Mapping[int, float | None], denominators: Mapping[int, float | None]
) -> list[float]:
    """``numerators[r] / denominators[r]`` for every round ``r`` both sides measured (see :func:`ratio`).

    Keyed by round so that a run missing on one side does not shift the pairs.
    """
    out = []
    for r in sorted(numerators.keys() & denominators.keys()):
        q = ratio(numerators[r], denominators[r])
        if q is not None:
            out.append(q)
    return out


K = TypeVar("K", bound=Hashable)
T = TypeVar("T")


@dataclass
class Alternation(Generic[K, T]):
    """What :func:`alternate` measured: each label's runs by round, the failures, the order of runs."""

    runs: dict[K, dict[int, T]]  # label -> round -> result (rounds the label failed in are missing)
    errors: dict[K, str]  # label -> why it stopped (a failed label is not run again)
    order: list[tuple[int, K]]  # (round, label) in the order they ran


def alternate(labels: Sequence[K], rounds: int, run: Callable[[K, int], T]) -> Alternation[K, T]:
    """Run every label once per round, round after round (A B A B ...): ``run(label, round)``.

    Alternating makes a slow stretch of a shared machine hit every label alike, so ratios of labels
    taken round by round hold still where separate blocks of runs would not. A label whose run raises
    is recorded in ``errors`` (first line of the exception) and skipped in later rounds; the others go on.
    """
    result: Alternation[K, T] = Alternation({label: {} for label in labels}, {}, [])
    for r in range(rounds):
        for label in labels:
            if label in result.errors:
                continue
            result.order.append((r, label))
            try:
                result.runs[label][r] = run(label, r)
            except Exception as exc:
                text = str(exc).strip()
                result.errors[label] = text.splitlines()[0][:300] if text else type(exc).__name__
    return result


# --------------------------------------------------------------------------------------------- tables


@dataclass(frozen=True)
class Column:
    """One column of a :class:`Table`.

    ``key`` names the value in each row (and in the JSON); ``header`` is what the table prints
    (default: ``key``); ``fmt`` is a format spec applied to numbers (e.g. ``",.0f"``, ``".2f"``).
    """

    key: str
    header: str = ""
    fmt: str = ""

    def render(self, value: Any) -> str:
        if value is None:
            return "-"
        if isinstance(value, bool):
            return "yes" if value else "no"
        if isinstance(value, Spread):
            return value.render(self.fmt)
        if isinstance(value, int | float) and self.fmt:
            if isinstance(value, float) and not math.isfinite(value):
                return "-"
            return format(value, self.fmt)
        return str(value)


@dataclass
class Table:
    """Rows of measurements with fixed columns; printed as a Markdown table, stored as JSON rows.

    Invariant: every row has exactly the keys of ``columns`` (missing ones are None).
    """

    name: str
    title: str
    columns: list[Column]
    rows: list[dict[str, Any]] = field(default_factory=list)
    note_key: str = "note"
    # Owned by the Report (the same dict object): values every row gets unless the row sets them, e.g.
    # the broker of the current pass (see Report.stamp).
    stamp: dict[str, Any] = field(default_factory=dict)

    def add(self, **values: Any) -> dict[str, Any]:
        """Add a row; unknown keys are an error (a typo would otherwise vanish silently)."""
        keys = {c.key for c in self.columns}
        unknown = set(values) - keys
        if unknown:
            raise KeyError(f"table {self.name!r} has no column(s) {sorted(unknown)}")
        values = {**{k: v for k, v in self.stamp.items() if k in keys}, **values}
        row = {c.key: values.get(c.key) for c in self.columns}
        self.rows.append(row)
        return row

    def add_unavailable(self, reason: str, **values: Any) -> dict[str, Any]:
        """Add a row whose measurement is missing: its note says ``not available (<reason>)``.

        Needs a column named ``note_key`` (default ``"note"``); the row's numbers stay None.
        """
        values[self.note_key] = f"{NOT_AVAILABLE} ({reason})"
        return self.add(**values)

    def to_markdown(self) -> str:
        headers = [c.header or c.key for c in self.columns]
        lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
        for row in self.rows:
            cells = [c.render(row.get(c.key)).replace("|", "\\|") for c in self.columns]
            lines.append("| " + " | ".join(cells) + " |")
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "title": self.title,
            "columns": [{"key": c.key, "header": c.header or c.key} for c in self.columns],
            "rows": self.rows,
        }


_OPS: dict[str, Callable[[float, float], bool]] = {
    ">=": lambda v, t: v >= t,
    "<=": lambda v, t: v <= t,
    ">": lambda v, t: v > t,
    "<": lambda v, t: v < t,
}


@dataclass(frozen=True)
class Goal:
    """A target on a measured (ratio) value; ``passed`` is None when the value was not measured."""

    name: str
    value: float | None
    target: float
    op: str = ">="
    spread: Spread | None = None  # the runs behind ``value`` (its median), when it was repeated

    @property
    def passed(self) -> bool | None:
        if self.value is None or (isinstance(self.value, float) and not math.isfinite(self.value)):
            return None
        return _OPS[self.op](self.value, self.target)

    def render(self) -> str:
        verdict = {True: "PASS", False: "FAIL", None: "not measured"}[self.passed]
        shown = "-" if self.value is None else f"{self.value:.3g}"
        if self.spread is not None and self.spread.n > 1:
            shown += f" (runs {self.spread.lo:.3g}..{self.spread.hi:.3g}, n={self.spread.n})"
        return f"- {verdict}: {self.name}: {shown} (goal {self.op} {self.target:g})"


# --------------------------------------------------------------------------------------------- report


@dataclass
class Report:
    """Everything one benchmark run prints: header, tables, goals, notes; rendered as text or JSON."""

    benchmark: str
    quick: bool
    command: str
    machine: dict[str, Any] = field(default_factory=dict)
    params: dict[str, Any] = field(default_factory=dict)
    tables: list[Table] = field(default_factory=list)
    goals: list[Goal] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    date: str = field(default_factory=lambda: datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"))
    started: float = field(default_factory=time.monotonic)
    # Passes of one body over several settings (e.g. brokers, benchmarks._data.broker_passes): the
    # columns every table created afterwards leads with, and the current pass's values for them.
    # Invariant: ``stamp`` is the same dict object in every table (rows take its value at add time).
    stamp_columns: list[Column] = field(default_factory=list)
    stamp: dict[str, Any] = field(default_factory=dict)

    def table(self, name: str, title: str, columns: Sequence[Column]) -> Table:
        """Create, register and return a table (printed in creation order).

        A second call with the same name (a later pass of the same scenario) returns the table
        already made, so each pass adds its rows to one table.
        """
        for t in self.tables:
            if t.name == name:
                return t
        t = Table(name=name, title=title, columns=[*self.stamp_columns, *columns], stamp=self.stamp)
        self.tables.append(t)
        return t

    def goal(self, name: str, value: float | Spread | None, target: float, op: str = ">=") -> Goal:
        """Add a goal; a :class:`Spread` value is judged on its median and shown with its range."""
        if op not in _OPS:
            raise ValueError(f"unknown goal operator {op!r}; use one of {sorted(_OPS)}")
        if self.stamp:
            name = f"[{', '.join(f'{k} {v}' for k, v in self.stamp.items())}] {name}"
        if isinstance(value, Spread):
            g = Goal(name=name, value=value.median, target=target, op=op, spread=value)
        else:
            g = Goal(name=name, value=value, target=target, op=op)
        self.goals.append(g)
        return g

    def note(self, text: str) -> None:
        """Add a note (once: a later pass of the same scenario may say it again)."""
        if text not in self.notes:
            self.notes.append(text)

    def header_text(self) -> str:
        m = self.machine
        lines = [
            f"# {self.benchmark} benchmark{' (--quick)' if self.quick else ''}",
            "",
            f"- date: {self.date}",
            f"- command: `{self.command}`",
            f"- machine: {m.get('cores')} cores, {m.get('cpu_model')}, {m.get('memory_gib')} GiB; "
            f"{m.get('os')}",
            f"- python {m.get('python')}, confluent-kafka {m.get('confluent_kafka')}, "
            f"librdkafka {m.get('librdkafka')}",
            f"- load average at start: {m.get('loadavg_start')}",
        ]
        if self.params:
            lines.append("- parameters: " + ", ".join(f"{k}={v}" for k, v in self.params.items()))
        return "\n".join(lines)

    def to_text(self) -> str:
        parts = [self.header_text()]
        for t in self.tables:
            parts.append(f"## {t.title}\n\n{t.to_markdown()}")
        if self.goals:
            parts.append("## Goals\n\n" + "\n".join(g.render() for g in self.goals))
        if self.notes:
            parts.append("## Notes\n\n" + "\n".join(f"- {n}" for n in self.notes))
        if self.errors:
            parts.append("## Errors\n\n" + "\n".join(f"- {e}" for e in self.errors))
        return "\n\n".join(parts) + "\n"

    def to_json(self) -> dict[str, Any]:
        return json_safe(
            {
                "benchmark": self.benchmark,
                "schema": SCHEMA_VERSION,
                "date": self.date,
                "command": self.command,
                "quick": self.quick,
                "ok": not self.errors,
                "elapsed_s": round(time.monotonic() - self.started, 3),
                "machine": self.machine,
                "params": self.params,
                "tables": [t.to_json() for t in self.tables],
                "goals": [
                    {
                        "name": g.name,
                        "value": g.value,
                        "target": g.target,
                        "op": g.op,
                        "passed": g.passed,
                        "spread": g.spread,
                    }
                    for g in self.goals
                ],
                "notes": self.notes,
                "errors": self.errors,
            }
        )


# --------------------------------------------------------------------------------------------- machine


def _cpu_model() -> str:
    with contextlib.suppress(OSError), open("/proc/cpuinfo", encoding="utf-8") as f:
        for line in f:
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def _memory_gib() -> float | None:
    with contextlib.suppress(OSError, ValueError, IndexError), open("/proc/meminfo", encoding="utf-8") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / (1024 * 1024), 1)
    return None


def _loadavg() -> str:
    with contextlib.suppress(OSError):
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    return "unknown"


def machine_info() -> dict[str, Any]:
    """Cores, CPU model, memory, OS, Python, confluent-kafka and librdkafka versions, load average."""
    info: dict[str, Any] = {
        "cores": os.cpu_count(),
        "cpu_model": _cpu_model(),
        "memory_gib": _memory_gib(),
        "os": platform.platform(terse=True),
        "python": platform.python_version(),
        "loadavg_start": _loadavg(),
    }
    try:
        import confluent_kafka

        version = confluent_kafka.version()  # a (str, int) tuple in older releases, a str in newer ones
        info["confluent_kafka"] = version[0] if isinstance(version, tuple) else str(version)
        info["librdkafka"] = confluent_kafka.libversion()[0]
    except ImportError:
        info["confluent_kafka"] = info["librdkafka"] = "not installed"
    return info


# --------------------------------------------------------------------------------------------- main


def _command_line(argv: Sequence[str], module: str) -> str:
    return " ".join(["python", "-m", module, *(shlex.quote(a) for a in argv)])


def main(
    name: str,
    description: str,
    body: Callable[[argparse.Namespace, Report], None],
    add_arguments: Callable[[argparse.ArgumentParser], None] | None = None,
    argv: Sequence[str] | None = None,
    module: str | None = None,
) -> int:
    """Parse the common options, run ``body(args, report)``, print the report; return the exit code.

    1. Parse ``--quick``, ``--json``, ``--out`` and the benchmark's own options.
    2. Run the body; an exception is recorded in ``report.errors`` (the tables measured so far are
       still printed) and makes the exit code 1.
    3. Print the text report on stdout; with ``--json`` print the JSON object as the last line.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    # 1.
    parser = argparse.ArgumentParser(
        prog=f"python -m {module or 'benchmarks.' + name}", description=description
    )
    parser.add_argument("--quick", action="store_true", help="small sizes and fewer rows (< 1 minute)")
    parser.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    parser.add_argument("--out", metavar="PATH", help="also write the JSON object to this file")
    if add_arguments is not None:
        add_arguments(parser)
    args = parser.parse_args(argv)
    report = Report(
        benchmark=name,
        quick=bool(args.quick),
        command=_command_line(argv, module or f"benchmarks.{name}"),
        machine=machine_info(),
    )
    # 2.
    try:
        body(args, report)
    except KeyboardInterrupt:
        report.errors.append("interrupted")
    except Exception as exc:
        log(traceback.format_exc())
        report.errors.append(f"{type(exc).__name__}: {exc}")
    report.machine["loadavg_end"] = _loadavg()
    # 3.
    sys.stdout.write(report.to_text())
    doc = report.to_json()
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump(doc, f, indent=2)
            f.write("\n")
    if args.json:
        sys.stdout.write(json.dumps(doc, separators=(",", ":")) + "\n")
    sys.stdout.flush()
    return 0 if not report.errors else 1
