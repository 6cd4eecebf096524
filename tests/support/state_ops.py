"""Random state changes, applying them through a ``StateManager``'s views, and the state they should
leave: the helpers the state tests share. Test-only."""

from __future__ import annotations

import random
from collections.abc import Callable

from multilane.formats.keyranges import HASH_SPACE, KeyRange, key_hash
from multilane.worker.state import StateManager

__all__ = ["FULL", "DoneSet", "Ops", "apply_ops", "random_ops", "reference"]

FULL = KeyRange(0, HASH_SPACE)
Ops = list[tuple[int, bytes, bytes | None]]
"""(source offset, state key, new value or None for a delete), one input record per change."""


class DoneSet:
    """A progress record that calls exactly the given (source offset, key hash) pairs done."""

    def __init__(self, done: set[tuple[int, int]]) -> None:
        self.done = done

    def is_done(self, offset: int, key_hash: int) -> bool:
        return (offset, key_hash) in self.done


def random_ops(n: int, keys: int, seed: int, *, first: int = 0, delete_share: float = 0.2) -> Ops:
    """Source offsets ``first..first+n-1``, keys ``key-<i>`` of ``keys`` (few keys: most changes
    overwrite), about ``delete_share`` deletes; a function of the arguments."""
    rnd = random.Random(seed)
    return [
        (i, b"key-%d" % rnd.randrange(keys), None if rnd.random() < delete_share else b"v%d" % i)
        for i in range(first, first + n)
    ]


def apply_ops(sm: StateManager, topic: str, ops: Ops, partition: int = 0) -> None:
    """Each change through the view a processor of its source record would get."""
    for src, key, value in ops:
        view = sm.view(topic, partition, key, FULL, src, key_hash(key))
        if value is None:
            view.delete()
        else:
            view.put(value)


def reference(ops: Ops, applicable: Callable[[int], bool] | None = None) -> dict[bytes, bytes]:
    """The state ``ops`` leave when only the changes whose source offset is ``applicable`` apply."""
    out: dict[bytes, bytes] = {}
    for src, key, value in ops:
        if applicable is not None and not applicable(src):
            continue
        if value is None:
            out.pop(key, None)
        else:
            out[key] = value
    return out
