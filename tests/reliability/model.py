"""An independent model of what stream-dp must compute, written from the README alone.

Plain Python over dicts and sets; nothing here comes from ``stream_dp``
except the query file's loader. Given the input topic as the broker holds it
(partition, offset, key, value, record timestamp), the query file and the
contribution secret, it computes per query:

* the **late set** by the README's clock rule: a partition's watermark is the
  newest record timestamp it delivered before an event, less
  ``allowed_lateness``; an event whose window ends at or before that
  watermark is late (``Truth.late_ends`` keeps each late event's window
  end). This per-record clock is the latest a worker's can be: the worker
  judges a batch by the records before it, and takes the lowest clock of its
  active partitions, so it may accept events the model calls late, never
  the reverse (``checks.accepted_by_coarser_clock``). The idle rule can also
  close windows on the wall clock, which the model does not know: the
  workloads keep every partition busy from before the stream begins
  (``workload.LiveProducer.warm_up``) until it ends, and an on-time event
  made late by a fault is a violation.
* the **bounded contributions**: per unit and window, the
  ``max_groups_per_unit`` groups and per (unit, group) the
  ``max_events_per_group`` events that the README's "Bounding, precisely"
  keyed hashes choose, values clipped into ``clip``;
* the **budget**: per namespace and unit, windows charged in window order,
  a window admitted when, for every limit of the namespace (each budget's
  epsilon, and its delta if it has one), the unit's fixed-point spend plus
  the window's cost stays within the limit, otherwise excluded from it
  entirely. A Laplace window costs the query's epsilon; a Gaussian one its
  epsilon and its delta (``docs/privacy/index.md``); one over selected
  groups its epsilon and the delta selection spent (``stated_delta``). Every
  horizon must be longer than the stream (nothing charged expires during a
  run);
* **continual release** (``docs/queries/continual.md``): a unit is charged
  the query's epsilon once per period, at its first window of the period
  (``Truth.first_units``; refused, it is left out and asked again at its
  next window), and counts in at most ``max_windows_per_unit`` windows of
  the period (later ones leave it out); each window releases the running
  totals from the period's start, or from the window its tree restarted at
  (``Truth.running_totals``);
* the **partials** (per query, window and input partition: per-group count,
  clipped sum and distinct units after exclusion; units charged and
  excluded) and the per-window totals the noisy releases must centre on.

It models the inputs the workloads produce: JSON objects with a string (or
integer) unit id, integer epoch-millisecond times, group fields among the
public groups (any string or integer for selected groups) and a numeric value. Anything else is "rejected" here without
a reason, which is all the checks need of it.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field
from fractions import Fraction

from stream_dp.config import PipelineConfig

_MASK = (1 << 64) - 1
_SIP_INIT = (0x736F6D6570736575, 0x646F72616E646F6D, 0x6C7967656E657261, 0x7465646279746573)
FIXED_POINT = 10**6  # budget amounts are counted in 1e-6 of epsilon
DELTA_FIXED_POINT = 10**12  # and in 1e-12 of delta
MECHANISMS = ("laplace", "geometric", "gaussian")


# -- the keyed hashes of the README's "Bounding, precisely" ----------------------------------------------------


def derive_key(secret: bytes, label: str, size: int) -> bytes:
    base = secret if len(secret) <= 64 else hashlib.blake2b(secret).digest()
    return hashlib.blake2b(label.encode("ascii"), key=base, digest_size=size).digest()


def siphash_1_3(key: bytes, message: bytes) -> int:
    """SipHash-1-3 (one compression round, three finalisation rounds), from the paper."""
    k0, k1 = int.from_bytes(key[:8], "little"), int.from_bytes(key[8:16], "little")
    v0, v1, v2, v3 = k0 ^ _SIP_INIT[0], k1 ^ _SIP_INIT[1], k0 ^ _SIP_INIT[2], k1 ^ _SIP_INIT[3]

    def rotl(x: int, b: int) -> int:
        return ((x << b) | (x >> (64 - b))) & _MASK

    def sipround() -> None:
        nonlocal v0, v1, v2, v3
        v0 = (v0 + v1) & _MASK; v1 = rotl(v1, 13) ^ v0; v0 = rotl(v0, 32)  # noqa: E702
        v2 = (v2 + v3) & _MASK; v3 = rotl(v3, 16) ^ v2  # noqa: E702
        v0 = (v0 + v3) & _MASK; v3 = rotl(v3, 21) ^ v0  # noqa: E702
        v2 = (v2 + v1) & _MASK; v1 = rotl(v1, 17) ^ v2; v2 = rotl(v2, 32)  # noqa: E702

    tail = len(message) % 8
    words = [int.from_bytes(message[i:i + 8], "little") for i in range(0, len(message) - tail, 8)]
    words.append(int.from_bytes(message[len(message) - tail:], "little") | ((len(message) & 0xFF) << 56))
    for m in words:
        v3 ^= m
        sipround()
        v0 ^= m
    v2 ^= 0xFF
    for _ in range(3):
        sipround()
    return v0 ^ v1 ^ v2 ^ v3


def encode_group_key(parts: tuple) -> bytes:
    """Each part: ``s`` + 4-byte big-endian length + UTF-8 for a string, ``i`` + the same + decimal for an integer."""
    out = b""
    for part in parts:
        tag, data = (b"s", part.encode("utf-8", "surrogatepass")) if isinstance(part, str) else (b"i", str(part).encode())
        out += tag + len(data).to_bytes(4, "big") + data
    return out


class Hashes:
    def __init__(self, secret: bytes) -> None:
        self.unit_key = derive_key(secret, "stream-dp/units", 16)
        self.group_key = derive_key(secret, "stream-dp/groups", 32)
        self.pair_key = derive_key(secret, "stream-dp/pairs", 16)
        self.event_key = derive_key(secret, "stream-dp/events", 16)

    def unit(self, unit: str) -> int:
        return siphash_1_3(self.unit_key, unit.encode("utf-8"))

    def group(self, group: tuple) -> int:
        digest = hashlib.blake2b(encode_group_key(group), key=self.group_key, digest_size=8).digest()
        return int.from_bytes(digest, "little")

    def pair(self, unit_hash: int, group_hash: int) -> int:
        return siphash_1_3(self.pair_key, unit_hash.to_bytes(8, "little") + group_hash.to_bytes(8, "little"))

    def event(self, unit_hash: int, group_hash: int, partition: int, offset: int) -> int:
        message = b"".join(x.to_bytes(8, "little", signed=signed) for x, signed in
                           ((unit_hash, False), (group_hash, False), (partition, True), (offset, True)))
        return siphash_1_3(self.event_key, message)


# -- the model ----------------------------------------------------------------------------------------------------


@dataclass
class ModelPartial:
    """One (query, window, input partition) after bounding and exclusion."""

    groups: dict[tuple, list] = field(default_factory=dict)  # group -> [count, clipped sum, distinct units]
    units: set[str] = field(default_factory=set)
    excluded: set[str] = field(default_factory=set)


@dataclass
class Truth:
    late: dict[str, set[tuple[int, int]]] = field(default_factory=dict)  # query -> (partition, offset)
    #: query -> (partition, offset) -> the window end of each late event
    late_ends: dict[str, dict[tuple[int, int], int]] = field(default_factory=dict)
    rejected: dict[str, set[tuple[int, int]]] = field(default_factory=dict)
    accepted: dict[str, int] = field(default_factory=dict)
    partials: dict[tuple[str, int, int], ModelPartial] = field(default_factory=dict)  # (query, start, partition)
    namespace: dict[str, str] = field(default_factory=dict)  # query -> namespace
    cost_units: dict[str, int] = field(default_factory=dict)  # query -> fixed-point epsilon per window
    limit_units: dict[str, int] = field(default_factory=dict)  # namespace -> its first fixed-point epsilon limit
    #: namespace -> every limit in the order the budget state holds them: (is a delta limit, fixed-point limit)
    limits: dict[str, list[tuple[bool, int]]] = field(default_factory=dict)
    costs: dict[str, list[int]] = field(default_factory=dict)  # query -> fixed-point charge per limit per window
    admitted: dict[tuple[str, str], list[str]] = field(default_factory=dict)  # (namespace, unit) -> charge ids
    period_ms: dict[str, int] = field(default_factory=dict)  # continual query -> its period
    #: (continual query, start, partition) -> the units charged the period there (their first window of it)
    first_units: dict[tuple[str, int, int], set[str]] = field(default_factory=dict)

    def windows(self, query: str) -> set[int]:
        return {start for q, start, _ in self.partials if q == query}

    def totals(self, query: str, start: int) -> dict[tuple, tuple[int, float]]:
        out: dict[tuple, tuple[int, float]] = {}
        for (q, s, _), partial in self.partials.items():
            if (q, s) == (query, start):
                for group, (count, total, _) in partial.groups.items():
                    c, t = out.get(group, (0, 0.0))
                    out[group] = (c + count, t + total)
        return out

    def period_start(self, query: str, start: int) -> int:
        return start // self.period_ms[query] * self.period_ms[query]

    def running_totals(self, query: str, start: int, since: int | None = None) -> dict[tuple, tuple[int, float]]:
        """A continual query's running totals through window ``start``, from ``since`` (default: its period's
        start; a restarted tree's window)."""
        since = self.period_start(query, start) if since is None else since
        out: dict[tuple, tuple[int, float]] = {}
        for w in {s for q, s, _ in self.partials if q == query and since <= s <= start}:
            for group, (count, total) in self.totals(query, w).items():
                c, t = out.get(group, (0, 0.0))
                out[group] = (c + count, t + total)
        return out

    def spent_units(self, namespace: str, unit: str, query: str) -> int:
        return len(self.admitted.get((namespace, unit), [])) * self.cost_units[query]

    def spent_per_limit(self, namespace: str, unit: str, query: str) -> list[int]:
        """Fixed-point units charged against each limit of the namespace (one query per namespace)."""
        windows = len(self.admitted.get((namespace, unit), []))
        return [windows * cost for cost in self.costs[query]]

    def charge_ids(self, query: str) -> set[str]:
        """Charge ids of the query's windows: every window partition's; a continual query's where some unit
        was charged the period (the worker appends its settings' fingerprint, which the checks strip)."""
        if query in self.period_ms:
            return {f"{q}/{start}/{p}" for (q, start, p), units in self.first_units.items() if q == query and units}
        return {f"{q}/{start}/{p}" for q, start, p in self.partials if q == query}


