"""A Redis that runs out of memory (``maxmemory`` reached under ``noeviction``) holds windows, never loses them.

A real worker process, real Kafka, a private Redis: window 0 is released; then Redis is made full
(``maxmemory`` 1 byte: every write is refused with OOM, reads still answer), window 1 closes and must be
held -- not released, not dropped, the worker alive, the error counted under its own kind -- and once
Redis has room again it is charged and released, once.
"""

from __future__ import annotations

import time

import pytest

from stream_dp.windows.record_clock import PRODUCER_QUORUM
from tests.reliability.topics import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.services]

UNITS = [f"m-{i:03d}" for i in range(20)]


def test_a_full_redis_holds_the_window_until_it_has_room_then_releases_it_once(scenario):
    s = scenario()
    s.start_worker()
    s.produce([s.event(u, 0) for u in UNITS] + s.closers(0))
    assert s.wait_released(0, 60), f"window 0 was never released; see {s.worker.log_path}"

    client = s.redis.client()
    client.config_set("maxmemory-policy", "noeviction")
    client.config_set("maxmemory", "1")
    s.produce([s.event(u, 1) for u in UNITS] + s.closers(1))
    assert wait_until(lambda: s.metric("stream_dp_pending_charges") >= 1, 40, 0.3), "window 1 was not held"
    assert wait_until(lambda: s.metric("stream_dp_budget_store_errors_total", kind="out_of_memory") >= 1, 20, 0.3), (
        "the out-of-memory refusals were not counted as such"
    )
    time.sleep(5)  # several retries of the charge, all refused
    assert s.worker.alive, f"the worker exited on a full Redis; see {s.worker.log_path}"
    assert s.window_start(1) not in s.releases(), "window 1 was released while its charge could not be written"
    assert "out of memory" in s.worker.log_text() and "maxmemory" in s.worker.log_text()

    client.config_set("maxmemory", "0")
    assert s.wait_released(1, 60), f"window 1 was not released once Redis had room; see {s.worker.log_path}"
    assert s.worker.alive
    records = s.releases()[s.window_start(1)]
    ids = [r["release_id"] for r in records]
    assert len(ids) == len(set(ids)) == 2, records  # one record per public page, published once
    partials = s.partials()[s.window_start(1)]
    # the units, and window 0's closers (they lie in window 1), charged and kept: nothing excluded, nothing lost
    assert partials and all((p.count.sum(), p.units_excluded) == (len(UNITS) + PRODUCER_QUORUM, 0)
                            for p in partials), (
        [(p.count.tolist(), p.units_excluded) for p in partials])
