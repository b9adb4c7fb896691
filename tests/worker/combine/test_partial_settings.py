"""Partials name the settings their units were charged under; only a worker on those settings adds them up.

The ingest stage charges each unit the loss of the settings its worker runs (epsilon, bounds, window, ...);
the release stage noises a window for the releasing worker's settings. In a rolling restart onto a changed
query the two differ: units charged at epsilon 1 would be released with the noise of epsilon 4. So every
partial carries its ingest worker's ``settings_fingerprint``, and a window whose partials carry another one
-- or none, as partials of earlier versions -- is released as if empty: noise only, its units still charged,
counted in ``stream_dp_windows_withheld_total{reason}`` and logged. Under the same settings (a restart, a
replay) nothing changes.
"""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
from aiokafka.structs import TopicPartition
from prometheus_client import CollectorRegistry

from stream_dp.config import parse_config
from stream_dp.worker.assemble.runtimes import build_runtimes
from stream_dp.worker.combine.combiner import WindowCombiner
from stream_dp.worker.ingest.partials_out import partial_message
from stream_dp.worker.partials.wire import PartialAggregate, Progress, encode_progress, partial_records
from stream_dp.worker.query.runtime import settings_fingerprint
from stream_dp.worker.release.intake import PartialsReader
from stream_dp.worker.release.stage import ReleaseStage
from stream_dp.worker.store.ledger import MemoryReleaseLedger
from tests.windows._support import NOW_MS, batch_of, event, make_engine
from tests.worker._offline_stage import offline_stage

SECRET = b"test-secret-0123456789abcdef"
MIN = 60_000
START = NOW_MS - 2 * MIN  # the window the tests fill, closed well before NOW_MS
PAGES = ["/a", "/b", "/c"]


def query(**changes: Any) -> dict[str, Any]:
    base = {
        "name": "visits", "input_topic": "in", "output_topic": "out",
        "privacy_unit": {"namespace": "users", "field": "user_id"}, "timestamp_field": "ts",
        "window": {"size": "1m"}, "group_by": ["page"], "groups": {"public": PAGES},
        "bounds": {"max_groups_per_unit": 1, "max_events_per_group": 1},
        "aggregations": {"count": {}, "sum": {"field": "value", "clip": [0, 10]}}, "epsilon": 1.0,
    }
    return {**base, **changes}


def runtime(**changes: Any) -> Any:
    config = parse_config({"namespaces": {"users": {"budgets": [{"horizon": "1d", "epsilon": 100.0, "delta": 1e-3}]}},
                           "queries": [query(**changes)]})
    (built,) = build_runtimes(config, secret=SECRET, clock_ms=lambda: 0)
    return built


def closed_partials() -> list[Any]:
    """The window at ``START`` of two input partitions, closed: 20 units, each on one page."""
    engine, clock = make_engine(partitions=(0, 1), max_groups=1, max_events=1, clip=(0.0, 10.0))
    engine.set_partition_count(2)  # partials of several partitions are added up only when placement was checked
    for p in (0, 1):
        engine.process(batch_of([event(f"u{u}", START + u, PAGES[u % 3], 2.0) for u in range(20) if u % 2 == p],
                                partition=p))
    clock.now_ms += 10**9
    return list(engine.tick())


def records_of(charged_by: Any) -> list[bytes]:
    """The partials-topic records of the window's partials as a worker on ``charged_by``'s settings writes them."""
    out = []
    for partial in closed_partials():
        totals = partial.aggregate(None, histogram=charged_by.histogram, features=charged_by.features,
                                   blocks=charged_by.blocks)
        message = partial_message(charged_by, partial, totals, input_partitions=2, units=len(partial.units),
                                  excluded=0, closed_at_ms=NOW_MS)
        out += partial_records(message, 1_000_000)
    return out


