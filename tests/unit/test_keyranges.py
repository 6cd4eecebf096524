"""Unit tests of multilane.formats.keyranges: hashing, layouts, split/merge invariants."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from multilane.formats.keyranges import (
    HASH_BITS,
    HASH_SPACE,
    KeyRange,
    KeyRangeMap,
    key_hash,
    offset_route_key,
    route_hash,
)


def _assert_tiles(m: KeyRangeMap) -> None:
    rs = m.ranges
    assert rs[0].start == 0
    assert rs[-1].end == HASH_SPACE
    for a, b in itertools.pairwise(rs):
        assert a.end == b.start
    assert sum(r.width for r in rs) == HASH_SPACE


def test_constants() -> None:
    assert HASH_BITS == 32
    assert HASH_SPACE == 2**32


def test_key_hash_known_values_are_stable() -> None:
    # Pinned values: a change here changes which lane every key lands in (and invalidates
    # persisted key-range progress), so it must never change silently.
    assert key_hash(b"") == 0
    assert key_hash(b"abc") == 3505490737
    assert key_hash(b"user-1") == key_hash(b"user-1")
    assert key_hash(b"user-1") != key_hash(b"user-2")


def test_key_hash_is_crc32_plus_fmix32() -> None:
    def fmix32(h: int) -> int:
        h ^= h >> 16
        h = (h * 0x85EBCA6B) & 0xFFFFFFFF
        h ^= h >> 13
        h = (h * 0xC2B2AE35) & 0xFFFFFFFF
        return h ^ (h >> 16)

    for k in (b"a", b"hello", b"\x00" * 8, bytes(range(256))):
        assert key_hash(k) == fmix32(zlib.crc32(k))


def test_key_hash_same_in_another_process() -> None:
    keys = [b"k1", b"user-42", bytes(range(20))]
    code = f"from multilane.formats.keyranges import key_hash;print([key_hash(k) for k in {keys!r}])"
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONHASHSEED": "12345", "PATH": ""},
    ).stdout.strip()
    assert out == str([key_hash(k) for k in keys])


@given(st.binary(max_size=64))
def test_key_hash_in_range(key: bytes) -> None:
    assert 0 <= key_hash(key) < HASH_SPACE


def test_offset_route_key() -> None:
    assert offset_route_key(0) == b"\x00" * 8
    assert offset_route_key(258) == b"\x00\x00\x00\x00\x00\x00\x01\x02"
    assert len(offset_route_key(2**62)) == 8
    assert route_hash(None, 5) == key_hash(offset_route_key(5))
    assert route_hash(b"k", 5) == key_hash(b"k")


def test_key_range_basics() -> None:
    r = KeyRange(10, 20)
    assert r.width == 10
    assert r.contains(10)
    assert r.contains(19)
    assert not r.contains(20)
    assert not r.contains(9)
    assert 15 in r
    with pytest.raises(ValueError, match="start < end"):
        KeyRange(5, 5)
    with pytest.raises(ValueError):
        KeyRange(-1, 5)
    with pytest.raises(ValueError):
        KeyRange(0, HASH_SPACE + 1)
    with pytest.raises(TypeError):
        KeyRange(0.5, 3)  # type: ignore[arg-type]


@pytest.mark.parametrize("f", [1, 2, 3, 7, 8, 64, 1000])
def test_even_layout(f: int) -> None:
    m = KeyRangeMap.even(f)
    assert len(m) == f
    _assert_tiles(m)
    widths = {r.width for r in m.ranges}
    assert max(widths) - min(widths) <= 1


def test_even_rejects_bad_factor() -> None:
    for bad in (0, -1):
        with pytest.raises(ValueError, match="factor"):
            KeyRangeMap.even(bad)


def test_from_ranges_validates_coverage() -> None:
    half = HASH_SPACE // 2
    assert len(KeyRangeMap.from_ranges([(0, half), (half, HASH_SPACE)])) == 2
    with pytest.raises(ValueError, match="contiguous"):
        KeyRangeMap.from_ranges([(0, half), (half + 1, HASH_SPACE)])
    with pytest.raises(ValueError, match="start at 0"):
        KeyRangeMap.from_ranges([(1, HASH_SPACE)])
    with pytest.raises(ValueError, match="end at 2"):
        KeyRangeMap.from_ranges([(0, half)])
    with pytest.raises(ValueError, match="at least one"):
        KeyRangeMap.from_ranges([])
    with pytest.raises(ValueError, match="start at 0"):  # unsorted
        KeyRangeMap.from_ranges([(half, HASH_SPACE), (0, half)])
    with pytest.raises(ValueError, match="contiguous"):  # overlapping
        KeyRangeMap.from_ranges([(0, half), (half - 1, HASH_SPACE)])
    with pytest.raises(ValueError, match="pair"):
        KeyRangeMap.from_ranges([(0, 1, 2)])  # type: ignore[list-item]


def test_lane_of_edges() -> None:
    m = KeyRangeMap.even(4)
    assert m.lane_of(0) == 0
    assert m.lane_of(HASH_SPACE // 4 - 1) == 0
    assert m.lane_of(HASH_SPACE // 4) == 1
    assert m.lane_of(HASH_SPACE - 1) == 3
    with pytest.raises(ValueError):
        m.lane_of(HASH_SPACE)
    with pytest.raises(ValueError):
        m.lane_of(-1)


def test_split_merge_resize() -> None:
    m = KeyRangeMap.even(2)
    s = m.split(0)
    assert len(s) == 3
    assert s[0] == KeyRange(0, HASH_SPACE // 4)
    assert s[1] == KeyRange(HASH_SPACE // 4, HASH_SPACE // 2)
    assert s.merge(0) == m
    with pytest.raises(ValueError, match="last lane"):
        s.merge(2)
    with pytest.raises(IndexError):
        s.split(3)
    assert m.resize(2) is m
    assert m.resize(8) == KeyRangeMap.even(8)
    tiny = KeyRangeMap.from_ranges([(0, 1), (1, HASH_SPACE)])
    with pytest.raises(ValueError, match="cannot be split"):
        tiny.split(0)


def test_json_round_trip() -> None:
    m = KeyRangeMap.even(5).split(2).merge(0)
    data = json.loads(json.dumps(m.to_list()))
    assert KeyRangeMap.from_list(data) == m
    with pytest.raises(ValueError):
        KeyRangeMap.from_list({"a": 1})


ops = st.lists(st.tuples(st.sampled_from(["split", "merge"]), st.integers(0, 1000)), max_size=60)


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 16), ops, st.lists(st.integers(0, HASH_SPACE - 1), min_size=1, max_size=30))
def test_coverage_invariant_after_random_split_merge(
    f: int, steps: list[tuple[str, int]], hashes: list[int]
) -> None:
    m = KeyRangeMap.even(f)
    for op, n in steps:
        lane = n % len(m)
        if op == "split" and m[lane].width >= 2:
            m = m.split(lane)
        elif op == "merge" and lane + 1 < len(m):
            m = m.merge(lane)
        _assert_tiles(m)
    for h in hashes + [0, HASH_SPACE - 1] + [r.start for r in m.ranges] + [r.end - 1 for r in m.ranges]:
        lane = m.lane_of(h)
        assert m[lane].contains(h)
        assert sum(r.contains(h) for r in m.ranges) == 1


def test_key_hash_distribution_is_roughly_uniform() -> None:
    # 100k similar keys ("key-0" ... "key-99999") over 16 even lanes: expected 6250 per lane,
    # standard deviation sqrt(6250 * 15/16) ~ 77; allow +-5% (~4 sigma) per lane, and a chi-square
    # bound far above its 15-degree-of-freedom mean (p < 1e-6 at 60).
    n, f = 100_000, 16
    m = KeyRangeMap.even(f)
    counts = [0] * f
    for i in range(n):
        counts[m.lane_of(key_hash(f"key-{i}".encode()))] += 1
    expected = n / f
    assert all(abs(c - expected) < 0.05 * expected for c in counts), counts
    chi2 = sum((c - expected) ** 2 / expected for c in counts)
    assert chi2 < 60, (chi2, counts)
