"""Every invariant check accepts clean evidence and rejects doctored evidence (no services needed).

The clean evidence is a small world built from the model itself: a seeded
stream, the partials, outputs, dead letters, Redis state and counters a
correct worker would leave. Each test doctors one thing and expects exactly
the violation that describes it.
"""

from __future__ import annotations

import copy
import time

import numpy as np
import orjson
import pytest

from stream_dp.config import load_config
from stream_dp.wire.letters import dead_letter_record
from stream_dp.worker.partials.wire import PartialAggregate, encode_partial
from tests.reliability.checks import (
    CheckReport,
    accepted_by_coarser_clock,
    Observed,
    check_accounting,
    check_metrics_text,
    check_outputs,
    check_partials,
    check_partials_before_release,
    check_release_records,
)
from tests.reliability.evidence import canonical
from tests.reliability.model import FIXED_POINT, compute_truth
from tests.reliability.state_checks import RedisEvidence, check_budgets, check_completeness, check_ledger
from tests.reliability.topics import TopicRecord
from tests.reliability.workload import CLIP, MAX_EVENTS, MAX_GROUPS, StreamSpec, encode_event, schedule, write_config

SECRET = b"checks-secret-0123456789abcdef"
PARTITIONS = 3


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    spec = StreamSpec(seed=5, duration_s=12.0, rate_per_s=150.0, gaussian=True, selected=True, top_k=True,
                      continual=True)
    path = tmp_path_factory.mktemp("checks") / "queries.yaml"
    write_config(path, "w", "in", spec)
    config = load_config(path)
    start_ms = (int(time.time() * 1000) - 60_000) // 2000 * 2000
    offsets: dict[int, int] = {}
    inputs = []
    for event in schedule(spec):
        offset = offsets[event.partition] = offsets.get(event.partition, -1) + 1
        inputs.append(TopicRecord(event.partition, offset, event.unit.encode(), encode_event(event, start_ms), {},
                                  start_ms + int(event.at_s * 1000)))
    truth = compute_truth(config, SECRET, inputs)
    partials = []
    public = {q.name: [tuple(g) for g in q.public_group_keys() or []] for q in config.queries}
    for i, ((query, start, partition), p) in enumerate(sorted(truth.partials.items())):
        groups = sorted(p.groups)
        positions = np.array([public[query].index(g) for g in groups], dtype=np.int64) if public[query] else None
        partials.append(TopicRecord(0, i, None, encode_partial(PartialAggregate(
            query, start, start + 2000, partition, PARTITIONS, groups, np.array([p.groups[g][0] for g in groups]),
            np.array([p.groups[g][1] for g in groups]), np.array([p.groups[g][2] for g in groups]),
            len(p.units) - len(p.excluded), len(p.excluded), start + 3000, public_positions=positions)), {}))
    outputs: dict[str, list[TopicRecord]] = {}
    for query in truth.namespace:
        for start in sorted(truth.windows(query)):
            continual = None
            if query in truth.period_ms:  # running totals; the tree starts at the query's first window of a period
                period = truth.period_start(query, start)
                first = min(w for w in truth.windows(query) if truth.period_start(query, w) == period)
                continual = {"period_start": "2026-01-01T00:00:00.000Z", "period_start_ms": period,
                             "period_end_ms": period + truth.period_ms[query],
                             "window_index": (start - period) // 2000 + 1, "windows_per_period": 5,
                             "max_windows_per_unit": 2, "tree_restarted_ms": None if first == period else first}
            for page in ("home", "search", "cart"):
                count, total = (truth.running_totals(query, start, continual["tree_restarted_ms"]) if continual
                                else truth.totals(query, start)).get((page,), (0, 0.0))
                if query.endswith("_select") and not count:
                    continue  # selection never releases a group without data
                outputs.setdefault(query, []).append(_release(query, start, page, count + 1, total, continual))
            if query.endswith("_top"):
                outputs[query].append(_top_k(query, start, [("search",), ("home",)]))
    dead = []
    for i, (q, (p, o), values) in enumerate(
            (q, s, [r.value for r in inputs if (r.partition, r.offset) == s]) for q in truth.late for s in truth.late[q]):
        head, headers = dead_letter_record(values[0], [("source", f"in/{p}/{o}".encode()), ("query", q.encode()),
                                                       ("reason", b"late")], 1_000_000)
        dead.append(TopicRecord(0, i, None, head, dict(headers)))
    observed = Observed("in", inputs, partials, outputs, dead,
                        {q.name: q.public_group_keys() or [] for q in config.queries}, 2000,
                        selected={q.name for q in config.queries if q.public_group_keys() is None})
    evidence = RedisEvidence()
    for (namespace, unit), admitted in truth.admitted.items():
        query = next(q for q, ns in truth.namespace.items() if ns == namespace)
        evidence.spend[(namespace, unit)] = truth.spent_per_limit(namespace, unit, query)
    for query, namespace in truth.namespace.items():
        evidence.charge_records.setdefault(namespace, set()).update(truth.charge_ids(query))
        for start in truth.windows(query):
            evidence.ledger[(query, start)] = (b"published", {canonical(orjson.loads(r.value)) for r in outputs[query]
                                                              if orjson.loads(r.value)["window"]["start_ms"] == start})
    for (query, start, partition), p in truth.partials.items():
        evidence.charge_units[f"{query}/{start}/{partition}"] = set(p.units)
    for (query, start, partition), units in truth.first_units.items():
        evidence.first_units[f"{query}/{start}/{partition}"] = set(units)
    return observed, truth, evidence


