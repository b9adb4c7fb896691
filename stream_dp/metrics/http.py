"""The worker's HTTP endpoint: ``/metrics`` for Prometheus, ``/healthz`` and ``/readyz`` for orchestrators.

One port for all three, so one container port and one firewall rule serve
both the scraper and the kubelet's probes. Like ``/metrics``, the health
answers carry no user data: only the state of the worker's own connections.
"""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Callable, Iterable
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app

from stream_dp.metrics.health import Health, Verdict

log = logging.getLogger(__name__)


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A scraper or probe that gave up on a busy worker resets its connection: a debug line, not
        socketserver's traceback on stderr (the worker's log, where a traceback means a worker fault).
        Anything else is logged with its traceback."""
        error = sys.exc_info()[1]
        if isinstance(error, ConnectionError):
            log.debug("client %s closed the connection before its answer (%r)", client_address, error)
            return
        log.error("request from %s failed", client_address, exc_info=True)


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        """Probes every few seconds would flood the worker's log."""


def make_app(registry: CollectorRegistry, health: Health) -> Callable[..., Iterable[bytes]]:
    metrics = make_wsgi_app(registry)
    checks: dict[str, Callable[[], Verdict]] = {"/healthz": health.liveness, "/readyz": health.readiness}

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        check = checks.get(environ.get("PATH_INFO", ""))
        if check is None:
            return metrics(environ, start_response)
        verdict = check()
        status = "200 OK" if verdict.ok else "503 Service Unavailable"
        start_response(status, [("Content-Type", "text/plain; charset=utf-8")])
        return [(verdict.detail + "\n").encode()]

    return app


def serve(port: int, host: str, registry: CollectorRegistry, health: Health) -> tuple[WSGIServer, threading.Thread]:
    """Serve the three endpoints from a daemon thread; call ``server.shutdown()`` to stop."""
    return serve_app(port, host, make_app(registry, health))


def serve_app(port: int, host: str, app: Callable[..., Iterable[bytes]]) -> tuple[WSGIServer, threading.Thread]:
    """Serve a WSGI ``app`` from a daemon thread, one thread per request."""
    server = make_server(host, port, app, _Server, handler_class=_QuietHandler)
    thread = threading.Thread(target=server.serve_forever, name="metrics-http", daemon=True)
    thread.start()
    return server, thread
