"""Shared parts of the engine benchmark: the sizes, the run context and the row runners.

Every row runs in a child process, once per round; the rows of one comparison run in alternation
(:meth:`Ctx.measure`: round 1 A B, round 2 A B, ...) and are summarised as medians with their spread
(:class:`RowResult`). A row that fails returns its reason instead of costing the other rows. With
``--compare REF`` every multilane row runs once per build (this tree and REF, see :class:`Build`).
Does I/O: starts child processes and produces topics.
"""

from __future__ import annotations

import contextlib
import io
import marshal
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks._children import ChildError, run_json_child
from benchmarks._common import Column, Report, Spread, alternate, log, paired_ratios, spread
from benchmarks._data import ProducedTopic, produce_zipf, zipf_top_share
from benchmarks.baselines.quix import run_quix

VALUE_BYTES = 100
N_KEYS = 10_000
ZIPF_S = 1.0
BASE_MS = 10.0
SLOW_MS = 200.0
SLOW_FRACTION = 0.01
HOL_IN_FLIGHT = 256
KEY_MODE_F = 256
SEED = 1
MAX_MULTILANE_FAILURES = 3


@dataclass(frozen=True)
class Sizes:
    """Record counts of one run (full or ``--quick``); each is about 2-10 s of work at full speed."""

    noop_records: int
    io_records: dict[int, int]  # in flight -> records
    quix_sleep_records: int  # quixstreams with 10 ms sleeps runs at ~96 rec/s
    key_io_records: int  # key mode is capped by the hot keys (~1k rec/s at F=256)
    hol_records: int
    hol_naive_records: int  # the naive loop runs at ~6% efficiency here: a prefix is enough
    replay_records: int
    replay_kill_after: int  # kill -9 once this many records have ended
    sync_noop_row: bool = True  # also measure multilane with a sync (thread-pool) no-op
    key_noop_rows: bool = True  # scenario 3 also compares the modes with the no-op processor
    naive_at: tuple[int, ...] = field(default=(16, 64, 256, 1024))


FULL = Sizes(
    noop_records=1_000_000,
    io_records={16: 8_000, 64: 32_000, 256: 100_000, 1024: 200_000},
    quix_sleep_records=300,
    key_io_records=20_000,
    hol_records=100_000,
    hol_naive_records=10_000,
    replay_records=20_000,
    replay_kill_after=8_000,
)
QUICK = Sizes(
    noop_records=100_000,
    io_records={16: 2_000, 256: 10_000, 1024: 20_000},
    quix_sleep_records=50,
    key_io_records=2_000,
    hol_records=10_000,
    hol_naive_records=2_000,
    replay_records=3_000,
    replay_kill_after=1_500,
    sync_noop_row=False,
    key_noop_rows=False,
    naive_at=(256,),
)


# ------------------------------------------------------------------------------------------ rows

Runner = Callable[[], dict[str, Any]]  # one run of a row: the child's JSON result


@dataclass(frozen=True)
class Build:
    """A build of multilane whose rows are measured: ``pythonpath`` None is this tree as imported."""

    name: str
    pythonpath: str | None = None


@dataclass
class RowResult:
    """A row's runs, round by round, and their summary (medians with the range of the runs)."""

    runs: dict[int, dict[str, Any]]  # round -> the child's JSON result

    def values(self, key: str) -> dict[int, float | None]:
        return {r: run.get(key) for r, run in self.runs.items()}

    @property
    def rate(self) -> Spread | None:
        return spread(self.values("rate").values())

    @property
    def cpu_us(self) -> Spread | None:
        return spread(self.values("cpu_us_per_record").values())

    @property
    def main_thread_us(self) -> Spread | None:
        """CPU µs per record of the main thread (the event loop's), where the child reported threads."""
        return spread((run.get("thread_cpu_us_per_record") or {}).get("main") for run in self.runs.values())

    @property
    def median_rate(self) -> float | None:
        s = self.rate
        return s.median if s else None

    @property
    def seconds(self) -> float:
        """Measured seconds over all runs."""
        return sum(float(run.get("seconds") or 0.0) for run in self.runs.values())

    @property
    def checked(self) -> bool:
        """True when every run applied the delivery checkers (and they held: a failure fails the run)."""
        return bool(self.runs) and all(run.get("checked") for run in self.runs.values())

    def get(self, key: str) -> Any:
        """The largest value of ``key`` over the runs (for diagnostics such as peak running)."""
        vals = [run[key] for run in self.runs.values() if run.get(key) is not None]
        return max(vals) if vals else None

    def vs(self, other: RowResult | str | None, key: str = "rate") -> Spread | None:
        """This row ÷ ``other`` round by round (both alternated in the same rounds): their spread."""
        if not isinstance(other, RowResult):
            return None
        return spread(paired_ratios(self.values(key), other.values(key)))