def _release(query: str, start: int, page: str, count: float, total: float,
             continual: dict | None = None) -> TopicRecord:
    record = {"release_id": f"{query}:{start}:{page}", "query": query,
              "window": {"start": "2026-01-01T00:00:00.000Z", "end": "2026-01-01T00:00:02.000Z",
                         "start_ms": start, "end_ms": start + 2000},
              "group": {"page": page}, "count": count, "sum": total, "mean": 1.0,
              "ci95": {"count": 3.0, "sum": 30.0, "mean": 10.0}, "std": {"count": 1.4, "sum": 14.1},
              "privacy": {"namespace": "ns", "unit_field": "user_id", "mechanism": "laplace", "epsilon": 1.0,
                          "delta": 0.0, "rho": None, "count_scale": 1.0, "sum_scale": 10.0, "groups": "public",
                          "max_groups_per_unit": MAX_GROUPS, "max_events_per_group": MAX_EVENTS, "clip": list(CLIP),
                          "charged": "per_window", "trust_model": "central"},
              "released_at_ms": 1, "released_at": "2026-01-01T00:00:03.000Z"}
    if continual is not None:
        record["continual"] = continual
    return TopicRecord(0, 0, None, orjson.dumps(record), {})


def _top_k(query: str, start: int, ranked: list[tuple], *, candidates: int = 3) -> TopicRecord:
    record = {"query": query, "kind": "top_k", "release_id": f"{query}:{start}:top",
              "window": {"start": "2026-01-01T00:00:00.000Z", "end": "2026-01-01T00:00:02.000Z",
                         "start_ms": start, "end_ms": start + 2000},
              "k": len(ranked), "top": [{"rank": i, "group": {"page": g[0]}} for i, g in enumerate(ranked, 1)],
              "candidates": candidates, "privacy": {}, "released_at_ms": 1, "released_at": "2026-01-01T00:00:03.000Z"}
    return TopicRecord(0, 0, None, orjson.dumps(record), {})


def _all_checks(observed, truth, evidence, counts=None) -> CheckReport:
    report = CheckReport()
    check_outputs(observed, truth, report)
    check_partials(observed, truth, PARTITIONS, report)
    check_accounting(observed, truth, report)
    check_budgets(evidence, truth, report)
    check_ledger(evidence, observed.outputs, truth, report)
    check_completeness(counts or {q: (0.0, 0.0) for q in truth.namespace}, report)
    return report


def test_the_clean_world_passes_every_check(world):
    observed, truth, evidence = world
    report = _all_checks(observed, truth, evidence)
    assert not report.violations, report.violations
    assert truth.late and all(truth.late.values()), "the world must hold late events for the late-set checks"
    assert any(p.excluded for p in truth.partials.values()), "and excluded units for the budget checks"
    cont = [p for (q, _, _), p in truth.partials.items() if q in truth.period_ms]
    assert any(p.excluded for p in cont) and len({truth.period_start("w_cont", s) for s in truth.windows("w_cont")}) > 1


