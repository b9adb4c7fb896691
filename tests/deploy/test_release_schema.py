"""The release schema accepts every kind of record the worker publishes, and refuses one that leaves out
what it spent: each option's block comes with its privacy statement and the statement with its block.

``tests/data/release_records.jsonl`` holds real records, one or two of each kind: copied from an
end-to-end run of the worker (every query option, both trust models, top_k over public and selected
groups, both levels of a hierarchy), and for the shapes that run lacks (a hierarchy with quantiles,
a staircase count or sum alone) built by ``stream_dp.worker.release.build.build_release``. Each rule is
checked on a doctored copy of a real record: a field removed, moved or made up.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonschema
import pytest

REPO = Path(__file__).resolve().parents[2]
SCHEMA = json.loads((REPO / "deploy/schemas/release.schema.json").read_text())
RECORDS = [json.loads(line) for line in (REPO / "tests/data/release_records.jsonl").read_text().splitlines()]
OPTIONS = ("quantiles", "mean_vector", "covariance", "sample_aggregate", "local_dp", "continual")

Record = dict[str, Any]


def _validator() -> jsonschema.Draft202012Validator:
    return jsonschema.Draft202012Validator(SCHEMA, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)


def _kind(record: Record) -> str:
    """What kind of record this is: top_k, or the mechanism with the option blocks it carries."""
    if record.get("kind") == "top_k":
        return f"top_k {record['privacy']['groups']}"
    parts = [record["privacy"]["mechanism"]] + [name for name in OPTIONS if name in record]
    if "level" in record:
        parts.append("coarser level" if "level_epsilon" in record["privacy"] else "finest level")
    if "sample_aggregate" in record:
        parts.append(record["sample_aggregate"].get("aggregate", "mean"))
    return " ".join(parts)


def _record(test: Callable[[Record], bool]) -> Record:
    """A deep copy of the first real record ``test`` picks: doctoring it leaves the others alone."""
    return copy.deepcopy(next(r for r in RECORDS if test(r)))


def test_the_records_cover_every_kind():
    kinds = {_kind(r) for r in RECORDS}
    assert {
        "laplace", "gaussian mean_vector", "gaussian covariance", "laplace quantiles", "laplace continual",
        "laplace sample_aggregate mean", "laplace sample_aggregate median", "local_krr local_dp",
        "local_oue local_dp", "laplace finest level", "laplace coarser level", "laplace quantiles finest level",
        "staircase", "top_k public", "top_k selected",
    } <= kinds, kinds
    assert {r["privacy"]["groups"] for r in RECORDS} == {"public", "selected"}


@pytest.mark.parametrize("record", RECORDS, ids=[f"{i}:{_kind(r)}" for i, r in enumerate(RECORDS)])
def test_every_real_record_is_valid(record):
    _validator().validate(record)


def _drop(record: Record, *paths: str) -> Record:
    for path in paths:
        *parents, leaf = path.split(".")
        node = record
        for key in parents:
            node = node[key]
        del node[leaf]
    return record


def _with(record: Record, path: str, value: Any) -> Record:
    *parents, leaf = path.split(".")
    node = record
    for key in parents:
        node = node[key]
    node[leaf] = value
    return record


def _has(name: str) -> Callable[[Record], bool]:
    return lambda r: name in r


def _mechanism(name: str) -> Callable[[Record], bool]:
    return lambda r: r["privacy"]["mechanism"] == name


def _plain(r: Record) -> bool:
    """A per-window laplace record of a group with no option: the base others are grafted onto."""
    return _kind(r) == "laplace"


def _staircase_both(r: Record) -> bool:
    return r["privacy"]["mechanism"] == "staircase" and r["privacy"]["sum_scale"] is not None \
        and r["privacy"]["count_scale"] is not None


def _privacy_of(name: str) -> Any:
    return copy.deepcopy(next(r["privacy"][name] for r in RECORDS if name in r["privacy"]))


DOCTORED: dict[str, Callable[[], Record]] = {
    # staircase: the noise law is stated, for each component it noised, and only for a staircase
    "staircase without privacy.staircase": lambda: _drop(_record(_mechanism("staircase")), "privacy.staircase"),
    "staircase sum without its law": lambda: _drop(_record(_staircase_both), "privacy.staircase.sum"),
    "staircase count without its law": lambda: _drop(_record(_staircase_both), "privacy.staircase.count"),
    "laplace with a staircase law": lambda: _with(_record(_plain), "privacy.staircase", _privacy_of("staircase")),
    # continual: the running totals, their tree, and the charge once per period go together
    "continual without privacy.continual": lambda: _drop(_record(_has("continual")), "privacy.continual"),
    "continual without its block": lambda: _drop(_record(_has("continual")), "continual"),
    "continual without either block": lambda: _drop(_record(_has("continual")), "continual", "privacy.continual"),
    "continual charged per_window": lambda: _with(_record(_has("continual")), "privacy.charged", "per_window"),
    "continual without charged": lambda: _drop(_record(_has("continual")), "privacy.charged"),
    "per_window record with a tree": lambda: _with(_record(_plain), "privacy.continual", _privacy_of("continual")),
    "per_period record without a tree": lambda: _with(_record(_plain), "privacy.charged", "per_period"),
    # each option's block and its privacy statement
    **{f"{name} without privacy.{name}": (lambda name=name: _drop(_record(_has(name)), f"privacy.{name}"))
       for name in ("quantiles", "mean_vector", "covariance", "sample_aggregate", "local_dp")},
    **{f"privacy.{name} without {name}": (lambda name=name: _drop(_record(_has(name)), name))
       for name in ("quantiles", "mean_vector", "covariance", "sample_aggregate", "local_dp")},
    # with both its blocks gone a record releases nothing; one that also holds a count (quantiles, covariance)
    # is then a valid count record: which options the query had is not in the record to check against
    **{f"{name} without either block": (lambda name=name: _drop(_record(_has(name)), name, f"privacy.{name}"))
       for name in ("mean_vector", "sample_aggregate")},
    "quantiles of a hierarchy's finest level without their block": lambda: _drop(
        _record(lambda r: "quantiles" in r and "level" in r), "quantiles"),
    "covariance stated as mean_vector": lambda: _with(
        _drop(_record(_has("covariance")), "privacy.covariance"), "privacy.mean_vector", _privacy_of("covariance")),
    # each vector block names its own mechanism: a mean vector is not released by Analyze Gauss, nor the reverse
    "mean_vector stated as analyze_gauss": lambda: _with(
        _record(_has("mean_vector")), "privacy.mean_vector.mechanism", "analyze_gauss"),
    "covariance stated as gaussian_vector": lambda: _with(
        _record(_has("covariance")), "privacy.covariance.mechanism", "gaussian_vector"),
    "central record with a local randomizer": lambda: _with(
        _record(_plain), "privacy.local_dp", _privacy_of("local_dp")),
    # the privacy statement says nothing beyond its listed keys, and leaves none of them out
    "privacy with a made-up key": lambda: _with(_record(_plain), "privacy.spent", 0),
    "continual privacy with a made-up key": lambda: _with(_record(_has("continual")), "privacy.window_epsilon", 1.0),
    **{f"privacy without {key}": (lambda key=key: _drop(_record(_plain), f"privacy.{key}"))
       for key in ("charged", "groups", "max_groups_per_unit", "max_events_per_group", "clip")},
}


@pytest.mark.parametrize("doctor", DOCTORED.values(), ids=DOCTORED.keys())
def test_a_doctored_record_is_invalid(doctor):
    record = doctor()
    assert not _validator().is_valid(record), f"still valid: {json.dumps(record)[:400]}"


def test_a_coarser_level_states_the_quantiles_it_does_not_carry():
    """A hierarchy with quantiles releases them at its finest level only; the coarser levels' privacy still
    states the window's whole spend, quantiles included, so their records carry privacy.quantiles alone."""
    coarse = [r for r in RECORDS if "level_epsilon" in r["privacy"] and "quantiles" in r["privacy"]]
    assert coarse and all("quantiles" not in r for r in coarse)
    assert all(_validator().is_valid(r) for r in coarse)


