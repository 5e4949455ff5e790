"""A loopback TCP proxy that a test can cut, stall and restore: a real network fault
between the platform and the Ray dashboard (connections reset and new ones refused, or
connections accepted and never answered), not a mock. In front of an S3 server it can
also refuse one kind of request, as S3 does for a role without that permission, or let
a kind of request through and lose its answer (the write lands, the client never hears)."""

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
    AccessDenied, and never reach the server, until ``restore()``. ``lose_answers(method)``:
    requests with that method reach the server, which does what they ask, and the
    connection is reset instead of the answer reaching the client."""

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
        self._losing: dict[bytes, int | None] = {}
        self.lost = 0  # answers lost by lose_answers()
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
            lose = threading.Event()  # this connection's next answer is to be lost
            for a, b in ((client, upstream), (upstream, client)):
                delay = self.latency if a is client else 0.0
                threading.Thread(
                    target=self._pump, args=(a, b, delay, a is client, lose), daemon=True
                ).start()

    def _pump(
        self,
        src: socket.socket,
        dst: socket.socket,
        delay: float = 0.0,
        requests: bool = False,
        lose: threading.Event | None = None,
    ) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                if requests and data.split(b" ", 1)[0] in self._denied:
                    self._deny(src, dst)  # a client sends a request's head in one write
                    return
                if requests and lose is not None and self._take_loss(data.split(b" ", 1)[0]):
                    lose.set()
                if not requests and lose is not None and lose.is_set():
                    # An interim "100 Continue" (send the body) is not the answer; the
                    # answer may follow it in the same chunk.
                    while data.startswith(b"HTTP/1.1 100 ") and b"\r\n\r\n" in data:
                        interim, data = data.split(b"\r\n\r\n", 1)
                        dst.sendall(interim + b"\r\n\r\n")
                    if not data:
                        continue
                    with self._lock:  # the request was done; its answer never arrives
                        self.lost += 1
                    for sock in (dst, src):  # shut down first: wakes the other pump's recv
                        with contextlib.suppress(OSError):
                            sock.shutdown(socket.SHUT_RDWR)
                        self._reset(sock)
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

    def _take_loss(self, method: bytes) -> bool:
        with self._lock:
            if method not in self._losing:
                return False
            left = self._losing[method]
            if left is not None:
                if left <= 1:
                    del self._losing[method]
                else:
                    self._losing[method] = left - 1
            return True

    def lose_answers(self, method: str, count: int | None = None) -> None:
        """Let requests with HTTP ``method`` through and reset the connection in place of
        the server's answer: the first ``count`` such requests (every one until
        ``restore`` when None). The server has done what they asked; the client cannot
        know (an object store's write that lands as the network fails)."""
        with self._lock:
            self._losing[method.encode()] = count

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
        with self._lock:
            self._losing.clear()

    def close(self) -> None:
        self._closed.set()
        self.cut()
        with contextlib.suppress(OSError):
            self._listener.close()
