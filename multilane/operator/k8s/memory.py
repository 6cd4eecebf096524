"""What the operator remembers of each consumer between passes, and the one place it is forgotten
when the consumer goes. Pure (no I/O of its own; the forget callbacks may drop clients).

Each part of the kopf side keeps its memory of a consumer in a :class:`Slot` of its own (uid -> one
value), asked of :class:`ConsumerMemory` when the parts are wired (``k8s/handlers.py``): a part sees
only its slots, and writes only those. Parts that keep per-consumer state elsewhere (the certificate
manager, the status memory, the platform's caches, the metrics' label sets) register a forget
callback. :meth:`ConsumerMemory.forget` calls every callback and empties every slot for the consumer:
nothing of a deleted consumer stays, and a new part's memory cannot be left out of the deletion.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar

from multilane.operator.spec.child_meta import ConsumerRef

__all__ = ["ConsumerMemory", "Slot"]

log = logging.getLogger(__name__)

T = TypeVar("T")


class Slot(Generic[T]):
    """One part's memory of each consumer: uid -> value. Invariant: holds only consumers not forgotten
    since (:meth:`ConsumerMemory.forget` clears the uid). Written by the part it was given to only."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._values: dict[str, T] = {}

    def get(self, uid: str) -> T | None:
        return self._values.get(uid)

    def set(self, uid: str, value: T) -> T:
        self._values[uid] = value
        return value

    def setdefault(self, uid: str, make: Callable[[], T]) -> T:
        if uid not in self._values:
            self._values[uid] = make()
        return self._values[uid]

    def pop(self, uid: str) -> T | None:
        return self._values.pop(uid, None)

    def __contains__(self, uid: object) -> bool:
        return uid in self._values

    def values(self) -> list[T]:
        return list(self._values.values())

    def clear(self) -> None:
        self._values.clear()

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._values))


class ConsumerMemory:
    """Every slot and forget callback of the kopf side. Invariant: a slot or callback is registered
    before the first pass (at wiring), so :meth:`forget` reaches all of them."""

    def __init__(self) -> None:
        self._slots: dict[str, Slot[Any]] = {}
        self._forgetters: list[Callable[[ConsumerRef], None]] = []

    def slot(self, name: str) -> Slot[Any]:
        """A new slot named ``name`` (one owner: names are unique)."""
        if name in self._slots:
            raise ValueError(f"slot {name!r} exists: each slot has one owner")
        slot: Slot[Any] = Slot(name)
        self._slots[name] = slot
        return slot

    def on_forget(self, forget: Callable[[ConsumerRef], None]) -> None:
        """``forget(ref)`` is called when a consumer is forgotten (memory kept outside the slots)."""
        self._forgetters.append(forget)

    def forget(self, ref: ConsumerRef) -> None:
        """Drop everything remembered of ``ref``: every forget callback (which may still read the slots,
        e.g. to close a client), then every slot's value."""
        for forget in self._forgetters:
            forget(ref)
        for slot in self._slots.values():
            slot.pop(ref.uid)
        log.info("forgot %s/%s (children go with it through owner references)", ref.namespace, ref.name)

    def remembers(self, uid: str) -> list[str]:
        """The names of the slots that hold ``uid`` (tests: nothing left after :meth:`forget`)."""
        return [name for name, slot in self._slots.items() if uid in slot]