def _doctor_continual(observed: Observed, nth: int, **block) -> Observed:
    """The continual query's records of its ``nth`` window (from 0) with ``block`` in their continual block."""
    doctored = copy.copy(observed)
    starts = sorted({orjson.loads(r.value)["window"]["start_ms"] for r in observed.outputs["w_cont"]})
    records = []
    for record in observed.outputs["w_cont"]:
        value = orjson.loads(record.value)
        if value["window"]["start_ms"] == starts[nth]:
            value["continual"] = {**value["continual"], **block}
            record = TopicRecord(0, 0, None, orjson.dumps(value), {})
        records.append(record)
    doctored.outputs = {**observed.outputs, "w_cont": records}
    return doctored


def test_continual_checks_reject_a_restarted_tree_a_wrong_period_and_per_window_totals(world):
    observed, truth, _ = world
    starts = sorted(truth.windows("w_cont"))
    later = next(i for i, s in enumerate(starts) if i and truth.period_start("w_cont", s) == truth.period_start(
        "w_cont", starts[i - 1]) and truth.period_start("w_cont", s) != s)
    # the tree restarted within a period whose windows were all released: fresh noise on published totals
    for doctored in (_doctor_continual(observed, later, tree_restarted_ms=starts[later]),
                     _doctor_continual(observed, 0, tree_restarted_ms=starts[0] - 2000)):
        report = CheckReport()
        check_outputs(doctored, truth, report)
        assert report.kinds["tree restarted"] == 3, report.violations  # one per public group
    report = CheckReport()
    check_outputs(_doctor_continual(observed, later, window_index=1, period_start_ms=starts[later]), truth, report)
    assert report.kinds == {"continual period": 3}, report.violations
    # the window's own totals released as if they were the running ones
    doctored = copy.copy(observed)
    doctored.outputs = {**observed.outputs, "w_cont": [
        _release("w_cont", s, page, *truth.totals("w_cont", s).get((page,), (0, 0.0)),
                 orjson.loads(r.value)["continual"])
        for r in observed.outputs["w_cont"] for s, page in [(orjson.loads(r.value)["window"]["start_ms"],
                                                             orjson.loads(r.value)["group"]["page"])]]}
    report = CheckReport()
    check_outputs(doctored, truth, report)
    assert report.kinds["noisy value off"] >= 1 and set(report.kinds) == {"noisy value off"}, report.violations


def test_budget_check_rejects_a_continual_unit_charged_in_a_window_not_its_first_of_the_period(world):
    observed, truth, evidence = world
    # a window with units charged the period, and a later window of its partition in the same period
    (query, start, partition), units, later = next(
        (key, units, later) for key, units in sorted(truth.first_units.items()) if units
        for later in sorted(truth.partials) if later[0] == key[0] and later[2] == key[2] and later[1] > key[1]
        and truth.period_start(key[0], later[1]) == truth.period_start(key[0], key[1]))
    doctored = copy.deepcopy(evidence)
    unit = sorted(units)[0]
    doctored.first_units[f"{query}/{start}/{partition}"] -= {unit}
    doctored.first_units.setdefault(f"{query}/{later[1]}/{partition}", set()).add(unit)
    report = CheckReport()
    check_budgets(doctored, truth, report)
    assert report.kinds["charged units differ"] >= 1, report.violations
    # a fingerprinted continual charge id is the window's; a journal of first units, its own
    from tests.reliability.state_checks import _window_charge

    assert _window_charge(f"{query}/{start}/{partition}/0123456789abcdef") == (f"{query}/{start}/{partition}", False)
    assert _window_charge(f"{query}/{start}/{partition}/0123456789abcdef/first") == (
        f"{query}/{start}/{partition}", True)
    assert _window_charge(f"{query}/{start}/{partition}") == (f"{query}/{start}/{partition}", False)


def _doctor_partial(observed: Observed, index: int, **changes) -> Observed:
    from stream_dp.worker.partials.wire import decode_internal

    doctored = copy.copy(observed)
    partials = list(observed.partials)
    message = decode_internal(partials[index].value)
    fields = {**message.__dict__, **changes}
    partials[index] = TopicRecord(0, index, None, encode_partial(PartialAggregate(**fields)), {})
    doctored.partials = partials
    return doctored


