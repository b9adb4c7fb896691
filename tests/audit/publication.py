"""The worker's path from input records to published records, in process: engine, partials, combiner, release.

What ``test_publication.py`` drives for each of two neighbouring streams. Every step is the worker's own
code: the window engine (decoding, placement, windows, bounding, clipping), the partial as the ingest stage
publishes it (``partial_message``, through the binary wire format and back), the combiner with the progress
markers of every input partition, and the release build as the release stage runs it (``draw_payload``:
a window whose release cannot be built is withheld, whatever that policy is). Only Kafka, Redis and the budget
are left out: every unit is charged (none excluded), which is what a budget far from its limit does.

Queries are generated (``queries``) from every option the query file offers, and streams (``streams``) from
units whose values sit at, just over and under the clip bounds, and beyond them: NaN, infinities, huge
numbers, -0.0, numbers that overflow, strings.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from stream_dp.config import parse_config
from stream_dp.dp import OpenDPNoise
from stream_dp.dp.local import REPORT_TAG_FIELD, LocalRandomizer, report_tag
from stream_dp.metrics.worker import WorkerMetrics
from stream_dp.windows import RawBatch
from stream_dp.windows.partitioning import expected_partitions
from stream_dp.worker.assemble.runtimes import build_runtimes
from stream_dp.worker.ingest.partials_out import partial_message
from stream_dp.worker.partials.wire import Progress, decode_partial_payload, encode_partial_payload
from stream_dp.worker.release.draw import draw_payload

SECRET = b"publication-secret-0123456789abcdef"
T0 = 1_700_000_000_000  # a whole second: windows of 1 s start at T0 + w * 1000 (+ the window offset)
WINDOWS = 3
PAGES = ("a", "b", "c", "d")
REGION = {"a": "r1", "b": "r1", "c": "r2", "d": "r2"}
# Clip ranges, most of them not exact in binary: a clipped value at hi times a count can round above count * hi
CLIPS = ((0.0, 0.3), (0.1, 0.7), (-3.3, 12.34), (0.0, 99.99), (0.0, 1000 / 3), (-0.7, 0.1), (0.0, 10.0),
         (-1e15, 1e15))
LOCAL_EPSILON = 1.5
NOW_MS = T0 + (WINDOWS + 10) * 1000  # the wall clock once every record is read: past every window's end


# -- queries --------------------------------------------------------------------------------------------

def _value_texts(lo: float, hi: float) -> list[bytes]:
    """JSON texts of a value field: at, just over and under the bounds, beyond them, and not numbers at all."""
    finite = [lo, hi, math.nextafter(hi, math.inf), math.nextafter(hi, -math.inf), math.nextafter(lo, -math.inf),
              math.nextafter(lo, math.inf), (lo + hi) / 2, hi * 3 + 1, lo - 5, -0.0, 0.0, 1e15, -1e15, 1e16,
              1.7976931348623157e308, 5e-324]
    return [repr(v).encode() for v in finite] + [b"NaN", b"Infinity", b"-Infinity", b"1e999", b"-1e999", b'"7"',
                                                 b"null", b"true"]


@st.composite
def queries(draw: Any, selected: bool) -> dict:
    """One query of the file (``groups: {select: ...}`` if ``selected``), with every option it may hold."""
    kinds = ["basic", "vector", "sample_aggregate"] + ([] if selected else ["hierarchy", "continual", "local_dp"])
    kind = draw(st.sampled_from(kinds))
    query: dict[str, Any] = {
        "name": "q", "input_topic": "in", "output_topic": "out",
        "privacy_unit": {"namespace": "users", "field": "user_id"}, "timestamp_field": "ts",
        "window": {"size": "1s", "allowed_lateness": "500ms", "offset": draw(st.sampled_from(["0ms", "250ms"]))},
        "group_by": ["page"],
        "groups": {"select": {"delta": 1e-6}} if selected else {"public": list(PAGES[:draw(st.integers(2, 4))])},
        "bounds": {"max_groups_per_unit": draw(st.integers(1, 3)), "max_events_per_group": draw(st.integers(1, 3))},
        "epsilon": draw(st.sampled_from([0.5, 1.0, 3.0])),
    }
    public = None if selected else query["groups"]["public"]
    clip = draw(st.sampled_from(CLIPS))
    capped = {"max_released_groups": draw(st.integers(1, 3))} if selected else {}
    aggregations: dict[str, Any] = {}
    mechanism = draw(st.sampled_from(["laplace", "geometric", "gaussian", "staircase"]))
    if kind == "basic":
        names = draw(st.sets(st.sampled_from(["count", "sum", "mean", "top_k", "quantiles"]), min_size=1))
        if "mean" in names:
            names.add("sum")
        if "quantiles" in names and not names & {"count", "mean"}:
            names.add("count")
        if selected and "top_k" in names and not names & {"count", "sum", "mean"}:
            names.add("count")
        for name in sorted(names):
            if name == "count":
                aggregations["count"] = {}
            elif name in ("sum", "mean"):
                aggregations[name] = {"field": "value", **({"clip": list(clip)} if name == "sum" else {})}
            elif name == "top_k":
                most = 3 if selected else len(public) - 1
                aggregations["top_k"] = {"k": draw(st.integers(1, most))}
            else:
                aggregations["quantiles"] = {
                    "field": "value", "q": draw(st.sampled_from([[0.5], [0.1, 0.9], [0.25, 0.5, 0.75]])),
                    "bounds": list(clip), "bins": draw(st.sampled_from([2, 7, 64])),
                    "value_interval": draw(st.booleans()), **capped}
    elif kind == "vector":
        mechanism = "gaussian"
        fields = draw(st.sampled_from([["vx"], ["vx", "vy"]]))
        vector = draw(st.sampled_from(["mean_vector", "covariance"]))
        aggregations[vector] = {"fields": fields, "clip_norm": draw(st.sampled_from([0.3, 12.34, 1e3])), **capped}
        if selected or draw(st.booleans()):
            aggregations["count"] = {}
    elif kind == "sample_aggregate":
        median = draw(st.booleans())
        mechanism = "laplace" if median else draw(st.sampled_from(["laplace", "gaussian"]))
        aggregations["sample_aggregate"] = {
            "function": "statistics:mean", "field": "value", "blocks": draw(st.integers(2, 4)),
            "output_range": list(clip), "timeout": "10ms", **capped,
            **({"aggregate": "median", "bins": draw(st.sampled_from([3, 16]))} if median else {})}
        if selected or draw(st.booleans()):
            aggregations["count"] = {}
    elif kind == "hierarchy":
        mechanism = draw(st.sampled_from(["laplace", "gaussian"]))
        query["group_by"] = ["region", "page"]
        query["groups"] = {"public": [[REGION[p], p] for p in public]}
        query["hierarchy"] = draw(st.sampled_from([True, {"split": [1, 2]}]))
        names = draw(st.sets(st.sampled_from(["count", "sum", "mean"]), min_size=1))
        aggregations = {"count": {}} if "count" in names else {}
        if names & {"sum", "mean"}:
            aggregations["sum"] = {"field": "value", "clip": list(clip)}
        if "mean" in names:
            aggregations["mean"] = {"field": "value"}
    elif kind == "continual":
        mechanism = "laplace"
        query["continual"] = {"period": "2s", "max_windows_per_unit": draw(st.integers(1, 2))}
        aggregations = {"count": {}}
        if draw(st.booleans()):
            aggregations["sum"] = {"field": "value", "clip": list(clip)}
            if draw(st.booleans()):
                aggregations["mean"] = {"field": "value"}
    else:  # local_dp
        mechanism = "laplace"
        query["local_dp"] = {"field": "page", "mechanism": draw(st.sampled_from(["krr", "oue"])),
                             "epsilon": LOCAL_EPSILON}
        query["epsilon"] = LOCAL_EPSILON
        query["bounds"] = {"max_groups_per_unit": 1, "max_events_per_group": 1}
        aggregations = {"count": {}}
    query["mechanism"] = mechanism
    if mechanism == "gaussian":
        query["delta"] = 1e-6
    query["aggregations"] = aggregations
    return query


def pipeline_config(query: dict) -> Any:
    return parse_config({
        "namespaces": {"users": {"budgets": [{"horizon": "1h", "epsilon": 1000.0, "delta": 1e-3}]}},
        "queries": [query]})


# -- streams --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Event:
    unit: str
    window: int
    page: str
    value: bytes  # the value field's JSON text
    region: str | None = None  # None: the page's own region
    jitter_ms: int = 0


def _texts(query: dict) -> list[bytes]:
    aggregations = query["aggregations"]
    if "sum" in aggregations:
        lo, hi = aggregations["sum"]["clip"]
    elif "quantiles" in aggregations:
        lo, hi = aggregations["quantiles"]["bounds"]
    elif "sample_aggregate" in aggregations:
        lo, hi = aggregations["sample_aggregate"]["output_range"]
    else:
        lo, hi = -12.34, 12.34
    return _value_texts(lo, hi)


@st.composite
def events(draw: Any, query: dict, unit: str, pages: tuple[str, ...], most: int) -> list[Event]:
    texts = _texts(query)
    out = []
    for _ in range(draw(st.integers(1, most))):
        page = draw(st.sampled_from(pages))
        region = draw(st.sampled_from([None, None, "r1", "r2"]))  # sometimes not the page's own (hierarchy)
        out.append(Event(unit, draw(st.integers(0, WINDOWS - 1)), page, draw(st.sampled_from(texts)), region,
                         draw(st.integers(0, 999))))
    return out


@st.composite
def streams(draw: Any, query: dict) -> tuple[list[Event], list[Event]]:
    """(background events, the target unit's events): D is the background, D' the background and the target."""
    pages = (*PAGES, "zz")  # "zz" is never public
    background = []
    for i in range(draw(st.integers(0, 8))):
        background += draw(events(query, f"u{i}", pages, 4))
    target = draw(events(query, "target", (*pages, "t1", "t2"), 6))
    return background, target


# -- the pipeline ---------------------------------------------------------------------------------------

def _event_bytes(query: Any, event: Event, start_ms: int) -> bytes:
    ts = start_ms + event.jitter_ms
    value = event.value
    fields = [b'"user_id":' + orjson.dumps(event.unit), b'"ts":%d' % ts]
    # the page under both names a query here groups by ("group" in the audit's scenarios)
    named = {"page": event.page, "group": event.page}
    if query.local_dp is not None:
        public = [key[0] for key in query.public_group_keys()]
        report: Any = event.page
        if query.local_dp.mechanism == "oue":
            report = [event.page] if event.page in public else []
        named[query.local_dp.field] = report
        tag = report_tag(LocalRandomizer.build(query.local_dp.mechanism, query.local_dp.epsilon, len(public)), public)
        fields.append(b'"' + REPORT_TAG_FIELD.encode() + b'":' + orjson.dumps(tag))
    fields += [orjson.dumps(name) + b":" + orjson.dumps(value) for name, value in named.items()]
    region = event.region or REGION.get(event.page, "r9")
    fields += [b'"region":' + orjson.dumps(region), b'"value":' + value, b'"vx":' + value, b'"vy":-1.5']
    return b"{" + b",".join(fields) + b"}"


def input_batch(query: Any, events_: list[Event], partitions: int) -> RawBatch:
    """The records as a producer keyed by unit sends them (murmur2), stamped with their event times, and one
    record per partition dated two windows after the last: its timestamp closes every window."""
    size, offset = query.window.size_ms, query.window.offset_ms
    units = [e.unit for e in events_]
    closers = [_closer(p, partitions, query.partitioner) for p in range(partitions)]
    values = [_event_bytes(query, e, T0 + offset + e.window * size) for e in events_]
    closing = T0 + offset + (WINDOWS + 2) * size  # in a window left open
    values += [_event_bytes(query, Event(c, WINDOWS + 2, "a", b"1.0"), closing) for c in closers]
    keys = [u.encode() for u in units + closers]
    placed = expected_partitions(np.array(keys, dtype="S"), partitions, query.partitioner)
    stamps = [T0 + offset + e.window * size + e.jitter_ms for e in events_] + [closing] * partitions
    offsets, seen = [], {}
    for p in placed.tolist():
        offsets.append(seen.get(p, 0))
        seen[p] = offsets[-1] + 1
    return RawBatch(values, placed, np.array(offsets), np.array(stamps, dtype=np.int64), keys)


def _closer(partition: int, partitions: int, partitioner: str) -> str:
    """A unit id the partitioner puts on ``partition``."""
    i = 0
    while int(expected_partitions(np.array([f"closer-{partition}-{i}".encode()], dtype="S"), partitions,
                                  partitioner)[0]) != partition:
        i += 1
    return f"closer-{partition}-{i}"


class FixedSelection:
    """Partition selection whose outcome is given: ``decide(window start, group key)`` says whether a group
    is kept. It notes the groups each window offered (``offered``), so that a neighbour can be given the
    same outcome. Stands in for ``PartitionSelection`` in a release plan (only ``select`` is called)."""

    def __init__(self, decide: Callable[[int, tuple], bool]) -> None:
        self.decide = decide
        self.window: Any = None
        self.offered: dict[int, set[tuple]] = {}
        self.kept: dict[int, set[tuple]] = {}

    def select(self, distinct_units: np.ndarray, noise: Any) -> np.ndarray:
        start, groups = self.window.window_start_ms, list(self.window.groups)
        assert len(groups) == len(distinct_units)
        keep = np.array([self.decide(start, tuple(g)) for g in groups], dtype=bool)
        self.offered[start] = {tuple(g) for g in groups}
        self.kept[start] = {tuple(g) for g, k in zip(groups, keep) if k}
        return keep


class InProcessSandbox:
    """``statistics:mean`` of each block in this process (the real sandbox forks a child per function)."""

    def run(self, blocks: list[np.ndarray]) -> np.ndarray:
        with np.errstate(all="ignore"):
            return np.array([float(np.mean(values)) for values in blocks])

    def take_failures(self) -> dict[str, int]:
        return {}


@dataclass
class Published:
    records: list[dict] = field(default_factory=list)
    withheld: list[int] = field(default_factory=list)  # windows not published at all
    as_if_empty: list[int] = field(default_factory=list)  # windows released without their data

    def keys(self) -> set[tuple]:
        """(window start, kind, level, group, as_if_empty) of every record."""
        return {(r["window"]["start_ms"], r.get("kind", "group"), r.get("level"),
                 None if "group" not in r else orjson.dumps(r["group"], option=orjson.OPT_SORT_KEYS),
                 r.get("as_if_empty")) for r in self.records}


def run(query_dict: dict, events_: list[Event], partitions: int, selection: FixedSelection | None = None) -> Published:
    """Every record the worker publishes for ``events_`` (one batch, then the windows close)."""
    config = pipeline_config(query_dict)
    (runtime,) = build_runtimes(config, secret=SECRET, clock_ms=lambda: NOW_MS)
    if runtime.sandbox is not None:
        runtime.sandbox = InProcessSandbox()
    if selection is not None:
        base = runtime.plan.levels[-1]
        assert base.selection is not None
        runtime.plan = dataclasses.replace(runtime.plan, levels=(*runtime.plan.levels[:-1],
                                                                 dataclasses.replace(base, selection=selection)))
    engine, combiner = runtime.engine, runtime.combiner
    engine.assign(range(partitions))
    engine.set_partition_count(partitions)
    result = engine.process(input_batch(config.queries[0], events_, partitions))
    partials = result.partials + engine.tick()
    for partial in partials:
        totals = partial.aggregate(None, histogram=runtime.histogram, features=runtime.features,
                                   blocks=runtime.blocks)
        message = partial_message(runtime, partial, totals, input_partitions=partitions, units=len(partial.units),
                                  excluded=0, closed_at_ms=NOW_MS)
        assert combiner.add_partial(decode_partial_payload(encode_partial_payload(message)), NOW_MS)
    closed = engine.closed_through_ms
    for p in range(partitions):
        for home in range(combiner.partials_partitions):
            combiner.add_progress(Progress(runtime.name, p, partitions, closed[p]), home)
    # the query's first release, as the ledger tells a running deployment: the first window here
    combiner.query_start_ms = T0 + config.queries[0].window.offset_ms
    return asyncio.run(_release(runtime, combiner, selection))


async def _release(runtime: Any, combiner: Any, selection: FixedSelection | None) -> Published:
    """Each window the combiner has ready, drawn as the release stage draws it, and its records rendered."""
    out = Published()
    metrics = WorkerMetrics(CollectorRegistry())
    noise = OpenDPNoise()
    states: dict[int, Any] = {}  # a continual query's tree after the last window, by period start
    for start in combiner.ready():
        window = combiner.take(start)
        if selection is not None:
            selection.window = window
        previous = None
        if runtime.continual is not None:
            previous = states.get(runtime.continual.period_start(start))
        drawn = await draw_payload(runtime, window, noise, metrics, NOW_MS, previous)
        if drawn is None:  # not even as if empty
            out.withheld.append(start)
            continue
        if drawn.window.withheld is not None:
            out.as_if_empty.append(start)
        if runtime.continual is not None:
            states[runtime.continual.period_start(start)] = drawn.release.state
        out.records += [orjson.loads(value) for _, value in drawn.release.render()]
    return out


def seeded(seed: int) -> Callable[[int, tuple], bool]:
    """A selection outcome drawn once per (window, group) from ``seed``: the same in every run."""
    def decide(start: int, group: tuple) -> bool:
        digest = hashlib.blake2b(orjson.dumps([seed, start, list(group)]), digest_size=1).digest()
        return digest[0] < 128
    return decide