def released_by(releasing: Any, records: list[bytes]) -> Any:
    """The window at ``START`` as ``releasing``'s combiner takes it after reading ``records``."""
    reader = PartialsReader()
    for offset, value in enumerate(records):
        message = reader.read(0, offset, value)
        if message is not None:
            assert releasing.combiner.add_partial(message, now_ms=NOW_MS)
    return releasing.combiner.take(START)


TRUE_COUNTS = [7, 7, 6]  # units u0..u19 on pages u % 3


# -- (1) partials charged under other settings -------------------------------------------------------


@pytest.mark.parametrize("changes", [
    {"epsilon": 4.0},
    {"bounds": {"max_groups_per_unit": 2, "max_events_per_group": 3}},
    {"aggregations": {"count": {}, "sum": {"field": "value", "clip": [0, 100]}}},
    {"groups": {"public": ["/a", "/b", "/c", "/d"]}},
    {"continual": {"period": "8m", "max_windows_per_unit": 1}},
], ids=["epsilon-raised", "bounds-widened", "clip-widened", "group-added", "made-continual"])
def test_a_window_charged_under_other_settings_is_withheld_by_a_worker_on_new_settings(changes, caplog):
    old, new = runtime(), runtime(**changes)
    records = records_of(old)
    with caplog.at_level(logging.WARNING, logger="stream_dp.worker.combine.combiner"):
        window = released_by(new, records)
    assert window.withheld == "settings_differ"
    assert not window.count.any() and (window.sum is None or not window.sum.any())  # noise only
    assert window.units_charged == 20  # the units stay charged: the window says so
    (line,) = [r.getMessage() for r in caplog.records if r.name == "stream_dp.worker.combine.combiner"]
    assert settings_fingerprint(old) in line and settings_fingerprint(new) in line
    # ... and the other way round: a worker still on the old settings withholds what the new ones charged
    assert released_by(runtime(), records_of(new)).withheld == "settings_differ"


def test_partials_charged_under_the_releasing_workers_settings_are_added_up():
    window = released_by(runtime(), records_of(runtime()))  # built afresh: as after a restart
    assert window.withheld is None and window.partitions_missing == []
    assert window.count.tolist() == TRUE_COUNTS and window.sum.tolist() == [2.0 * c for c in TRUE_COUNTS]


def test_one_partial_of_other_settings_withholds_the_whole_window():
    old, new = runtime(), runtime(epsilon=4.0)
    first, second = records_of(old), records_of(new)
    assert len(first) == len(second) == 2  # one record per input partition
    window = released_by(new, [first[0], second[1]])
    assert window.withheld == "settings_differ" and not window.count.any()


def test_every_runtime_checks_its_partials_against_its_own_fingerprint():
    built = runtime()
    assert built.combiner.settings == settings_fingerprint(built)
    partial = PartialsReader().read(0, 0, records_of(built)[0])
    assert partial.settings == settings_fingerprint(built)


# -- the combiner's rule, on partials made here ------------------------------------------------------


def _partial(partition: int, settings: str | None, count: int = 1) -> PartialAggregate:
    return PartialAggregate(
        query="q", window_start_ms=0, window_end_ms=MIN, partition=partition, input_partitions=2,
        groups=[("a",)], count=np.array([count]), sum=None, distinct_units=np.array([count]),
        units_charged=count, units_excluded=0, closed_at_ms=MIN + 1, placement_partitions=2, settings=settings,
    )


def _combiner(settings: str | None) -> WindowCombiner:
    return WindowCombiner("q", window_size_ms=MIN, window_offset_ms=0, release_timeout_ms=1,
                          public_groups=None, has_sum=False, settings=settings)


