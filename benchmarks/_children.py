"""Child-process rows of the benchmarks: a row measured in a fresh interpreter prints one JSON object
as its last stdout line (:func:`emit_child_result`, with a :class:`Meter`'s figures);
:func:`run_json_child` runs such a child and returns that object, or raises :class:`ChildError`
with the tail of its output. Does I/O: child processes, stdout.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from benchmarks._common import json_safe

__all__ = ["ChildError", "Meter", "emit_child_result", "run_json_child"]


@dataclass
class Meter:
    """Wall and CPU time of one measured run, from its first record to its last.

    Call :meth:`start` when the first record arrives (``already`` = records that arrived with it and
    are counted as done at that instant, e.g. a first fetched batch), then :meth:`stop` after the last.
    CPU time is the whole process's (``RUSAGE_SELF``: every thread, librdkafka's included).
    """

    started_at: float | None = None
    stopped_at: float | None = None
    cpu_start: float = 0.0
    cpu_stop: float = 0.0
    already: int = 0
    threads_start: dict[str, float] | None = None  # CPU seconds by thread name (Linux), at start
    threads_stop: dict[str, float] | None = None

    @staticmethod
    def _cpu() -> float:
        import resource

        ru = resource.getrusage(resource.RUSAGE_SELF)
        return ru.ru_utime + ru.ru_stime

    @staticmethod
    def thread_cpu() -> dict[str, float] | None:
        """CPU seconds of this process's threads, summed by thread name (``/proc``; None elsewhere).

        librdkafka names its threads (``rdk:main``, ``rdk:broker...``); the Python main thread carries
        the process's name. Threads that ended before the call are missing (their CPU still counts in
        the process total).
        """
        out: dict[str, float] = {}
        tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        try:
            tids = os.listdir("/proc/self/task")
        except OSError:
            return None
        for tid in tids:
            try:
                with open(f"/proc/self/task/{tid}/stat", encoding="utf-8") as f:
                    stat = f.read()
            except OSError:
                continue  # the thread ended meanwhile
            name = stat[stat.index("(") + 1 : stat.rindex(")")]
            fields = stat[stat.rindex(")") + 2 :].split()
            # fields[11], fields[12]: utime, stime (fields 14 and 15 of proc(5), counted from 1)
            cpu = (int(fields[11]) + int(fields[12])) / tick
            key = "main" if tid == str(os.getpid()) else _thread_group(name)
            out[key] = out.get(key, 0.0) + cpu
        return out

    def start(self, already: int = 0) -> None:
        if self.started_at is None:
            self.started_at = time.perf_counter()
            self.cpu_start = self._cpu()
            self.threads_start = self.thread_cpu()
            self.already = already

    def stop(self) -> None:
        self.stopped_at = time.perf_counter()
        self.cpu_stop = self._cpu()
        self.threads_stop = self.thread_cpu()

    def result(self, records: int, **extra: Any) -> dict[str, Any]:
        """The child's JSON result: ``records``, ``seconds``, ``rate``, ``cpu_s``, ``cpu_us_per_record``."""
        if self.started_at is None or self.stopped_at is None:
            raise RuntimeError("Meter.result() before start() and stop()")
        seconds = max(self.stopped_at - self.started_at, 1e-9)
        measured = max(records - self.already, 1)
        cpu = self.cpu_stop - self.cpu_start
        result: dict[str, Any] = {
            "records": records,
            "seconds": seconds,
            "rate": measured / seconds,
            "cpu_s": cpu,
            "cpu_us_per_record": cpu / measured * 1e6,
        }
        if self.threads_start is not None and self.threads_stop is not None:
            # CPU µs per record by thread group over the measured interval (clock-tick resolution)
            result["thread_cpu_us_per_record"] = {
                k: (v - self.threads_start.get(k, 0.0)) / measured * 1e6 for k, v in self.threads_stop.items()
            }
        result.update(extra)
        return result


def _thread_group(name: str) -> str:
    """A thread name without its number: ``rdk:broker1`` -> ``rdk:broker``, ``asyncio_3`` -> ``asyncio``."""
    return name.rstrip("0123456789").rstrip("_-:") or name


class ChildError(RuntimeError):
    """A measurement child process failed or printed no JSON result."""


def emit_child_result(result: Mapping[str, Any]) -> None:
    """The child's side of :func:`run_json_child`: print ``result`` as the last stdout line."""
    sys.stdout.write(json.dumps(json_safe(dict(result)), separators=(",", ":")) + "\n")
    sys.stdout.flush()


def run_json_child(
    argv: Sequence[str],
    timeout: float,
    env: Mapping[str, str] | None = None,
    cwd: str | None = None,
    replace_env: bool = False,
) -> dict[str, Any]:
    """Run ``argv``, wait at most ``timeout`` s, return the JSON object on its last stdout line.

    ``env`` is added to this process's environment, or replaces it when ``replace_env`` is true.

    The child's stderr is captured; its last lines are in the :class:`ChildError` raised when the child
    fails, times out (it is killed by PID) or prints no JSON.
    """
    full_env = {} if replace_env else dict(os.environ)
    if env:
        full_env.update(env)
    proc = subprocess.Popen(
        list(argv), stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=full_env, cwd=cwd, text=True
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        proc.kill()
        out, err = proc.communicate()
        raise ChildError(f"timed out after {timeout:.0f}s; stderr tail: {_tail(err)}") from exc
    lines = [line for line in out.splitlines() if line.strip()]
    if proc.returncode != 0 or not lines:
        raise ChildError(f"exit code {proc.returncode}; stderr tail: {_tail(err)}")
    try:
        result = json.loads(lines[-1])
    except json.JSONDecodeError as exc:
        raise ChildError(f"last line is not JSON: {lines[-1][:200]!r}; stderr tail: {_tail(err)}") from exc
    if not isinstance(result, dict):
        raise ChildError(f"last line is JSON but not an object: {lines[-1][:200]!r}")
    return result


def _tail(text: str, lines: int = 6) -> str:
    return " | ".join(line.strip() for line in text.strip().splitlines()[-lines:]) or "(empty)"
