"""The ``SPECTRACE_METRICS_PORT`` endpoint: ``/metrics`` served by a fixed pool of threads.

``prometheus_client.start_http_server`` starts a thread per connection and never times
one out: connections that open and send nothing pile up threads inside the server being
traced, and enough of them make a scrape fail. Here one thread waits (``selectors``) on the
listening socket and on connections that have not sent a byte yet; a connection is handed
to one of :data:`WORKERS` threads only once it has something to read. Every bound:

- at most :data:`MAX_WAITING` connections wait for their first byte; past it the oldest is
  closed, and any waits at most :data:`IDLE_S`;
- a worker reads and writes with a socket timeout of :data:`SOCKET_TIMEOUT_S`, and a
  connection it serves is shut down :data:`REQUEST_S` after it was handed over (a client
  that trickles its request a byte at a time holds one worker that long at most);
- at most :data:`MAX_QUEUED` readable connections wait for a worker; past it one is closed.

A normal scrape is served while idle connections are held: they wait in the selector, not
in a worker. Threads: 1 + :data:`WORKERS`, whatever the clients do.
"""

from __future__ import annotations

import queue
import selectors
import socket
import threading
import time
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

WORKERS = 4
MAX_WAITING = 256
MAX_QUEUED = 64
IDLE_S = 10.0
SOCKET_TIMEOUT_S = 5.0
REQUEST_S = 10.0


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        pass  # a scrape per interval is no news for the server's log


class MetricsServer:
    """``/metrics`` of ``registry`` on ``address:port`` (see the module); :meth:`close` stops it."""

    def __init__(self, port: int, address: str, registry: Any) -> None:
        from prometheus_client import make_wsgi_app

        family, _, _, _, sockaddr = socket.getaddrinfo(address, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]

        class _Server(WSGIServer):
            address_family = family
            request_queue_size = 128  # the kernel's backlog: accepted at once, then bounded here

        self._server = _Server((str(sockaddr[0]), port), _QuietHandler)
        self._server.set_app(make_wsgi_app(registry))
        self._server.socket.setblocking(False)
        self.port = int(self._server.server_address[1])
        self._queue: queue.Queue[tuple[socket.socket, Any] | None] = queue.Queue(MAX_QUEUED)
        self._closed = threading.Event()
        self._wake_r, self._wake_w = socket.socketpair()
        self.refused = 0  # connections closed for a bound (waiting too long, too many, too slow)
        self._serving: dict[socket.socket, float] = {}  # handed to a worker: when to cut it
        self._serving_lock = threading.Lock()
        self._threads = [threading.Thread(target=self._select, name="spectrace-metrics", daemon=True)]
        self._threads += [threading.Thread(target=self._work, name=f"spectrace-metrics-{i}", daemon=True) for i in range(WORKERS)]
        for thread in self._threads:
            thread.start()

    # ------------------------------------------------------------ the waiting thread
    def _select(self) -> None:
        sel = selectors.DefaultSelector()
        sel.register(self._server.socket, selectors.EVENT_READ)
        sel.register(self._wake_r, selectors.EVENT_READ)
        waiting: dict[socket.socket, tuple[float, Any]] = {}  # insertion order: the oldest first
        try:
            while not self._closed.is_set():
                for key, _ in sel.select(timeout=1.0):
                    sock = key.fileobj
                    if sock is self._wake_r:
                        continue
                    if sock is self._server.socket:
                        self._accept(sel, waiting)
                        continue
                    assert isinstance(sock, socket.socket)
                    sel.unregister(sock)
                    _, addr = waiting.pop(sock)
                    self._hand_over(sock, addr)
                now = time.monotonic()
                for sock, (since, _) in list(waiting.items()):
                    if now - since <= IDLE_S:
                        break  # the rest came later
                    self._drop(sel, waiting, sock)
                self._cut_slow(now)
        finally:
            for sock in list(waiting):
                self._drop(sel, waiting, sock)
            sel.close()

    def _accept(self, sel: selectors.BaseSelector, waiting: dict[socket.socket, tuple[float, Any]]) -> None:
        for _ in range(64):  # what is there now, not forever
            try:
                conn, addr = self._server.socket.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                return
            if len(waiting) >= MAX_WAITING:
                self._drop(sel, waiting, next(iter(waiting)))
            conn.setblocking(False)
            waiting[conn] = (time.monotonic(), addr)
            sel.register(conn, selectors.EVENT_READ)

    def _drop(self, sel: selectors.BaseSelector, waiting: dict[socket.socket, tuple[float, Any]], sock: socket.socket) -> None:
        waiting.pop(sock, None)
        try:
            sel.unregister(sock)
        except (KeyError, ValueError):
            pass
        self.refused += 1
        sock.close()

    def _hand_over(self, sock: socket.socket, addr: Any) -> None:
        sock.setblocking(True)
        sock.settimeout(SOCKET_TIMEOUT_S)
        try:
            self._queue.put_nowait((sock, addr))
        except queue.Full:
            self.refused += 1
            sock.close()

    def _cut_slow(self, now: float) -> None:
        """Shut down connections a worker has served longer than :data:`REQUEST_S` (its
        blocked read then returns: the worker is free again)."""
        with self._serving_lock:
            late = [sock for sock, end in self._serving.items() if now > end]
            for sock in late:
                del self._serving[sock]
        for sock in late:
            self.refused += 1
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    # ---------------------------------------------------------------- the workers
    def _work(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            sock, addr = item
            with self._serving_lock:
                self._serving[sock] = time.monotonic() + REQUEST_S
            try:
                self._server.finish_request(sock, addr)
            except Exception:  # a client that went away, timed out or sent garbage: its own loss
                pass
            finally:
                with self._serving_lock:
                    self._serving.pop(sock, None)
                self._server.shutdown_request(sock)

    def close(self) -> None:
        """Stop serving: the threads end, the port is released."""
        if self._closed.is_set():
            return
        self._closed.set()
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass
        for _ in range(WORKERS):
            try:
                self._queue.put(None, timeout=1.0)
            except queue.Full:
                break
        for thread in self._threads:
            thread.join(2.0)
        self._server.server_close()
        self._wake_r.close()
        self._wake_w.close()
