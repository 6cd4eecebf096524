"""The per-record latency model shared by every IO-bound row (multilane and baselines alike).

A record's simulated IO takes ``base_s``, except a deterministic ``slow_fraction`` of offsets that take
``slow_s`` (head-of-line blocking scenario). Which offsets are slow depends only on the offset, so
every system sees the same slow records.
"""

from __future__ import annotations

_GOLDEN = 0x9E3779B1  # Knuth's multiplicative hash constant: spreads consecutive offsets evenly


def is_slow(offset: int, slow_fraction: float) -> bool:
    """True for about ``slow_fraction`` of offsets, deterministically and evenly spread."""
    if slow_fraction <= 0:
        return False
    return ((offset * _GOLDEN) & 0xFFFFFFFF) < slow_fraction * 2**32


def latency_s(offset: int, base_s: float, slow_s: float = 0.0, slow_fraction: float = 0.0) -> float:
    """The simulated IO time of the record at ``offset``."""
    return slow_s if is_slow(offset, slow_fraction) else base_s


def mean_latency_s(
    first_offset: int, records: int, base_s: float, slow_s: float = 0.0, slow_fraction: float = 0.0
) -> float:
    """Mean of :func:`latency_s` over ``records`` consecutive offsets starting at ``first_offset``."""
    total = sum(
        latency_s(o, base_s, slow_s, slow_fraction) for o in range(first_offset, first_offset + records)
    )
    return total / max(records, 1)
