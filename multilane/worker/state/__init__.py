"""Per-partition state stores on RocksDB, their changelog, restore and learner mode. Does I/O.

Entry point: :class:`StateManager` (the engine's ``PartitionStateHooks``). The pure parts are
``codec`` (changelog envelope), ``apply`` (which changes a restore applies) and ``errors``; see
``docs/state.md``. Importing this package (or its pure modules, e.g. from the snapshot pipeline) does
not import RocksDB or Kafka: ``StateManager`` is loaded on first access.
"""

from typing import TYPE_CHECKING, Any

from multilane.formats.changelog import Change, ChangelogCodec, ChangeOp
from multilane.worker.state.apply import ApplyFilter, DoneOracle
from multilane.worker.state.errors import (
    ChangelogCorruptError,
    CheckpointError,
    RestoreError,
    StateDurabilityError,
    StateError,
    StateKeyError,
    StatePhaseError,
)

if TYPE_CHECKING:
    from multilane.worker.state.manager import StateManager

__all__ = [
    "ApplyFilter",
    "Change",
    "ChangeOp",
    "ChangelogCodec",
    "ChangelogCorruptError",
    "CheckpointError",
    "DoneOracle",
    "RestoreError",
    "StateDurabilityError",
    "StateError",
    "StateKeyError",
    "StateManager",
    "StatePhaseError",
]


def __getattr__(name: str) -> Any:
    if name == "StateManager":
        from multilane.worker.state.manager import StateManager

        return StateManager
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
