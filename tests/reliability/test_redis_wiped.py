"""A Redis restarted without its data under a running worker: nothing is charged or released on it.

A real worker process, real Kafka, a private Redis behind the fault proxy. Window 0 is released; window
1's budget charge is held in the proxy while Redis is killed and started again empty (its append-only
file gone), then let go. The charge's connection is dead, so the budget store retries on a new one --
which reaches the empty server. Charged there, every unit would have its whole budget again, and the
window would be released on a store that forgot window 0's release. The worker must instead refuse the
restarted server at that connection, find the store markers missing, stop, and say why; window 1 is
never released.
"""

from __future__ import annotations

import shutil

import pytest

from tests.reliability.faults_network import STORE_LOST
from tests.reliability.redis_proxy import is_budget_charge
from tests.reliability.topics import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.services]

UNITS = [f"w-{i:03d}" for i in range(12)]


def test_a_redis_restarted_empty_between_two_charges_stops_the_worker_before_it_charges_or_releases(scenario):
    s = scenario()
    s.start_worker()
    s.produce([s.event(u, 0) for u in UNITS] + s.closers(0))
    assert s.wait_released(0, 60), f"window 0 was never released; see {s.worker.log_path}"

    s.proxy.hold(is_budget_charge)
    s.produce([s.event(u, 1) for u in UNITS] + s.closers(1))
    assert wait_until(lambda: s.proxy.holding > 0, 60, 0.1), "window 1 was never charged"
    s.redis.stop(crash=True)
    for path in s.redis.directory.iterdir():
        if path.name != "redis.log":
            shutil.rmtree(path) if path.is_dir() else path.unlink()
    s.redis.start()
    s.proxy.release_holds()

    assert wait_until(lambda: not s.worker.alive, 60, 0.3), f"the worker ran on an empty Redis; see {s.worker.log_path}"
    assert s.worker.reap() == 1
    assert STORE_LOST in s.worker.log_text()
    assert s.window_start(1) not in s.releases(), "window 1 was released on the Redis that lost window 0's release"
    assert s.redis.client().keys("dp:c:*") == [], "a charge was recorded on the empty Redis"
