"""The invariants a run must keep, checked from the topics, Redis and the ground truth.

* **Exactly once**: every (query, window, group) of the truth is released
  under one ``release_id``; repeated deliveries of an id carry identical
  records (one noise draw per window, never two).
* **Nothing lost**: every partial of the truth is on the partials topic,
  every copy of it identical, and equal to the truth; released noisy values
  are within a wide band around the true totals.
* **Budgets**: each unit's spend is exactly the cost of the windows it was
  admitted to (charged once per window, never twice), never over the limit,
  and the charge records name exactly the windows of the truth.
* **Accounting**: per query, every produced message is accepted into a
  window, rejected or late; the dead-letter topic holds each rejected and
  late message (by source offset, possibly more than once after a replay)
  with one reason, and the deliberately late events are there as ``late``.
"""

from __future__ import annotations

import json
import math
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import jsonschema
import orjson
import redis

from stream_dp.budget import RedisBudgetStore
from stream_dp.budget.policy import BudgetPolicy
from stream_dp.worker.records import PartialAggregate, WireFormatError, decode_internal
from tests.reliability.reference import Reference
from tests.reliability.topics import TopicRecord

# Released values must lie within this many 95% half-widths of the truth. For
# Laplace noise the half-width is b ln 20, so a draw falls outside with
# probability 20**-7 < 1e-9: over the ~10^3 checks of the 20-run suite a false
# failure has probability below 1e-6.
NOISE_BAND_HALF_WIDTHS = 7.0
# Fixed point: each charge is rounded up to 1e-6.
SPEND_TOLERANCE_PER_WINDOW = 2e-6
RELEASE_SCHEMA = Path(__file__).resolve().parents[2] / "deploy" / "schemas" / "release.schema.json"


@dataclass
class Observed:
    """What a run left behind."""

    input_topic: str
    input_records: list[TopicRecord]
    partials: list[TopicRecord]
    outputs: dict[str, list[TopicRecord]]  # query -> output topic records
    dead_letters: list[TopicRecord]
    deliberately_late: set[bytes]  # values of the events sent late on purpose
    public_groups: dict[str, list[tuple]]
    window_ms: int


@dataclass
class CheckReport:
    violations: list[str] = field(default_factory=list)
    kinds: Counter = field(default_factory=Counter)  # violation kind -> how many
    stats: dict[str, int] = field(default_factory=dict)

    def fail(self, kind: str, message: str) -> None:
        self.kinds[kind] += 1
        if len(self.violations) < 200:
            self.violations.append(f"[{kind}] {message}")

    def count(self, name: str, n: int = 1) -> None:
        self.stats[name] = self.stats.get(name, 0) + n


def dead_letter_sources(observed: Observed) -> dict[tuple[str, int, int], set[str]]:
    """(query, partition, offset) of each dead-lettered input message -> its reasons."""
    sources: dict[tuple[str, int, int], set[str]] = defaultdict(set)
    for record in observed.dead_letters:
        source = record.headers.get("source", b"").decode()
        parts = source.rsplit("/", 2)
        if len(parts) != 3 or parts[0] != observed.input_topic:
            continue
        query = record.headers.get("query", b"").decode()
        sources[(query, int(parts[1]), int(parts[2]))].add(record.headers.get("reason", b"").decode())
    return sources


def late_by_query(observed: Observed) -> dict[str, set[tuple[int, int]]]:
    late: dict[str, set[tuple[int, int]]] = defaultdict(set)
    for (query, partition, offset), reasons in dead_letter_sources(observed).items():
        if "late" in reasons:
            late[query].add((partition, offset))
    return late