@dataclass
class Ctx:
    """What every scenario needs: the broker, the report, the sizes, the rounds, the builds."""

    broker: Any  # multilane.testing.broker.EmbeddedBroker
    report: Report
    sizes: Sizes
    repeat: int  # rounds: every row runs this many times, alternated with the rows it is compared to
    multilane_missing: str | None  # None when the engine is usable, else why not
    builds: list[Build] = field(default_factory=lambda: [Build("multilane")])
    loop: str = "asyncio"  # event loop of the asyncio children: "asyncio" or "uvloop"
    profile_dir: Path | None = None  # --profile: multilane rows write cProfile stats here
    workdir: Path | None = None  # produced keys for the children's delivery checkers
    topics: dict[int, ProducedTopic] = field(default_factory=dict)
    keys_files: dict[str, str] = field(default_factory=dict)
    multilane_failures: int = 0  # multilane rows failed in a row

    def topic(self, records: int) -> ProducedTopic:
        """A one-partition topic holding exactly ``records`` records, produced on first use.

        Every multilane row reads a topic that holds exactly its records, so a run ends when the
        backlog is drained and no record beyond the measured ones competes for lanes. Every topic has
        the same key sequence (same seed): a shorter topic is a prefix of a longer one.
        """
        if records not in self.topics:
            name = f"bench-{records}-{uuid.uuid4().hex[:6]}"
            self.broker.create_topic(name, 1)
            produced = produce_zipf(self.bootstrap, name, records, VALUE_BYTES, N_KEYS, ZIPF_S, seed=SEED)
            log(
                f"produced {produced.records:,} records to {name} in {produced.seconds:.1f}s "
                f"with {produced.generator}"
            )
            self.report.params["producer"] = produced.generator
            self.topics[records] = produced
        return self.topics[records]

    def keys_file(self, topic: str) -> tuple[str, int] | None:
        """(file holding the produced keys of ``topic``, its first offset), for the child's checkers."""
        data = next((t for t in self.topics.values() if t.topic == topic), None)
        if data is None or self.workdir is None:
            return None
        if topic not in self.keys_files:
            path = self.workdir / f"{topic}.keys"
            with open(path, "wb") as f:
                marshal.dump(data.keys, f)
            self.keys_files[topic] = str(path)
        return self.keys_files[topic], data.first_offset

    @property
    def bootstrap(self) -> str:
        return str(self.broker.bootstrap)

    def group(self, label: str) -> str:
        return f"bench-{label}-{uuid.uuid4().hex[:6]}"

    def measure(self, rows: Mapping[str, Runner | str]) -> dict[str, RowResult | str]:
        """Run the rows in alternation, ``repeat`` rounds (A B A B ...); each row's result or reason.

        A value that is already a string is a row that could not be set up (its reason is kept).
        """
        runnable = {k: v for k, v in rows.items() if not isinstance(v, str)}

        def run(label: str, r: int) -> dict[str, Any]:
            t0 = time.monotonic()
            result = runnable[label]()
            log(
                f"  {label} [{r + 1}/{self.repeat}]: {result['rate']:,.0f} rec/s, "
                f"{result.get('cpu_us_per_record', 0):.2f} CPU µs/rec ({time.monotonic() - t0:.1f}s)"
            )
            return result

        alt = alternate(list(runnable), self.repeat, run)
        out: dict[str, RowResult | str] = {}
        for label, row in rows.items():
            if isinstance(row, str):
                out[label] = row
            elif label in alt.errors and not alt.runs[label]:
                log(f"  {label}: row failed: {alt.errors[label]}")
                out[label] = alt.errors[label]
            else:
                out[label] = RowResult(alt.runs[label])
        return out


def _consumer_args(ctx: Ctx, topic: str, records: int) -> list[str]:
    return ["--bootstrap", ctx.bootstrap, "--topic", topic, "--group", "{group}", "--records", str(records)]


def _child(ctx: Ctx, label: str, argv: list[str], timeout: float, build: Build | None = None) -> Runner:
    """A runner of one child process (a fresh consumer group per run), importing ``build``'s multilane."""
    env, cwd = build_env(build)

    def once() -> dict[str, Any]:
        full = [a.replace("{group}", ctx.group(label)) for a in argv]
        return run_json_child(full, timeout=timeout, env=env, cwd=cwd)

    return once


