"""The invariants a run must keep, checked from the topics and the worker's counters against the model.

The truth is ``model.Truth``, computed from the README's semantics alone;
each check is pure (evidence in, violations out) and ``test_checks`` shows
every one of them rejecting doctored evidence.

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
  window, rejected or late; the messages dead-lettered as late are exactly
  the model's late set (a fault that makes on-time events late fails), the
  rejected ones exactly its rejected set, each with one reason and the
  original bytes.
* **Completeness**: no window was released without an input partition's
  partial, and no partial arrived after its window's release.
* **Publication start**: a query over public groups publishes every window
  from its first one, the window holding the Redis clock at the query's first
  start less ``allowed_lateness`` (the README's rule), data or not: its first
  published window lies between those of the run's bounds on that start, and
  no window after it is missing.
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

from tests.reliability.evidence import Partial, read_partials
from tests.reliability.model import Truth
from tests.reliability.topics import TopicRecord

# Released values must lie within this many 95% half-widths of the truth. For
# Laplace noise the half-width is b ln 20, so a draw falls outside with
# probability 20**-7 < 1e-9: over the ~10^3 checks of the 20-run suite a false
# failure has probability below 1e-6.
NOISE_BAND_HALF_WIDTHS = 7.0
RELEASE_SCHEMA = Path(__file__).resolve().parents[2] / "deploy" / "schemas" / "release.schema.json"


@dataclass
class Observed:
    """What a run left behind."""

    input_topic: str
    input_records: list[TopicRecord]
    partials: list[TopicRecord]
    outputs: dict[str, list[TopicRecord]]  # query -> output topic records
    dead_letters: list[TopicRecord]
    public_groups: dict[str, list[tuple]]
    window_ms: int
    planted_partials: set[tuple[int, int]] = field(default_factory=set)  # (partition, offset) a fault wrote
    #: (earliest, latest) wall-clock ms the queries can have first started at (the first worker launched; a
    #: release seen before any event was sent), and their allowed_lateness; None: not judged.
    started_between: tuple[int, int] | None = None
    lateness_ms: int = 0
    selected: set[str] = field(default_factory=set)  # queries whose groups partition selection picks
    without_sum: set[str] = field(default_factory=set)  # queries that release counts only


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


def is_copy_of(record: TopicRecord, original: bytes | None) -> bool:
    """Whether a dead-letter record is the bounded copy of ``original`` (``stream_dp.wire.letters``): its
    head, its size and its digest."""
    from stream_dp.wire.chunks import payload_digest
    from stream_dp.wire.letters import DEAD_LETTER_HEAD_BYTES

    original = original or b""
    return (record.value or b"") == original[:DEAD_LETTER_HEAD_BYTES] \
        and record.headers.get("size") == str(len(original)).encode() \
        and record.headers.get("digest") == payload_digest(original).encode()


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


def accepted_by_coarser_clock(model_late: dict[str, set[tuple[int, int]]],
                              dead_lettered_late: dict[str, set[tuple[int, int]]],
                              sent_late: set[tuple[int, int]],
                              late_ends: dict[str, dict[tuple[int, int], int]],
                              ) -> dict[str, set[tuple[int, int]]]:
    """Per query, the events the model calls late that the worker accepted, when they may count as on time.

    A worker judges each batch it reads by the records of earlier batches, and its clock is the lowest of its
    active partitions' (``docs/concepts/how-it-works.md``, "Windows"); the model's is per record and per
    partition. Which records shared a worker batch is not in the evidence (a backlog read after an outage can
    be thousands), so the worker may accept any event the model calls late, as long as its verdicts in each
    partition fit one closure that never goes back and never passes the model's clock:

    * every event it dead-lettered as late is late by the model (no on-time event made late);
    * no accepted event lies in a window at or before that of an event it dead-lettered as late at an earlier
      offset of the same partition (a closed window is never reopened);
    * no event sent late on purpose (late by far more than any batch) was accepted.

    Empty (judge by the model's late set, so the late-set check names the difference) unless all three hold.
    """
    accepted = {q: late - dead_lettered_late.get(q, set()) for q, late in model_late.items()}
    if not any(accepted.values()) or any(sent_late & events for events in accepted.values()):
        return {}
    if any(not dead_lettered_late.get(q, set()) <= late for q, late in model_late.items()):
        return {}
    for query, events in accepted.items():
        ends = late_ends.get(query, {})
        closed: dict[int, list[tuple[int, int]]] = defaultdict(list)  # partition -> (offset, window end) dead-lettered
        for partition, offset in dead_lettered_late.get(query, set()):
            closed[partition].append((offset, ends[(partition, offset)]))
        for partition, offset in events:
            if any(o <= offset and ends[(partition, offset)] <= end for o, end in closed.get(partition, ())):
                return {}
    return {q: events for q, events in accepted.items() if events}


def late_by_query(observed: Observed) -> dict[str, set[tuple[int, int]]]:
    late: dict[str, set[tuple[int, int]]] = defaultdict(set)
    for (query, partition, offset), reasons in dead_letter_sources(observed).items():
        if "late" in reasons:
            late[query].add((partition, offset))
    return late


def check_outputs(observed: Observed, truth: Truth, report: CheckReport) -> None:
    for query, records in observed.outputs.items():
        by_id: dict[str, list[dict]] = defaultdict(list)
        tops: dict[str, list[dict]] = defaultdict(list)  # the top_k records of a top_k query
        for record in records:
            value = orjson.loads(record.value)
            (tops if value.get("kind") == "top_k" else by_id)[value["release_id"]].append(value)
        ids_per_group: dict[tuple[int, tuple], set[str]] = defaultdict(set)
        public = {tuple(g) for g in observed.public_groups[query]}
        selected = query in observed.selected
        if tops:
            _check_top_k(query, tops, {c[0]["window"]["start_ms"] for c in by_id.values()}, public,
                         observed.window_ms, report)
        for release_id, copies in by_id.items():
            window, group = copies[0]["window"], tuple(copies[0]["group"].values())
            # Selection releases only groups with data: no noise can make a group of no unit pass it.
            allowed = ({g for g, (count, _) in truth.totals(query, window["start_ms"]).items() if count}
                       if selected else public)
            if window["start_ms"] % observed.window_ms or window["end_ms"] - window["start_ms"] != observed.window_ms \
                    or group not in allowed:
                report.fail("unexpected window", f"{query}: release {release_id} is of window {window['start_ms']}.."
                            f"{window['end_ms']} group {group}: not a window of the query's grid and public groups")
            if any(c != copies[0] for c in copies[1:]):
                report.fail("noise drawn twice",
                            f"{query}: release {release_id} was published with {len(copies)} differing values")
            first = copies[0]
            ids_per_group[(first["window"]["start_ms"], tuple(first["group"].values()))].add(release_id)
            report.count("duplicate deliveries", len(copies) - 1)
        for (start, group), ids in ids_per_group.items():
            if len(ids) > 1:
                report.fail("released twice", f"{query}: window {start} group {group} released under {len(ids)} release ids")
        expected = truth.windows(query)
        released = {start for start, _ in ids_per_group}
        for start in sorted(expected):
            for group in observed.public_groups[query]:
                if (start, group) not in ids_per_group:
                    report.fail("window lost", f"{query}: window {start} group {group} was never released")
        # Public groups are released every window, data or not, from the query's first window on: a gap
        # between released windows, or a first window its data chose, would tell without noise which windows
        # somebody's events made it into.
        if selected:  # which windows and groups pass selection is the noise's choice: values are judged below
            checked = set(range(min(expected), max(expected) + 1, observed.window_ms)) if expected else set()
            _check_values(query, by_id, truth, checked, report, query not in observed.without_sum)
            report.count("selected groups released", len(ids_per_group))
            continue
        if released and observed.started_between is not None:
            size, lateness = observed.window_ms, observed.lateness_ms
            earliest, latest = ((t - lateness) // size * size for t in observed.started_between)
            if not earliest <= min(released) <= latest:
                report.fail("first window", f"{query}: the first window released is {min(released)}, not one "
                            f"holding the query's first start less allowed_lateness ({earliest}..{latest})")
        # Up to the stream's last data window: the empty windows after it are released as the wall clock
        # passes them, each home partition on its own, and the workers are stopped at some point of that.
        if expected:
            for start in range(min(expected | released), max(expected) + 1, observed.window_ms):
                if start not in expected and start not in released:
                    report.fail("empty window not released", f"{query}: window {start} (no data) was never released")
        report.count("windows released", len(released & expected))
        if query in truth.period_ms:
            _check_continual(query, by_id, released, truth, observed.window_ms, report)
        # A window between the model's first and last with no data in it (its events late by the broker's stamps
        # after an outage, say) is released as every public window is: its values are checked against zero.
        checked = set(range(min(expected), max(expected) + 1, observed.window_ms)) if expected else set()
        report.count("windows released empty", len((released & checked) - expected))
        _check_values(query, by_id, truth, checked, report, query not in observed.without_sum)


def _check_top_k(query: str, tops: dict[str, list[dict]], windows: set[int], public: set[tuple], window_ms: int,
                 report: CheckReport) -> None:
    """One top-k record per released window, drawn once: k distinct public groups ranked 1..k among all of
    them (docs/queries/top-k.md). Which groups lead is the noise's choice; the counts' records are judged
    like any other."""
    per_window: dict[int, set[str]] = defaultdict(set)
    for release_id, copies in tops.items():
        first = copies[0]
        if any(c != first for c in copies[1:]):
            report.fail("noise drawn twice", f"{query}: top-k release {release_id} published with differing picks")
        window = first["window"]
        per_window[window["start_ms"]].add(release_id)
        ranked = [(entry["rank"], tuple(entry["group"].values())) for entry in first["top"]]
        if window["start_ms"] % window_ms or window["end_ms"] - window["start_ms"] != window_ms \
                or [r for r, _ in ranked] != list(range(1, first["k"] + 1)) \
                or len({g for _, g in ranked}) != first["k"] or not {g for _, g in ranked} <= public \
                or first["candidates"] != len(public):
            report.fail("unexpected window", f"{query}: top-k release {release_id} of window {window['start_ms']} "
                        f"ranks {ranked} among {first['candidates']}: not k distinct public groups ranked 1..k")
    for start, ids in per_window.items():
        if len(ids) > 1:
            report.fail("released twice", f"{query}: window {start}'s top-k released under {len(ids)} release ids")
    for start in sorted(windows - set(per_window)):
        report.fail("window lost", f"{query}: window {start} was released without its top-k record")
    report.count("top-k records", len(per_window))


def _check_continual(query: str, by_id: dict[str, list[dict]], released: set[int], truth: Truth, window_ms: int,
                     report: CheckReport) -> None:
    """Each record's period and place in it (``docs/queries/continual.md``); its tree restarted only at the
    query's first released window of a period: with every window released, a restart elsewhere would add
    fresh noise to totals already published (the tree's state is stored with every release)."""
    for release_id, copies in by_id.items():
        record = copies[0]
        start, block = record["window"]["start_ms"], record.get("continual") or {}
        period = truth.period_start(query, start)
        first = min(w for w in released if truth.period_start(query, w) == period)
        if block.get("period_start_ms") != period or block.get("window_index") != (start - period) // window_ms + 1 \
                or block.get("period_end_ms") != period + truth.period_ms[query]:
            report.fail("continual period", f"{query}: release {release_id} of window {start} states period "
                        f"{block.get('period_start_ms')} window {block.get('window_index')}, not period {period} "
                        f"window {(start - period) // window_ms + 1}")
        restarted = block.get("tree_restarted_ms")
        if restarted is not None and restarted != first or restarted is None and first != period:
            report.fail("tree restarted", f"{query}: window {start}'s running totals restart at {restarted}; the "
                        f"query's first window of period {period} is {first}")


def _check_values(query: str, by_id: dict[str, list[dict]], truth: Truth, checked: set[int],
                  report: CheckReport, sums: bool = True) -> None:
    """Every released value of a window in ``checked`` within the noise band around the model's total
    (``sums``: the query releases sums too)."""
    for release_id, copies in by_id.items():
        record = copies[0]
        start = record["window"]["start_ms"]
        if start not in checked:
            continue
        # A continual query releases running totals: from its period's start, or the window its tree restarted at.
        totals = (truth.running_totals(query, start, (record.get("continual") or {}).get("tree_restarted_ms"))
                  if query in truth.period_ms else truth.totals(query, start))
        true_count, true_sum = totals.get(tuple(record["group"].values()), (0, 0.0))
        for name, exact in (("count", true_count), ("sum", true_sum))[:2 if sums else 1]:
            value, half_width = record.get(name), (record.get("ci95") or {}).get(name)
            if value is None or half_width is None:
                report.fail("bad record", f"{query}: release {release_id} has no {name} or no ci95")
                continue
            # Counts are clamped at 0 (post-processing), which only moves them towards a true value >= 0.
            if abs(value - exact) > NOISE_BAND_HALF_WIDTHS * half_width + 1:
                report.fail("noisy value off", f"{query}: window {start} group {record['group']} {name}={value} is "
                            f"{abs(value - exact):.1f} from the truth {exact} (95% half-width {half_width:.1f})")


def _cells(partial: Partial) -> dict[tuple, tuple[int, float, int]]:
    sums = partial.sum if partial.sum is not None else [0.0] * len(partial.groups)
    return {tuple(g): (c, s, d) for g, c, s, d in zip(partial.groups, partial.count, sums, partial.distinct_units) if c}


def check_partials(observed: Observed, truth: Truth, partitions: int, report: CheckReport) -> None:
    """Every partial of the model is on the partials topic, every copy identical, and exactly the model's
    (read with ``evidence``'s decoders, written from the documented wire format)."""
    copies: dict[tuple[str, int, int], list[Partial]] = defaultdict(list)
    whole, errors = read_partials(observed.partials, observed.planted_partials)
    for error in errors:
        report.fail("corrupt partial", f"{error} does not decode")
    for copy in whole:
        message = copy.partial
        copies[(message.query, message.window_start_ms, message.partition)].append(message)
    for key, found in copies.items():
        report.count("partial copies", len(found))
        if any(not found[0].same_as(other) for other in found[1:]):
            report.fail("partial copies differ", f"partial {key} was published {len(found)} times with different contents")
        if key not in truth.partials:
            report.fail("partial not in truth", f"partial {key} is on the partials topic but the model has no data there")
    for key, expected in truth.partials.items():
        found = copies.get(key)
        if not found:
            report.fail("partial lost", f"partial {key} of the model never reached the partials topic (window data lost)")
            continue
        got, want = _cells(found[0]), {g: tuple(c) for g, c in expected.groups.items() if c[0]}
        if {g: (c, d) for g, (c, _, d) in got.items()} != {g: (c, d) for g, (c, _, d) in want.items()}:
            report.fail("partial differs", f"partial {key}: (count, distinct units) per group {got} differ from "
                                           f"the model's {want}")
        elif not all(math.isclose(got[g][1], want[g][1], rel_tol=1e-9, abs_tol=1e-9) for g in want):
            report.fail("partial differs", f"partial {key}: clipped sums {got} differ from the model's {want}")
        charged, excluded = len(expected.units) - len(expected.excluded), len(expected.excluded)
        if (found[0].units_charged, found[0].units_excluded) != (charged, excluded):
            report.fail("exclusion differs", f"partial {key}: {found[0].units_charged} units charged and "
                                             f"{found[0].units_excluded} excluded, the model has {charged} and {excluded}")
        public = [tuple(g) for g in observed.public_groups.get(key[0]) or []]
        positions = [public.index(g) if g in public else -1 for g in found[0].groups]
        if public and found[0].public_positions != positions:
            report.fail("partial differs", f"partial {key}: public positions {found[0].public_positions} are not the "
                                           f"groups' places in the public list {positions}")
        if found[0].input_partitions != partitions:
            report.fail("partial differs",
                        f"partial {key}: says {found[0].input_partitions} input partitions, the topic has {partitions}")


def check_partials_before_release(observed: Observed, truth: Truth, report: CheckReport) -> None:
    """No partial of the model first reached the partials topic after its window's release was published
    (both topics stamped by the broker): such a window was released without that partition's data."""
    first_copy: dict[tuple[str, int, int], int] = {}
    whole, _ = read_partials(observed.partials, observed.planted_partials)
    for copy in whole:  # stamped with its last chunk's arrival
        key = (copy.partial.query, copy.partial.window_start_ms, copy.partial.partition)
        first_copy[key] = min(copy.timestamp, first_copy.get(key, copy.timestamp))
    published: dict[tuple[str, int], int] = {}
    for query, records in observed.outputs.items():
        for record in records:
            key = (query, orjson.loads(record.value)["window"]["start_ms"])
            published[key] = min(record.timestamp, published.get(key, record.timestamp))
    for (query, start, partition) in sorted(truth.partials):
        arrived, released = first_copy.get((query, start, partition)), published.get((query, start))
        if arrived is not None and released is not None and arrived > released:
            report.fail("partial after release", f"{query}: the partial of window {start} partition {partition} "
                        f"reached the partials topic {arrived - released} ms after the window was published")


def check_accounting(observed: Observed, truth: Truth, report: CheckReport) -> None:
    """Late and rejected messages exactly the model's, dead letters true copies, nothing unaccounted for."""
    sources = dead_letter_sources(observed)
    values = {(r.partition, r.offset): r.value for r in observed.input_records}
    for record in observed.dead_letters:
        parts = record.headers.get("source", b"").decode().rsplit("/", 2)
        if len(parts) == 3 and parts[0] == observed.input_topic:
            key = (int(parts[1]), int(parts[2]))
            if key in values and not is_copy_of(record, values[key]):
                report.fail("dead letter altered", f"dead letter of {parts[1]}@{parts[2]} is not the bounded copy "
                            "(head, size, digest) of the original message")
    produced = len(observed.input_records)
    for query in truth.namespace:
        mine = {(p, o): reasons for (q, p, o), reasons in sources.items() if q == query}
        for source, reasons in mine.items():
            if len(reasons) > 1:
                report.fail("several reasons",
                            f"{query}: message {source} was dead-lettered with several reasons {sorted(reasons)}")
        late = {s for s, reasons in mine.items() if "late" in reasons}
        rejected = {s for s, reasons in mine.items() if "late" not in reasons}
        for name, got, want in (("late", late, truth.late[query]), ("rejected", rejected, truth.rejected[query])):
            if got != want:
                report.fail(f"{name} set differs", f"{query}: {len(got)} messages dead-lettered as {name}, the model has "
                            f"{len(want)}; not in the model: {sorted(got - want)[:5]}, missing: {sorted(want - got)[:5]}")
        accepted = truth.accepted[query]
        if accepted + len(rejected | late) != produced:
            report.fail("accounting", f"{query}: accepted {accepted} + dead-lettered {len(rejected | late)} "
                                      f"!= produced {produced}")
        report.stats["produced"] = produced
        report.stats[f"{query}: accepted"] = accepted
        report.stats[f"{query}: rejected"] = len(rejected)
        report.stats[f"{query}: late"] = len(late)
        report.stats[f"{query}: excluded units"] = sum(len(p.excluded) for (q, _, _), p in truth.partials.items()
                                                       if q == query)
    report.count("dead letters", len(observed.dead_letters))
    for reason, n in Counter(r.headers.get("reason", b"").decode() for r in observed.dead_letters).items():
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