def check_outputs(observed: Observed, reference: Reference, report: CheckReport) -> None:
    for query, records in observed.outputs.items():
        by_id: dict[str, list[dict]] = defaultdict(list)
        for record in records:
            by_id[orjson.loads(record.value)["release_id"]].append(orjson.loads(record.value))
        ids_per_group: dict[tuple[int, tuple], set[str]] = defaultdict(set)
        for release_id, copies in by_id.items():
            if any(c != copies[0] for c in copies[1:]):
                report.fail("noise drawn twice",
                            f"{query}: release {release_id} was published with {len(copies)} differing values")
            first = copies[0]
            ids_per_group[(first["window"]["start_ms"], tuple(first["group"].values()))].add(release_id)
            report.count("duplicate deliveries", len(copies) - 1)
        for (start, group), ids in ids_per_group.items():
            if len(ids) > 1:
                report.fail("released twice", f"{query}: window {start} group {group} released under {len(ids)} release ids")
        expected = reference.windows.get(query, set())
        released = {start for start, _ in ids_per_group}
        for start in sorted(expected):
            for group in observed.public_groups[query]:
                if (start, group) not in ids_per_group:
                    report.fail("window lost", f"{query}: window {start} group {group} was never released")
        # Public groups are released every window, data or not: a gap between released windows
        # would tell, without noise, that nobody's events made it into those windows.
        if expected:
            for start in range(min(expected), max(expected) + 1, observed.window_ms):
                if start not in expected and start not in released:
                    report.fail("empty window not released", f"{query}: window {start} (no data) was never released")
        if expected:
            inside = [s for s in released - expected if min(expected) <= s <= max(expected)]
            for start in inside:
                report.fail("unexpected window", f"{query}: window {start} released but the truth has no data in it")
        report.count("windows released", len(released & expected))
        for release_id, copies in by_id.items():
            record = copies[0]
            start = record["window"]["start_ms"]
            if start not in expected:
                continue
            true_count, true_sum = reference.totals(query, start).get(tuple(record["group"].values()), (0, 0.0))
            for name, truth in (("count", true_count), ("sum", true_sum)):
                value, half_width = record[name], record["ci95"][name]
                if value is None or half_width is None:
                    report.fail("bad record", f"{query}: release {release_id} has no {name} or no ci95")
                    continue
                # Counts are clamped at 0 (post-processing), which only moves them towards a true value >= 0.
                if abs(value - truth) > NOISE_BAND_HALF_WIDTHS * half_width + 1:
                    report.fail("noisy value off", f"{query}: window {start} group {record['group']} {name}={value} is "
                                f"{abs(value - truth):.1f} from the truth {truth} (95% half-width {half_width:.1f})")


def _same_partial(a: PartialAggregate, b: PartialAggregate) -> bool:
    return (a.groups == b.groups and a.count.tolist() == b.count.tolist()
            and (a.sum is None) == (b.sum is None) and (a.sum is None or a.sum.tolist() == b.sum.tolist())
            and a.distinct_units.tolist() == b.distinct_units.tolist()
            and (a.units_charged, a.units_excluded, a.window_end_ms, a.input_partitions)
            == (b.units_charged, b.units_excluded, b.window_end_ms, b.input_partitions))


