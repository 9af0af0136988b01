"""A TCP proxy a test can cut: the browser reaches the server through it, and the test
drops every connection (as a network failure would) and refuses new ones for a while."""

from __future__ import annotations

import contextlib
import socket
import threading

__all__ = ["CuttableProxy"]


class CuttableProxy:
    """Forward ``127.0.0.1:<port>`` to ``target_port``; :meth:`cut` drops the
    connections, :meth:`block` and :meth:`unblock` refuse or admit new ones."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()
        self._blocked = False
        self.refused = 0
        self._closed = False
        threading.Thread(target=self._accept, name="proxy-accept", daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def block(self) -> None:
        """Refuse new connections (accept and close them at once) until unblocked."""
        with self._lock:
            self._blocked = True

    def unblock(self) -> None:
        with self._lock:
            self._blocked = False

    def cut(self) -> int:
        """Drop every open connection, both ways; returns how many sockets were cut."""
        with self._lock:
            sockets, self._open = self._open, set()
        for sock in sockets:
            _drop(sock)
        return len(sockets)

    def close(self) -> None:
        self._closed = True
        self._listener.close()
        self.cut()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                blocked = self._blocked
            if blocked:
                self.refused += 1
                _drop(client)
                continue
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target_port), timeout=5)
            except OSError:
                _drop(client)
                continue
            upstream.settimeout(None)
            with self._lock:
                self._open.update((client, upstream))
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(source, sink), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            with self._lock:
                self._open.discard(source)
                self._open.discard(sink)
            _drop(source)
            _drop(sink)


def _drop(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(OSError):
        sock.close()