def test_the_records_of_a_window_released_as_if_empty_are_valid_and_say_so():
    """Built as the release stage builds a fallback: the query's combiner takes the data out of the window
    (``WindowCombiner.as_if_empty``), and every record -- each group's, each hierarchy level's, the top-k
    list -- carries the reason; a reason of another type is refused."""
    import numpy as np

    from stream_dp.config import parse_config
    from stream_dp.dp import OpenDPNoise
    from stream_dp.worker.assemble.runtimes import build_runtimes
    from stream_dp.worker.release.build import build_release

    query = {
        "name": "fallback", "input_topic": "in", "output_topic": "out",
        "privacy_unit": {"namespace": "users", "field": "user_id"}, "timestamp_field": "ts",
        "window": {"size": "1m"}, "group_by": ["region", "page"],
        "groups": {"public": [["r", "/a"], ["r", "/b"], ["s", "/a"]]}, "hierarchy": True,
        "bounds": {"max_groups_per_unit": 1, "max_events_per_group": 1},
        "aggregations": {"count": {}, "top_k": {"k": 1}}, "epsilon": 1.0,
    }
    config = parse_config({"namespaces": {"users": {"budgets": [{"horizon": "1h", "epsilon": 10.0}]}},
                           "queries": [query]})
    (runtime,) = build_runtimes(config, secret=b"test-secret-0123456789abcdef", clock_ms=lambda: 0)
    window = runtime.combiner.take(60_000)
    window = runtime.combiner.as_if_empty(
        type(window)(**{**window.__dict__, "count": np.array([5, 0, 2]), "distinct_units": np.array([5, 0, 2])}),
        "release_failed")
    records = [json.loads(value) for _, value in build_release(runtime, window, OpenDPNoise(), 130_000).render()]
    assert {r.get("kind", r.get("level")) for r in records} == {0, 1, "top_k"}
    for record in records:
        assert record["as_if_empty"] == "release_failed", record
        _validator().validate(record)
    assert not _validator().is_valid({**records[0], "as_if_empty": True})
