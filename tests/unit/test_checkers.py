"""Unit tests of multilane.testing.checkers: hand-made clean and violating logs."""

from __future__ import annotations

import pytest

from multilane.testing.checkers import (
    AtLeastOnceChecker,
    CheckResult,
    ExclusiveKeyChecker,
    KeyOrderChecker,
    ProducedRecord,
    ReplayCounter,
    assert_all,
    check_delivery,
)
from multilane.testing.processors import ProcessingEvent


class Log:
    """Builds an event list with seq numbers, like the event log file would."""

    def __init__(self) -> None:
        self.events: list[ProcessingEvent] = []

    def add(
        self,
        kind: str,
        pid: int,
        offset: int = -1,
        key: bytes | None = b"a",
        attempt: int = 1,
        partition: int = 0,
    ) -> Log:
        if kind == "kill":
            e = ProcessingEvent("kill", 0.0, pid, "", -1, -1, None, 0, -1, seq=len(self.events))
        else:
            e = ProcessingEvent(kind, 0.0, pid, "t", partition, offset, key, attempt, 0, seq=len(self.events))
        self.events.append(e)
        return self

    def run(
        self, pid: int, offset: int, key: bytes | None = b"a", attempt: int = 1, partition: int = 0
    ) -> Log:
        return self.add("start", pid, offset, key, attempt, partition).add(
            "end", pid, offset, key, attempt, partition
        )


def produced(spec: list[tuple[int, bytes | None]], partition: int = 0) -> list[ProducedRecord]:
    return [ProducedRecord("t", partition, o, k) for o, k in spec]


# keys a and b interleaved on one partition
P = produced([(0, b"a"), (1, b"b"), (2, b"a"), (3, b"b"), (4, b"a")])


def clean_log() -> Log:
    log = Log()
    # two lanes: a and b run concurrently, each in order
    log.add("start", 1, 0, b"a").add("start", 1, 1, b"b").add("end", 1, 0, b"a")
    log.add("start", 1, 2, b"a").add("end", 1, 1, b"b").add("start", 1, 3, b"b")
    log.add("end", 1, 2, b"a").add("end", 1, 3, b"b").run(1, 4, b"a")
    return log


def test_clean_log_passes_everything() -> None:
    results = check_delivery(P, clean_log().events, mode="key")
    assert all(r.ok for r in results), results
    assert_all(results)
    assert results[0].counts == {"produced": 5, "processed": 5, "missing": 0, "unknown": 0}
    assert results[-1].counts["ended_more_than_once"] == 0


# -- at-least-once ----------------------------------------------------------------------------------


def test_at_least_once_reports_missing() -> None:
    log = Log().run(1, 0).run(1, 1, b"b").run(1, 2).add("start", 1, 3, b"b").run(1, 4)
    r = AtLeastOnceChecker(P).check(log.events)
    assert not r.ok
    assert r.counts["missing"] == 1
    assert "t/0@3" in r.violations[0]


def test_at_least_once_reports_unknown_and_wrong_key() -> None:
    log = clean_log().run(1, 99)
    r = AtLeastOnceChecker(P).check(log.events)
    assert not r.ok
    assert r.counts["unknown"] == 1
    assert "never produced" in r.violations[0]
    log2 = Log().run(1, 0, b"zz")
    r2 = AtLeastOnceChecker(produced([(0, b"a")])).check(log2.events)
    assert not r2.ok
    assert "produced with 'a'" in r2.violations[0]


def test_at_least_once_exempt_keys_and_many_missing() -> None:
    many = produced([(i, b"p") for i in range(30)])
    r = AtLeastOnceChecker(many).check([])
    assert r.counts["missing"] == 30
    assert len(r.violations) == 10  # only the first ones are listed
    assert AtLeastOnceChecker(many, exempt_keys=[b"p"]).check([]).ok


# -- key order --------------------------------------------------------------------------------------


