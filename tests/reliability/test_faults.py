"""A short subset of the seeded fault runs (the full set: ``tests/reliability/run_faults.py``).

Each run streams live events through two workers, injects one fault, and
checks every invariant of ``checks`` against the ground truth: no violation
of any kind is allowed. (``test_fault_replays`` replays single failure
modes one step at a time.)
"""

from __future__ import annotations

import pytest

from tests.reliability.faults import AddWorker, KillAtStep, RedisOutage
from tests.reliability.harness import FaultRun, RunResult
from tests.reliability.report import describe

pytestmark = [pytest.mark.slow, pytest.mark.services]


def _run(fault, seed: int, tmp_path, kafka_bootstrap: str) -> RunResult:
    result = FaultRun(fault, seed, tmp_path, bootstrap=kafka_bootstrap, completion_timeout_s=90).run()
    assert result.error is None, describe(result)
    assert result.report.stats.get("windows released", 0) >= 6, describe(result)
    return result


@pytest.mark.parametrize(
    ("fault", "seed"),
    [
        (KillAtStep("charge", forward=True), 202),
        (KillAtStep("claim", forward=True, name="kill -9 between ledger write and publish"), 302),
        (AddWorker(), 601),
    ],
    ids=["kill-after-charge", "kill-between-ledger-and-publish", "worker-added"],
)
def test_fault_run_keeps_every_invariant(fault, seed, tmp_path, kafka_bootstrap):
    result = _run(fault, seed, tmp_path, kafka_bootstrap)
    if isinstance(fault, KillAtStep):
        assert result.facts.get("frozen_kills") == 1, describe(result)  # the fault point was really reached
    assert not result.report.violations, describe(result)
    assert not result.unexpected_exits, describe(result)


def test_redis_outage_fails_closed_and_resumes(tmp_path, kafka_bootstrap):
    result = _run(RedisOutage(crash=True), 401, tmp_path, kafka_bootstrap)
    assert result.facts.get("failed_closed", 0) > 0, describe(result)  # charges were refused while Redis was down
    # Nothing released uncharged or twice, nobody over a limit, every window released once Redis was back.
    assert not result.report.violations, describe(result)
    assert not result.unexpected_exits, describe(result)
