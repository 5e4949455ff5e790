"""A loopback TCP proxy that a test can cut, stall and restore: a real network fault
between the platform and the Ray dashboard (connections reset and new ones refused, or
connections accepted and never answered), not a mock. In front of an S3 server it can
also refuse one kind of request, as S3 does for a role without that permission."""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
import time


class TcpProxy:
    """Forwards ``127.0.0.1:{port}`` to ``target``; ``cut()`` resets every connection and
    resets new ones as they arrive until ``restore()``; ``stall()`` keeps every connection
    open, old and new, and forwards nothing either way until ``restore()`` (a dashboard
    that accepts and never answers). ``latency``: seconds each chunk the client sends
    waits before it is forwarded (a request to a server far away, say an object store's
    first-byte time). ``deny(method)``: HTTP requests with that method get S3's 403
    AccessDenied, and never reach the server, until ``restore()``."""

    def __init__(self, target_host: str, target_port: int, latency: float = 0.0) -> None:
        self.target = (target_host, target_port)
        self.latency = latency
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(64)
        self.port = int(self._listener.getsockname()[1])
        self._cut = threading.Event()
        self._stalled = threading.Event()
        self._closed = threading.Event()
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()
        self.refused = 0  # connections reset while cut
        self._denied: set[bytes] = set()
        self.denied = 0  # requests answered 403 by deny()
        threading.Thread(target=self._accept_loop, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @staticmethod
    def _reset(sock: socket.socket) -> None:
        with contextlib.suppress(OSError):
            # linger 0: close sends RST, so the peer sees "connection reset"
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        with contextlib.suppress(OSError):
            sock.close()

    def _accept_loop(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            if self._cut.is_set():
                self.refused += 1
                self._reset(client)
                continue
            try:
                upstream = socket.create_connection(self.target, timeout=5)
                upstream.settimeout(None)
            except OSError:
                self._reset(client)
                continue
            with self._lock:
                self._open.update({client, upstream})
            for a, b in ((client, upstream), (upstream, client)):
                delay = self.latency if a is client else 0.0
                threading.Thread(
                    target=self._pump, args=(a, b, delay, a is client), daemon=True
                ).start()

    def _pump(
        self, src: socket.socket, dst: socket.socket, delay: float = 0.0, requests: bool = False
    ) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                if requests and data.split(b" ", 1)[0] in self._denied:
                    self._deny(src, dst)  # a client sends a request's head in one write
                    return
                if delay:
                    time.sleep(delay)
                while self._stalled.is_set() and not self._closed.is_set():
                    time.sleep(0.05)  # held, not dropped: delivered after restore()
                dst.sendall(data)
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                dst.shutdown(socket.SHUT_WR)

    def _deny(self, client: socket.socket, upstream: socket.socket) -> None:
        body = (
            b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>AccessDenied</Code>'
            b"<Message>Access Denied</Message></Error>"
        )
        head = (
            "HTTP/1.1 403 Forbidden\r\nContent-Type: application/xml\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
        )
        self.denied += 1
        with contextlib.suppress(OSError):
            client.sendall(head.encode() + body)
        for sock in (client, upstream):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                sock.close()

    def deny(self, method: str) -> None:
        """Answer every request with HTTP ``method`` (``DELETE``, say) S3's 403
        AccessDenied, on open and new connections alike, until ``restore``."""
        self._denied.add(method.encode())

    def cut(self) -> None:
        """Reset every open connection; reset new ones until ``restore``."""
        self._cut.set()
        with self._lock:
            socks, self._open = list(self._open), set()
        for s in socks:
            self._reset(s)

    def stall(self) -> None:
        """Forward nothing, on open and new connections alike, until ``restore``."""
        self._stalled.set()

    def restore(self) -> None:
        self._cut.clear()
        self._stalled.clear()
        self._denied.clear()

    def close(self) -> None:
        self._closed.set()
        self.cut()
        with contextlib.suppress(OSError):
            self._listener.close()
