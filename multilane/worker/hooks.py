"""The engine's state hooks as typed protocols (docs/state.md), and :class:`EngineHooks`, what one
engine was given sorted by capability once at construction. Pure: no I/O (protocols only).

:class:`multilane.worker.state.StateManager` implements all four protocols; a test double may
implement only :class:`PartitionStateHooks`:

- :class:`PartitionStateHooks` (required): open a partition's state before its first record,
  ``view`` for ``ctx.state``, ``before_commit`` before every commit, close after the final one;
- :class:`DurableStateHooks`: ``make_durable`` on demand, so that the progress cycle may write
  progress records between commits (without it, progress goes with commits only);
- :class:`StateStatusHooks`: ``learner_status`` for ``/v1/status`` and ``metrics_collectors``;
- :class:`HandoverStateHooks`: ``changelog_end`` at a release, handed to the next owner's
  ``open_partition(..., changelog_end=)`` so that a learner's promotion knows where to stop reading;
- :class:`TransactionalStateHooks`: required with exactly-once outputs: the changelog records are held
  by the state and go out in the partition's transaction (``take_changes``), and the commit is
  reported back (``changes_committed``) instead of ``before_commit``;
- :class:`LearnerHooks`: the learner verbs behind ``Engine.learn`` / ``promote`` / ``demote`` /
  ``drop`` (without them those raise ``EngineError``, HTTP 404).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from multilane.api import StateView
from multilane.formats.keyranges import KeyRange

if TYPE_CHECKING:
    from prometheus_client.registry import Collector

    from multilane.formats.progress import ProgressRecord

__all__ = [
    "DurableStateHooks",
    "EngineHooks",
    "HandoverStateHooks",
    "LearnerHooks",
    "PartitionStateHooks",
    "StateStatusHooks",
]


@runtime_checkable
class PartitionStateHooks(Protocol):
    """The hooks every state store gives the engine. Blocking; thread-safe across partitions."""

    def open_partition(
        self, topic: str, partition: int, committed_offset: int | None, progress: ProgressRecord | None
    ) -> None:
        """Restore the partition's state (before any of its records is fetched); raise on failure."""

    def view(
        self,
        topic: str,
        partition: int,
        key: bytes | None,
        key_range: KeyRange,
        source_offset: int,
        source_key_hash: int,
    ) -> StateView:
        """``ctx.state`` of one processing attempt."""

    def before_commit(self, topic: str, partition: int, offset: int) -> None:
        """Make every change of the records below ``offset`` durable; ``StateDurabilityError`` when
        one was lost (the engine then does not commit and reopens the partition)."""

    def close_partition(self, topic: str, partition: int, clean: bool) -> None:
        """Close the partition's state; ``clean`` only after a successful final commit."""


@runtime_checkable
class DurableStateHooks(Protocol):
    """State hooks that can make the changes made so far durable on demand."""

    def make_durable(self, topic: str, partition: int) -> None:
        """Wait until the changelog acknowledged every change of the partition made so far."""


@runtime_checkable
class HandoverStateHooks(Protocol):
    """State hooks that tell, at a release, where the partition's changelog ends; the engine hands it
    to the next owner with the progress record, whose ``open_partition`` then takes a keyword
    ``changelog_end`` (only passed when known: hooks without this protocol never receive it)."""

    def changelog_end(self, topic: str, partition: int) -> int | None:
        """One past the partition's last changelog record (after ``before_commit``); None: unknown."""


@runtime_checkable
class TransactionalStateHooks(Protocol):
    """State hooks whose changelog records go in the input partition's transaction (exactly-once
    outputs). ``transactional`` is True when they hold the records instead of producing them."""

    transactional: bool

    def take_changes(self, topic: str, partition: int,
                     is_complete: Callable[[int], bool]) -> list[tuple[int, str, int, bytes, bytes | None]]:
        """On the loop: remove and return the held changelog records (source offset, changelog topic,
        partition, key, value) of the records ``is_complete`` says are complete, in apply order."""

    def changes_committed(self, topic: str, partition: int, offset: int, changelog_end: int | None) -> None:
        """The transaction committing ``offset`` (its changelog records ending at ``changelog_end``)
        succeeded."""


@runtime_checkable
class StateStatusHooks(Protocol):
    """State hooks that report on their partitions."""

    def learner_status(self) -> list[dict[str, object]]:
        """Every partition the store knows (``/v1/status``'s ``learners``)."""

    def metrics_collectors(self) -> tuple[Collector, ...]:
        """Prometheus collectors served beside the worker's metrics."""


@runtime_checkable
class LearnerHooks(Protocol):
    """The learner verbs (docs/state.md, "Learner protocol"). Blocking."""

    def learn(self, topic: str, partition: int) -> None: ...

    def promote(self, topic: str, partition: int) -> None: ...

    def demote(self, topic: str, partition: int) -> None: ...

    def drop(self, topic: str, partition: int) -> None: ...


@dataclass(frozen=True)
class EngineHooks:
    """The hooks of one engine by capability (each None when the hooks lack it). Invariant: every
    field that is not None is the same object as ``state``."""

    state: PartitionStateHooks | None = None
    durable: DurableStateHooks | None = None
    status: StateStatusHooks | None = None
    learner: LearnerHooks | None = None

    @classmethod
    def of(cls, hooks: PartitionStateHooks | None) -> EngineHooks:
        """Sort ``hooks`` by the protocols they implement (structural ``isinstance``)."""
        if hooks is None:
            return cls()
        return cls(
            state=hooks,
            durable=hooks if isinstance(hooks, DurableStateHooks) else None,
            status=hooks if isinstance(hooks, StateStatusHooks) else None,
            learner=hooks if isinstance(hooks, LearnerHooks) else None,
        )

    def collectors(self) -> Iterable[Collector]:
        """The state store's metric collectors (none without them)."""
        return self.status.metrics_collectors() if self.status is not None else ()