@pytest.mark.parametrize(("fingerprints", "reason"), [
    (("b0b0", "b0b0"), "settings_differ"),
    (("a1a1", "b0b0"), "settings_differ"),
    ((None, None), "settings_missing"),
    (("a1a1", None), "settings_missing"),
    (("b0b0", None), "settings_differ"),
    (("a1a1", "a1a1"), None),
])
def test_partials_whose_fingerprints_are_not_the_combiners_own_are_withheld(fingerprints, reason):
    c = _combiner("a1a1")
    for partition, settings in enumerate(fingerprints):
        c.add_partial(_partial(partition, settings, count=3), now_ms=0)
    window = c.take(0)
    assert window.withheld == reason
    assert window.count.tolist() == ([] if reason else [6])


def test_a_lone_partial_without_a_fingerprint_is_withheld_too():
    """Whatever it was charged, no release can know: an earlier version's partial counts as other settings."""
    c = _combiner("a1a1")
    c.add_partial(_partial(0, None), now_ms=0)
    assert c.take(0).withheld == "settings_missing"


def test_changed_settings_are_named_before_the_conflicts_they_cause():
    """Changed settings may make partials conflict in other ways too (partition counts, bins): the reason
    given is the change of settings."""
    c = _combiner("a1a1")
    c.add_partial(_partial(0, "b0b0"), now_ms=0)
    c.add_partial(replace(_partial(1, "a1a1"), placement_partitions=3), now_ms=0)
    assert c.take(0).withheld == "settings_differ"


def test_a_combiner_without_settings_of_its_own_checks_none():
    c = _combiner(None)
    c.add_partial(_partial(0, "b0b0"), now_ms=0)
    c.add_partial(_partial(1, None), now_ms=0)
    assert c.take(0).withheld is None


# -- the release stage: metric, log, and a replay after a restart ------------------------------------


@dataclass
class _Record:
    offset: int
    value: bytes
    timestamp: int


class _Consumer:
    """What the release stage asks of its consumer here: its assignment, and commits (kept)."""

    def __init__(self) -> None:
        self.committed: dict[TopicPartition, int] = {}

    def assignment(self) -> set[TopicPartition]:
        return {TopicPartition("partials", 0)}

    async def commit(self, offsets: dict[TopicPartition, int]) -> None:
        self.committed.update(offsets)


def _ledger() -> MemoryReleaseLedger:
    """A ledger whose clock says the query first ran when the window began: the window is published."""
    return MemoryReleaseLedger(clock_ms=lambda: START)


def _stage(releasing: Any, ledger: MemoryReleaseLedger, monkeypatch: pytest.MonkeyPatch
           ) -> tuple[ReleaseStage, CollectorRegistry, list[dict]]:
    return offline_stage(releasing, monkeypatch, ledger=ledger, consumer=_Consumer(), now_ms=NOW_MS)


def _topic(records: list[bytes]) -> dict[TopicPartition, list[_Record]]:
    """The partials topic's one partition: the records, then both input partitions' progress past the window."""
    progress = [encode_progress(Progress("visits", p, 2, START + MIN)) for p in (0, 1)]
    return {TopicPartition("partials", 0): [_Record(i, v, NOW_MS - MIN) for i, v in enumerate(records + progress)]}


def _withheld(registry: CollectorRegistry, reason: str) -> float:
    return registry.get_sample_value("stream_dp_windows_withheld_total", {"query": "visits", "reason": reason}) or 0.0


def test_the_release_stage_counts_and_logs_a_window_charged_under_other_settings(monkeypatch, caplog):
    new = runtime(epsilon=4.0)
    stage, registry, published = _stage(new, _ledger(), monkeypatch)
    with caplog.at_level(logging.WARNING):
        asyncio.run(stage._step(_topic(records_of(runtime()))))
    assert _withheld(registry, "settings_differ") == 1
    assert any("released without data: settings_differ" in r.getMessage() for r in caplog.records), caplog.text
    # released as if empty: every public group, noise only, at the new settings' epsilon
    assert sorted(r["group"]["page"] for r in published) == PAGES
    assert all(r["privacy"]["epsilon"] == pytest.approx(4.0) for r in published)
    assert stage.consumer.committed == {TopicPartition("partials", 0): 4}  # its partials are committed past


