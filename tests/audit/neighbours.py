"""Two neighbouring streams through real worker processes: D, and D' = D plus one target unit per scenario.

Both streams hold ``windows`` one-second windows of compressed past event time
(starting ``START_AGO_S`` ago), produced at once like a backlog: every
record keyed by its unit id and stamped with its event time, as a producer
sending them live would have stamped them (on CreateTime topics, which the
queries trust: ``trust_producer_timestamps``). Background units are fresh in every
window and identical in D and D'. Each stream runs through its own deployment
of three worker processes (one consumer group, its own internal topics and
budget namespaces), which reads three input topics with one query per scenario; the
released noisy values of each window are one sample of the mechanism on D or
on D'.
"""

from __future__ import annotations

import datetime
import os
import re
import time
import uuid
from collections import defaultdict
from typing import Any
from dataclasses import dataclass, field
from pathlib import Path

import orjson
import yaml

from stream_dp.windows.record_clock import PRODUCER_QUORUM
from tests.audit.claims import claim_problems
from tests.audit.doctor import ENV as DOCTOR_ENV
from tests.audit.doctor import local_epsilon
from tests.redis_databases import delete_keys
from tests.reliability.topics import _kafka, create_topic, delete_topics
from tests.reliability.workers import WorkerProcess

GROUPS = ("a", "b", "c", "d", "e")
BACKGROUND_UNITS = 3  # fresh units per window, one event each in group "a"
BACKGROUND_VALUE = 5.0  # the value of each of their events
START_AGO_S = 30 * 60
WORKERS = 3
SECRET = "audit-secret-0123456789abcdef"
FUTURE_EVERY = 150  # windows between two of the clock attacker's future-dated events
FUTURE_AHEAD_MS = 4 * 60_000  # inside max_future_skew (5 minutes)
EXHAUSTED_AFTER = 10  # windows the exhausted target's budget covers
LOCAL_EPSILON = 1.0  # of one report, in the local_dp scenario
# Windows at the end of a clock topic segment its own records leave open: the trusted producer clock is the
# PRODUCER_QUORUM-th newest stamp of distinct units (keys), BACKGROUND_UNITS fresh units a window back, and
# lateness closes one more.
SEGMENT_OPEN = -(-PRODUCER_QUORUM // BACKGROUND_UNITS) + 3


@dataclass(frozen=True)
class Scenario:
    """One query and what the target does in D'."""

    name: str
    topic: str
    statistic: str  # "count" or "sum"
    groups: tuple[str, ...]
    settings: dict


SCENARIOS = (
    # The target sends 10 events to each of 5 groups every window: far over both bounds. The discrete
    # Laplace count's threshold test reaches most of the claim: seen 0.57 to 0.74 of 1.0.
    Scenario("over_bounds", "main", "count", GROUPS,
             {"bounds": {"max_groups_per_unit": 1, "max_events_per_group": 2}, "epsilon": 1.0}),
    # ... each with value 1e6, against a clip of [0, 10]. Count and sum spend half of epsilon each: sampled
    # as whether both are at least the target's 2 events and 20 above D's true values, the event of the
    # pair's largest likelihood ratio (as for continual); the sum alone reaches half the claim at most, and
    # a sum calibrated for half its sensitivity no more than the claim.
    Scenario("sum_clipping", "main", "count_and_sum", GROUPS,
             {"bounds": {"max_groups_per_unit": 1, "max_events_per_group": 2}, "epsilon": 1.0,
              "aggregations": {"count": {}, "sum": {"field": "value", "clip": [0, 10]}}}),
    # Gaussian noise: its epsilon at delta 1e-6 lies in tails 800 samples do not reach (seen about 0);
    # the records' rho is audited too (``stats.rho_lower_bound``), which sees noise half as large at some
    # 6,400 samples (tests/audit/test_negative_controls.py); its calibration is checked exactly in tests/dp.
    Scenario("gaussian", "main", "count", GROUPS,
             {"bounds": {"max_groups_per_unit": 1, "max_events_per_group": 2}, "epsilon": 1.0,
              "mechanism": "gaussian", "delta": 1e-6}),
    # A budget of EXHAUSTED_AFTER windows: the target is excluded from every later one.
    Scenario("exhausted_budget", "main", "count", GROUPS,
             {"bounds": {"max_groups_per_unit": 1, "max_events_per_group": 2}, "epsilon": 1.0}),
    # One event of the target on each of three partitions, read by three workers. Seen 0.70 to 0.84: the
    # two events that are not on the key's partition are rejected, the one left moves the count by 1.
    Scenario("three_partitions_three_workers", "spread", "count", ("a",),
             {"bounds": {"max_groups_per_unit": 1, "max_events_per_group": 1}, "epsilon": 1.0}),
    # Every FUTURE_EVERY windows the target sends one event dated 4 minutes ahead. Configured by the
    # discrete Laplace's other name, geometric.
    Scenario("future_timestamp", "clock", "count", ("a",),
             {"bounds": {"max_groups_per_unit": 1, "max_events_per_group": 1}, "epsilon": 1.0,
              "mechanism": "geometric"}),
)
# The query options, each audited on what it publishes: the top group's identity (1 if the group
# ranks first), a median, the coarsest level of a hierarchy, a period's running total.
SCENARIOS += (
    # On a topic where every group holds TOPK_BACKGROUND units of one event per window, the target sends
    # two events to each of groups "c" and "d", of which this query keeps one group (max_groups_per_unit 1):
    # in D each group ranks first a fifth of the time, in D' the kept one is ahead by max_events_per_group,
    # the most one unit can move a score. The exact loss of this event is ln(0.489 / 0.2) = 0.89 (in D' the
    # target's group is picked first when the ones drawn before it are all refused, each with chance
    # 1 - e^-1). Seen: 0.46 to 0.74 of a claimed 1.0, and 2.33 with the permute-and-flip scale divided by 4.
    Scenario("top_k", "topk", "top1", GROUPS,
             {"bounds": {"max_groups_per_unit": 1, "max_events_per_group": 2}, "epsilon": 1.0,
              "aggregations": {"top_k": {"k": 1}}}),
    # k = 2, keeping both of the target's groups: each is ahead by 2, and each of the two picks spends half
    # of epsilon (scale k * max_events_per_group / epsilon), so the list {c, d} has the largest likelihood
    # ratio, up to e^epsilon. Seen: 0.20 to 0.44 when sound, 1.53 with the permute-and-flip scale divided by 4 (a
    # simulation of this law over 800 windows puts the scale not multiplied by k at 0.78 to 0.99: caught
    # only by the exact law, tests/dp/test_topk.py).
    Scenario("top_k2", "topk", "top2_target", ("c",),
             {"bounds": {"max_groups_per_unit": 2, "max_events_per_group": 2}, "epsilon": 1.0,
              "groups": {"public": list(GROUPS)}, "aggregations": {"top_k": {"k": 2}}}),
    # The same target among groups partition selection releases (a private group domain): every group holds
    # TOPKSEL_BACKGROUND units per window, over the selection's threshold (13 units at epsilon 1 and delta
    # 1e-5), so most windows offer all five as candidates; epsilon 3 gives selection, count and top_k 1 each,
    # and the top_k record claims its own 1. Seen 0.41 to 0.50 when sound, 2.23 with the permute-and-flip scale divided by 4.
    Scenario("top_k_selected", "topksel", "top1", GROUPS,
             {"bounds": {"max_groups_per_unit": 1, "max_events_per_group": 2}, "epsilon": 3.0,
              "groups": {"select": {"delta": 1e-5}}, "aggregations": {"count": {}, "top_k": {"k": 1}}}),
    # On a topic where every group holds two background values at 0 in every window: the target's two
    # values clipped to 10 make the middle candidate (5) the best instead of 0 (with no other values in
    # its group, both sides would give every candidate the same score). Three candidates: each sample
    # says more. The count beside the quantile (which sizes its 95% interval) takes half of epsilon: the
    # bound is held against the quantiles' own claim (``privacy.quantiles.epsilon``, 0.5). In D every
    # candidate scores the same, so this pair's loss is about 0.3 of that 0.5, and with the scale halved
    # about 0.55: a 2x error shows only by a margin no affordable sample resolves (3,200 samples in process:
    # 0.46 and 0.52, tests/audit/test_negative_controls.py). Seen: about 0 at 800 windows, and 1.07 of a
    # claimed 1.0 with the exponential scale divided by 4.
    Scenario("quantiles", "quant", "median", GROUPS,
             {"bounds": {"max_groups_per_unit": 1, "max_events_per_group": 2}, "epsilon": 1.0,
              "aggregations": {"count": {}, "quantiles": {"field": "value", "q": [0.5], "bounds": [0, 10], "bins": 2}}}),
    # The target moves both levels (each spends its share of epsilon) by 2: sampled as how far both the
    # region's consistent count and the group's are above D's true counts (``releases._excess``), whose
    # threshold 2 is the event of the largest likelihood ratio for the two levels' noises (as for
    # continual). The target's one kept group is "a", beside the background. Consistent counts hold less than the
    # two levels' noisy counts (the region's own count is only seen mixed with its children's). Seen: 0.18
    # to 0.36 when sound; 1.11 with every level's noise calibrated to twice its share (twice the claimed loss),
    # which the sum of the two counts, audited before, did not reach (0.90); 2.32 with the noise / 4.
    Scenario("hierarchy", "main", "both_levels", GROUPS,
             {"bounds": {"max_groups_per_unit": 1, "max_events_per_group": 2}, "epsilon": 1.0,
              "group_by": ["region", "group"], "groups": {"public": [["r1", g] for g in GROUPS]},
              "hierarchy": True}),
    # Local DP protects a report's value, not whether a unit reported: the neighbours are the target
    # reporting "a" (D) or "e" (D'), randomized as the producer would (``stream-dp produce --local-dp``).
    # The release is a function of all reports' counts: the background's randomized reports hide which
    # one is the target's, so a sound run is seen at 0.07 to 0.29; producers randomizing at 4 epsilon were
    # seen at 3.06 (to doctor so now, tag the reports as the query's epsilon, as a forging producer would:
    # the worker rejects reports tagged with another).
    Scenario("local_dp", "local", "count", GROUPS,
             {"bounds": {"max_groups_per_unit": 1, "max_events_per_group": 1}, "epsilon": LOCAL_EPSILON,
              "local_dp": {"field": "group", "mechanism": "krr", "epsilon": LOCAL_EPSILON}}),
    # The same neighbours with optimized unary encoding: each report a set of values (``--local-dp`` with oue).
    # Seen about 0 when sound, 1.56 with producers randomizing at 4 epsilon.
    Scenario("local_dp_oue", "local_oue", "count", GROUPS,
             {"bounds": {"max_groups_per_unit": 1, "max_events_per_group": 1}, "epsilon": LOCAL_EPSILON,
              "local_dp": {"field": "group", "mechanism": "oue", "epsilon": LOCAL_EPSILON}}),
    # The staircase on counts: its steps make the threshold at a stair's edge the likelihood ratio's
    # largest. Seen 0.62 to 0.75 when sound, 3.02 with the noise divided by 4.
    Scenario("staircase", "main", "count", GROUPS,
             {"bounds": {"max_groups_per_unit": 1, "max_events_per_group": 2}, "epsilon": 1.0,
              "mechanism": "staircase"}),
    # The staircase on a clipped sum (values on the grid of the sum's noise, one stair wider than the clip).
    # Seen 0.64 to 0.73 when sound, 2.61 with the noise divided by 4.
    Scenario("staircase_sum", "main", "sum", GROUPS,
             {"bounds": {"max_groups_per_unit": 1, "max_events_per_group": 2}, "epsilon": 1.0,
              "mechanism": "staircase", "aggregations": {"sum": {"field": "value", "clip": [0, 10]}}}),
    # The target's value 1e6 in every group, against a clip norm of 10: the augmented sum's two coordinates
    # added up, ``sum[0] + clip_norm * units`` (each unit adds (x, C), C the clip norm): the one statistic
    # that carries the whole claim (the first coordinate alone carries half of its rho, and doubled no more
    # than the claim). Gaussian: seen about 0 when sound (as for ``gaussian``), 1.39 with the noise divided
    # by 8 (on the first coordinate); rho bound 0.034 and 0.040 of a claimed 0.024 at 6,400 samples with the
    # noise halved or the sensitivity doubled.
    Scenario("mean_vector", "main", "vector_sum", GROUPS,
             {"bounds": {"max_groups_per_unit": 1, "max_events_per_group": 2}, "epsilon": 1.0,
              "mechanism": "gaussian", "delta": 1e-6,
              "aggregations": {"mean_vector": {"fields": ["value"], "clip_norm": 10.0}}}),
    # The same target against a covariance query: its (x, C) adds x^2, x C and C^2 to the augmented matrix.
    # Audited on the sum of those three entries read back from units, mean and second moment after noise
    # and PSD projection (the corner alone, units * C^2, when fewer than one noisy unit leaves no mean).
    # Seen about 0 when sound; on the corner alone, 0.95 to 1.34 with the noise divided by 8 (not always
    # caught: see the next).
    Scenario("covariance", "main", "cov_total", GROUPS,
             {"bounds": {"max_groups_per_unit": 1, "max_events_per_group": 2}, "epsilon": 1.0,
              "mechanism": "gaussian", "delta": 1e-6,
              "aggregations": {"covariance": {"fields": ["value"], "clip_norm": 10.0}}}),
    # The same query audited on a matrix entry: the target's clipped x (10) adds x^2 = 100 to the second
    # moment S_00, released as second_moment = S_00 / units (its product with units is S_00 after the
    # projection; 0 when fewer than one noisy unit leaves no second moment). Seen about 0 when sound, 1.46
    # with the noise divided by 8 (in the same run, the units statistic above bound at 0.95: not caught).
    Scenario("covariance_entry", "main", "cov_second_moment", GROUPS,
             {"bounds": {"max_groups_per_unit": 1, "max_events_per_group": 2}, "epsilon": 1.0,
              "mechanism": "gaussian", "delta": 1e-6,
              "aggregations": {"covariance": {"fields": ["value"], "clip_norm": 10.0}}}),
    # A median per block of units: the target's 1e6 values push its block's median to the top of the
    # output range (and fill an empty block in groups b to e); outputs clipped to [0, 10]. Timeouts short
    # enough for 1 s windows: check-config bounds the file's group-by-group releases together, 5 groups x
    # (4 blocks x 30 ms here + 2 blocks x 35 ms for the median below) and the quantiles' and vectors' few
    # ms within the window; a block takes ms.
    # Seen 0.10 to 0.18 when sound, 2.97 with the noise divided by 8.
    Scenario("sample_aggregate", "main", "sa_value", GROUPS,
             {"bounds": {"max_groups_per_unit": 1, "max_events_per_group": 2}, "epsilon": 1.0,
              "aggregations": {"sample_aggregate": {"function": "statistics:median", "field": "value", "blocks": 4,
                                                    "output_range": [0, 10], "timeout": "30ms"}}}),
    # The blocks' median instead of their mean: in the target's group both blocks are empty in D (each
    # counts at the midpoint 5, in the middle of three bins: every edge scores the same), and in D' its
    # block's output is 10, in the top bin (edge 6.67 scores best: drawn 35% of the time against 25%). A
    # bound of about ln(0.355 / 0.25) = 0.35 at most, which 800 windows do not resolve: the scenario
    # catches a median drawn with far too little noise (one without any would bound at ln 4 = 1.39 or
    # more), its calibration is checked exactly in tests/dp/test_sample_aggregate.py.
    Scenario("sample_aggregate_median", "main", "sa_value", GROUPS,
             {"bounds": {"max_groups_per_unit": 1, "max_events_per_group": 2}, "epsilon": 1.0,
              "aggregations": {"sample_aggregate": {"function": "statistics:median", "field": "value", "blocks": 2,
                                                    "output_range": [0, 10], "aggregate": "median", "bins": 3,
                                                    "timeout": "35ms"}}}),
    # Periods of two windows; the target counts in its first window of each (max_windows_per_unit 1).
    # It moves both tree nodes of the period: sampled as how far both of the period's two running totals
    # are above D's true totals (``releases._excess``); both at least its 2 events above with probability
    # about 1/4 in D' and e^(-epsilon)/4 in D (each node spends half): the pair's likelihood ratio at its largest.
    # Seen 0.20 to 0.33 when sound (a 1/4 event: fewer samples where the ratio is largest), 1.07 with the
    # tree's depth ignored in the calibration.
    Scenario("continual", "main", "count", GROUPS,
             {"bounds": {"max_groups_per_unit": 1, "max_events_per_group": 2}, "epsilon": 1.0,
              "continual": {"period": "2s", "max_windows_per_unit": 1}}),
)
TOP_K_SCENARIOS = ("top_k", "top_k2", "top_k_selected")
TOPIC_PARTITIONS = {"main": 3, "spread": 3, "clock": 1, "local": 3, "local_oue": 3, "quant": 3, "topk": 3,
                    "topksel": 3}
QUANT_BACKGROUND = 2  # units per group and window on the quant topic, each with value 0
TOPK_BACKGROUND = 2  # units per group and window on the topk topic
TOPK_TARGET_GROUPS = ("c", "d")  # the target's two events in each, on the topk and topksel topics
TOPKSEL_BACKGROUND = 16  # units per group and window on the topksel topic


def _event(unit: str, ts: int, group: str, value: float) -> bytes:
    return orjson.dumps({"user_id": unit, "ts": ts, "group": group, "value": value, "region": "r1"})


def _closer_keys(partition: int, partitions: int) -> list[bytes]:
    """PRODUCER_QUORUM unit ids that the default partitioner (murmur2, as the producer's) puts on ``partition``."""
    from kafka.partitioner.default import murmur2

    keys: list[bytes] = []
    i = 0
    while len(keys) < PRODUCER_QUORUM:
        key = f"closer-{partition}-{i}".encode()
        if (murmur2(key) & 0x7FFFFFFF) % partitions == partition:
            keys.append(key)
        i += 1
    return keys


def records(topic: str, start_ms: int, windows: int, *, with_target: bool,
            doctoring: str | None = None) -> list[tuple[bytes, bytes, int, int | None]]:
    """(key, value, record timestamp, explicit partition or None) in sending order.

    The stream ends with records of PRODUCER_QUORUM units per partition dated past the
    last window's end plus lateness: their record timestamps close every
    audited window, in D as in D', without waiting for the idle rule (fewer
    would move no trusted producer clock, ``stream_dp.windows.record_clock``).
    ``doctoring``: see ``tests/audit/doctor.py`` (local-DP reports randomized
    at twice their epsilon for ``noise_half``).
    """
    out: list[tuple[bytes, bytes, int, int | None]] = []
    for w in range(windows):
        t = start_ms + w * 1000
        if topic == "quant":
            for g, group in enumerate(GROUPS):
                for i in range(QUANT_BACKGROUND):
                    unit, ts = f"bg-{w}-{group}-{i}", t + 100 + g * QUANT_BACKGROUND + i
                    out.append((unit.encode(), _event(unit, ts, group, 0.0), ts, None))
        if topic in ("topk", "topksel"):  # balanced groups, and nothing else
            for g, group in enumerate(GROUPS):
                for i in range(TOPK_BACKGROUND if topic == "topk" else TOPKSEL_BACKGROUND):
                    unit, ts = f"bg-{w}-{group}-{i}", t + 100 + g * TOPKSEL_BACKGROUND + i
                    out.append((unit.encode(), _event(unit, ts, group, 1.0), ts, None))
        for i in range(BACKGROUND_UNITS if topic not in ("topk", "topksel") else 0):
            unit = f"bg-{w}-{i}"
            out.append((unit.encode(), _event(unit, t + 100 + i, "a", BACKGROUND_VALUE), t + 100 + i, None))
        if topic in ("local", "local_oue"):
            out.append((b"target", _event("target", t + 200, "e" if with_target else "a", 1.0), t + 200, None))
        if not with_target:
            continue
        if topic in ("main", "quant"):
            for group in GROUPS:
                for e in range(10):
                    out.append((b"target", _event("target", t + 200 + e, group, 1e6), t + 200 + e, None))
        elif topic in ("topk", "topksel"):
            for g, group in enumerate(TOPK_TARGET_GROUPS):
                for e in range(2):
                    out.append((b"target", _event("target", t + 200 + 2 * g + e, group, 1.0), t + 200 + 2 * g + e, None))
        elif topic == "spread":
            for partition in range(TOPIC_PARTITIONS["spread"]):  # explicit partitions, the same key
                out.append((b"target", _event("target", t + 300, "a", 1.0), t + 300, partition))
        elif topic == "clock" and w % FUTURE_EVERY == FUTURE_EVERY - 1:
            # The last record of a segment (see ``produce``): stamped now, dated 4 minutes ahead.
            out.append((b"target", _event("target", t + FUTURE_AHEAD_MS, "a", 1.0), t + 900, None))
    closes_all = start_ms + (windows + 1) * 1000 + 600
    for partition in range(TOPIC_PARTITIONS[topic]):
        out += [(key, _event(key.decode(), closes_all, "a", 0.0), closes_all, None)
                for key in _closer_keys(partition, TOPIC_PARTITIONS[topic])]
    if topic in ("local", "local_oue"):
        return _randomized(out, "krr" if topic == "local" else "oue", local_epsilon(LOCAL_EPSILON, doctoring))
    return out


def _randomized(records_: list[tuple[bytes, bytes, int, int | None]], mechanism: str,
                epsilon: float) -> list[tuple[bytes, bytes, int, int | None]]:
    """Each event's group replaced by its randomized report (k-ary randomized response: a value; optimized
    unary encoding: the values whose bits came out 1) and tagged with the randomizer, as ``stream-dp produce
    --local-dp`` does (the worker takes no untagged report). Randomized at ``epsilon``, tagged as the
    query's randomizer (LOCAL_EPSILON), as a producer randomizing at another epsilon than it says would."""
    import numpy as np

    from stream_dp.dp.exact_sampling import UrandomBits
    from stream_dp.dp.local import REPORT_TAG_FIELD, LocalRandomizer, report_tag

    randomizer = LocalRandomizer.build(mechanism, epsilon, len(GROUPS))
    tag = report_tag(LocalRandomizer.build(mechanism, LOCAL_EPSILON, len(GROUPS)), GROUPS)  # groups.public
    events = [orjson.loads(value) for _, value, _, _ in records_]
    reports = randomizer.randomize(np.array([GROUPS.index(e["group"]) for e in events]), UrandomBits()).tolist()
    out = []
    for (key, _, stamp, partition), event, report in zip(records_, events, reports):
        event["group"] = GROUPS[report] if mechanism == "krr" else [g for g, bit in zip(GROUPS, report) if bit]
        event[REPORT_TAG_FIELD] = tag
        out.append((key, orjson.dumps(event), stamp, partition))
    return out


def _config(run: str, topics: dict[str, str], outputs: dict[str, str], start_ms: int | None = None) -> dict:
    """The deployment's query file; ``start_ms``: the backlog's first window, public queries publish from it."""
    namespaces, queries = {}, []
    for s in SCENARIOS:
        limit = float(EXHAUSTED_AFTER) if s.name == "exhausted_budget" else 4000.0
        budget = {"horizon": "1h", "epsilon": limit}
        if s.settings.get("delta") or "select" in s.settings.get("groups", {}):
            budget["delta"] = 4e-3  # room for every window's delta
        namespaces[f"{run}-{s.name}"] = {"budgets": [budget], "alert_at": [1.0]}
        query = {
            "name": f"{run}_{s.name}", "input_topic": topics[s.topic], "output_topic": outputs[s.name],
            "privacy_unit": {"namespace": f"{run}-{s.name}", "field": "user_id"},
            "timestamp_field": "ts",
            # Idle partitions follow the wall clock, 30 minutes ahead of these records: no partition may
            # go idle before its records arrive (the first worker to join owns every partition for a
            # few seconds before any is sent), nor between the clock topic's segments. Record
            # timestamps close every window (see ``records``).
            "window": {"size": "1s", "allowed_lateness": "500ms", "idle_timeout": "10m"},
            "group_by": ["group"], "groups": {"public": list(s.groups)},
            "aggregations": {"count": {}},
            "release_timeout": "300s",  # a busy worker's partials are waited for, not released without
            # 30 minutes of windows compressed into a backlog: records stamped by their producers with their
            # events' times close the windows as they are read (by the broker's stamps all would arrive now)
            "trust_producer_timestamps": True,
        }
        query.update(s.settings)
        if start_ms is not None and "public" in query["groups"]:
            # the backlog is older than the workers: its windows are published because the file says so
            since = datetime.datetime.fromtimestamp(start_ms / 1000, datetime.timezone.utc).isoformat()
            query["window"] = {**query["window"], "publish_from": since}
        queries.append(query)
    return {"namespaces": namespaces, "queries": queries}


class _OutputReader:
    """Reads topics from their beginning, without a consumer group, with librdkafka.

    kafka-python 3.0's consumer was seen to block for good inside ``poll`` here
    (its IO thread idle, the caller waiting on an event that never came), which
    stalled the harness while every window had been released.
    """

    def __init__(self, bootstrap: str, topics: list[str]) -> None:
        from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

        self._consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"audit-reader-{uuid.uuid4().hex}",
                                   "enable.auto.commit": False})
        metadata = self._consumer.list_topics(timeout=30)
        absent = [t for t in topics if t not in metadata.topics or metadata.topics[t].error is not None]
        if absent:
            raise RuntimeError(f"output topics {absent} do not exist; the workers create them at start")
        self._consumer.assign([TopicPartition(t, p, OFFSET_BEGINNING) for t in topics
                               for p in metadata.topics[t].partitions])

    def poll(self, timeout_s: float) -> list[tuple[str, bytes]]:
        """(topic, value) of the records that arrived within ``timeout_s``."""
        return [(m.topic(), m.value()) for m in self._consumer.consume(num_messages=100_000, timeout=timeout_s)
                if m.error() is None]

    def close(self) -> None:
        self._consumer.close()


