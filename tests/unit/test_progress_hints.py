"""Progress hints (issue 22): a release answers the progress record of its final commit, and the next
owner uses it instead of reading the progress topic inside the pause, only when it is for the
committed offset that owner read (vetted like a record read from the topic). No broker: the progress
store is a double that counts its reads."""

from __future__ import annotations

from typing import Any

import pytest

from multilane.api import OrderingMode
from multilane.formats.progress import ProgressCodec, ProgressRecord
from multilane.operator.rollout.workers import _released
from multilane.worker.config import EngineConfig
from multilane.worker.control import _BadRequestError, _changelog_ends, _progress_hints
from multilane.worker.ownership import (
    Ownership,
    ReleaseResult,
    _end_if_fits,
    _released_progress,
    decode_progress_hint,
)

GROUP, TOPIC = "g", "in"


def record(base: int, partition: int = 3) -> bytes:
    return ProgressCodec.encode(
        ProgressRecord(
            GROUP, TOPIC, partition, base, "w", OrderingMode.UNORDERED, done_offsets=((base + 2, base + 3),)
        )
    )


class CountingStore:
    def __init__(self, answer: ProgressRecord | None) -> None:
        self.answer = answer
        self.reads: list[tuple[str, int, int | None]] = []

    def read_progress(self, topic: str, partition: int, committed: int | None) -> ProgressRecord | None:
        self.reads.append((topic, partition, committed))
        return self.answer


def ownership(store: CountingStore, ordering: OrderingMode = OrderingMode.UNORDERED) -> Ownership:
    own = Ownership.__new__(Ownership)  # load_progress needs only the config and the progress store
    own.config = EngineConfig(bootstrap_servers="b:1", group=GROUP, operator_mode=True, ordering=ordering)
    own.store = store  # type: ignore[assignment]
    return own


def test_a_hint_for_the_committed_offset_is_used_without_reading_the_topic() -> None:
    store = CountingStore(None)
    rec = ownership(store).load_progress((TOPIC, 3), (100, None), record(100))
    assert rec is not None and rec.base_offset == 100 and rec.done_offsets == ((102, 103),)
    assert store.reads == []


@pytest.mark.parametrize(
    "hint", [record(90), record(100, partition=4), b"\x00garbage"], ids=["stale", "foreign", "undecodable"]
)
def test_a_hint_that_does_not_fit_falls_back_to_reading_the_topic(hint: bytes) -> None:
    from_topic = ProgressCodec.decode(record(100))
    store = CountingStore(from_topic)
    assert ownership(store).load_progress((TOPIC, 3), (100, None), hint) == from_topic
    assert store.reads == [(TOPIC, 3, 100)]


def test_partition_ordering_keeps_no_progress_even_with_a_hint() -> None:
    store = CountingStore(None)
    own = ownership(store, OrderingMode.PARTITION)
    assert own.load_progress((TOPIC, 3), (100, None), record(100)) is None
    assert store.reads == []


class Part:
    def __init__(self, last_progress: bytes | None, committed: int | None) -> None:
        self.last_progress, self.committed = last_progress, committed


def test_a_release_answers_the_progress_of_its_final_commit_only() -> None:
    assert _released_progress(Part(record(100), 100)) == record(100)  # type: ignore[arg-type]
    assert _released_progress(Part(record(90), 100)) is None  # type: ignore[arg-type]  # an older commit's
    assert _released_progress(Part(None, 100)) is None  # type: ignore[arg-type]  # its write failed
    assert _released_progress(Part(record(100), None)) is None  # type: ignore[arg-type]


def test_the_hint_travels_as_base64_through_the_control_api() -> None:
    answer: dict[str, Any] = ReleaseResult(TOPIC, 3, 100, record(100)).to_dict()
    assert set(answer) == {"topic", "partition", "committed_offset", "progress"}
    assert "progress" not in ReleaseResult(TOPIC, 3, 100).to_dict()
    body = {"progress": [{"topic": TOPIC, "partition": 3, "progress": answer["progress"]}]}
    assert _progress_hints(body) == {(TOPIC, 3): record(100)}
    assert decode_progress_hint(answer["progress"]) == record(100)
    assert _progress_hints({}) == {}


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"progress": {"in/3": "x"}}, "'progress' must be a list"),
        ({"progress": [{"topic": TOPIC, "partition": 3}]}, "must be a base64 string"),
        ({"progress": [{"topic": TOPIC, "partition": 3, "progress": "not base64!"}]}, "not base64"),
        ({"progress": [{"topic": TOPIC, "partition": -1, "progress": ""}]}, "bad partition"),
    ],
)
def test_a_bad_hint_is_refused_with_a_one_line_reason(body: dict[str, Any], message: str) -> None:
    with pytest.raises(_BadRequestError, match=message) as exc:
        _progress_hints(body)
    assert "\n" not in str(exc.value)


def test_the_changelog_end_travels_with_the_hint_and_counts_only_when_the_hint_fits() -> None:
    """A release's changelog end goes operator-ward in its answer and back with the progress item; the
    next owner hands it to the state open only when that release's progress record is for the
    committed offset it read (else somebody may have written the changelog since)."""
    answer: dict[str, Any] = ReleaseResult(TOPIC, 3, 100, record(100), 740).to_dict()
    assert answer["changelog_end"] == 740
    assert "changelog_end" not in ReleaseResult(TOPIC, 3, 100, record(100)).to_dict()
    [released] = _released([answer])
    assert (released.progress, released.changelog_end) == (answer["progress"], 740)
    hint = answer["progress"]
    body = {"progress": [{"topic": TOPIC, "partition": 3, "progress": hint, "changelog_end": 740},
                         {"topic": TOPIC, "partition": 4, "progress": hint}]}
    assert _changelog_ends(body) == {(TOPIC, 3): 740}
    assert _end_if_fits(740, record(100), 100) == 740
    assert _end_if_fits(740, record(100), 120) is None  # committed since: the end may be stale
    assert _end_if_fits(740, None, 100) is None
    assert _end_if_fits(740, b"garbage", 100) is None
    assert _end_if_fits(None, record(100), 100) is None


@pytest.mark.parametrize("end", [-1, "12", True, 1.5])
def test_a_bad_changelog_end_is_refused_with_a_one_line_reason(end: Any) -> None:
    body = {"progress": [{"topic": TOPIC, "partition": 3, "progress": "", "changelog_end": end}]}
    with pytest.raises(_BadRequestError, match="'changelog_end' must be an int >= 0") as exc:
        _changelog_ends(body)
    assert "\n" not in str(exc.value)
