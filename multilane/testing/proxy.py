"""A loopback TCP proxy that tests can cut, black-hole and restore, and a broker placed behind one.

Does I/O: listens on 127.0.0.1 and forwards bytes in background threads.

Kafka clients learn broker addresses from metadata (the *advertised* listener), so a proxy between a
client and the broker only sees the traffic if the broker advertises the proxy's port.
:class:`ProxiedBroker` does that: the broker listens on port A and advertises 127.0.0.1:B, and a
:class:`TcpProxy` listens on B and forwards to A. Tansu (the embedded broker) accepts a listener URL
that differs from the advertised URL (measured; ``tests/integration/test_proxy.py`` checks it):
metadata fetched from port A names B, so every client -- bootstrapped from A or B -- ends up on B.
Measured through the proxy on this 2-core machine: 200k x 100 B produced in ~1.2 s and consumed in
~0.8 s (the thread-per-direction pump is not the bottleneck); after ``cut()`` + ``restore()`` a
librdkafka producer and consumer reconnect by themselves within ~1 s.

Faults:

- :meth:`TcpProxy.cut`: close every connection now and close new ones as soon as they are accepted
  (clients see resets / EOF at once, like a crashed broker or a firewall sending RSTs).
- :meth:`TcpProxy.blackhole`: keep connections open but forward nothing, and accept new connections
  without connecting them onwards (clients see silence and must rely on their timeouts, like a
  partition that drops packets).
- :meth:`TcpProxy.restore`: forward again (held data in a black hole is delivered; cut connections stay
  closed, clients reconnect).
"""

from __future__ import annotations

import contextlib
import enum
import socket
import threading
from types import TracebackType

from multilane.testing.broker import EmbeddedBroker, free_port

__all__ = ["LinkState", "ProxiedBroker", "TcpProxy", "start_broker_behind_proxy"]

_CHUNK = 256 * 1024


class LinkState(enum.Enum):
    OPEN = "open"
    CUT = "cut"
    BLACKHOLE = "blackhole"


class _Link:
    """One client connection and its upstream connection (``upstream`` is None until connected)."""

    __slots__ = ("client", "upstream")

    def __init__(self, client: socket.socket) -> None:
        self.client = client
        self.upstream: socket.socket | None = None

    def close(self) -> None:
        for s in (self.client, self.upstream):
            if s is not None:
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
                with contextlib.suppress(OSError):
                    s.close()


