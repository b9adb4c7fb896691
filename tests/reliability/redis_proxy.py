"""A TCP proxy in front of Redis that freezes a worker at an exact step.

The worker talks to Redis through the proxy. A ``Trigger`` names a command
(by a predicate on its arguments) and an occurrence; at that command the
proxy either

* holds it back (``forward=False``): the step never happens, e.g. a budget
  charge that never reached Redis; or
* forwards it and then swallows everything Redis sends back
  (``forward=True``): the step happened, the worker never learns it did, e.g.
  a charge applied whose reply was lost.

Either way that connection freezes and the harness, told through
``Trigger.fired``, kills the worker there. redis-py sends a command only after
reading the previous reply on the same connection (pipelines read all their
replies before returning), so no earlier reply can be in flight on a frozen
connection.

The request parser understands RESP arrays of bulk strings, which is all
redis-py sends.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

Command = list[bytes]


class RespRequestParser:
    """Splits a client->server byte stream into complete commands (pure logic, incremental)."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[tuple[Command, bytes]]:
        """Each complete command with its exact bytes; an incomplete tail waits for more data."""
        self._buffer += data
        out: list[tuple[Command, bytes]] = []
        while True:
            parsed = self._parse_one()
            if parsed is None:
                return out
            command, length = parsed
            out.append((command, bytes(self._buffer[:length])))
            del self._buffer[:length]

    def _parse_one(self) -> tuple[Command, int] | None:
        buf = self._buffer
        if not buf:
            return None
        if buf[:1] != b"*":
            raise ValueError(f"expected a RESP array from the client, got {bytes(buf[:20])!r}")
        end = buf.find(b"\r\n")
        if end < 0:
            return None
        count = int(buf[1:end])
        position = end + 2
        args: Command = []
        for _ in range(count):
            end = buf.find(b"\r\n", position)
            if end < 0:
                return None
            if buf[position:position + 1] != b"$":
                raise ValueError(f"expected a RESP bulk string, got {bytes(buf[position:position + 20])!r}")
            size = int(buf[position + 1:end])
            start = end + 2
            if len(buf) < start + size + 2:
                return None
            args.append(bytes(buf[start:start + size]))
            position = start + size + 2
        return args, position


def is_budget_charge(command: Command) -> bool:
    """EVALSHA of the budget store's charge script: its first key is the charge record ``dp:c:...``."""
    return len(command) > 3 and command[0].upper() in (b"EVALSHA", b"EVAL") and command[3].startswith(b"dp:c:")


def is_ledger_claim(command: Command) -> bool:
    """EVALSHA of the release ledger's claim script: its key is ``stream-dp:ledger:{query}:{window}``."""
    return (
        len(command) > 3
        and command[0].upper() in (b"EVALSHA", b"EVAL")
        and command[3].startswith(b"stream-dp:ledger:")
        and b"released-through" not in command[3]
        and not command[3].startswith(b"stream-dp:ledger:store:")  # the store markers (store_guard), written once
    )


def is_mark_published(command: Command) -> bool:
    """HSET of a ledger entry's state to ``published`` (after the records went to Kafka)."""
    return len(command) >= 4 and command[0].upper() == b"HSET" and command[1].startswith(b"stream-dp:ledger:") \
        and b"published" in command[2:]


@dataclass
class Trigger:
    """Freeze at the ``occurrence``-th (1-based) command matching ``matches``.

    With ``forward`` only commands Redis executed count: a ``NOSCRIPT`` error
    reply (redis-py then loads the script and sends the command again) is
    passed through and not counted. One trigger may be armed on several
    proxies (one per worker): matches are counted over all of them and
    ``fired_by`` tells which proxy froze.
    """

    matches: Callable[[Command], bool]
    occurrence: int = 1
    forward: bool = False
    fired: threading.Event = field(default_factory=threading.Event)
    command: Command | None = None
    fired_by: int | None = None  # port of the proxy that froze
    _seen: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def count(self, command: Command, port: int) -> bool:
        """Count one match; True when it is the one to freeze at."""
        with self._lock:
            if self.fired_by is not None:
                return False
            self._seen += 1
            if self._seen < self.occurrence:
                return False
            self.command = command
            self.fired_by = port
            return True