def _fixed(amount: float | Fraction, rounding, scale: int = FIXED_POINT) -> int:
    return int(rounding((amount if isinstance(amount, Fraction) else Fraction(str(amount))) * scale))


def _decode(value: bytes | None, query) -> tuple[str, int, tuple, float] | None:
    """(unit, event time ms, group, value) of a well-formed event, else None."""
    try:
        event = json.loads(value) if value is not None else None
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(event, dict):
        return None
    unit, ts = event.get(query.privacy_unit.field), event.get(query.timestamp_field)
    if isinstance(unit, bool) or not isinstance(unit, (str, int)) or unit == "":
        return None
    if isinstance(ts, bool) or not isinstance(ts, int):
        return None
    group = tuple(event.get(f) for f in query.group_by)
    public = query.public_group_keys()
    if public is None:  # selected groups: any string or integer values
        if any(isinstance(v, bool) or not isinstance(v, (str, int)) for v in group):
            return None
    elif list(group) not in [list(g) for g in public]:
        return None
    raw = event.get(query.aggregations.value_field) if query.aggregations.value_field else 0.0
    if isinstance(raw, bool) or not isinstance(raw, (int, float)) or not math.isfinite(raw):
        return None
    return str(unit), ts, group, float(raw)


def compute_truth(config: PipelineConfig, secret: bytes, records: list,
                  on_time: dict[str, set[tuple[int, int]]] | None = None,
                  stated_delta: dict[str, float] | None = None) -> Truth:
    """``records``: the input topic's records (``partition``, ``offset``, ``key``, ``value``, ``timestamp``).

    ``on_time``: per query, (partition, offset) of events the model's clock calls late that count as on time
    (the worker's coarser clock accepted them: see ``harness.FaultRun._check``). ``stated_delta``: per query
    over selected groups, the delta its releases state (``privacy.delta``): partition selection spends the
    delta of the threshold it calibrated, at most its configured ``select.delta``, and that is what a window
    must be charged (the caller checks the bound)."""
    hashes = Hashes(secret)
    truth = Truth()
    span_ms = max((r.timestamp for r in records), default=0) - min((r.timestamp for r in records), default=0)
    for name, ns in config.namespaces.items():
        if ns.accounting != "epsilon" or any(b.horizon_ms <= span_ms + 60_000 for b in ns.budgets):
            raise ValueError(f"namespace {name}: the model covers epsilon namespaces whose horizons outlast the stream")
        truth.limit_units[name] = _fixed(ns.budgets[0].epsilon, math.floor)
        truth.limits[name] = [(is_delta, _fixed(limit, math.floor, DELTA_FIXED_POINT if is_delta else FIXED_POINT))
                              for b in ns.budgets
                              for is_delta, limit in ((False, b.epsilon), (True, b.delta)) if limit is not None]
    by_partition: dict[int, list] = {}
    for record in records:
        by_partition.setdefault(record.partition, []).append(record)
    contributions: dict[tuple[str, int, int, str], dict[tuple, dict[int, float]]] = {}
    for query in config.queries:
        if query.mechanism not in MECHANISMS or (
                query.aggregations.top_k is not None and query.public_group_keys() is None) or (
                query.continual is not None and (query.public_group_keys() is None or query.window.offset_ms)):
            raise ValueError(f"query {query.name}: the model covers {MECHANISMS} queries released per window "
                             "(top_k over public groups) or continually (public groups, windows without offset)")
        name, size = query.name, query.window.size_ms
        if query.continual is not None:
            truth.period_ms[name] = query.continual.period_ms
        truth.namespace[name] = query.privacy_unit.namespace
        truth.cost_units[name] = _fixed(query.epsilon, math.ceil)
        delta = Fraction(str(query.delta if query.mechanism == "gaussian" else 0.0))
        if query.public_group_keys() is None:  # partition selection spends its own delta, per window
            stated = (stated_delta or {}).get(name)
            delta = Fraction(str(stated)) if stated is not None else delta + Fraction(str(query.groups.select.delta))
        truth.costs[name] = [_fixed(delta, math.ceil, DELTA_FIXED_POINT) if is_delta else truth.cost_units[name]
                             for is_delta, _ in truth.limits[truth.namespace[name]]]
        late, rejected = truth.late.setdefault(name, set()), truth.rejected.setdefault(name, set())
        clip = query.aggregations.sum.clip if query.aggregations.sum else (0.0, 0.0)
        accepted = 0
        late_ends = truth.late_ends.setdefault(name, {})
        for partition, recs in by_partition.items():
            newest: int | None = None
            for record in sorted(recs, key=lambda r: r.offset):
                decoded = _decode(record.value, query)
                source = (partition, record.offset)
                if decoded is None or record.key != decoded[0].encode("utf-8") \
                        or decoded[1] > record.timestamp + query.max_future_skew_ms:
                    rejected.add(source)
                else:
                    unit, ts, group, value = decoded
                    start = ts // size * size
                    if newest is not None and start + size <= newest - query.window.allowed_lateness_ms \
                            and source not in (on_time or {}).get(name, ()):
                        late.add(source)
                        late_ends[source] = start + size
                    else:
                        accepted += 1
                        events = contributions.setdefault((name, start, partition, unit), {}).setdefault(group, {})
                        uh, gh = hashes.unit(unit), hashes.group(group)
                        events[hashes.event(uh, gh, partition, record.offset)] = min(max(value, clip[0]), clip[1])
                newest = record.timestamp if newest is None else max(newest, record.timestamp)
        truth.accepted[name] = accepted
    _bound_and_charge(config, hashes, contributions, truth)
    return truth


