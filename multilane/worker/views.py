"""What a worker engine shows: its status (``/v1/status``) and the figures the Prometheus collectors
read (:mod:`multilane.worker.metrics`). No I/O: reads the engine's parts only (the learner figures
are those :class:`LearnerStatusCache` read last, off the loop)."""

from __future__ import annotations

from typing import Any

from multilane.worker.config import EngineConfig
from multilane.worker.control_state import ControlState
from multilane.worker.flow import FlowController
from multilane.worker.housekeeping import LearnerStatusCache, RateMeter
from multilane.worker.partition import Phase
from multilane.worker.partition_set import PartitionSet
from multilane.worker.watchdog import StallWatchdog

__all__ = ["StatusView"]


class StatusView:
    """Builds the worker's status from the parts that hold it."""

    def __init__(self, config: EngineConfig, control: ControlState, partitions: PartitionSet,
                 flow: FlowController, watchdog: StallWatchdog, rate: RateMeter,
                 learners: LearnerStatusCache, with_state: bool) -> None:
        self._config = config
        self._control = control
        self._partitions = partitions
        self._flow = flow
        self._watchdog = watchdog
        self._rate = rate
        self._learners = learners
        self._with_state = with_state

    def status(self) -> dict[str, Any]:
        """The worker's status (``GET /v1/status``; docs/architecture.md, "Worker control API").

        ``partitions``: the partitions this engine owns, plus those whose state is being opened
        (phase ``promoting``: a restore or a learner's promotion before processing starts); their
        ``restore_lag`` comes from the state hooks' ``learner_status()``. ``learners``: every
        partition the state hooks know (restoring, learning, promoting, active, failed) with its
        restore progress; learners of partitions this engine does not own appear only there (the
        operator counts every ``partitions`` entry as owned). The learner figures are those of the
        last refresh (the housekeeping loop refreshes them every half second).
        """
        parts = sorted(self._partitions, key=lambda p: (p.topic, p.partition))
        learners = self._learners.learners
        by_tp = {(str(e.get("topic")), int(e.get("partition", -1))): e for e in learners}
        entries = []
        for p in parts:
            entry = p.status()
            learner = by_tp.get((p.topic, p.partition))
            if learner is not None:
                entry["restore_lag"] = int(learner.get("restore_lag") or 0)
            entries.append(entry)
        for tp in self._partitions.opening():
            learner = by_tp.get(tp, {})
            entries.append({
                "topic": tp[0],
                "partition": tp[1],
                "phase": Phase.PROMOTING,
                "committed": learner.get("committed_offset"),
                "position": None,
                "high_watermark": None,
                "lag": None,
                "in_flight": 0,
                "restore_lag": int(learner.get("restore_lag") or 0),
                "state_phase": learner.get("phase"),
            })  # fmt: skip
        control, flow = self._control, self._flow
        out: dict[str, Any] = {
            "worker_id": self._config.worker_id,
            "generation": control.generation,
            "factor": control.factor,
            "mode": self._config.ordering.value,
            "paused": control.user_paused,
            "fenced": control.fenced_at is not None,
            "partitions": entries,
            "processed_total": self._partitions.processed_total(),
            "processing_rate": round(self._rate.processing_rate, 3),
            "busy_lanes": round(self._rate.busy_lanes, 3),
            "in_flight": flow.records,
            "in_flight_bytes": flow.bytes,
            "peak_in_flight": flow.peak_records,
            "peak_in_flight_bytes": flow.peak_bytes,
            "max_in_flight": flow.max_records,
            "max_in_flight_bytes": flow.max_bytes,
            "stalled": self._watchdog.stalled,
            "back_pressure_pauses": sum(p.flow_counters.pauses for p in parts),
        }
        if self._with_state:
            out["learners"] = learners
        return out

    def lane_utilisation(self) -> float:
        parts = self._partitions.owned()
        if not parts:
            return 0.0
        return sum(p.lanes.busy_fraction for p in parts) / len(parts)
