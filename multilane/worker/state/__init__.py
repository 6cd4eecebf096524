"""Per-partition state stores on RocksDB, their changelog, restore and learner mode. Does I/O.

Entry point: :class:`StateManager` (the engine's ``PartitionStateHooks``). The pure parts are
``codec`` (changelog envelope) and ``apply`` (which changes a restore applies); see ``docs/state.md``.
"""

from multilane.worker.state.apply import ApplyFilter, DoneOracle
from multilane.worker.state.codec import Change, ChangelogCodec, ChangeOp
from multilane.worker.state.errors import (
    ChangelogCorruptError,
    CheckpointError,
    RestoreError,
    StateDurabilityError,
    StateError,
    StateKeyError,
    StatePhaseError,
)
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