def check_partials(observed: Observed, reference: Reference, partitions: int, report: CheckReport) -> None:
    copies: dict[tuple[str, int, int], list[PartialAggregate]] = defaultdict(list)
    for record in observed.partials:
        try:
            message = decode_internal(record.value)
        except WireFormatError as exc:
            report.fail("corrupt partial", f"partials topic record {record.partition}@{record.offset} does not decode: {exc}")
            continue
        if isinstance(message, PartialAggregate):
            copies[(message.query, message.window_start_ms, message.partition)].append(message)
    for key, found in copies.items():
        report.count("partial copies", len(found))
        if any(not _same_partial(found[0], other) for other in found[1:]):
            report.fail("partial copies differ", f"partial {key} was published {len(found)} times with different contents")
        if key not in reference.partials:
            report.fail("partial not in truth", f"partial {key} is on the partials topic but not in the truth")
    for key, expected in reference.partials.items():
        found = copies.get(key)
        if not found:
            report.fail("partial lost", f"partial {key} of the truth never reached the partials topic (window data lost)")
            continue
        got = found[0]
        truth_groups = [list(g) for g in expected.groups]
        if [list(g) for g in got.groups] != truth_groups or got.count.tolist() != expected.count:
            got_counts = dict(zip(map(tuple, got.groups), got.count.tolist()))
            report.fail("partial differs", f"partial {key}: counts {got_counts} differ from "
                        f"the truth {dict(zip(expected.groups, expected.count))}")
        elif got.sum is None or not all(math.isclose(x, y, rel_tol=1e-9, abs_tol=1e-9)
                                        for x, y in zip(got.sum.tolist(), expected.sum)):
            report.fail("partial differs", f"partial {key}: sums differ from the truth")
        if (got.units_charged, got.units_excluded) != (len(expected.units) - len(expected.excluded), len(expected.excluded)):
            report.fail("exclusion differs", f"partial {key}: {got.units_charged} units charged and "
                                             f"{got.units_excluded} excluded, the truth "
                        f"has {len(expected.units) - len(expected.excluded)} and {len(expected.excluded)}")
        if got.input_partitions != partitions:
            report.fail("partial differs",
                        f"partial {key}: says {got.input_partitions} input partitions, the topic has {partitions}")


def check_budgets(client: redis.Redis, policy: BudgetPolicy, reference: Reference, report: CheckReport) -> None:
    store = RedisBudgetStore(client, policy)
    latest_end = max((p.window_end_ms for p in reference.partials.values()), default=0)
    for query, namespace in reference.namespace.items():
        limit = policy.namespace(namespace).horizons[0].limit
        units = sorted({u for p in reference.partials.values() if p.query == query for u in p.units})
        for unit in units:
            windows = reference.charged_windows.get((query, unit), 0)
            (spend, *_) = store.spend(namespace, unit, latest_end)
            expected = windows * reference.cost[query]
            if abs(spend.spent - expected) > SPEND_TOLERANCE_PER_WINDOW * max(1, windows):
                report.fail("spend differs", f"{query}: unit {unit} spent {spend.spent:.6f}, the truth charges "
                                             f"{windows} windows = "
                            f"{expected:.6f}")
            if spend.spent > limit + 1e-9:
                report.fail("over limit", f"{query}: unit {unit} spent {spend.spent:.6f}, over its limit {limit}")
        report.count("units checked", len(units))
        prefix = f"dp:c:{namespace}:"
        recorded = {key.decode()[len(prefix):] for key in client.scan_iter(match=f"{prefix}*", count=1000)}
        truth = {p.charge_id for p in reference.partials.values() if p.query == query}
        for charge_id in sorted(recorded - truth):
            report.fail("charge not in truth",
                        f"{query}: charge {charge_id} is recorded in Redis but is no window partial of the truth")
        for charge_id in sorted(truth - recorded):
            report.fail("never charged", f"{query}: window partial {charge_id} of the truth was never charged")


def check_ledger(client: redis.Redis, reference: Reference, report: CheckReport) -> None:
    for query, starts in reference.windows.items():
        for start in sorted(starts):
            state = client.hget(f"stream-dp:ledger:{{{query}}}:{start}", "state")
            if state != b"published":
                report.fail("ledger", f"{query}: release ledger entry of window {start} is {state!r}, not published")