def test_retries_of_the_same_offset_are_in_order() -> None:
    log = Log().add("start", 1, 0).add("fail", 1, 0).add("start", 1, 0, attempt=2).add("end", 1, 0, attempt=2)
    log.run(1, 2).run(1, 4)
    r = KeyOrderChecker(P).check(log.events)
    assert r.ok, r


def test_skip_forward_is_caught_and_names_the_skipped_offset() -> None:
    log = Log().run(1, 0).run(1, 4).run(1, 2)
    r = KeyOrderChecker(P).check(log.events)
    assert not r.ok
    assert "skips produced offset(s) 2" in r.violations[0]


def test_out_of_order_within_one_process_is_caught() -> None:
    log = Log().run(1, 0).run(1, 2).run(1, 0)
    r = KeyOrderChecker(P).check(log.events)
    assert not r.ok
    assert "within one incarnation" in r.violations[0]
    assert KeyOrderChecker(P, rewind_within_incarnation=True).check(log.events).ok


def test_rewind_in_a_new_process_then_in_order_is_fine() -> None:
    log = Log().run(1, 0).run(1, 2).add("start", 1, 4).add("kill", 1)
    log.run(2, 2).run(2, 4)
    r = KeyOrderChecker(P).check(log.events)
    assert r.ok, r
    assert r.counts["rewinds"] == 1


def test_rewind_after_a_kill_marker_in_the_same_pid_is_a_new_incarnation() -> None:
    log = Log().run(1, 0).run(1, 2).add("kill", 1).run(1, 0).run(1, 2).run(1, 4)
    assert KeyOrderChecker(P).check(log.events).ok


def test_rewind_then_skip_is_caught() -> None:
    log = Log().run(1, 0).run(1, 2).add("kill", 1).run(2, 0).run(2, 4)
    r = KeyOrderChecker(P).check(log.events)
    assert not r.ok
    assert "after offset 0 skips produced offset(s) 2" in r.violations[0]


def test_late_first_start_needs_permission() -> None:
    log = Log().run(1, 2).run(1, 4)
    assert not KeyOrderChecker(P).check(log.events).ok
    assert KeyOrderChecker(P, allow_late_start=True).check(log.events).ok


def test_unknown_offset_for_key_is_caught() -> None:
    log = Log().run(1, 0).run(1, 1, b"a")  # offset 1 belongs to key b
    r = KeyOrderChecker(P).check(log.events)
    assert not r.ok
    assert "never produced" in r.violations[0]


def test_null_keys_have_no_order_in_key_mode_but_do_in_partition_mode() -> None:
    pn = produced([(0, None), (1, None), (2, None)])
    log = Log().run(1, 2, None).run(1, 0, None).run(1, 1, None)
    assert KeyOrderChecker(pn).check(log.events).ok
    r = KeyOrderChecker(pn, by="partition").check(log.events)
    assert not r.ok


def test_partition_mode_order() -> None:
    ok = Log().run(1, 0, b"a").run(1, 1, b"b").run(1, 2, b"a").run(1, 3, b"b").run(1, 4, b"a")
    assert KeyOrderChecker(P, by="partition").check(ok.events).ok
    # the clean key-mode log starts records in offset order, but runs two of them at once
    assert KeyOrderChecker(P, by="partition").check(clean_log().events).ok
    assert not ExclusiveKeyChecker(by="partition").check(clean_log().events).ok
    bad = Log().run(1, 1, b"b").run(1, 0, b"a")
    assert not KeyOrderChecker(P, by="partition").check(bad.events).ok
    with pytest.raises(ValueError, match="by must be"):
        KeyOrderChecker(P, by="lane")


# -- exclusivity ------------------------------------------------------------------------------------


def test_overlap_across_processes_is_caught() -> None:
    log = Log().add("start", 1, 0).add("start", 2, 2).add("end", 1, 0).add("end", 2, 2)
    r = ExclusiveKeyChecker().check(log.events)
    assert not r.ok
    assert r.counts["overlaps"] == 1
    assert "while pid 1 still runs @0" in r.violations[0]


