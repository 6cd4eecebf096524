"""Example stateful processors (used by the state crash tests and the benchmark). Pure apart from
``ctx.state`` (which does I/O through the worker's state store).

``count_per_key``: counts the records of each key in ``ctx.state`` (8-byte big-endian counter per
key). After processing a topic exactly once per record the state equals
:func:`reference_counts` of the input; at-least-once replays of records that were not committed do
not double-count, because restore skips the changes of uncommitted records.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from multilane.api import Context, Record

__all__ = ["count_per_key", "decode_count", "encode_count", "reference_counts"]


def encode_count(n: int) -> bytes:
    return n.to_bytes(8, "big")


def decode_count(raw: bytes | None) -> int:
    if raw is None:
        return 0
    if len(raw) != 8:
        raise ValueError(f"a counter is 8 bytes, got {len(raw)}")
    return int.from_bytes(raw, "big")


def count_per_key(record: Record, ctx: Context) -> None:
    """Increment the record's key's counter. Keyless records are not counted."""
    if ctx.state is None:
        raise RuntimeError("count_per_key needs the worker to run with --state-dir")
    if record.key is None:
        return
    ctx.state.put(encode_count(decode_count(ctx.state.get()) + 1))


def reference_counts(keys: Iterable[bytes | None]) -> dict[bytes, int]:
    """What ``count_per_key`` leaves in the store after each record was processed once."""
    return dict(Counter(k for k in keys if k is not None))