@pytest.mark.parametrize(("changes", "kind"), [
    ({"count": "plus one"}, "partial differs"),
    ({"sum": "doubled"}, "partial differs"),
    ({"units_excluded": "plus one"}, "exclusion differs"),
    ({"input_partitions": 2}, "partial differs"),
])
def test_partials_check_rejects_a_wrong_partial(world, changes, kind):
    observed, truth, evidence = world
    from stream_dp.worker.partials.wire import decode_internal

    original = decode_internal(observed.partials[0].value)
    real = {"plus one": lambda v: v + 1, "doubled": lambda v: v * 2}
    changed = {k: (real[v](getattr(original, k)) if isinstance(v, str) else v) for k, v in changes.items()}
    report = CheckReport()
    check_partials(_doctor_partial(observed, 0, **changed), truth, PARTITIONS, report)
    assert report.kinds[kind] == 1, report.violations


def test_partials_check_rejects_public_positions_that_are_not_the_groups_places(world):
    """A public-groups partial names each group's place in the public list (``public.position``); the release
    adds partials up by them, so a wrong one would count a group's data under another group."""
    observed, truth, _ = world
    from stream_dp.worker.partials.wire import decode_internal

    index = next(i for i, r in enumerate(observed.partials) if len(decode_internal(r.value).groups) > 1)
    original = decode_internal(observed.partials[index].value)
    for positions in (original.public_positions[::-1].copy(), None):  # swapped, or left out
        report = CheckReport()
        check_partials(_doctor_partial(observed, index, public_positions=positions), truth, PARTITIONS, report)
        assert report.kinds == {"partial differs": 1}, report.violations


def test_partials_check_rejects_a_lost_and_a_differing_copy(world):
    observed, truth, _ = world
    lost = copy.copy(observed)
    lost.partials = observed.partials[1:]
    report = CheckReport()
    check_partials(lost, truth, PARTITIONS, report)
    assert report.kinds["partial lost"] == 1, report.violations
    twice = _doctor_partial(observed, 0, closed_at_ms=1)
    twice.partials = twice.partials + [observed.partials[0]]
    from stream_dp.worker.partials.wire import decode_internal

    first = decode_internal(observed.partials[0].value)
    twice = _doctor_partial(twice, 0, count=first.count + 1)
    report = CheckReport()
    check_partials(twice, truth, PARTITIONS, report)
    assert report.kinds["partial copies differ"] == 1, report.violations


def test_accounting_rejects_an_on_time_event_made_late_and_a_late_one_accepted(world):
    observed, truth, _ = world
    on_time = next(r for r in observed.input_records if (r.partition, r.offset) not in truth.late["w_free"])
    made_late = copy.copy(observed)
    made_late.dead_letters = observed.dead_letters + [TopicRecord(
        0, 99, None, on_time.value,
        {"source": f"in/{on_time.partition}/{on_time.offset}".encode(), "query": b"w_free", "reason": b"late"})]
    report = CheckReport()
    check_accounting(made_late, truth, report)
    assert report.kinds["late set differs"] == 1 and report.kinds["accounting"] == 1, report.violations
    accepted_late = copy.copy(observed)
    accepted_late.dead_letters = [d for d in observed.dead_letters if d.headers["query"] != b"w_capped"][:-1] + \
        [d for d in observed.dead_letters if d.headers["query"] == b"w_capped"]
    report = CheckReport()
    check_accounting(accepted_late, truth, report)
    assert report.kinds["late set differs"] == 1, report.violations


def test_accounting_rejects_an_altered_dead_letter(world):
    observed, truth, _ = world
    doctored = copy.copy(observed)
    first = observed.dead_letters[0]
    doctored.dead_letters = [TopicRecord(0, 0, None, b"{}", first.headers)] + observed.dead_letters[1:]
    report = CheckReport()
    check_accounting(doctored, truth, report)
    assert report.kinds["dead letter altered"] == 1, report.violations


