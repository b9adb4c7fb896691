"""A release stage without Kafka: what it would publish is kept in a list, its ledger is in memory."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from prometheus_client import CollectorRegistry

from stream_dp.dp import OpenDPNoise
from stream_dp.metrics.worker import WorkerMetrics
from stream_dp.worker.release import stage as release_module
from stream_dp.worker.release.stage import ReleaseStage
from stream_dp.worker.store.ledger import MemoryReleaseLedger


def offline_stage(runtime: Any, monkeypatch: pytest.MonkeyPatch, *, ledger: MemoryReleaseLedger, consumer: Any,
                  now_ms: int) -> tuple[ReleaseStage, CollectorRegistry, list[dict]]:
    """(stage, its metrics registry, the records it published) for one query runtime."""
    published: list[dict] = []

    async def publish(producer, topic, release, **_options):  # type: ignore[no-untyped-def]
        published.extend(orjson.loads(value) for _, value in release.render())
        return release.rows, 0.0

    monkeypatch.setattr(release_module, "publish_release", publish)
    registry = CollectorRegistry()
    stage = ReleaseStage([runtime], consumer=consumer, producer=None, ledger=ledger, noise=OpenDPNoise(),
                         metrics=WorkerMetrics(registry), partials_topic="partials", release_age_limit_ms=10**12,
                         clock_ms=lambda: now_ms)
    return stage, registry, published
