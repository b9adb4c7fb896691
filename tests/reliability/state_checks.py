"""Invariants on what the workers left in Redis and in their counters, checked against the model.

Reading the evidence (``read_redis_evidence``, ``completeness_counts``) is
kept apart from judging it (the ``check_*`` functions, pure), so that
``test_checks`` can feed every check doctored evidence.

* **Budgets**: each unit's spend is the model's (the windows it was admitted
  to, each charged once), nobody is over a limit, the charge records are
  exactly the model's windows and each charge journal names exactly the
  model's units of that window.
* **Ledger**: every window of the model has a published ledger entry, no
  entry is left claimed but unpublished, and every record on an output topic
  is byte for byte one the ledger stored for its window.
* **Completeness**: no window released without an input partition's partial
  (``stream_dp_release_partitions_missing_total``); the count of partials
  that came after their window's release (``stream_dp_late_partials_total``)
  is reported, not judged, since it includes copies re-sent after a restart
  (``checks.check_partials_before_release`` judges arrival times instead).
"""

from __future__ import annotations

import re
import zlib
from dataclasses import dataclass, field

import orjson
import redis

from tests.reliability import evidence as wire
from tests.reliability.checks import CheckReport
from tests.reliability.model import DELTA_FIXED_POINT, FIXED_POINT, Truth
from tests.reliability.topics import TopicRecord
from tests.reliability.workers import metric_total

LEDGER_PREFIX = "stream-dp:ledger"
BUDGET_PREFIX = "dp"


@dataclass
class RedisEvidence:
    #: (namespace, unit) -> fixed-point units charged against each limit of the namespace (``Truth.limits``)
    spend: dict[tuple[str, str], list[int]] = field(default_factory=dict)
    charge_records: dict[str, set[str]] = field(default_factory=dict)  # namespace -> charge ids recorded
    charge_units: dict[str, set[str]] = field(default_factory=dict)  # charge id -> units its journal names
    first_units: dict[str, set[str]] = field(default_factory=dict)  # continual charge id -> units charged the period
    ledger: dict[tuple[str, int], tuple[bytes | None, set[bytes]]] = field(default_factory=dict)
    # (query, window start) -> (state, the records stored: ``evidence.canonical`` texts)
    errors: list[str] = field(default_factory=list)  # what did not decode


def read_redis_evidence(client: redis.Redis, limits: dict[str, int], truth: Truth) -> RedisEvidence:
    """Everything the budget and ledger checks need, read from Redis once with ``evidence``'s decoders
    (``limits``: namespace -> how many limits its budget states hold, see the wire formats page)."""
    evidence = RedisEvidence()
    for query, namespace in truth.namespace.items():
        units = {u for (q, _, _), p in truth.partials.items() if q == query for u in p.units}
        try:
            stored = wire.spends(client, f"{BUDGET_PREFIX}:", namespace, limits[namespace])
        except wire.EvidenceError as exc:
            evidence.errors.append(f"budget states of {namespace}: {exc}")
            stored = {}
        for unit in units:
            evidence.spend[(namespace, unit)] = stored.get(unit, [0] * limits[namespace])
        prefix = f"{BUDGET_PREFIX}:c:{namespace}:"
        # On a cluster a hash tag (``{...}:``) comes before the charge id.
        evidence.charge_records[namespace] = {_window_charge(re.sub(r"^\{[^}]*\}:", "", k.decode()[len(prefix):]))[0]
                                              for k in client.scan_iter(match=f"{prefix}*", count=10_000)}
    journal = f"{LEDGER_PREFIX}:units:"
    for key in client.scan_iter(match=f"{journal}*", count=10_000):
        if not key.endswith(b"}"):
            continue  # a writer's staged chunks or a WAIT sync key, not a journal
        charge_id, first = _window_charge(key.decode()[len(journal):].strip("{}"))
        text = zlib.decompress(_stored_payload(client, key)).decode()
        (evidence.first_units if first else evidence.charge_units)[charge_id] = set(text.split("\0")) if text else set()
    for query in truth.namespace:
        entry_prefix = f"{LEDGER_PREFIX}:{{{query}}}:"
        for key in client.scan_iter(match=f"{entry_prefix}*", count=10_000):
            suffix = key.decode()[len(entry_prefix):]
            if not suffix.isdigit():
                continue  # released-through marks, the query start, staged chunks
            state = client.hget(key, "state")
            payload = _stored_payload(client, key)
            try:
                values = {wire.canonical(r) for r in wire.ledger_records(payload)} if payload else set()
            except wire.EvidenceError as exc:
                evidence.errors.append(f"ledger entry {key.decode()}: {exc}")
                values = set()
            evidence.ledger[(query, int(suffix))] = (state, values)
    return evidence


_CONTINUAL_CHARGE = re.compile(r"^(.+/-?\d+/\d+)/[0-9a-f]{16}(/first)?$")


def _window_charge(charge_id: str) -> tuple[str, bool]:
    """(query/window start/partition, whether it is a first-unit journal): a continual window's charge id
    carries its settings' fingerprint, and its journal of the units charged the period ``/first``."""
    match = _CONTINUAL_CHARGE.match(charge_id)
    return (match.group(1), match.group(2) is not None) if match else (charge_id, False)