def test_outputs_check_rejects_noise_drawn_twice_a_lost_window_and_a_value_off_the_band(world):
    observed, truth, _ = world
    query = "w_free"
    records = observed.outputs[query]
    first = orjson.loads(records[0].value)
    redrawn = TopicRecord(0, 0, None, orjson.dumps(dict(first, count=first["count"] + 2)), {})
    off = TopicRecord(0, 0, None, orjson.dumps(dict(first, sum=first["sum"] + 1000.0)), {})
    for doctored_records, kind in (([*records, redrawn], "noise drawn twice"), (records[3:], "window lost"),
                                   ([off, *records[1:]], "noisy value off")):
        doctored = copy.copy(observed)
        doctored.outputs = {**observed.outputs, query: doctored_records}
        report = CheckReport()
        check_outputs(doctored, truth, report)
        assert report.kinds[kind] >= 1, (kind, report.violations)


def test_outputs_check_rejects_a_first_window_its_data_chose_and_one_before_the_start(world):
    """The first window is the one holding the query's first start less allowed_lateness (bounded by the run):
    releases that begin at the first data window instead, or before the start, fail."""
    observed, truth, _ = world
    query = next(iter(truth.namespace))
    first = min(truth.windows(query))
    lateness = 1_000

    def report_for(started_between, outputs=None) -> CheckReport:
        doctored = copy.copy(observed)
        doctored.started_between, doctored.lateness_ms = started_between, lateness
        if outputs is not None:
            doctored.outputs = {**observed.outputs, query: outputs}
        report = CheckReport()
        check_outputs(doctored, truth, report)
        return report

    assert not report_for((first + lateness, first + lateness + 500)).violations  # started in the first window
    # started three windows before the data, yet nothing was released until the data came
    assert report_for((first - 6_000 + lateness, first - 6_000 + lateness)).kinds["first window"] >= 1
    early = _release(query, first - 4_000, "home", 0.0, 0.0)
    report = report_for((first + lateness, first + lateness), [early, *observed.outputs[query]])
    assert report.kinds["first window"] >= 1 and report.kinds["empty window not released"] >= 1, report.violations


def test_arrival_check_rejects_a_partial_that_reached_the_topic_after_its_window_was_published(world):
    observed, truth, _ = world
    stamped = copy.copy(observed)
    stamped.partials = [TopicRecord(r.partition, r.offset, r.key, r.value, r.headers, 1_000) for r in observed.partials]
    stamped.outputs = {q: [TopicRecord(0, 0, None, r.value, {}, 2_000) for r in rs] for q, rs in observed.outputs.items()}
    report = CheckReport()
    check_partials_before_release(stamped, truth, report)
    assert not report.violations, report.violations
    late = stamped.partials[0]
    stamped.partials = [TopicRecord(0, late.offset, None, late.value, {}, 2_001)] + stamped.partials[1:]
    check_partials_before_release(stamped, truth, report)
    assert report.kinds == {"partial after release": 1}, report.violations


def _doctored_evidence(evidence: RedisEvidence) -> RedisEvidence:
    return copy.deepcopy(evidence)


def test_budget_check_rejects_a_wrong_spend_an_overspend_and_unknown_or_missing_charges(world):
    observed, truth, evidence = world
    namespace = truth.namespace["w_capped"]
    unit = next(u for (ns, u), a in truth.admitted.items() if ns == namespace and len(a) == 3)
    cases = []
    doctored = _doctored_evidence(evidence)
    doctored.spend[(namespace, unit)][0] += 2 * FIXED_POINT  # charged a fourth window: also over its limit of three
    cases.append((doctored, {"spend differs", "over limit"}))
    doctored = _doctored_evidence(evidence)
    doctored.charge_records[namespace].add("w_capped/0/0")
    cases.append((doctored, {"charge not in truth"}))
    doctored = _doctored_evidence(evidence)
    doctored.charge_records[namespace].discard(sorted(truth.charge_ids("w_capped"))[0])
    cases.append((doctored, {"never charged"}))
    doctored = _doctored_evidence(evidence)
    charge_id = sorted(truth.charge_ids("w_capped"))[0]
    doctored.charge_units[charge_id] = doctored.charge_units[charge_id] | {"someone-else"}
    cases.append((doctored, {"charged units differ"}))
    for doctored, kinds in cases:
        report = CheckReport()
        check_budgets(doctored, truth, report)
        assert set(report.kinds) == kinds, (kinds, report.violations)


