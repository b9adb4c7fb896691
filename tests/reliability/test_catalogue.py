"""The CI subset of fault runs injects every kind of fault the full suite does, judged by kind."""

from __future__ import annotations

from tests.reliability.catalogue import _kinds, ci_catalogue, full_catalogue
from tests.reliability.faults import BrokerOutage, RedisOutage, RemoveWorker
from tests.reliability.faults_cluster import LeaderKilled
from tests.reliability.harness import leaf_faults


def _kinds_of(runs) -> set[str]:
    return set().union(*(run.kinds for run in runs))


def test_ci_subset_covers_every_kind():
    missing = _kinds_of(_kinds()) - _kinds_of(ci_catalogue())
    assert missing == set(), f"fault kinds the CI subset never injects: {sorted(missing)}"
    assert any(run.partitions >= 12 and run.workers >= 3 for run in ci_catalogue())
    assert {run.redis_fsync for run in _kinds()} <= {run.redis_fsync for run in ci_catalogue()}


def test_kinds_tell_apart_what_one_fault_class_does_in_several_ways():
    """A Redis shutdown is not a Redis kill -9, nor a broker stop a broker kill, nor a plain removal one
    that rejoins, nor an input leader's kill a partials leader's: each is a kind of its own."""
    for variants in ((RedisOutage(crash=True), RedisOutage(crash=False)),
                     (BrokerOutage(crash=True), BrokerOutage(crash=False)),
                     (RemoveWorker(), RemoveWorker(rejoin=True)),
                     tuple(LeaderKilled(role) for role in ("partials", "output", "input"))):
        assert len({v.kind for v in variants}) == len(variants), variants
    every = _kinds_of(_kinds())
    for kind in ("redis shutdown", "broker stop", "leader of an input partition kill -9", "worker removed"):
        assert kind in every, kind


def test_every_fault_of_the_catalogues_names_its_kind():
    for run in ci_catalogue() + full_catalogue():
        for leaf in leaf_faults(run.fault):
            assert isinstance(leaf.kind, str) and leaf.kind, leaf


def test_the_full_suite_has_at_least_a_hundred_seeded_runs_of_every_kind():
    runs = full_catalogue()
    assert len(runs) >= 100
    assert len({(run.kind, run.seed) for run in runs}) == len(runs), "a (kind, seed) pair repeats"
    assert {run.kind for run in _kinds()} == {run.kind for run in runs}
    assert _kinds_of(runs) == _kinds_of(_kinds())
