"""Child processes a test helper owns: bound to its parent's life, stopped by PID. Does I/O (signals).

The helpers that start servers for tests (:mod:`multilane.testing.broker`, :mod:`~.apache`,
:mod:`~.cluster`) share these two steps and nothing else: each keeps its own ``Popen`` objects and
calls :func:`stop_by_pid` on them; each passes a ``preexec_fn`` from here to ``Popen``.

``PR_SET_PDEATHSIG`` follows the *thread* that forked, not the process: start a child from a thread
that lives as long as the child (e.g. the main thread).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
from collections.abc import Callable

__all__ = ["die_with_parent", "die_with_parent_of", "stop_by_pid"]

_PR_SET_PDEATHSIG = 1  # prctl(2)
# Resolved once in the parent: the child between fork and exec only calls it (no dlopen there, which
# could wait forever on a lock another thread held at the fork). None where there is no prctl (not
# Linux): the child is then not bound to its parent.
_PRCTL: Callable[..., int] | None = getattr(ctypes.CDLL(None, use_errno=True), "prctl", None)


def die_with_parent() -> None:
    """A ``preexec_fn``: the child gets SIGKILL when the thread that started it ends (``prctl``)."""
    if _PRCTL is not None:
        _PRCTL(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)


def die_with_parent_of(parent: int) -> Callable[[], None]:
    """A ``preexec_fn`` as :func:`die_with_parent` that also closes the window between the fork and the
    ``prctl``: when ``parent`` (this process's pid, taken before the fork) is already gone by then,
    the child kills itself. The child calls only ``prctl``, ``getppid`` and ``kill``."""

    def pre() -> None:
        die_with_parent()
        if os.getppid() != parent:
            os.kill(os.getpid(), signal.SIGKILL)

    return pre


def stop_by_pid(
    proc: subprocess.Popen[bytes], grace_s: float, *, group: bool, reap_s: float | None = None
) -> None:
    """Stop a child this process started and reap it (steps 1-3); nothing when it already exited.

    1. SIGTERM to its pid, or to its process group when ``group`` (a child started in its own session:
       its own children go with it).
    2. Wait up to ``grace_s`` for it to exit.
    3. Still running: SIGKILL the same way, then wait (at most ``reap_s``; None waits as long as it takes,
       which SIGKILL bounds unless the process is stuck in the kernel).
    """
    if proc.poll() is not None:
        return
    send = os.killpg if group else os.kill
    # 1.
    with contextlib.suppress(ProcessLookupError):
        send(proc.pid, signal.SIGTERM)
    # 2.
    try:
        proc.wait(timeout=grace_s)
        return
    except subprocess.TimeoutExpired:
        pass
    # 3.
    with contextlib.suppress(ProcessLookupError):
        send(proc.pid, signal.SIGKILL)
    proc.wait(timeout=reap_s)
