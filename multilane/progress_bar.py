"""Progress bars for long CLI work (``multilane simulate``, ``multilane loadgen``). Does I/O: writes to
stderr, and only when stderr is a terminal, so pipes, log files and CI output stay clean.

    with ProgressBar("simulating", total=12) as bar:
        for i, run in enumerate(runs, 1):
            ...
            bar.update(i)

A bar that is not shown costs one attribute check per update.
"""

from __future__ import annotations

from types import TracebackType

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

__all__ = ["ProgressBar"]


class ProgressBar:
    """A bar of ``completed`` out of ``total`` steps on ``console`` (default: stderr), shown only when
    that console is a terminal; it disappears when the block ends (``transient``), leaving the
    command's own output alone.

    Invariant: ``_progress`` and ``_task`` are both set exactly while a shown bar is open.
    """

    def __init__(self, description: str, total: int, *, console: Console | None = None) -> None:
        if total < 0:
            raise ValueError(f"total must be >= 0, got {total}")
        self.description = description
        self.total = total
        self._console = console if console is not None else Console(stderr=True)
        self._progress: Progress | None = None
        self._task: TaskID | None = None

    @property
    def shown(self) -> bool:
        return self._progress is not None

    def __enter__(self) -> ProgressBar:
        if self._console.is_terminal:
            self._progress = Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                TimeRemainingColumn(),
                console=self._console,
                transient=True,
            )
            self._progress.start()
            self._task = self._progress.add_task(self.description, total=self.total)
        return self

    def update(self, completed: int) -> None:
        """``completed`` steps of ``total`` are done (a count, not an increment)."""
        if self._progress is not None and self._task is not None:
            self._progress.update(self._task, completed=min(completed, self.total))

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._progress is not None:
            self._progress.stop()
        self._progress = None
        self._task = None
