"""Records who creates temporary files: loaded at start-up by every Python process of a test session
(``tests/support/tempdir_check.py`` puts this directory first on ``PYTHONPATH``). Does I/O (appends to
the ledger file).

While ``MULTILANE_TMP_LEDGER`` names the ledger file, an audit hook appends one JSON line to it for each
``tempfile.mkstemp`` / ``tempfile.mkdtemp`` event (``NamedTemporaryFile`` and ``TemporaryDirectory``
raise them too): the path, the process's pid and argv, and the callers outside ``tempfile``. The check
then names the process that created each file left behind. Only the standard library is used (the
process may be any Python of the machine), and a failure to write is ignored: the hook never changes
what the process does.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from typing import Any

_EVENTS = ("tempfile.mkstemp", "tempfile.mkdtemp")


def _callers() -> str:
    """The innermost frames outside ``tempfile`` and this module: ``file:line function < ...``."""
    frame = sys._getframe(1)
    out: list[str] = []
    while frame is not None and len(out) < 6:
        name = frame.f_code.co_filename
        if not name.endswith(("tempfile.py", "sitecustomize.py")):
            out.append(f"{name}:{frame.f_lineno} {frame.f_code.co_name}")
        frame = frame.f_back  # type: ignore[assignment]
    return " < ".join(out)


def hook_for(ledger: str) -> Callable[[str, tuple[Any, ...]], None]:
    """An audit hook that records to ``ledger`` while ``MULTILANE_TMP_LEDGER`` names it."""

    def hook(event: str, args: tuple[Any, ...]) -> None:
        if event not in _EVENTS or os.environ.get("MULTILANE_TMP_LEDGER") != ledger:
            return
        try:
            line = json.dumps({"path": str(args[0]), "pid": os.getpid(), "argv": list(sys.argv),
                               "caller": _callers()})
            fd = os.open(ledger, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            try:
                os.write(fd, (line + "\n").encode())  # one write with O_APPEND: lines don't mix
            finally:
                os.close(fd)
        except Exception:  # a record is best effort: the process goes on
            pass

    return hook


if __name__ == "sitecustomize" and os.environ.get("MULTILANE_TMP_LEDGER"):  # at start-up only
    sys.addaudithook(hook_for(os.environ["MULTILANE_TMP_LEDGER"]))