def test_overlap_within_a_process_is_caught() -> None:
    log = Log().add("start", 1, 0).add("start", 1, 2).add("end", 1, 2).add("end", 1, 0)
    assert not ExclusiveKeyChecker().check(log.events).ok


def test_different_keys_may_overlap() -> None:
    assert ExclusiveKeyChecker().check(clean_log().events).ok


def test_killed_process_attempt_closes_at_the_kill_marker() -> None:
    base = Log().add("start", 1, 0)
    ok = Log()
    ok.events = [*base.events]
    ok.add("kill", 1).run(2, 0)
    assert ExclusiveKeyChecker().check(ok.events).ok
    # the same without a kill marker, but pid 1 writes again later: still open -> violation
    bad = Log()
    bad.events = [*base.events]
    bad.add("start", 2, 0).add("end", 2, 0).run(1, 1, b"b")
    assert not ExclusiveKeyChecker().check(bad.events).ok


def test_unmarked_dead_process_closes_after_its_last_event() -> None:
    log = Log().add("start", 1, 0).add("start", 1, 1, b"b").run(2, 0)
    r = ExclusiveKeyChecker().check(log.events)
    assert r.ok, r


def test_end_without_start_is_caught() -> None:
    log = Log().add("end", 1, 0)
    r = ExclusiveKeyChecker().check(log.events)
    assert not r.ok
    assert "without a matching start" in r.violations[0]


def test_partition_exclusivity() -> None:
    log = (
        Log().add("start", 1, 0, b"a").add("start", 1, 1, b"b").add("end", 1, 0, b"a").add("end", 1, 1, b"b")
    )
    assert ExclusiveKeyChecker(by="key").check(log.events).ok
    assert not ExclusiveKeyChecker(by="partition").check(log.events).ok


# -- replays ----------------------------------------------------------------------------------------


def test_replay_counter() -> None:
    log = Log().run(1, 0).run(1, 2).add("start", 1, 4).add("kill", 1).run(2, 2).run(2, 4)
    r = ReplayCounter().check(log.events)
    assert r.ok
    assert r.counts == {
        "records": 3,
        "ended_more_than_once": 1,
        "extra_ends": 1,
        "started_in_several_incarnations": 2,
    }
    assert ReplayCounter(max_replays=1, max_restarted=2).check(log.events).ok
    bounded = ReplayCounter(max_replays=0, max_restarted=1).check(log.events)
    assert not bounded.ok
    assert len(bounded.violations) == 2
    assert "t/0@2" in bounded.violations[0]


# -- reporting --------------------------------------------------------------------------------------


def test_assert_all_message_lists_failures() -> None:
    bad = CheckResult("x", False, {"n": 1}, ["boom"])
    good = CheckResult("y", True, {})
    assert_all(good, [good])
    with pytest.raises(AssertionError) as info:
        assert_all(good, [bad])
    msg = str(info.value)
    assert "x: FAILED" in msg
    assert "boom" in msg
    assert "y:" not in msg


def test_check_delivery_modes() -> None:
    log = clean_log()
    assert len(check_delivery(P, log.events, mode="unordered")) == 2
    assert len(check_delivery(P, log.events, mode="partition")) == 4
    with pytest.raises(ValueError, match="ordering mode"):
        check_delivery(P, log.events, mode="lane")


def test_cancel_closes_an_attempt_but_an_abandoned_one_stays_open() -> None:
    # pid 1 loses the partition: its async attempt is cancelled, pid 2 takes over -> fine
    cancelled = Log().add("start", 1, 0).add("cancel", 1, 0).run(2, 0).run(1, 1, b"b")
    assert ExclusiveKeyChecker().check(cancelled.events).ok
    # a sync attempt cannot be cancelled: pid 1 is still running it when pid 2 starts the key
    abandoned = Log().add("start", 1, 0).run(2, 0).add("end", 1, 0)
    r = ExclusiveKeyChecker().check(abandoned.events)
    assert not r.ok
    assert "while pid 1 still runs @0" in r.violations[0]