def test_a_window_replayed_after_a_restart_on_the_same_settings_is_released_with_its_data(monkeypatch):
    """A worker read the window's partials and stopped before releasing it; one started afresh from the
    same query file reads them again and releases the data, not noise alone."""
    records, ledger = records_of(runtime()), _ledger()
    first, _, nothing = _stage(runtime(), ledger, monkeypatch)
    asyncio.run(first._take_record(0, 0, records[0], NOW_MS, NOW_MS - MIN))  # one partial read, then a stop
    assert nothing == [] and ledger.get("visits", START) is None
    stage, registry, published = _stage(runtime(), ledger, monkeypatch)
    asyncio.run(stage._step(_topic(records)))
    assert _withheld(registry, "settings_differ") == 0 and _withheld(registry, "settings_missing") == 0
    assert ledger.get("visits", START).published and len(published) == 3
    assert registry.get_sample_value("stream_dp_windows_released_total", {"query": "visits"}) == 1


# -- what the fingerprint covers, for every kind of query --------------------------------------------

HIERARCHY = {"group_by": ["region", "page"], "groups": {"public": [["eu", "/a"], ["eu", "/b"], ["us", "/a"]]},
             "aggregations": {"count": {}}}
LOCAL_DP = {"group_by": ["answer"], "groups": {"public": ["yes", "no"]}, "aggregations": {"count": {}},
            "local_dp": {"field": "answer", "epsilon": 1.0}}
QUANTILES = {"aggregations": {"count": {}, "quantiles": {"field": "value", "q": [0.5], "bounds": [0, 100], "bins": 16}}}
VECTOR = {"aggregations": {"count": {}, "mean_vector": {"fields": ["x", "y"], "clip_norm": 5.0}},
          "mechanism": "gaussian", "delta": 1e-7}


@pytest.mark.parametrize(("base", "changes"), [
    ({}, {"epsilon": 2.0}),
    ({}, {"mechanism": "staircase"}),
    ({"mechanism": "gaussian", "delta": 1e-7}, {"delta": 1e-6}),
    ({}, {"privacy_unit": {"namespace": "users", "field": "account"}}),
    ({}, {"bounds": {"max_groups_per_unit": 1, "max_events_per_group": 2}}),
    ({}, {"group_by": ["path"]}),
    ({}, {"groups": {"public": ["/c", "/b", "/a"]}}),
    ({}, {"groups": {"select": {"delta": 1e-6}}}),
    ({"groups": {"select": {"delta": 1e-6}}}, {"groups": {"select": {"delta": 1e-7}}}),
    ({}, {"aggregations": {"count": {}, "sum": {"field": "value", "clip": [0, 20]}}}),
    ({}, {"aggregations": {"count": {}, "sum": {"field": "other", "clip": [0, 10]}}}),
    ({}, {"aggregations": {"count": {}, "sum": {"field": "value", "clip": [0, 10]}, "top_k": {"k": 1}}}),
    ({"aggregations": {"count": {}, "top_k": {"k": 1}}}, {"aggregations": {"count": {}, "top_k": {"k": 2}}}),
    (QUANTILES, {"aggregations": {"count": {}, "quantiles": {"field": "value", "q": [0.5], "bounds": [0, 100],
                                                             "bins": 32}}}),
    (QUANTILES, {"aggregations": {"count": {}, "quantiles": {"field": "value", "q": [0.9], "bounds": [0, 100],
                                                             "bins": 16}}}),
    (QUANTILES, {"aggregations": {"count": {}, "quantiles": {"field": "value", "q": [0.5], "bounds": [0, 100],
                                                             "bins": 16, "value_interval": True}}}),
    (VECTOR, {"aggregations": {"count": {}, "mean_vector": {"fields": ["x", "z"], "clip_norm": 5.0}}}),
    (VECTOR, {"aggregations": {"count": {}, "mean_vector": {"fields": ["x", "y"], "clip_norm": 6.0}}}),
    ({}, {"window": {"size": "2m"}}),
    ({}, {"window": {"size": "1m", "offset": "30s"}}),
    (HIERARCHY, {"hierarchy": True}),
    ({**HIERARCHY, "hierarchy": True}, {"hierarchy": {"split": [1, 3]}}),
    (LOCAL_DP, {"local_dp": {"field": "answer", "epsilon": 2.0}, "epsilon": 2.0}),
    (LOCAL_DP, {"local_dp": {"field": "answer", "epsilon": 1.0, "mechanism": "oue"}}),
    ({}, {"continual": {"period": "8m"}}),
    ({"continual": {"period": "8m"}}, {"continual": {"period": "8m", "max_windows_per_unit": 2}}),
])
def test_every_setting_of_the_charge_and_the_noise_is_in_the_fingerprint(base, changes):
    assert settings_fingerprint(runtime(**{**base, **changes})) != settings_fingerprint(runtime(**base))


