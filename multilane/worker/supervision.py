"""What ``multilane worker`` puts around its engine: outputs, the guard (breaker, record timeout,
end-to-end latency), the broker probe, loop-blocking detection, health metrics, readiness facts and the
log format. Does I/O (through the parts it builds).

The engine is not changed: the processor it runs is wrapped (:func:`WorkerSupervisor.wrap`), the
metrics are an extra collector on its registry, and the worker's readiness facts are laid over the
engine's (:meth:`WorkerSupervisor.facts`; ``multilane.worker.readiness`` decides).

Lifecycle (steps 1-4, called by ``multilane.worker.cli``):

1. :meth:`WorkerSupervisor.wrap` before the engine is built: outputs inside, the guard outside.
2. :meth:`WorkerSupervisor.preflight` before the engine starts: wait for the broker (exit after
   ``--broker-timeout-s``), refuse missing input topics (exit 2; topics are never auto-created), and
   check the declared output topics (``--output-topic``, :mod:`multilane.worker.output_topics`:
   created when declared with a partition count, else a missing one is refused, exit 2).
3. :meth:`WorkerSupervisor.start` once the engine runs: probe, loop watch, metrics.
4. :meth:`WorkerSupervisor.stop` after the engine stopped: release held records, flush outputs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import time
from dataclasses import replace
from typing import Any

from multilane.api import Processor
from multilane.worker.breaker import CircuitBreaker
from multilane.worker.config import EngineConfig, security_settings
from multilane.worker.guard import EndToEndLatency, guarded
from multilane.worker.health import AppMetricsCollector, BrokerProbe, HealthCollector, kafka_logger
from multilane.worker.loopwatch import LoopBlockWatch
from multilane.worker.output_topics import check_output_topics, missing_message, parse_output_topics
from multilane.worker.readiness import ReadinessFacts
from multilane.worker.retry import RetryPolicy

__all__ = ["JsonLogFormatter", "StartupError", "WorkerSupervisor", "add_arguments", "client_overrides"]

log = logging.getLogger("multilane.worker")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    a = parser.add_argument
    a("--breaker-dead-letters", type=int, default=5,
      help="open the circuit breaker after this many consecutive dead letters: the worker takes no more "
           "records and commits nothing past them until POST /breaker/reset or a restart (0 = off)")
    a("--record-timeout-s", type=float, default=0.0,
      help="a record's processing (with its outputs) taking longer fails with RecordTimeoutError, "
           "retried like any failure (0 = no limit)")
    a("--broker-timeout-s", type=float, default=120.0,
      help="exit (code 1) when the broker has not answered for this long, at start or later (0 = never)")
    a("--loop-block-threshold-s", type=float, default=0.5,
      help="warn, naming the processor and record, when the event loop is blocked this long (0 = off)")
    a("--group-instance-id", default=os.environ.get("MULTILANE_GROUP_INSTANCE_ID") or None,
      help="static group membership (group.instance.id; e.g. the pod name): a restarted member gets its "
           "partitions back without a rebalance, where the broker supports it (or "
           "$MULTILANE_GROUP_INSTANCE_ID)")
    a("--log-format", choices=("text", "json"), default=os.environ.get("MULTILANE_LOG_FORMAT", "text"),
      help="stderr log lines as text or one JSON object per line (or $MULTILANE_LOG_FORMAT)")


def client_overrides(args: argparse.Namespace, overrides: dict[str, Any]) -> dict[str, Any]:
    """The consumer settings this module adds: no topic auto-creation, static membership, the client
    log through Python logging (rate-limited). Settings given explicitly win."""
    out: dict[str, Any] = {"allow.auto.create.topics": "false", "logger": kafka_logger()}
    if getattr(args, "group_instance_id", None):
        out["group.instance.id"] = args.group_instance_id
    out.update(overrides)
    return out


class JsonLogFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message (and the exception, if any)."""

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {"time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
                               + f".{int(record.msecs):03d}Z", "level": record.levelname,
                               "logger": record.name, "message": record.getMessage()}
        if record.exc_info:
            doc["exception"] = self.formatException(record.exc_info)
        return json.dumps(doc, ensure_ascii=False)


