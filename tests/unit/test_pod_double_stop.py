"""``StatefulSetProcessDouble.stop()`` after a test timed out inside it: pytest-timeout's ``Failed`` (a
``BaseException``) can land inside the double's loop task, which then dies of it; stopping must still
end every pod process by PID, promptly, and not raise that exception again."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from multilane.testing.kubelet import PodProcess
from multilane.testing.pods import StatefulSetProcessDouble
from multilane.testing.tls_front import TlsFront


class TestTimedOut(BaseException):  # what pytest.fail raises: an OutcomeException, not an Exception
    __test__ = False


def pod(double: StatefulSetProcessDouble, name: str, argv: list[str]) -> PodProcess:
    p = PodProcess(name, 0, "orders", double.root, {}, {}, TlsFront(1, double._cert, double._key))
    p.proc = subprocess.Popen(argv, start_new_session=True)
    double.pods[name] = p
    return p


@pytest.mark.asyncio
@pytest.mark.parametrize("loop_task", ["died", "hangs"])
async def test_stop_kills_the_pods_when_the_loop_task_died_or_hangs(tmp_path: Path, loop_task: str) -> None:
    double = StatefulSetProcessDouble(None, "http://127.0.0.1:1", "team-a", tmp_path, grace_cap_s=2.0)  # type: ignore[arg-type]  # no API: stop() only

    async def died() -> None:
        raise TestTimedOut

    release = asyncio.Event()

    async def hangs() -> None:
        while not release.is_set():  # a loop that swallows its cancellation (until the test ends)
            with contextlib.suppress(asyncio.CancelledError):
                await release.wait()

    job: Any = died() if loop_task == "died" else hangs()
    double._task = job_task = asyncio.create_task(job)
    await asyncio.sleep(0.05)
    polite = pod(double, "orders-0", ["sleep", "600"])  # ends at SIGTERM
    ignore_term = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"
    stubborn = pod(double, "orders-1", [sys.executable, "-c", ignore_term])  # needs SIGKILL
    started = time.monotonic()
    await double.stop(task_grace_s=1.0)
    took = time.monotonic() - started
    assert polite.proc is not None and polite.proc.poll() is not None
    assert stubborn.proc is not None and stubborn.proc.poll() is not None
    assert not double.pods
    assert took < 20, f"stop took {took:.1f} s (bound: 1 s task grace + 2 s SIGTERM grace)"
    assert double._task is None
    await double.stop(task_grace_s=0.1)  # idempotent
    release.set()
    await asyncio.wait_for(asyncio.gather(job_task, return_exceptions=True), 5)