@dataclass
class Deployment:
    """One stream's topics, worker processes and releases."""

    label: str
    work_dir: Path
    bootstrap: str
    redis_url: str
    windows: int
    start_ms: int
    with_target: bool
    run: str = field(default_factory=lambda: f"au{uuid.uuid4().hex[:8]}")
    topics: dict[str, str] = field(default_factory=dict)
    outputs: dict[str, str] = field(default_factory=dict)
    workers: list[WorkerProcess] = field(default_factory=list)
    doctoring: str | None = None  # workers run doctored (tests/audit/doctor.py)
    releases: Any = None  # a ``releases.Releases``
    queries: dict[str, dict] = field(default_factory=dict)  # each scenario's query, as the file configures it
    # per scenario: how many records were read, and how each record's privacy statement departs from its query
    claims_checked: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    claims_wrong: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))

    def __post_init__(self) -> None:
        from tests.audit.releases import Releases  # (it reads this module's scenarios)

        self.releases = Releases(self.start_ms, self.windows)

    def start(self) -> None:
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self.topics = {name: f"{self.run}-{name}" for name in TOPIC_PARTITIONS}
        self.outputs = {s.name: f"{self.run}-out-{s.name}" for s in SCENARIOS}
        for name, partitions in TOPIC_PARTITIONS.items():
            create_topic(self.bootstrap, self.topics[name], partitions, {"message.timestamp.type": "CreateTime"})
        config = _config(self.run, self.topics, self.outputs, self.start_ms)
        self.queries = {s.name: query for s, query in zip(SCENARIOS, config["queries"], strict=True)}
        config_path = self.work_dir / "queries.yaml"
        config_path.write_text(yaml.safe_dump(config, sort_keys=False))
        env = {k: v for k, v in os.environ.items() if not k.startswith(("KAFKA_", "STREAM_DP_", "REDIS_"))}
        env.update(KAFKA_BOOTSTRAP_SERVERS=self.bootstrap, REDIS_URL=self.redis_url,
                   STREAM_DP_GROUP_ID=f"{self.run}-g", STREAM_DP_INTERNAL_TOPIC_PREFIX=f"{self.run}.",
                   STREAM_DP_CONTRIBUTION_SECRET=SECRET, STREAM_DP_OUTPUT_PARTITIONS="1",
                   # six workers share two cores here: a starved one must not be rebalanced out mid-stream
                   STREAM_DP_CONSUMER_SESSION_TIMEOUT_MS="45000")
        module = "stream_dp.cli.main"
        if self.doctoring is not None:
            env[DOCTOR_ENV] = self.doctoring
            module = "tests.audit.doctored_worker"
        self.workers = [WorkerProcess(f"worker{i}", config_path, env, self.work_dir, module=module)
                        for i in range(WORKERS)]
        for worker in self.workers:
            worker.start()

    def wait_assigned(self, timeout_s: float = 90.0, settled_s: float = 3.0) -> None:
        """Until both consumer groups have settled: every worker owns input partitions, and together all of
        them, every worker owns release homes, and neither assignment changed for ``settled_s``.

        Events sent before that would all be read by the first worker to join, which would bound one
        unit's events on several partitions together; and a release group still rebalancing re-reads
        partials of windows already released (counted as late partials).
        """
        wanted = {f"{self.topics[name]}[{p}]" for name, n in TOPIC_PARTITIONS.items() for p in range(n)}
        deadline = time.monotonic() + timeout_s
        state, since = None, time.monotonic()
        while time.monotonic() < deadline:
            self.check_workers()
            inputs, homes = [], []
            for worker in self.workers:
                text = worker.log_text().splitlines()
                lines = [line for line in text if "stream_dp.worker.ingest.stage: assigned" in line]
                inputs.append(set(re.findall(r"'([^']+)'", lines[-1])) if lines else set())
                lines = [line for line in text if "release homes assigned" in line]
                homes.append(lines[-1].split("assigned", 1)[1].strip() if lines else "[]")
            settled = (all(inputs) and set().union(*inputs) == wanted and sum(map(len, inputs)) == len(wanted)
                       and all(h != "[]" for h in homes))
            current = (tuple(map(frozenset, inputs)), tuple(homes))
            if current != state:
                state, since = current, time.monotonic()
            elif settled and time.monotonic() - since >= settled_s:
                return
            time.sleep(0.5)
        raise RuntimeError(f"{self.label}: the workers did not settle on the input partitions and release homes:\n"
                           f"{self.log_tails()}")

    def produce(self) -> None:
        kafka = _kafka()
        producer = kafka.KafkaProducer(bootstrap_servers=self.bootstrap, acks="all", linger_ms=20,
                                       batch_size=256 * 1024)
        try:
            for name in ("main", "spread", "local", "local_oue", "quant", "topk", "topksel"):
                for key, value, stamp, partition in records(name, self.start_ms, self.windows,
                                                            with_target=self.with_target, doctoring=self.doctoring):
                    producer.send(self.topics[name], key=key, value=value, timestamp_ms=stamp, partition=partition)
            producer.flush(timeout=120)
            # The clock topic goes in segments of FUTURE_EVERY windows, each sent once the worker has
            # released the segment before up to the last window its own events close (all but its last
            # SEGMENT_OPEN: the clock trails the newest stamp by PRODUCER_QUORUM units): the worker reads every segment in batches of its own, as on a live stream, so an
            # event that moved the window clock would make the next segment's events late (within one
            # batch it could not). Waiting for a window only idle closing releases would let the wall
            # clock close everything, in D as in D'.
            clock = records("clock", self.start_ms, self.windows, with_target=self.with_target)
            released = _OutputReader(self.bootstrap, [self.outputs["future_timestamp"]])
            try:
                seen: set[int] = set()
                for first in range(0, self.windows, FUTURE_EVERY):
                    lo, hi = self.start_ms + first * 1000, self.start_ms + (first + FUTURE_EVERY) * 1000
                    last = first + FUTURE_EVERY >= self.windows  # with the record that closes the stream
                    for key, value, stamp, partition in clock:
                        if lo <= stamp and (stamp < hi or last):
                            producer.send(self.topics["clock"], key=key, value=value, timestamp_ms=stamp,
                                          partition=partition)
                    producer.flush(timeout=60)
                    self._wait_released(released, seen,
                                        min(hi, self.start_ms + self.windows * 1000) - SEGMENT_OPEN * 1000)
            finally:
                released.close()
        finally:
            producer.close()

    def _wait_released(self, consumer, seen: set[int], window_start_ms: int, timeout_s: float = 600.0) -> None:
        # The segment's windows are charged behind the other topics' backlog (about 14,000 windows of 18
        # queries, sent first): on two loaded cores that took over 120 s for the second segment.
        deadline = time.monotonic() + timeout_s
        while window_start_ms not in seen:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.label}: window {window_start_ms} of the clock topic was not released "
                                   f"within {timeout_s:.0f}s:\n{self.log_tails()}")
            seen.update(orjson.loads(value)["window"]["start_ms"] for _, value in consumer.poll(0.3))
            self.check_workers()

    def collect(self, deadline: float, quiet_s: float = 3.0) -> None:
        """Read the output topics until every window of every scenario is released or ``deadline`` passes,
        then on until nothing came for ``quiet_s`` (the records a window publishes after those audited)."""
        consumer = _OutputReader(self.bootstrap, list(self.outputs.values()))
        by_topic = {topic: name for name, topic in self.outputs.items()}
        scenarios = {s.name: s for s in SCENARIOS}
        quiet_since = None
        try:
            while time.monotonic() < deadline:
                polled = consumer.poll(0.5)
                for topic, value in polled:
                    record, name = orjson.loads(value), by_topic[topic]
                    # every record, audited or not, states what its query configures (``claims``)
                    self.claims_checked[name] += 1
                    self.claims_wrong[name] += claim_problems(record, self.queries[name])
                    self.releases.add(scenarios[name], record)
                self.check_workers()
                if self.missing():
                    continue
                if polled or quiet_since is None:
                    quiet_since = time.monotonic()
                elif time.monotonic() - quiet_since >= quiet_s:
                    break
        finally:
            consumer.close()

    def missing(self) -> dict[str, list[int]]:
        return self.releases.missing(SCENARIOS)

    def check_workers(self) -> None:
        for worker in self.workers:
            code = worker.reap()
            if code is not None:
                raise RuntimeError(f"{self.label}: {worker.name} exited with {code}:\n{worker.log_text()[-3000:]}")

    def rejected(self) -> dict[str, float]:
        """Events rejected by reason, over the workers' metrics."""
        from tests.reliability.workers import parse_metrics

        out: dict[str, float] = defaultdict(float)
        for worker in self.workers:
            text = worker.scrape() or ""
            for name, labels, value in parse_metrics(text):
                if name == "stream_dp_events_rejected_total":
                    out[f"{labels.get('query', '').split('_', 1)[-1]}:{labels.get('reason')}"] += value
                elif name == "stream_dp_events_total" and labels.get("outcome") == "late":
                    out[f"{labels.get('query', '').split('_', 1)[-1]}:late"] += value
                elif name in ("stream_dp_windows_withheld_total", "stream_dp_release_partitions_missing_total",
                              "stream_dp_late_partials_total"):
                    # windows released without (some) data: timing, not the target, would differ D from D'
                    out[f"{labels.get('query', '').split('_', 1)[-1]}:{name[10:-6]}"] += value
                elif name == "stream_dp_budget_failures_total":  # windows dropped unreleased, or held
                    out[f"{labels.get('query', '').split('_', 1)[-1]}:budget_{labels.get('kind')}"] += value
        return dict(out)

    def stop(self) -> None:
        for worker in self.workers:
            worker.stop(timeout_s=20)
        delete_topics(self.bootstrap, [*self.topics.values(), *self.outputs.values()])
        delete_keys(self.redis_url, f"*{self.run}*")  # charges, spend and ledger entries, ~50k keys a stream

    def log_tails(self) -> str:
        return "\n".join(f"--- {self.label} {w.name}\n{w.log_text()[-2000:]}" for w in self.workers)