class TcpProxy:
    """Forwards TCP connections from ``127.0.0.1:listen_port`` to ``target`` (host, port).

    Invariants: ``_state`` changes only under ``_cond``; every live connection is in ``_links``
    (removed by its pump threads when they finish), so ``cut()`` can close all of them.
    """

    def __init__(
        self, listen_port: int | None, target: tuple[str, int], connect_timeout: float = 5.0
    ) -> None:
        self.listen_port: int = listen_port or free_port()
        self.target = target
        self.connect_timeout = connect_timeout
        self._cond = threading.Condition()
        self._state = LinkState.OPEN
        self._links: set[_Link] = set()
        self._server: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self._stopping = False
        self.accepted = 0  # connections accepted, for tests
        self.bytes_forwarded = 0  # guarded by _count_lock: both pump threads of a link add to it
        self._count_lock = threading.Lock()

    # -- lifecycle ----------------------------------------------------------------------------------

    def start(self) -> TcpProxy:
        srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        srv.bind(("127.0.0.1", self.listen_port))
        srv.listen(128)
        self._server = srv
        self._thread = threading.Thread(
            target=self._accept_loop, name=f"tcp-proxy-{self.listen_port}", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        srv, self._server = self._server, None
        if srv is not None:
            with contextlib.suppress(OSError):
                srv.shutdown(socket.SHUT_RDWR)
            srv.close()
        self._close_all()
        if self._thread is not None:
            self._thread.join(5)
            self._thread = None

    def __enter__(self) -> TcpProxy:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.listen_port}"

    @property
    def state(self) -> LinkState:
        return self._state

    @property
    def connections(self) -> int:
        with self._cond:
            return len(self._links)

    # -- faults -------------------------------------------------------------------------------------

    def cut(self) -> None:
        """Close every connection now; close new ones right after accepting them."""
        with self._cond:
            self._state = LinkState.CUT
            self._cond.notify_all()
        self._close_all()

    def blackhole(self) -> None:
        """Stop forwarding without closing anything (new connections are held, not connected)."""
        with self._cond:
            self._state = LinkState.BLACKHOLE
            self._cond.notify_all()

    def restore(self) -> None:
        """Forward again."""
        with self._cond:
            self._state = LinkState.OPEN
            self._cond.notify_all()

    # -- internals ----------------------------------------------------------------------------------

    def _close_all(self) -> None:
        with self._cond:
            links = list(self._links)
        for link in links:
            link.close()

    def _wait_open(self) -> bool:
        """Block while black-holed; True when forwarding may go on, False when the link must close."""
        with self._cond:
            while self._state is LinkState.BLACKHOLE and not self._stopping:
                self._cond.wait()
            return self._state is LinkState.OPEN and not self._stopping

    def _accept_loop(self) -> None:
        srv = self._server
        assert srv is not None
        while True:
            try:
                client, _ = srv.accept()
            except OSError:
                return  # the server socket was closed by stop()
            self.accepted += 1
            if self._state is LinkState.CUT or self._stopping:
                with contextlib.suppress(OSError):
                    client.close()
                continue
            link = _Link(client)
            with self._cond:
                self._links.add(link)
            threading.Thread(target=self._connect_and_pump, args=(link,), daemon=True).start()

    def _connect_and_pump(self, link: _Link) -> None:
        try:
            # 1. a black hole holds new connections before they reach the target
            if not self._wait_open():
                return
            # 2. connect onwards
            try:
                up = socket.create_connection(self.target, timeout=self.connect_timeout)
            except OSError:
                return
            up.settimeout(None)
            for s in (link.client, up):
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            link.upstream = up
            if self._state is LinkState.CUT:
                return
            # 3. pump both directions; the first side to finish closes the link
            other = threading.Thread(target=self._pump, args=(up, link.client, link), daemon=True)
            other.start()
            self._pump(link.client, up, link)
            other.join()
        finally:
            link.close()
            with self._cond:
                self._links.discard(link)

    def _pump(self, src: socket.socket, dst: socket.socket, link: _Link) -> None:
        try:
            while True:
                data = src.recv(_CHUNK)
                if not data:
                    break
                if not self._wait_open():
                    break
                dst.sendall(data)
                with self._count_lock:
                    self.bytes_forwarded += len(data)
        except OSError:
            pass
        finally:
            link.close()


class ProxiedBroker:
    """An :class:`EmbeddedBroker` that listens on port A but advertises the proxy's port B.

    Every client, whatever address it bootstraps from, then talks to the broker through ``proxy``.
    ``bootstrap`` is the proxy's address. Start with :meth:`start` (or ``with``), stop with :meth:`stop`.
    """

    def __init__(self, listen_port: int | None = None, advertised_port: int | None = None) -> None:
        self.broker = EmbeddedBroker(listen_port or free_port(),
                                     advertised_port=advertised_port or free_port())
        self.proxy = TcpProxy(self.broker.advertised_port, ("127.0.0.1", self.broker.port))

    @property
    def bootstrap(self) -> str:
        return self.proxy.address

    @property
    def direct_bootstrap(self) -> str:
        """The broker's own listener (metadata still sends clients to the proxy)."""
        return f"127.0.0.1:{self.broker.port}"

    def create_topic(
        self, name: str, partitions: int = 1, config: dict[str, str] | None = None, timeout: float = 10.0
    ) -> None:
        """Create a topic and wait until its metadata shows every partition (through the proxy's broker)."""
        self.broker.create_topic(name, partitions, config, timeout)

    def start(self, timeout: float = 20.0) -> ProxiedBroker:
        """1. Start the proxy (it forwards to A). 2. Start the broker on A advertising B, probed via B."""
        # 1.
        self.proxy.start()
        # 2.
        try:
            self.broker.start(timeout)
        except BaseException:
            self.proxy.stop()
            raise
        return self

    def stop(self) -> None:
        self.broker.stop()
        self.proxy.stop()

    def __enter__(self) -> ProxiedBroker:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def start_broker_behind_proxy(timeout: float = 20.0) -> ProxiedBroker:
    """Start a broker whose every client connection passes through a :class:`TcpProxy` (see module doc)."""
    return ProxiedBroker().start(timeout)
