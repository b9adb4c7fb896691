"""The exporter's loop: read the output topics, keep each query's newest window, serve ``/metrics``."""

from __future__ import annotations

import logging
import signal
import threading
import time
from typing import Any

from prometheus_client import CollectorRegistry, make_wsgi_app

from stream_dp.config import PipelineConfig, Settings
from stream_dp.export.collector import ExportMetrics
from stream_dp.export.latest import LatestReleases, QueryBounds
from stream_dp.export.reader import OutputReader
from stream_dp.metrics.http import serve_app

log = logging.getLogger(__name__)


def latest_releases(config: PipelineConfig, max_groups: int) -> LatestReleases:
    """Bounds of every query of the file: its public list, or ``max_groups`` selected groups."""
    return LatestReleases({query.name: QueryBounds.of(query, max_groups) for query in config.queries})


def _window_start(record: Any) -> int:
    try:
        return int(record["window"]["start_ms"])
    except (KeyError, TypeError, ValueError):
        return 0


def run_exporter(config: PipelineConfig, settings: Settings, *, host: str, port: int, max_groups: int,
                 lookback: int, registry: CollectorRegistry | None = None,
                 stop: threading.Event | None = None) -> int:
    """Serve the latest releases of ``config``'s queries on ``host:port`` until ``stop`` is set (or SIGTERM)."""
    registry = registry if registry is not None else CollectorRegistry()
    latest = latest_releases(config, max_groups)
    metrics = ExportMetrics(registry, latest)
    stop = stop if stop is not None else threading.Event()
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
    topics = sorted({query.output_topic for query in config.queries})
    reader = OutputReader(settings.kafka_client_options(), topics, lookback=lookback)
    server, _thread = serve_app(port, host, make_wsgi_app(registry))
    log.info("serving the latest releases of %d queries (topics %s) on http://%s:%d/metrics",
             len(config.queries), ", ".join(topics), host, server.server_port)

    def take(records: list[Any]) -> None:
        # oldest window first: a batch spanning two windows ends on the newer one
        for outcome, count in latest.add_all(sorted(records, key=_window_start)).items():
            metrics.records.labels(outcome).inc(count)
        metrics.last_read.set(time.time())

    try:
        while not stop.is_set():
            reader.poll(take)
    finally:
        server.shutdown()
        reader.close()
    return 0
