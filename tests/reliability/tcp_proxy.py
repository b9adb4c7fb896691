"""A plain TCP relay that can black-hole its traffic: a network partition between a worker and a broker.

Unlike ``redis_proxy`` it understands nothing of what it relays. While
partitioned, every byte either way is held back (not refused, not reset):
what a network that drops packets looks like to both ends, until TCP gives
up or the link heals and the held bytes go through.
"""

from __future__ import annotations

import socket
import threading


class PartitionProxy:
    """Listens on its own loopback port and relays to ``127.0.0.1:upstream_port``."""

    def __init__(self, upstream_port: int, port: int = 0) -> None:
        self.upstream_port = upstream_port
        self._listener = socket.socket()
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", port))
        self._listener.listen(128)
        self.port = self._listener.getsockname()[1]
        self._healed = threading.Event()
        self._healed.set()
        self._closed = False
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def partitioned(self) -> bool:
        return not self._healed.is_set()

    def partition(self) -> None:
        self._healed.clear()

    def heal(self) -> None:
        self._healed.set()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._connect, args=(client,), daemon=True).start()

    def _connect(self, client: socket.socket) -> None:
        self._wait_healed()  # a connection opened across the partition hangs, it is not refused
        try:
            upstream = socket.create_connection(("127.0.0.1", self.upstream_port), timeout=5)
            upstream.settimeout(None)
        except OSError:
            client.close()
            return
        with self._lock:
            self._sockets += [client, upstream]
        for source, target in ((client, upstream), (upstream, client)):
            threading.Thread(target=self._pipe, args=(source, target), daemon=True).start()

    def _wait_healed(self) -> None:
        while not self._healed.wait(0.5):
            if self._closed:
                return

    def _pipe(self, source: socket.socket, target: socket.socket) -> None:
        try:
            while True:
                data = source.recv(65536)
                if not data:
                    break
                self._wait_healed()
                target.sendall(data)
        except OSError:
            pass
        self._wait_healed()  # a close does not cross a partition either
        for sock in (source, target):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def close(self) -> None:
        self._closed = True
        self._healed.set()
        self._listener.close()
        with self._lock:
            sockets, self._sockets = self._sockets, []
        for sock in sockets:
            try:
                sock.close()
            except OSError:
                pass
