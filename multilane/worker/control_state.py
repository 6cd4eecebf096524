"""What the engine's control API decided (generation, factor, pause, fence) and where the engine is in
its life (stopping, stopped). Pure: no I/O.

Both are written only by :class:`multilane.worker.engine.Engine` (``start`` and ``stop``) and its
:class:`multilane.worker.assignment.AssignmentControl` (the control calls); the ownership protocol,
the reopen and the loops read them.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ControlState", "Lifecycle"]


@dataclass
class ControlState:
    """The control API's decisions (written by ``Engine`` and ``AssignmentControl`` only)."""

    factor: int  # lanes per partition given to every new or resized partition
    # Invariant: never decreases.
    generation: int = 0
    user_paused: bool = False  # pause(): every owned and newly added partition stays paused
    # Not None while fenced (``Engine.fence``): the generation held when the lease was lost. Invariant:
    # while set, nothing is fetched, processed or committed, and only an assignment with a higher
    # generation is accepted (it clears it).
    fenced_at: int | None = None
    # True from a lost Lease until it is renewed. Invariant: while True, assign() accepts no
    # generation at all, so a worker the operator may consider dead never resumes processing.
    lease_lost: bool = False


@dataclass
class Lifecycle:
    """Where the engine is in its life (written by ``Engine`` only)."""

    stopped: bool = False  # stop() began: no control call or reopen starts any more
    stopping: bool = False  # stop() released every partition: the loops end
