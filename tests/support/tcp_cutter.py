"""A TCP forwarder on loopback whose connections a test can cut (not a test module).

``TcpCutter(target_port)`` listens on a free loopback port and forwards every
connection to ``127.0.0.1:target_port`` byte for byte (TLS passes through untouched).
:meth:`cut` closes every connection open now, as a network blip or a failover
would; new connections are forwarded as before. :meth:`hold` cuts them and closes
each new one at once until :meth:`release`: a blip as long as the test wants.
"""

from __future__ import annotations

import contextlib
import selectors
import socket
import threading

__all__ = ["TcpCutter"]


class TcpCutter:
    def __init__(self, target_port: int, host: str = "127.0.0.1"):
        self.target = (host, target_port)
        self.listener = socket.create_server((host, 0))
        self.port = self.listener.getsockname()[1]
        self.address = f"{host}:{self.port}"
        self.accepted = 0
        self._pairs: list[tuple[socket.socket, socket.socket]] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._held = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="tcp-cutter", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        sel = selectors.DefaultSelector()
        self.listener.setblocking(False)
        sel.register(self.listener, selectors.EVENT_READ, None)
        while not self._stop.is_set():
            for key, _ in sel.select(timeout=0.1):
                if key.data is None:
                    with contextlib.suppress(BlockingIOError):
                        client, _ = self.listener.accept()
                        self._open(sel, client)
                    continue
                src, dst = key.data
                try:
                    data = src.recv(65536)
                except OSError:
                    data = b""
                if data:
                    with contextlib.suppress(OSError):
                        dst.sendall(data)
                    continue
                self._close_pair(sel, src, dst)
        sel.close()

    def _open(self, sel, client: socket.socket) -> None:
        if self._held.is_set():
            client.close()
            return
        try:
            server = socket.create_connection(self.target, timeout=5)
        except OSError:
            client.close()
            return
        client.setblocking(True)
        server.setblocking(True)
        with self._lock:
            self._pairs.append((client, server))
            self.accepted += 1
        sel.register(client, selectors.EVENT_READ, (client, server))
        sel.register(server, selectors.EVENT_READ, (server, client))

    def _close_pair(self, sel, a: socket.socket, b: socket.socket) -> None:
        for s in (a, b):
            with contextlib.suppress(KeyError, ValueError, OSError):
                sel.unregister(s)
            with contextlib.suppress(OSError):
                s.close()
        with self._lock:
            self._pairs = [p for p in self._pairs if a not in p]

    def open_connections(self) -> int:
        with self._lock:
            return len(self._pairs)

    def cut(self) -> int:
        """Close every connection open now (both ends); how many were cut."""
        with self._lock:
            pairs, self._pairs = self._pairs, []
        for pair in pairs:
            for s in pair:
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
        return len(pairs)

    def hold(self) -> int:
        """Cut every connection, and close each new one at once until :meth:`release`;
        how many were cut."""
        self._held.set()
        return self.cut()

    def release(self) -> None:
        self._held.clear()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.cut()
        self.listener.close()

    def __enter__(self) -> TcpCutter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