def _baseline(ctx: Ctx, module: str) -> list[str]:
    """Run a baseline module through ``engine_child baseline`` (which sets the event loop)."""
    return [sys.executable, "-m", "benchmarks.engine_child", "baseline", "--loop", ctx.loop, module]


def raw_loop(ctx: Ctx, topic: str, records: int) -> Runner:
    argv = [sys.executable, "-m", "benchmarks.baselines.raw_loop", *_consumer_args(ctx, topic, records)]
    return _child(ctx, "raw", argv, timeout=120)


def naive_batch(ctx: Ctx, topic: str, records: int, in_flight: int, slow: bool = False) -> Runner:
    argv = [
        *_baseline(ctx, "benchmarks.baselines.naive_batch"), *_consumer_args(ctx, topic, records),
        "--concurrency", str(in_flight), "--base-ms", str(BASE_MS), *_slow_args(slow),
    ]  # fmt: skip
    return _child(ctx, f"naive-{in_flight}", argv, timeout=300)


def bare_asyncio(ctx: Ctx, records: int, in_flight: int, slow: bool = False) -> Runner:
    argv = [
        *_baseline(ctx, "benchmarks.baselines.bare_asyncio"), "--records", str(records),
        "--concurrency", str(in_flight), "--base-ms", str(BASE_MS), *_slow_args(slow),
    ]  # fmt: skip
    return _child(ctx, f"bare-{in_flight}", argv, timeout=300)


def quix(ctx: Ctx, topic: str, records: int, sleep_ms: float = 0.0) -> Runner:
    def once() -> dict[str, Any]:
        return run_quix(ctx.bootstrap, topic, ctx.group("quix"), records, sleep_ms=sleep_ms, timeout=300)

    return once


def multilane(
    ctx: Ctx,
    topic: str,
    records: int,
    ordering: str,
    factor: int,
    processor: str,
    slow: bool = False,
) -> dict[str, Runner | str]:
    """multilane's engine through its Python API in a child process (``benchmarks.engine_child``), one
    runner per build (keyed by the build's name). The child applies the delivery checkers to its run.

    The child gives up after ten times a healthy run's rough duration plus 60 s; after
    :data:`MAX_MULTILANE_FAILURES` failed runs in a row the engine is declared unavailable, so a
    broken engine costs minutes, not hours.
    """
    if ctx.multilane_missing:
        return {b.name: ctx.multilane_missing for b in ctx.builds}
    timeout = 60 + 10 * healthy_duration_s(records, ordering, factor, processor, slow)
    label = f"multilane-{ordering}-{factor}-{processor}"
    argv = [
        sys.executable, "-m", "benchmarks.engine_child", "run", *_consumer_args(ctx, topic, records),
        "--ordering", ordering, "--factor", str(factor), "--processor", processor,
        "--base-ms", str(BASE_MS), *_slow_args(slow), "--timeout", f"{timeout:.0f}", "--loop", ctx.loop,
    ]  # fmt: skip
    keys = ctx.keys_file(topic)
    if keys is not None:
        argv += ["--keys-file", keys[0], "--first-offset", str(keys[1])]
    return {b.name: _multilane_runner(ctx, b, f"{label}-{b.name}", argv, timeout) for b in ctx.builds}


def build_env(build: Build | None) -> tuple[dict[str, str] | None, str | None]:
    """(environment, working directory) of a child importing ``build``: ``python -m`` puts the working
    directory first on ``sys.path``, before PYTHONPATH, so both point at the build."""
    if build is None or build.pythonpath is None:
        return None, None
    return {"PYTHONPATH": build.pythonpath}, build.pythonpath


def _multilane_runner(ctx: Ctx, build: Build, label: str, argv: list[str], timeout: float) -> Runner:
    env, cwd = build_env(build)
    child = _child(ctx, label, argv, timeout=timeout + 60, build=build)
    profiles = 0

    def once() -> dict[str, Any]:
        nonlocal profiles
        if ctx.multilane_missing:
            raise ChildError(ctx.multilane_missing)
        try:
            result = child()
        except ChildError as exc:
            ctx.multilane_failures += 1
            if ctx.multilane_failures >= MAX_MULTILANE_FAILURES:
                ctx.multilane_missing = f"{ctx.multilane_failures} runs failed in a row; last: {exc}"[:300]
                ctx.report.note(f"multilane: not available ({ctx.multilane_missing})")
            raise
        ctx.multilane_failures = 0
        if ctx.profile_dir is not None and profiles == 0:
            # one more run under cProfile (not measured): where the CPU of this row goes
            profiles += 1
            path = ctx.profile_dir / f"{label}.prof"
            profiled = [*argv, "--profile", str(path)]
            full = [a.replace("{group}", ctx.group(label)) for a in profiled]
            run_json_child(full, timeout=3 * timeout + 60, env=env, cwd=cwd)
            result["profile"] = str(path)
        return result

    return once