def test_ledger_check_rejects_an_unpublished_entry_and_an_output_not_stored(world):
    observed, truth, evidence = world
    start = min(truth.windows("w_free"))
    doctored = _doctored_evidence(evidence)
    doctored.ledger[("w_free", start)] = (b"claimed", doctored.ledger[("w_free", start)][1])
    report = CheckReport()
    check_ledger(doctored, observed.outputs, truth, report)
    assert report.kinds["ledger"] == 1, report.violations
    doctored = _doctored_evidence(evidence)
    doctored.ledger[("w_free", start)] = (b"published", set())
    report = CheckReport()
    check_ledger(doctored, observed.outputs, truth, report)
    assert report.kinds["output not in ledger"] == 3, report.violations


def test_completeness_check_rejects_a_window_released_without_a_partition():
    report = CheckReport()
    check_completeness({"q": (1.0, 0.0), "r": (0.0, 2.0)}, report)
    assert report.kinds == {"partitions missing": 1}, report.violations
    assert report.stats["r: late partials counted"] == 2
    report = CheckReport()
    check_completeness({"q": (1.0, 0.0)}, report, withheld_partitions=True)
    assert not report.violations


def test_metrics_check_rejects_a_unit_id_label_and_the_secret():
    clean = 'stream_dp_events_total{query="q",outcome="accepted"} 3.0\n'
    report = CheckReport()
    check_metrics_text([clean], {"user-1"}, ["s3cret-value"], report)
    assert not report.violations
    doctored = clean + 'stream_dp_budget_spend{unit="user-1"} 1.0\n# s3cret-value\n'
    check_metrics_text([doctored], {"user-1"}, ["s3cret-value"], report)
    assert report.kinds == {"unit id label": 1, "secret in metrics": 1}, report.violations


def test_release_records_check_rejects_a_schema_breach_and_a_unit_id(world):
    observed, _, _ = world
    good = observed.outputs["w_free"][0].value
    report = CheckReport()
    check_release_records([good], {"user-1"}, report)
    assert not report.violations
    leaking = dict(orjson.loads(good), group={"page": "user-1"}, extra=1)
    check_release_records([orjson.dumps(leaking)], {"user-1"}, report)
    assert report.kinds == {"schema": 1, "unit id in output": 1}, report.violations


def test_events_accepted_by_the_coarser_clock_count_as_on_time_when_one_closure_explains_them():
    model = {"q": {(0, 1), (0, 2), (1, 5)}, "r": {(2, 7)}}
    ends = {"q": {(0, 1): 2_000, (0, 2): 4_000, (1, 5): 2_000}, "r": {(2, 7): 2_000}}
    # the worker dead-lettered all but (1, 5): that one counts as on time
    assert accepted_by_coarser_clock(model, {"q": {(0, 1), (0, 2)}, "r": {(2, 7)}}, {(0, 1)}, ends) == {"q": {(1, 5)}}
    # the model's late set holds: nothing to excuse
    assert accepted_by_coarser_clock(model, {"q": {(0, 1), (0, 2), (1, 5)}, "r": {(2, 7)}}, set(), ends) == {}
    # an event sent late on purpose was accepted: a clock that ignores lateness, not a coarser one
    assert accepted_by_coarser_clock(model, {"q": {(0, 2)}, "r": {(2, 7)}}, {(0, 1)}, ends) == {}
    # an on-time event was made late: never excused
    assert accepted_by_coarser_clock(model, {"q": {(0, 1), (0, 2), (3, 3)}, "r": {(2, 7)}}, set(), ends) == {}


