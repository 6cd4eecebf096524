"""Test and demo support for multilane: an embedded Kafka-compatible broker and delivery checkers.

Public API used by the test suite, the demo and the benchmarks. This package does I/O: it starts
and stops broker processes and talks to them over loopback.
"""

from multilane.testing.broker import BrokerError, EmbeddedBroker

__all__ = ["BrokerError", "EmbeddedBroker"]