def healthy_duration_s(records: int, ordering: str, factor: int, processor: str, slow: bool) -> float:
    """A rough duration of a healthy run, for timeouts: no-op at quixstreams' rate, or the sleeps at full
    concurrency; in key mode the hot key's records run one at a time (top key share x records x latency).
    """
    if processor != "async-sleep":
        return records / 100_000
    latency = (SLOW_FRACTION * SLOW_MS + (1 - SLOW_FRACTION) * BASE_MS) / 1000 if slow else BASE_MS / 1000
    bound = records * latency / factor
    if ordering == "key":
        bound = max(bound, zipf_top_share(N_KEYS, ZIPF_S) * records * BASE_MS / 1000)
    return bound


def _slow_args(slow: bool) -> list[str]:
    return ["--slow-ms", str(SLOW_MS), "--slow-fraction", str(SLOW_FRACTION)] if slow else []


@contextlib.contextmanager
def compared_build(ref: str) -> Iterator[Build]:
    """REF's ``multilane`` package in a temporary directory, beside this tree's ``benchmarks``.

    1. Resolve REF to a commit of this tree's repository.
    2. Extract its ``multilane/`` there (``git archive``: the repository and its worktrees stay as
       they are).
    3. Link this tree's ``benchmarks`` beside it: both builds are measured by the same child code.
    4. Remove the directory afterwards.
    """
    root = this_tree()
    # 1.
    sha = subprocess.run(
        ["git", "rev-parse", "--verify", f"{ref}^{{commit}}"], cwd=root, capture_output=True, text=True
    )
    if sha.returncode != 0:
        raise ValueError(f"--compare {ref}: not a commit of {root}: {sha.stderr.strip()}")
    commit = sha.stdout.strip()
    tmp = Path(tempfile.mkdtemp(prefix="multilane-compare-"))
    try:
        # 2.
        archive = subprocess.run(
            ["git", "archive", "--format=tar", commit, "multilane"], cwd=root, capture_output=True, check=True
        )
        with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
            tar.extractall(tmp, filter="data")
        # 3.
        (tmp / "benchmarks").symlink_to(Path(root) / "benchmarks", target_is_directory=True)
        yield Build(f"{ref} ({commit[:8]})", str(tmp))
    finally:
        # 4.
        shutil.rmtree(tmp, ignore_errors=True)


def this_build() -> Build:
    """This tree, named by its HEAD commit (``+`` when the tree has uncommitted changes)."""
    root = this_tree()
    head = subprocess.run(["git", "rev-parse", "--short=8", "HEAD"], cwd=root, capture_output=True, text=True)
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "multilane"], cwd=root, capture_output=True, text=True
    )
    name = f"this tree ({head.stdout.strip() or '?'}{'+' if dirty.stdout.strip() else ''})"
    return Build(name, root)


def profile_tables(ctx: Ctx, top: int) -> None:
    """One table per profiled row: the functions with the most own CPU time, as shares of the total."""
    import pstats

    if ctx.profile_dir is None:
        return
    for path in sorted(ctx.profile_dir.glob("*.prof")):
        stats = pstats.Stats(str(path))
        entries = stats.stats  # type: ignore[attr-defined]
        total = sum(v[2] for v in entries.values()) or 1.0
        table = ctx.report.table(
            f"profile-{path.stem}",
            f"Profile of {path.stem} (cProfile of the loop thread from the first completion to the last; "
            "an extra run, not measured)",
            [
                Column("function"),
                Column("calls", "calls", ","),
                Column("own_share", "own time share", ".1%"),
                Column("cum_share", "cumulative share", ".1%"),
            ],
        )
        ranked = sorted(entries.items(), key=lambda kv: kv[1][2], reverse=True)[:top]
        for (file, line, func), (_cc, nc, tt, ct, _callers) in ranked:
            where = f"{Path(file).parent.name}/{Path(file).name}:{line}" if line else file
            table.add(function=f"{func} ({where})", calls=nc, own_share=tt / total, cum_share=ct / total)


def this_tree() -> str:
    """The directory holding this tree's ``benchmarks`` and ``multilane`` packages."""
    return str(Path(__file__).resolve().parents[1])
