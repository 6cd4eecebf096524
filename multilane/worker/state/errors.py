"""Errors raised by the state store, its changelog and restore. Pure: no I/O."""

from __future__ import annotations

from multilane.formats.changelog import ChangelogDecodeError

__all__ = [
    "ChangelogCorruptError",
    "CheckpointError",
    "RestoreError",
    "StateDurabilityError",
    "StateError",
    "StateKeyError",
    "StatePhaseError",
]


class StateError(RuntimeError):
    """Base class of every error of ``multilane.worker.state``."""


class StateKeyError(StateError, KeyError):
    """A state key is missing, not bytes, empty, or outside the key range of the lane using it."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else "state key error"


class ChangelogCorruptError(StateError, ChangelogDecodeError):
    """A changelog record read from a topic does not decode (the codec's :class:`ChangelogDecodeError`
    with where it was read). ``offset`` names it when known (-1 when decoding bytes alone)."""

    def __init__(self, message: str, *, topic: str = "", partition: int = -1, offset: int = -1) -> None:
        where = (
            f" at {topic}[{partition}]@{offset}" if topic else (f" at offset {offset}" if offset >= 0 else "")
        )
        Exception.__init__(self, f"corrupt changelog record{where}: {message}")
        self.reason = message
        self.topic = topic
        self.partition = partition
        self.offset = offset


class RestoreError(StateError):
    """A restore could not complete (broker error, stall, or a corrupt record with ``on_corrupt='fail'``)."""


class StateDurabilityError(StateError):
    """A change could not be written to the changelog; the engine must not commit past its record."""


class CheckpointError(StateError):
    """A local checkpoint file is unreadable or inconsistent (the store is then restored from scratch)."""


class StatePhaseError(StateError):
    """A hook was called for a partition in a phase that does not allow it (e.g. ``view`` while learning)."""
