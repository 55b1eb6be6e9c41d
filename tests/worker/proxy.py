"""A TCP proxy the tests can cut: the database "goes away" without touching the server."""

from __future__ import annotations

import contextlib
import socket
import threading


class Proxy:
    """Forward 127.0.0.1:<port> to a target; `cut()` drops every connection and refuses new
    ones until `restore()`."""

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        probe = socket.socket()
        probe.bind(("127.0.0.1", 0))
        self.port = probe.getsockname()[1]
        probe.close()
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self._listener: socket.socket | None = None

    def restore(self) -> None:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def cut(self) -> None:
        with self._lock:
            if self._listener is not None:
                with contextlib.suppress(OSError):
                    self._listener.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept()
                self._listener.close()
                self._listener = None
            for sock in self._sockets:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()
            self._sockets.clear()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._sockets += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (src, dst):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
