"""Liveness and readiness verdicts (pure), and the HTTP endpoint serving them beside /metrics."""

from __future__ import annotations

import asyncio
import urllib.error
import urllib.request

import pytest
from prometheus_client import CollectorRegistry, Counter

from stream_dp.metrics.health import Health, watch
from stream_dp.metrics.http import serve
from tests.worker._support import free_port


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_not_ready_before_the_group_assigned_partitions_then_ready():
    health = Health(clock_s=_Clock())
    assert health.liveness().ok and not health.readiness().ok
    health.beat(assigned=None, redis_error=None)
    assert "joined" in health.readiness().detail
    health.beat(assigned=0, redis_error=None)  # more workers than partitions: joined, owns nothing
    assert health.readiness().ok


def test_redis_not_answering_is_not_ready_but_still_live():
    health = Health(clock_s=_Clock())
    health.beat(assigned=3, redis_error="ConnectionError: refused")
    assert health.liveness().ok
    verdict = health.readiness()
    assert not verdict.ok and "Redis" in verdict.detail and "refused" in verdict.detail


def test_a_stalled_event_loop_is_neither_live_nor_ready():
    clock = _Clock()
    health = Health(stall_after_s=60, clock_s=clock)
    health.beat(assigned=3, redis_error=None)
    clock.now += 59
    assert health.liveness().ok and health.readiness().ok
    clock.now += 2
    assert not health.liveness().ok and not health.readiness().ok
    assert "61 s" in health.liveness().detail


def test_stall_limit_must_be_positive():
    with pytest.raises(ValueError, match="stall_after_s must be positive"):
        Health(stall_after_s=0)


def test_the_watcher_samples_redis_and_the_assignment_until_stopped():
    health = Health()
    answers = iter([ConnectionError("refused"), True])

    def ping():
        answer = next(answers, True)
        if isinstance(answer, Exception):
            raise answer
        return answer

    async def run() -> list[bool]:
        stop = asyncio.Event()
        seen = []
        task = asyncio.create_task(watch(health, stop, assigned=lambda: 2, ping_redis=ping, interval_s=0.01))
        for _ in range(200):
            await asyncio.sleep(0.01)
            seen.append(health.readiness().ok)
            if seen[-1]:
                break
        stop.set()
        await task
        return seen

    seen = asyncio.run(run())
    assert seen[-1] and not seen[0]


def _get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def test_one_port_serves_metrics_liveness_and_readiness():
    registry = CollectorRegistry()
    Counter("stream_dp_example_total", "An example.", registry=registry).inc()
    health = Health()
    port = free_port()
    server, _thread = serve(port, "127.0.0.1", registry, health)
    try:
        status, body = _get(port, "/metrics")
        assert status == 200 and "stream_dp_example_total 1.0" in body
        assert _get(port, "/healthz")[0] == 200
        status, body = _get(port, "/readyz")
        assert status == 503 and "joined" in body
        health.beat(assigned=1, redis_error=None)
        assert _get(port, "/readyz") == (200, "ok: 1 input partitions assigned\n")
    finally:
        server.shutdown()
        server.server_close()
