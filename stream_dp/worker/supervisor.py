"""``stream-dp run --processes N``: N worker processes in one consumer group, one endpoint for all.

One Python process uses about one core for decoding and windowing; N
processes on one host share the group's partitions like N hosts would. Each
child is a whole worker (``stream-dp run``) on a private loopback metrics
port; the supervisor serves ``/metrics`` (every child's series with a
``process`` label), ``/healthz`` (every child alive and live) and ``/readyz``
(every child ready) on the configured port.

Fail fast: when a child exits, the others are stopped and the supervisor
exits with the child's code, so that whatever restarts the supervisor
(systemd, Kubernetes) restarts the set; a half-sized set would quietly carry
double load. SIGTERM and SIGINT are passed on; children that do not stop
within ``stop_timeout_s`` are killed.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any
from wsgiref.simple_server import WSGIServer

from stream_dp.metrics.merge import merge_expositions

log = logging.getLogger(__name__)

SCRAPE_TIMEOUT_S = 3.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Child:
    index: int
    port: int
    process: subprocess.Popen

    def get(self, path: str) -> tuple[int, bytes]:
        """(status, body) of one of the child's endpoints; status 0 when it does not answer."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=SCRAPE_TIMEOUT_S) as response:
                return response.status, response.read()
        except urllib.error.HTTPError as error:
            return error.code, error.read()
        except OSError as error:
            return 0, str(error).encode()


def make_app(children: Callable[[], list[Child]]) -> Callable[..., Iterable[bytes]]:
    """The supervisor's endpoint, answered from the children's."""

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        current = children()
        if path in ("/healthz", "/readyz"):
            lines, ok = [], True
            for child in current:
                alive = child.process.poll() is None
                status, body = child.get(path) if alive else (0, b"exited")
                ok = ok and alive and status == 200
                lines.append(f"process {child.index}: {body.decode(errors='replace').strip() or status}")
            start_response("200 OK" if ok and current else "503 Service Unavailable",
                           [("Content-Type", "text/plain; charset=utf-8")])
            return [("\n".join(lines) or "no worker processes").encode() + b"\n"]
        pages = {}
        for child in current:
            status, body = child.get("/metrics")
            if status == 200:  # a child that does not answer is missing from the page (and not ready)
                pages[str(child.index)] = body.decode()
        start_response("200 OK", [("Content-Type", "text/plain; version=0.0.4; charset=utf-8")])
        return [merge_expositions(pages)]

    return app


def supervise(
    argv: list[str],
    processes: int,
    *,
    host: str,
    port: int,
    env: dict[str, str] | None = None,
    stop_timeout_s: float = 60.0,
) -> int:
    """Run ``processes`` children of ``stream-dp run argv`` until one exits or a signal arrives."""
    if processes < 1:
        raise ValueError(f"--processes must be at least 1, got {processes}")
    from stream_dp.metrics.http import serve_app

    base_env = dict(os.environ if env is None else env)
    children: list[Child] = []
    for index in range(processes):
        child_port = _free_port()
        child_env = {**base_env, "STREAM_DP_METRICS_HOST": "127.0.0.1", "STREAM_DP_METRICS_PORT": str(child_port)}
        process = subprocess.Popen([sys.executable, "-m", "stream_dp.cli.main", "run", *argv], env=child_env)
        children.append(Child(index, child_port, process))
    log.info("started %d worker processes: pids %s", processes, [c.process.pid for c in children])
    server: WSGIServer = serve_app(port, host, make_app(lambda: children))[0]
    stopping = threading.Event()

    def on_signal(signum: int, _frame: Any) -> None:
        stopping.set()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        code = 0
        while not stopping.is_set():
            exited = [c for c in children if c.process.poll() is not None]
            if exited:
                code = exited[0].process.returncode or 1
                log.error("worker process %d exited with %s; stopping the others", exited[0].index,
                          exited[0].process.returncode)
                break
            stopping.wait(0.5)
        _stop(children, stop_timeout_s)
        return code
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        server.shutdown()
        server.server_close()


def _stop(children: list[Child], timeout_s: float) -> None:
    for child in children:
        if child.process.poll() is None:
            child.process.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    for child in children:
        try:
            child.process.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            log.error("worker process %d did not stop within %.0f s; killing it", child.index, timeout_s)
            child.process.kill()
            child.process.wait()
