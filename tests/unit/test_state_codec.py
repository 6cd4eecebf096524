"""ChangelogCodec: round trips and corrupt input (pure)."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from multilane.formats.changelog import (
    HEADER_SIZE,
    MAGIC,
    Change,
    ChangelogCodec,
    ChangelogDecodeError,
    ChangeOp,
)
from multilane.worker.state.errors import ChangelogCorruptError

offsets = st.integers(min_value=0, max_value=(1 << 63) - 1)
hashes = st.integers(min_value=0, max_value=(1 << 32) - 1)


@given(offsets, hashes, st.binary(max_size=512))
def test_put_round_trip(offset: int, h: int, payload: bytes) -> None:
    change = Change(ChangeOp.PUT, offset, h, payload)
    raw = ChangelogCodec.encode(change)
    assert raw == ChangelogCodec.encode_put(payload, offset, h)
    assert raw[:3] == MAGIC and raw[3:4] == b"P" and len(raw) == HEADER_SIZE + len(payload)
    assert ChangelogCodec.decode(raw) == change


@given(offsets, hashes)
def test_delete_round_trip_is_never_empty(offset: int, h: int) -> None:
    change = Change(ChangeOp.DELETE, offset, h)
    raw = ChangelogCodec.encode(change)
    assert raw == ChangelogCodec.encode_delete(offset, h)
    assert len(raw) == HEADER_SIZE == 16
    assert ChangelogCodec.decode(raw) == change


def test_envelope_layout_is_the_documented_one() -> None:
    raw = ChangelogCodec.encode_put(b"v", 258, 0xDEADBEEF)
    assert raw == b"ML1P" + (258).to_bytes(8, "big", signed=True) + bytes.fromhex("deadbeef") + b"v"


def test_null_value_decodes_to_tombstone() -> None:
    assert ChangelogCodec.decode(None) is None


@given(st.binary(max_size=HEADER_SIZE - 1))
def test_short_values_are_corrupt(raw: bytes) -> None:
    with pytest.raises(ChangelogDecodeError, match="bytes"):
        ChangelogCodec.decode(raw)


@given(st.binary(min_size=HEADER_SIZE, max_size=64))
def test_arbitrary_bytes_decode_or_raise_clearly(raw: bytes) -> None:
    error: ChangelogDecodeError | None = None
    try:
        change = ChangelogCodec.decode(raw)
    except ChangelogDecodeError as exc:
        error = exc
    if error is not None:
        assert "corrupt changelog record" in str(error)
    else:
        assert change is not None
        assert ChangelogCodec.encode(change) == raw  # whatever decodes re-encodes to the same bytes


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b"XX1P" + bytes(12), "bad magic"),
        (b"ML1X" + bytes(12), "unknown op"),
        (b"ML1D" + bytes(12) + b"x", "payload"),
        (b"ML1P" + struct.pack(">q", -5) + bytes(4), "negative source offset"),
    ],
)
def test_corrupt_envelopes(raw: bytes, message: str) -> None:
    with pytest.raises(ChangelogDecodeError, match=message):
        ChangelogCodec.decode(raw)


def test_change_invariants() -> None:
    with pytest.raises(ValueError, match="payload"):
        Change(ChangeOp.DELETE, 1, 1, b"x")
    with pytest.raises(ValueError, match="hash"):
        Change(ChangeOp.PUT, 1, 1 << 32)
    with pytest.raises(ValueError, match="64"):
        Change(ChangeOp.PUT, 1 << 63, 0)
    with pytest.raises(TypeError):
        Change("P", 1, 1)  # type: ignore[arg-type]


def test_corrupt_error_names_offset() -> None:
    exc = ChangelogCorruptError("bad magic", topic="g.t.changelog", partition=3, offset=42)
    assert "g.t.changelog[3]@42" in str(exc) and exc.offset == 42