def _stored_payload(client: redis.Redis, key: bytes) -> bytes:
    """What a ledger entry or charge journal holds: chunk fields c0..c<n-1> of a hash (wire version 2; see the
    README's wire formats), or an earlier version's ``payload`` field or string value."""
    if client.type(key) in (b"string", "string"):
        return client.get(key) or b""
    legacy, count = client.hmget(key, "payload", "chunks")
    if legacy is not None:
        return legacy
    pieces = client.hmget(key, [f"c{i}" for i in range(int(count or 0))])
    return b"".join(p for p in pieces if p is not None)


def check_budgets(evidence: RedisEvidence, truth: Truth, report: CheckReport) -> None:
    for query, namespace in truth.namespace.items():
        limits = truth.limits[namespace]
        units = {u for (q, _, _), p in truth.partials.items() if q == query for u in p.units}
        for unit in sorted(units):
            expected = truth.spent_per_limit(namespace, unit, query)
            spent = evidence.spend.get((namespace, unit), [0] * len(limits))
            for i, ((is_delta, limit), got, want) in enumerate(zip(limits, spent, expected)):
                what, scale = ("delta", DELTA_FIXED_POINT) if is_delta else ("epsilon", FIXED_POINT)
                if got != want:
                    report.fail("spend differs", f"{query}: unit {unit} spent {got / scale:g} {what} against limit "
                                f"{i}, the model charges {len(truth.admitted.get((namespace, unit), []))} windows = "
                                f"{want / scale:g}")
                if got > limit:
                    report.fail("over limit", f"{query}: unit {unit} spent {got / scale:g} {what}, over its limit "
                                              f"{limit / scale:g}")
        report.count("units checked", len(units))
        recorded = {c for c in evidence.charge_records.get(namespace, set()) if c.startswith(f"{query}/")}
        expected_ids = truth.charge_ids(query)
        for charge_id in sorted(recorded - expected_ids):
            report.fail("charge not in truth", f"{query}: charge {charge_id} is recorded in Redis but the model has "
                                               "no data in that window partition")
        for charge_id in sorted(expected_ids - recorded):
            report.fail("never charged", f"{query}: window partition {charge_id} of the model was never charged")
        for charge_id in sorted(expected_ids):
            named = evidence.charge_units.get(charge_id)
            q, start, partition = charge_id.rsplit("/", 2)
            if named is not None and named != truth.partials[(q, int(start), int(partition))].units:
                report.fail("charged units differ", f"{charge_id}: the charge journal names {len(named)} units, "
                                                    "not the model's units of that window")
            first = evidence.first_units.get(charge_id)
            if query in truth.period_ms and first != truth.first_units.get((q, int(start), int(partition)), set()):
                report.fail("charged units differ", f"{charge_id}: the journal of units charged the period names "
                            f"{'none' if first is None else len(first)}, not the model's first units of the period")


def check_ledger(evidence: RedisEvidence, outputs: dict[str, list[TopicRecord]], truth: Truth,
                 report: CheckReport) -> None:
    for error in evidence.errors:
        report.fail("corrupt store record", error)
    for query in truth.namespace:
        for start in sorted(truth.windows(query)):
            state = evidence.ledger.get((query, start), (None, set()))[0]
            if state != b"published":
                report.fail("ledger", f"{query}: release ledger entry of window {start} is {state!r}, not published")
    for (query, start), (state, _) in sorted(evidence.ledger.items()):
        if state != b"published" and start not in truth.windows(query):
            report.fail("ledger", f"{query}: release ledger entry of window {start} was left {state!r}")
    for query, records in outputs.items():
        for record in records:
            start = orjson.loads(record.value)["window"]["start_ms"]
            stored = evidence.ledger.get((query, start))
            if stored is None or wire.canonical(orjson.loads(record.value)) not in stored[1]:
                report.fail("output not in ledger", f"{query}: a record of window {start} on the output topic is not "
                                                    "one the release ledger stored for it")


def completeness_counts(pages: list[str], queries: list[str]) -> dict[str, tuple[float, float]]:
    """query -> (input partitions missing from released windows, partials after their window's release),
    summed over the given ``/metrics`` pages (one per worker incarnation)."""
    return {q: (sum(metric_total(t, "stream_dp_release_partitions_missing_total", query=q) for t in pages),
                sum(metric_total(t, "stream_dp_late_partials_total", query=q) for t in pages)) for q in queries}


def check_completeness(counts: dict[str, tuple[float, float]], report: CheckReport, *,
                       withheld_partitions: bool = False) -> None:
    """Every window released with every input partition's partial; ``withheld_partitions``: the scenario withholds a partition on purpose, so windows may go without it."""
    for query, (missing, late) in sorted(counts.items()):
        if missing and not withheld_partitions:
            report.fail("partitions missing", f"{query}: windows were released without the partials of {missing:.0f} "
                                              "input partitions")
        # Not a violation by itself: the worker counts a partial re-sent by a restarted ingest stage, whose
        # data the release did hold, as late too. ``check_partials_before_release`` tells the two apart.
        report.stats[f"{query}: late partials counted"] = int(late)