def test_a_backlog_read_in_one_batch_may_be_accepted_whole_but_a_closed_window_never_reopens():
    """After an outage the broker stamps a producer's buffer as it arrives: the model's per-record clock calls
    most of it late, a worker reading it in one batch accepts it, however large."""
    model = {"q": {(0, i) for i in range(10, 3_000)}}
    ends = {"q": {(0, i): 2_000 * (1 + i // 1_000) for i in range(10, 3_000)}}
    assert accepted_by_coarser_clock(model, {"q": set()}, set(), ends) == model
    # the worker dead-lettered (0, 1999), the last event of window [2000, 4000): it had closed that window
    # then, so what it accepted before it, or after it of later windows, fits one closure ...
    late = {"q": {(0, 1_999)}}
    assert accepted_by_coarser_clock(model, late, set(), ends) == {"q": model["q"] - late["q"]}
    # ... but an event of that window accepted after it means a closed window reopened
    assert accepted_by_coarser_clock(model, late, set(), {"q": {**ends["q"], (0, 2_500): 4_000}}) == {}
    assert accepted_by_coarser_clock(model, {"q": {(0, 1_500)}}, set(), ends) == {}, "(0, 1600) reopened it"
    # an event sent late on purpose among them: never excused
    assert accepted_by_coarser_clock(model, {"q": set()}, {(0, 30)}, ends) == {}


def test_outputs_check_rejects_a_window_released_twice_an_empty_window_not_released_and_an_unexpected_one(world):
    observed, truth, _ = world
    query = "w_free"
    records = observed.outputs[query]
    first = orjson.loads(records[0].value)
    # the same window and group under a second release id: two noise draws of one window
    again = TopicRecord(0, 0, None, orjson.dumps(dict(first, release_id=first["release_id"] + "-2")), {})
    # a window between two released ones withheld whole (every page): a gap that tells without noise
    middle = sorted(truth.windows(query))[1]
    gap = [r for r in records if orjson.loads(r.value)["window"]["start_ms"] != middle]
    # a window the query's grid does not have, and a group that is not public
    shifted = dict(first, release_id="x:1", window=dict(first["window"], start_ms=first["window"]["start_ms"] + 1))
    stranger = dict(first, release_id="x:2", group={"page": "checkout"})
    cases = [([*records, again], "released twice"), (gap, "empty window not released"),
             ([*records, TopicRecord(0, 0, None, orjson.dumps(shifted), {})], "unexpected window"),
             ([*records, TopicRecord(0, 0, None, orjson.dumps(stranger), {})], "unexpected window")]
    if middle in truth.windows(query):  # a data window withheld is also lost
        cases[1] = (gap, "window lost")
    for doctored_records, kind in cases:
        doctored = copy.copy(observed)
        doctored.outputs = {**observed.outputs, query: doctored_records}
        report = CheckReport()
        check_outputs(doctored, truth, report)
        assert report.kinds[kind] >= 1, (kind, report.violations)


def test_outputs_check_rejects_an_empty_window_not_released_between_data_windows(world):
    """A window with no data between two released ones must still be released (public groups, every window)."""
    observed, truth, _ = world
    query = "w_free"
    doctored_truth = copy.deepcopy(truth)
    middle = sorted(truth.windows(query))[1]
    for key in [k for k in doctored_truth.partials if k[0] == query and k[1] == middle]:
        del doctored_truth.partials[key]  # the middle window holds no data now
    doctored = copy.copy(observed)
    doctored.outputs = {**observed.outputs, query: [r for r in observed.outputs[query]
                                                    if orjson.loads(r.value)["window"]["start_ms"] != middle]}
    report = CheckReport()
    check_outputs(doctored, doctored_truth, report)
    assert report.kinds["empty window not released"] == 1 and not report.kinds["window lost"], report.violations


def test_accounting_rejects_a_message_dead_lettered_with_several_reasons(world):
    observed, truth, _ = world
    late = observed.dead_letters[0]
    doctored = copy.copy(observed)
    doctored.dead_letters = observed.dead_letters + [TopicRecord(0, 999, None, late.value,
                                                                 dict(late.headers, reason=b"bad_timestamp"))]
    report = CheckReport()
    check_accounting(doctored, truth, report)
    assert report.kinds["several reasons"] == 1, report.violations


def test_partials_check_rejects_a_corrupt_record_and_a_partial_the_model_has_not(world):
    observed, truth, _ = world
    from stream_dp.worker.partials.wire import decode_internal

    original = decode_internal(observed.partials[0].value)
    stranger = encode_partial(PartialAggregate(**{**original.__dict__, "window_start_ms": 2_000,
                                                  "window_end_ms": 4_000}))
    corrupt = observed.partials[1].value[:-7] + b"garbage"
    for extra, kind in ((stranger, "partial not in truth"), (corrupt, "corrupt partial")):
        doctored = copy.copy(observed)
        doctored.partials = observed.partials + [TopicRecord(1, 5, None, extra, {})]
        report = CheckReport()
        check_partials(doctored, truth, PARTITIONS, report)
        assert report.kinds[kind] == 1, (kind, report.violations)
    planted = copy.copy(observed)
    planted.partials = observed.partials + [TopicRecord(1, 5, None, corrupt, {})]
    planted.planted_partials = {(1, 5)}
    report = CheckReport()
    check_partials(planted, truth, PARTITIONS, report)
    assert not report.violations, "a record a fault planted is not the workers'"


def test_ledger_check_rejects_an_entry_that_does_not_decode(world):
    observed, truth, evidence = world
    doctored = _doctored_evidence(evidence)
    doctored.errors.append("ledger entry stream-dp:ledger:{w_free}:0: corrupt frame")
    report = CheckReport()
    check_ledger(doctored, observed.outputs, truth, report)
    assert report.kinds == {"corrupt store record": 1}, report.violations


def test_budget_check_rejects_a_delta_spend_off_by_a_window_and_over_its_limit(world):
    """A Gaussian query charges delta beside epsilon: a window's delta charged twice breaks its limit."""
    observed, truth, evidence = world
    namespace = truth.namespace["w_gauss"]
    delta_limit = next(i for i, (is_delta, _) in enumerate(truth.limits[namespace]) if is_delta)
    unit = next(u for (ns, u), a in truth.admitted.items() if ns == namespace and len(a) == 3)
    doctored = _doctored_evidence(evidence)
    doctored.spend[(namespace, unit)][delta_limit] += truth.costs["w_gauss"][delta_limit]
    report = CheckReport()
    check_budgets(doctored, truth, report)
    assert set(report.kinds) == {"spend differs", "over limit"}, report.violations
    assert "delta" in report.violations[0]


def test_outputs_check_rejects_a_selected_group_without_data_and_a_selected_value_off_the_band(world):
    """Selection may leave any group out, but never releases one no unit had data in, and what it releases
    centres on the truth like any release."""
    observed, truth, _ = world
    query = "w_select"
    records = observed.outputs[query]
    first = orjson.loads(records[0].value)
    start = first["window"]["start_ms"]
    absent = next(p for p in ("home", "search", "cart", "checkout")
                  if not truth.totals(query, start).get((p,), (0, 0.0))[0])
    invented = dict(first, release_id=f"{query}:{start}:x", group={"page": absent}, count=0.0, sum=0.0)
    off = dict(first, count=first["count"] + 1000.0)
    report = CheckReport()
    check_outputs(observed, truth, report)
    assert not report.violations, report.violations
    for doctored_records, kind in (([*records, TopicRecord(0, 0, None, orjson.dumps(invented), {})], "unexpected window"),
                                   ([TopicRecord(0, 0, None, orjson.dumps(off), {}), *records[1:]], "noisy value off"),
                                   (records[1:], None)):
        doctored = copy.copy(observed)
        doctored.outputs = {**observed.outputs, query: doctored_records}
        report = CheckReport()
        check_outputs(doctored, truth, report)
        if kind is None:
            assert not report.violations, "a selected group left out is the noise's choice, not a loss"
        else:
            assert report.kinds[kind] == 1, (kind, report.violations)


def test_outputs_check_rejects_a_top_k_record_lost_twice_redrawn_or_ranking_what_it_may_not(world):
    observed, truth, _ = world
    query = "w_top"
    records = observed.outputs[query]
    tops = [r for r in records if orjson.loads(r.value).get("kind") == "top_k"]
    rows = [r for r in records if orjson.loads(r.value).get("kind") != "top_k"]
    start = orjson.loads(tops[0].value)["window"]["start_ms"]
    again = TopicRecord(0, 0, None, orjson.dumps(dict(orjson.loads(tops[0].value), release_id="other")), {})
    redrawn = _top_k(query, start, [("home",), ("search",)])
    for doctored_records, kind in (
            (rows + tops[1:], "window lost"),
            (records + [again], "released twice"),
            (records + [redrawn], "noise drawn twice"),
            (rows + [_top_k(query, start, [("home",), ("checkout",)])] + tops[1:], "unexpected window"),
            (rows + [_top_k(query, start, [("home",), ("home",)])] + tops[1:], "unexpected window"),
            (rows + [_top_k(query, start, [("home",), ("cart",)], candidates=2)] + tops[1:], "unexpected window")):
        doctored = copy.copy(observed)
        doctored.outputs = {**observed.outputs, query: doctored_records}
        report = CheckReport()
        check_outputs(doctored, truth, report)
        assert report.kinds[kind] >= 1, (kind, report.violations)