@pytest.mark.parametrize(("base", "same"), [
    ({}, {"output_topic": "elsewhere", "release_timeout": "2m", "timestamp_format": "epoch_ms"}),
    ({}, {"window": {"size": "1m", "idle_timeout": "1m", "allowed_lateness": "5s"}}),
    ({}, {"mechanism": "geometric"}),  # read as laplace
    ({**HIERARCHY, "hierarchy": True}, {"hierarchy": {"split": [1, 1]}}),  # the same split of the budget
])
def test_settings_apart_from_the_charge_and_the_noise_leave_the_fingerprint(base, same):
    assert settings_fingerprint(runtime(**{**base, **same})) == settings_fingerprint(runtime(**base))


def test_continual_queries_keep_the_fingerprints_their_stored_periods_are_keyed_by():
    """Pinned: stored periods, charges and trees are keyed by these values, and another value would charge
    every unit of a running period again."""
    from tests.worker.release.test_continual_settings import runtime as continual_runtime

    assert settings_fingerprint(continual_runtime()) == "cfbddac1b92b4832"
    assert settings_fingerprint(continual_runtime(epsilon=5.0)) == "5150007720abc2fc"
    assert settings_fingerprint(continual_runtime(window={"size": "2m"})) == "37ac98cb2e80246b"


def test_quantiles_queries_without_value_intervals_keep_the_fingerprint_they_had_before_the_option():
    """Pinned: partials in flight when a worker is upgraded carry the old fingerprint, and a window whose
    partials name another one is withheld. ``value_interval: false`` is left out of the settings."""
    assert settings_fingerprint(runtime(**QUANTILES)) == "c88589010900b213"


def test_every_process_computes_the_same_fingerprint_whatever_its_hash_seed(tmp_path):
    """Ingest and release run in different processes: nothing may rest on set or dict order."""
    kinds = {"plain": {}, "selected": {"groups": {"select": {"delta": 1e-6}}}, "local": LOCAL_DP,
             "hierarchy": {**HIERARCHY, "hierarchy": True}, "quantiles": QUANTILES}
    here = {name: settings_fingerprint(runtime(**changes)) for name, changes in kinds.items()}
    assert len(set(here.values())) == len(kinds)
    script = ("import sys, json; sys.path.insert(0, sys.argv[1]); "
              "from tests.worker.combine.test_partial_settings import runtime, settings_fingerprint; "
              "kinds = json.loads(sys.argv[2]); "
              "print(json.dumps({k: settings_fingerprint(runtime(**v)) for k, v in kinds.items()}))")
    for seed in ("0", "1", "12345"):
        args = [sys.executable, "-c", script, str(Path(__file__).parents[3]), orjson.dumps(kinds).decode()]
        out = subprocess.run(args, check=True, capture_output=True, text=True, cwd=tmp_path,
                             env={**os.environ, "PYTHONHASHSEED": seed})
        assert orjson.loads(out.stdout) == here