class StartupError(Exception):
    """The worker cannot start: ``code`` is its exit code (2 configuration, 1 environment)."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


class WorkerSupervisor:
    """The parts around one engine (owner of each: this object)."""

    def __init__(self, args: argparse.Namespace, cfg: EngineConfig) -> None:
        self.args = args
        self.cfg = cfg
        policy = RetryPolicy.from_config(cfg)
        threshold = int(getattr(args, "breaker_dead_letters", 5))
        self.breaker = CircuitBreaker(threshold, lambda attempt, exc: not policy.should_retry(attempt, exc))
        self.latency = EndToEndLatency()
        self.timeout_s = float(getattr(args, "record_timeout_s", 0.0) or 0.0)
        self.outputs: Any = None
        self.loopwatch: LoopBlockWatch | None = None
        self.engine: Any = None
        self.exit_code = 0
        self._stopping = False
        security = security_settings(cfg.consumer_overrides)
        self.topics = tuple(cfg.topics) or tuple(sorted({t for t, _ in cfg.assign}))
        self.output_topics = parse_output_topics(getattr(args, "output_topic", None) or [])

        def admin() -> Any:
            from confluent_kafka.admin import AdminClient

            conf: dict[str, Any] = {"bootstrap.servers": cfg.bootstrap_servers, "logger": kafka_logger(),
                                    **security}
            return AdminClient(conf)

        self._admin = admin
        self.probe = BrokerProbe(admin, self.topics, timeout_s=float(getattr(args, "broker_timeout_s", 0.0)),
                                 on_give_up=self._give_up)

    # 1.
    def wrap(self, processor: Processor, outputs: Any = None) -> Processor:
        """Outputs (``ctx.produce``) inside, the guard outside (a failed output meets the breaker)."""
        self.outputs = outputs
        from multilane.worker.transactions import TransactionalOutputs

        if isinstance(outputs, TransactionalOutputs):  # exactly-once: outputs held for the transaction
            from multilane.worker.transactions import with_transactional_outputs

            processor = with_transactional_outputs(processor, outputs)
        elif outputs is not None:
            from multilane.worker.outputs import with_outputs

            processor = with_outputs(processor, outputs)
        wrapped = guarded(processor, self.breaker, self.timeout_s, self.latency)
        code = getattr(wrapped, "__code__", None)
        threshold = float(getattr(self.args, "loop_block_threshold_s", 0.5) or 0.0)
        if threshold > 0:
            self.loopwatch = LoopBlockWatch(threshold, code)
        return wrapped

    # 2.
    async def preflight(self) -> None:
        """Wait until the broker answers (StartupError 1 after ``--broker-timeout-s``), then refuse
        missing input topics (StartupError 2), then check the output topics (create those declared
        with a partition count; StartupError 2 for a missing one declared without)."""
        loop = asyncio.get_running_loop()
        t0 = time.monotonic()
        warned = False
        while True:
            answered, missing = await loop.run_in_executor(None, self.probe.check)
            self.probe.record(answered, missing)
            if answered:
                break
            waited = time.monotonic() - t0
            if not warned:
                log.warning("broker %s does not answer; waiting%s", self.cfg.bootstrap_servers,
                            f" up to {self.probe.timeout_s:g}s (--broker-timeout-s)"
                            if self.probe.timeout_s > 0 else "")
                warned = True
            if self.probe.timeout_s > 0 and waited >= self.probe.timeout_s:
                raise StartupError(f"broker {self.cfg.bootstrap_servers} unreachable for {waited:.0f}s "
                                   "(--broker-timeout-s); check --bootstrap-servers", 1)
            await asyncio.sleep(1.0)
        if missing:
            raise StartupError(f"input topic(s) {', '.join(missing)} do not exist on "
                               f"{self.cfg.bootstrap_servers}; create them first (multilane does not "
                               "auto-create input topics)", 2)
        if self.output_topics:
            try:
                absent = await loop.run_in_executor(None, check_output_topics, self._admin(),
                                                    self.output_topics)
            except Exception as exc:  # KafkaException (e.g. not authorised to create), TimeoutError
                raise StartupError(f"output topics {', '.join(t.name for t in self.output_topics)}: "
                                   f"cannot check or create them on {self.cfg.bootstrap_servers}: {exc}", 1) \
                    from exc
            if absent:
                raise StartupError(missing_message(absent, self.cfg.bootstrap_servers), 2)

    # 3.
    def start(self, engine: Any) -> None:
        self.engine = engine
        self.probe.start()
        if self.loopwatch is not None:
            self.loopwatch.start()
        registry = engine.metrics.registry
        registry.register(HealthCollector(self.cfg.group, self.cfg.worker_id, self.breaker, self.latency,
                                          self.loopwatch, self.probe))
        registry.register(AppMetricsCollector())

    def _give_up(self, reason: str) -> None:
        log.error("stopping: %s", reason)
        self.exit_code = 1
        if self.engine is not None:
            self.engine.request_stop()

    def request_stop(self) -> None:
        self._stopping = True

    # 4.
    async def stop(self) -> None:
        self.breaker.stop()
        await self.probe.stop()
        if self.loopwatch is not None:
            self.loopwatch.stop()

    # -- readiness ------------------------------------------------------------------------------------

    def facts(self, engine_facts: ReadinessFacts) -> ReadinessFacts:
        """The worker's readiness facts laid over the engine's (``ReadinessFacts.of_engine``)."""
        return replace(
            engine_facts,
            stopping=self._stopping,
            broker_reachable=self.probe.reachable,
            broker_unreachable_s=self.probe.unreachable_s,
            expects_partitions=self.cfg.operator_mode and bool(self.cfg.assign),
            breaker_open=self.breaker.is_open,
            breaker_reason=self.breaker.reason,
            missing_topics=self.probe.missing,
        )
