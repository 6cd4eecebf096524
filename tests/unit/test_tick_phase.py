"""Each consumer's pass runs at its own phase of the tick (HandlerSettings.tick_spread); a deleted
consumer's timer is noticed quickly."""

from __future__ import annotations

import uuid

from multilane.operator.k8s.resource import HandlerSettings, tick_phase


def test_phase_is_fixed_per_uid_and_within_the_spread() -> None:
    uids = [str(uuid.UUID(int=i * 7919 + 1)) for i in range(100)]
    phases = [tick_phase(u, 5.0, 0.8) for u in uids]
    assert phases == [tick_phase(u, 5.0, 0.8) for u in uids]  # the same in every replica
    assert all(0.0 <= p < 4.0 for p in phases)
    # 100 consumers found together do not start their passes together: spread over the window
    assert max(phases) - min(phases) > 3.0
    assert len({round(p, 3) for p in phases}) > 90


def test_no_spread_or_no_uid_means_no_delay() -> None:
    assert tick_phase("some-uid", 5.0, 0.0) == 0.0
    assert tick_phase("", 5.0, 0.8) == 0.0
    assert tick_phase("some-uid", 5.0, 5.0) < 5.0  # a spread above 1 is capped at one tick


def test_default_spread_leaves_a_fifth_of_the_tick_for_the_pass() -> None:
    assert 0.0 < HandlerSettings().tick_spread <= 0.8


def test_a_deleted_consumers_stopped_timer_is_noticed_within_seconds() -> None:
    """kopf releases the finalizer of a deleted consumer once its timer has exited, and checks for that
    every `cancellation_polling` seconds (60 by default: a delete then waited up to a minute)."""
    import kopf

    from multilane.operator.k8s.resource import configure_kopf

    settings = kopf.OperatorSettings()
    configure_kopf(settings)
    assert settings.background.cancellation_polling <= 2.0
