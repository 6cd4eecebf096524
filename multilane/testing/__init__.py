"""Test and demo support for multilane: an embedded Kafka-compatible broker, Apache Kafka
(``ApacheKafka``, imported on first use), delivery checkers, and ``run_processor`` for unit tests of a
processor.

Public API used by the test suite, the demo, the benchmarks and users' tests. This package does I/O:
it starts and stops broker processes and talks to them over loopback. ``run_processor`` and its result
types are imported on first use.
"""

from typing import TYPE_CHECKING, Any

from multilane.testing.broker import BrokerError, EmbeddedBroker

if TYPE_CHECKING:
    from multilane.testing.apache import ApacheKafka
    from multilane.testing.harness import (
        DeadLetter,
        Output,
        ProcessorRun,
        run_processor,
        run_processor_async,
    )
    from multilane.testing.memory_state import MemoryStateView

__all__ = ["ApacheKafka", "BrokerError", "DeadLetter", "EmbeddedBroker", "MemoryStateView", "Output",
           "ProcessorRun", "run_processor", "run_processor_async"]

_HARNESS = frozenset({"DeadLetter", "Output", "ProcessorRun", "run_processor", "run_processor_async"})


def __getattr__(name: str) -> Any:
    if name in _HARNESS:
        from multilane.testing import harness

        return getattr(harness, name)
    if name == "ApacheKafka":
        from multilane.testing.apache import ApacheKafka

        return ApacheKafka
    if name == "MemoryStateView":
        from multilane.testing.memory_state import MemoryStateView

        return MemoryStateView
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