def check_accounting(observed: Observed, reference: Reference, report: CheckReport) -> None:
    sources = dead_letter_sources(observed)
    values = {(r.partition, r.offset): r.value for r in observed.input_records}
    late_values = {(r.partition, r.offset) for r in observed.input_records if r.value in observed.deliberately_late}
    for record in observed.dead_letters:
        parts = record.headers.get("source", b"").decode().rsplit("/", 2)
        if len(parts) == 3 and parts[0] == observed.input_topic:
            original = values.get((int(parts[1]), int(parts[2])))
            if original is not None and len(original) <= 900_000 and record.value != original:
                report.fail("dead letter altered", f"dead letter of {parts[1]}@{parts[2]} does not hold the original message")
    for query in reference.namespace:
        mine = {(p, o): reasons for (q, p, o), reasons in sources.items() if q == query}
        for source, reasons in mine.items():
            if len(reasons) > 1:
                report.fail("several reasons",
                            f"{query}: message {source} was dead-lettered with several reasons {sorted(reasons)}")
        late = {s for s, reasons in mine.items() if "late" in reasons}
        rejected = {s: next(iter(r)) for s, r in mine.items() if "late" not in r}
        truth = {(p, o): reason for (q, p, o), reason in reference.rejections.items() if q == query}
        if rejected != truth:
            missing = sorted(set(truth) - set(rejected))[:5]
            extra = sorted(set(rejected) - set(truth))[:5]
            report.fail("rejections differ",
                        f"{query}: dead-lettered rejections differ from the truth (missing {missing}, extra {extra})")
        for source in sorted(late_values - late):
            report.fail("late not dead-lettered",
                        f"{query}: the late event at {source} is not in the dead-letter topic as late")
        produced = len(observed.input_records)
        accepted = reference.accepted[query]
        # The truth leaves out the dead-lettered late events and the deliberately late ones
        # (those missing from the dead-letter topic are reported above).
        late_all = late | late_values
        if accepted + len(truth) + len(late_all) != produced:
            report.fail("accounting", f"{query}: accepted {accepted} + rejected {len(truth)} + late {len(late_all)} "
                                      f"!= produced {produced}")
        report.stats["produced"] = produced
        report.stats[f"{query}: accepted"] = accepted
        report.stats[f"{query}: rejected"] = len(rejected)
        report.stats[f"{query}: late"] = len(late)
        report.stats[f"{query}: late not dead-lettered"] = len(late_values - late)
        report.stats[f"{query}: excluded events"] = reference.excluded_events[query]
    report.count("dead letters", len(observed.dead_letters))
    reasons = Counter(r.headers.get("reason", b"").decode() for r in observed.dead_letters)
    for reason, n in reasons.items():
        report.count(f"dead letters: {reason}", n)


def _strings(value: object) -> Iterator[str]:
    """Every string in a JSON value, keys included."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield str(key)
            yield from _strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)


def check_release_records(values: Iterable[bytes], unit_ids: set[str], report: CheckReport) -> None:
    """Every output record matches the release schema and names no privacy unit anywhere."""
    validator = jsonschema.Draft202012Validator(json.loads(RELEASE_SCHEMA.read_text()),
                                                format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)
    for value in values:
        record = orjson.loads(value)
        errors = sorted(validator.iter_errors(record), key=lambda e: list(e.path))
        if errors:
            report.fail("schema", f"release {record.get('release_id')}: {errors[0].message} at {list(errors[0].path)}")
        leaked = unit_ids.intersection(_strings(record))
        if leaked:
            report.fail("unit id in output", f"release {record.get('release_id')} holds unit ids {sorted(leaked)[:3]}")
        report.count("release records validated")


def check_metrics_text(texts: Iterable[str], unit_ids: set[str], secrets: Iterable[str], report: CheckReport) -> None:
    """No metric carries a unit id as a label value, and no secret appears anywhere in /metrics."""
    from tests.reliability.workers import parse_metrics

    secrets = [x for x in secrets if x]
    for text in texts:
        for secret in secrets:
            if secret in text:
                report.fail("secret in metrics", "a secret appears in /metrics")
        for name, labels, _ in parse_metrics(text):
            leaked = unit_ids.intersection(labels.values())
            if leaked:
                report.fail("unit id label", f"metric {name} has unit ids {sorted(leaked)[:3]} as label values")
        report.count("metric pages checked")
