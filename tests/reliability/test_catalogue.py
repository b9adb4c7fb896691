"""The CI subset of fault runs injects every kind of fault the full suite does."""

from __future__ import annotations

from tests.reliability.catalogue import _kinds, ci_catalogue, full_catalogue
from tests.reliability.faults import EveryStage, KillAtStep, KillDuringIngest, Together


def _leaves(fault) -> set[str]:
    if isinstance(fault, Together):
        return set().union(*(_leaves(part) for part in fault.parts))
    if isinstance(fault, EveryStage):  # the six worker kills, one after the other
        return {KillDuringIngest.__name__, KillAtStep.__name__}
    return {type(fault).__name__}


def test_ci_subset_covers_every_kind():
    every = set().union(*(_leaves(run.fault) for run in _kinds()))
    in_ci = set().union(*(_leaves(run.fault) for run in ci_catalogue()))
    assert every - in_ci == set(), "fault kinds the CI subset never injects"
    assert any(run.partitions >= 12 and run.workers >= 3 for run in ci_catalogue())
    assert {run.redis_fsync for run in _kinds()} <= {run.redis_fsync for run in ci_catalogue()}


def test_the_full_suite_has_at_least_fifty_seeded_runs_of_every_kind():
    runs = full_catalogue()
    assert len(runs) >= 50
    assert len({(run.kind, run.seed) for run in runs}) == len(runs), "a (kind, seed) pair repeats"
    assert {run.kind for run in _kinds()} == {run.kind for run in runs}
