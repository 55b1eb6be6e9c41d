"""A TCP proxy that cuts the client's connection right after forwarding its first COMMIT.

The server receives the COMMIT whole and commits; the client never hears back and sees its
connection drop, as when a network fails mid-COMMIT. With `refuse_after_cut`, the proxy
then accepts no new connection either: the client cannot read back what happened.
"""

from __future__ import annotations

import contextlib
import socket
import threading


class CommitCut:
    def __init__(self, target: tuple[str, int], *, refuse_after_cut: bool = False) -> None:
        self.target = target
        self.refuse_after_cut = refuse_after_cut
        self.cut = threading.Event()
        self._listener = socket.socket()
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(64)
        self.port = self._listener.getsockname()[1]
        self._upstreams: list[socket.socket] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()
        with self._lock:
            for sock in self._upstreams:
                with contextlib.suppress(OSError):
                    sock.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            if self.cut.is_set() and self.refuse_after_cut:
                client.close()
                continue
            upstream = socket.create_connection(self.target)
            with self._lock:
                self._upstreams.append(upstream)
            severed = threading.Event()  # this connection's COMMIT went out: nothing comes back
            threading.Thread(target=self._up, args=(client, upstream, severed), daemon=True).start()
            threading.Thread(
                target=self._down, args=(upstream, client, severed), daemon=True
            ).start()

    def _up(self, client: socket.socket, upstream: socket.socket, severed: threading.Event) -> None:
        try:
            while data := client.recv(65536):
                if b"COMMIT" in data and not self.cut.is_set():
                    # Severed before the COMMIT goes out: its reply, which can only come
                    # after, is never passed on, however fast the server answers.
                    severed.set()
                    self.cut.set()
                    upstream.sendall(data)
                    # The COMMIT is on its way to the server; the client's side goes dead.
                    # The upstream socket stays open, so the server finishes the COMMIT.
                    with contextlib.suppress(OSError):
                        client.shutdown(socket.SHUT_RDWR)
                    client.close()
                    return
                upstream.sendall(data)
        except OSError:
            pass
        with contextlib.suppress(OSError):
            upstream.shutdown(socket.SHUT_RDWR)

    def _down(
        self, upstream: socket.socket, client: socket.socket, severed: threading.Event
    ) -> None:
        try:
            while data := upstream.recv(65536):
                if severed.is_set():
                    break  # the reply to the COMMIT (or later): the client never hears it
                client.sendall(data)
        except OSError:
            pass
        with contextlib.suppress(OSError):
            client.shutdown(socket.SHUT_RDWR)
