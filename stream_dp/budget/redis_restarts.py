"""Notice a Redis server restarted under a running worker before anything is charged or released on it.

A Redis killed and started again within a second, without its data, looks to
redis-py like a dropped connection: the next command reconnects (or is retried)
and runs on the empty server. The store markers (``stream_dp.worker.guard.store``)
are read again only every few seconds, so charges and ledger claims could land
on the empty store in between: every unit's budget given back, a window's
stored noise forgotten.

So every new connection asks the server its ``run_id`` (``INFO server``; a
restart always changes it) and compares it with the one accepted for that
address. A different one fails the connection -- the command that opened it
fails closed, its window is held -- and tells the listeners (the store guard,
which then charges and releases nothing until it has read the markers again).
Connections to that server keep failing until the guard, having found the
markers intact, ``accept``s it. The markers themselves are read on a client
without this check. A new address (a replica promoted by a failover) is
recorded as it is first seen: a failover is not a restart.

On a Redis Cluster redis-py builds each node's client itself and takes no
connection class: there a master back empty is caught by the markers'
periodic check alone (``stream_dp.worker.guard.store``, every few seconds).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

import redis

log = logging.getLogger(__name__)


class ServerRestarted(redis.ConnectionError):
    """The Redis at an address is another server process than the one the store was verified on."""


def _run_id(connection: Any) -> str | None:
    """The server's run id, or None when it will not say (an ACL without ``INFO``: no check possible)."""
    try:
        connection.send_command("INFO", "server")
        reply = connection.read_response()
    except redis.ResponseError:
        return None
    text = reply.decode() if isinstance(reply, bytes) else str(reply)
    for line in text.splitlines():
        if line.startswith("run_id:"):
            return line.split(":", 1)[1].strip()
    return None


class ServerWatch:
    """The accepted server (run id) per address, shared by every client of one worker."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._accepted: dict[str, str] = {}
        self._pending: dict[str, str] = {}
        self._listeners: list[Callable[[], None]] = []

    def listen(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` (from the connecting thread) whenever a restarted server is found."""
        self._listeners.append(callback)

    def accept(self) -> None:
        """The store was verified on the servers answering now: their connections may go on."""
        with self._lock:
            self._accepted.update(self._pending)
            self._pending.clear()

    def check(self, connection: Any) -> None:
        """Raise ``ServerRestarted`` if ``connection`` reached another server than the accepted one."""
        run_id = _run_id(connection)
        if run_id is None:
            return
        address = f"{getattr(connection, 'host', '?')}:{getattr(connection, 'port', '?')}"
        with self._lock:
            if self._accepted.setdefault(address, run_id) == run_id:
                return
            first = self._pending.get(address) != run_id
            self._pending[address] = run_id
        if first:
            log.warning("the Redis at %s restarted (run id %s, was %s): nothing is charged or released on it "
                        "until the store markers are read again", address, run_id, self._accepted.get(address))
        for callback in self._listeners:
            callback()
        raise ServerRestarted(f"the Redis at {address} restarted; it is checked for lost data before it is used")

    def client_options(self, url: str) -> dict[str, Any]:
        """Options of ``redis_url.client_from_url`` that make its client checked: none for a cluster URL."""
        from stream_dp.budget.redis_url import is_cluster_url

        return {} if is_cluster_url(url) else {"connection_class": self.connection_class(url)}

    def connection_class(self, url: str) -> type:
        """A redis-py connection class for ``url`` (one Redis) that runs ``check`` on every new connection."""
        base: type = redis.SSLConnection if url.startswith("rediss://") else redis.Connection
        watch = self

        class WatchedConnection(base):  # type: ignore[misc, valid-type]
            def on_connect_check_health(self, *args: Any, **kwargs: Any) -> None:
                super().on_connect_check_health(*args, **kwargs)
                watch.check(self)

        return WatchedConnection
