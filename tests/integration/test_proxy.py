"""Integration tests of multilane.testing.proxy: raw TCP faults, and a broker behind the proxy."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from multilane.testing.proxy import LinkState, ProxiedBroker, TcpProxy


class EchoServer:
    """A loopback echo server in a thread."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._echo, args=(conn,), daemon=True).start()

    @staticmethod
    def _echo(conn: socket.socket) -> None:
        with conn:
            try:
                while data := conn.recv(65536):
                    conn.sendall(data)
            except OSError:
                pass

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def echo_proxy() -> Iterator[TcpProxy]:
    server = EchoServer()
    proxy = TcpProxy(None, ("127.0.0.1", server.port)).start()
    try:
        yield proxy
    finally:
        proxy.stop()
        server.close()


def _connect(proxy: TcpProxy) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", proxy.listen_port), timeout=5)
    s.settimeout(5)
    return s


def _roundtrip(s: socket.socket, payload: bytes) -> bytes:
    s.sendall(payload)
    got = b""
    while len(got) < len(payload):
        chunk = s.recv(65536)
        if not chunk:
            break
        got += chunk
    return got


def _is_closed(s: socket.socket, timeout: float = 5.0) -> bool:
    s.settimeout(timeout)
    try:
        with contextlib.suppress(OSError):
            s.sendall(b"x")
        return s.recv(1) == b""
    except (ConnectionResetError, BrokenPipeError):
        return True
    except TimeoutError:
        return False


def test_forwards_bytes_both_ways(echo_proxy: TcpProxy) -> None:
    with _connect(echo_proxy) as s:
        payload = bytes(range(256)) * 4000  # 1 MB
        assert _roundtrip(s, payload) == payload
    # The proxy thread counts a chunk after sending it, so the client may hold every echoed byte a
    # moment before the counter does: wait for the count instead of reading it once.
    deadline = time.monotonic() + 5.0
    while echo_proxy.bytes_forwarded < 2 * len(payload) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert echo_proxy.bytes_forwarded >= 2 * len(payload)


def test_cut_closes_connections_and_refuses_new_ones_until_restore(echo_proxy: TcpProxy) -> None:
    s = _connect(echo_proxy)
    assert _roundtrip(s, b"hello") == b"hello"
    echo_proxy.cut()
    assert echo_proxy.state is LinkState.CUT
    assert _is_closed(s)
    s.close()
    # a new connection is accepted and closed at once
    with _connect(echo_proxy) as s2:
        assert _is_closed(s2)
    echo_proxy.restore()
    with _connect(echo_proxy) as s3:
        assert _roundtrip(s3, b"again") == b"again"


def test_blackhole_holds_data_until_restore(echo_proxy: TcpProxy) -> None:
    with _connect(echo_proxy) as s:
        assert _roundtrip(s, b"a") == b"a"
        echo_proxy.blackhole()
        s.sendall(b"held")
        s.settimeout(0.5)
        with pytest.raises(TimeoutError):
            s.recv(10)
        # a connection opened during the black hole is held too
        s_new = _connect(echo_proxy)
        s_new.sendall(b"new")
        echo_proxy.restore()
        s.settimeout(5)
        assert s.recv(10) == b"held"
        assert s_new.recv(10) == b"new"
        s_new.close()


@pytest.mark.broker
def test_broker_behind_proxy_advertises_the_proxy_and_survives_a_cut() -> None:
    from confluent_kafka import Consumer, Producer, TopicPartition
    from confluent_kafka.admin import AdminClient

    with ProxiedBroker() as pb:
        # Measured fact: Tansu accepts a listener URL different from its advertised URL; metadata
        # fetched from the broker's own port names the proxy's port.
        md = AdminClient({"bootstrap.servers": pb.direct_bootstrap}).list_topics(timeout=10)
        assert [(b.host, b.port) for b in md.brokers.values()] == [("127.0.0.1", pb.proxy.listen_port)]

        pb.create_topic("proxied", 1)
        producer = Producer({"bootstrap.servers": pb.direct_bootstrap, "linger.ms": 5})
        for i in range(1000):
            producer.produce("proxied", key=b"k", value=f"v{i}".encode(), partition=0)
        assert producer.flush(30) == 0
        assert pb.proxy.bytes_forwarded > 1000 * 5  # the records went through the proxy

        consumer = Consumer(
            {"bootstrap.servers": pb.bootstrap, "group.id": "proxy-test", "enable.auto.commit": False}
        )
        try:
            consumer.assign([TopicPartition("proxied", 0, 0)])
            seen = 0
            deadline = time.monotonic() + 60
            while seen < 1000 and time.monotonic() < deadline:
                seen += sum(1 for m in consumer.consume(1000, 1.0) if m.error() is None)
            assert seen == 1000

            pb.proxy.cut()
            producer.produce("proxied", key=b"k", value=b"during-cut", partition=0)
            assert producer.flush(3) == 1  # cannot be delivered while the link is cut
            pb.proxy.restore()
            assert producer.flush(60) == 0  # librdkafka reconnects by itself

            got: list[bytes | None] = []
            deadline = time.monotonic() + 60
            while not got and time.monotonic() < deadline:
                got += [m.value() for m in consumer.consume(100, 1.0) if m.error() is None]
            assert got == [b"during-cut"]
        finally:
            consumer.close()