class _Connection:
    def __init__(self, proxy: FaultProxy, client: socket.socket, upstream: socket.socket) -> None:
        self.proxy = proxy
        self.client = client
        self.upstream = upstream
        self.frozen = False  # set: nothing more is relayed in either direction
        self.parser = RespRequestParser()
        self._verdict: tuple[Trigger, Command] | None = None  # a forwarded match whose reply decides

    def start(self) -> None:
        threading.Thread(target=self._client_to_server, daemon=True).start()
        threading.Thread(target=self._server_to_client, daemon=True).start()

    def _client_to_server(self) -> None:
        try:
            while not self.frozen:
                data = self.client.recv(65536)
                if not data:
                    break
                self.proxy.wait_healed()
                for command, raw in self.parser.feed(data):
                    self.proxy.wait_if_held(command)
                    trigger = self.proxy.check(command)
                    if trigger is not None and trigger.forward:
                        self._verdict = (trigger, command)  # before forwarding: the reply may come at once
                    elif trigger is not None and trigger.count(command, self.proxy.port):
                        self.frozen = True
                        trigger.fired.set()
                        return  # never forwarded; both sockets stay open, the worker waits for a reply
                    self.upstream.sendall(raw)
        except (OSError, ValueError):
            pass
        if not self.frozen:
            self.proxy.wait_healed()  # a close does not cross a partition either
            self.close()

    def _server_to_client(self) -> None:
        try:
            while True:
                data = self.upstream.recv(65536)
                if not data or self.frozen:
                    break
                self.proxy.wait_healed()
                verdict, self._verdict = self._verdict, None
                if verdict is not None and not data.startswith(b"-NOSCRIPT"):
                    trigger, command = verdict
                    if trigger.count(command, self.proxy.port):
                        self.frozen = True  # executed by Redis; its reply is swallowed
                        trigger.fired.set()
                        return
                self.client.sendall(data)
        except OSError:
            pass
        if not self.frozen:
            self.proxy.wait_healed()
            self.close()

    def close(self) -> None:
        for sock in (self.client, self.upstream):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()


class FaultProxy:
    """Listens on its own loopback port and relays to ``127.0.0.1:upstream_port``."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self._listener = socket.socket()
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(64)
        self.port = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._trigger: Trigger | None = None
        self._connections: list[_Connection] = []
        self._closed = False
        self._hold: Callable[[Command], bool] | None = None
        self._released = threading.Event()
        self.holding = 0  # connections waiting at a held command
        self._healed = threading.Event()
        self._healed.set()
        threading.Thread(target=self._accept, daemon=True).start()

    def partition(self) -> None:
        """Black-hole the link both ways until ``heal``: nothing is relayed and nothing refused, as a network
        that drops every packet (bytes already sent wait, as TCP retransmits them, and go through on healing
        unless an end closed the connection first)."""
        self._healed.clear()

    def heal(self) -> None:
        self._healed.set()

    def wait_healed(self) -> None:
        while not self._healed.wait(0.5):
            if self._closed:
                return

    def url(self, credentials: str = "") -> str:
        return f"redis://{credentials}127.0.0.1:{self.port}/0"

    def arm(self, trigger: Trigger | None) -> Trigger | None:
        """Watch for ``trigger`` (None: disarm)."""
        with self._lock:
            self._trigger = trigger
        return trigger

    def check(self, command: Command) -> Trigger | None:
        """The armed trigger if ``command`` matches it (the connection decides when it counts)."""
        with self._lock:
            trigger = self._trigger
        if trigger is None or trigger.fired_by is not None or not trigger.matches(command):
            return None
        return trigger

    def hold(self, matches: Callable[[Command], bool]) -> None:
        """Hold every command matching ``matches`` before it reaches Redis, until ``release_holds``."""
        with self._lock:
            self._released = threading.Event()
            self._hold = matches

    def release_holds(self) -> None:
        with self._lock:
            self._hold = None
            self._released.set()

    def wait_if_held(self, command: Command) -> None:
        with self._lock:
            matches, released = self._hold, self._released
            if matches is None or not matches(command):
                return
            self.holding += 1
        released.wait()
        with self._lock:
            self.holding -= 1

    def drop_frozen(self) -> None:
        """Close the connections a trigger froze (after the worker holding them was killed)."""
        with self._lock:
            frozen = [c for c in self._connections if c.frozen]
            self._connections = [c for c in self._connections if not c.frozen]
        for connection in frozen:
            connection.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(("127.0.0.1", self.upstream_port), timeout=5)
                upstream.settimeout(None)
            except OSError:
                client.close()  # Redis is down: the worker sees a refused/closed connection
                continue
            connection = _Connection(self, client, upstream)
            with self._lock:
                self._connections = [c for c in self._connections if c.frozen or c.client.fileno() >= 0]
                self._connections.append(connection)
            connection.start()

    def close(self) -> None:
        self._closed = True
        self._healed.set()
        self.release_holds()
        self._listener.close()
        with self._lock:
            connections, self._connections = self._connections, []
        for connection in connections:
            connection.close()
