"""About 2k generated hostile messages through a real worker (``run_faults.py --fuzz 100000`` for 1e5)."""

from __future__ import annotations

import pytest

from tests.reliability.fuzz_run import run_worker_fuzz

pytestmark = [pytest.mark.slow, pytest.mark.services]


def test_worker_dead_letters_garbage_and_keeps_windows_exact(tmp_path, kafka_bootstrap):
    outcome = run_worker_fuzz(kafka_bootstrap, tmp_path, messages=2_000, seed=7)
    assert outcome.report.stats.get("hostile") == 2_000, outcome.describe()
    assert outcome.passed, outcome.describe()