def _bound_and_charge(config: PipelineConfig, hashes: Hashes, contributions: dict, truth: Truth) -> None:
    queries = {q.name: q for q in config.queries}
    spent: dict[tuple[str, str], list[int]] = {}
    periods: dict[tuple[str, str, int], list[int]] = {}  # (continual query, unit, period start) -> windows counted
    # A unit's windows close in window order in its partition, so it is charged in that order.
    for (name, start, partition, unit) in sorted(contributions, key=lambda k: (k[1], k[0], k[2], k[3])):
        query = queries[name]
        groups = contributions[(name, start, partition, unit)]
        uh = hashes.unit(unit)
        ranked = sorted(groups, key=lambda g: (hashes.pair(uh, hashes.group(g)) >> 32, hashes.group(g)))
        kept = {g: sorted(groups[g].items())[:query.bounds.max_events_per_group]
                for g in ranked[:query.bounds.max_groups_per_unit]}
        partial = truth.partials.setdefault((name, start, partition), ModelPartial())
        partial.units.add(unit)
        namespace = truth.namespace[name]
        key = (namespace, unit)
        costs, limits = truth.costs[name], truth.limits[namespace]
        before = spent.get(key, [0] * len(limits))
        if query.continual is not None:  # charged once per period, counted in at most W of its windows
            counted = periods.setdefault((name, unit, truth.period_start(name, start)), [])
            if len(counted) >= query.continual.max_windows_per_unit:
                partial.excluded.add(unit)
                continue
            if counted:
                counted.append(start)
                _add(partial, kept)
                continue
            truth.first_units.setdefault((name, start, partition), set()).add(unit)
        if any(s + c > limit for s, c, (_, limit) in zip(before, costs, limits)):
            partial.excluded.add(unit)
            continue
        spent[key] = [s + c for s, c in zip(before, costs)]
        truth.admitted.setdefault(key, []).append(f"{name}/{start}/{partition}")
        if query.continual is not None:
            periods[(name, unit, truth.period_start(name, start))].append(start)
        _add(partial, kept)


def _add(partial: ModelPartial, kept: dict[tuple, list]) -> None:
    for group, events in kept.items():
        cell = partial.groups.setdefault(group, [0, 0.0, 0])
        cell[0] += len(events)
        cell[1] += sum(v for _, v in events)
        cell[2] += 1
