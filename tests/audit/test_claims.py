"""``claims.claim_problems``: sound records of every audit scenario pass it, and a doctored statement fails it.

The records are the worker's own, built in process (``publication.run``) from each scenario's query as the
audit's deployments configure it; ``test_publication.py`` checks the same on generated queries of every option.
"""

from __future__ import annotations

import copy

import pytest

from tests.audit.claims import claim_problems
from tests.audit.neighbours import SCENARIOS, _config
from tests.audit.publication import Event, run

_NAMES = [s.name for s in SCENARIOS]
_QUERIES = dict(zip(_NAMES, _config("r", {name: name for name in ("main", "spread", "clock", "local", "local_oue",
                                                                      "quant", "topk", "topksel")},
                                    {name: name for name in _NAMES})["queries"], strict=True))
# three windows of 20 units in each of the groups a to e: enough for partition selection to release them
_EVENTS = [Event(f"u{w}-{g}-{i}", w, g, b"%d.5" % i) for w in range(3) for g in "abcde" for i in range(20)]


def _records(name: str) -> tuple[dict, list[dict]]:
    query = copy.deepcopy(_QUERIES[name])
    query["privacy_unit"]["namespace"] = "users"  # publication.run's one namespace
    published = run(query, _EVENTS, 1)
    assert published.records and not published.withheld, name
    return query, published.records


@pytest.mark.parametrize("name", _NAMES)
def test_the_records_of_every_audit_scenario_state_what_its_query_configures(name):
    query, records = _records(name)
    problems = [p for record in records for p in claim_problems(record, query)]
    assert not problems, problems[:5]


def _double(block: dict, key: str) -> None:
    block[key] *= 2


# (scenario, what to doctor in the first record it applies to, the words of the problem expected)
DOCTORED = [
    ("over_bounds", lambda r: _double(r["privacy"], "epsilon"), "epsilon"),
    ("over_bounds", lambda r: r["privacy"].update(mechanism="gaussian"), "mechanism"),
    ("over_bounds", lambda r: r["privacy"].update(delta=1e-9), "delta"),
    ("over_bounds", lambda r: r["privacy"].update(epsilon=r["privacy"]["epsilon"] * 0.99), "epsilon"),
    ("gaussian", lambda r: _double(r["privacy"], "delta"), "delta"),
    ("top_k", lambda r: _double(r["privacy"], "epsilon") if r.get("kind") == "top_k" else None, "epsilon"),
    ("top_k_selected", lambda r: _double(r["privacy"], "epsilon") if r.get("kind") == "top_k" else None, "epsilon"),
    ("top_k_selected", lambda r: _double(r["privacy"], "window_delta") if r.get("kind") == "top_k" else None,
     "partition selection"),
    ("top_k_selected", lambda r: r["privacy"].update(rho=0.5) if "kind" not in r else None, "rho"),
    ("quantiles", lambda r: _double(r["privacy"]["quantiles"], "epsilon_per_quantile"), "epsilon_per_quantile"),
    ("hierarchy", lambda r: _double(r["privacy"], "level_epsilon") if "level_epsilon" in r["privacy"] else None,
     "level_epsilon"),
    ("continual", lambda r: _double(r["privacy"]["continual"], "epsilon_per_level"), "epsilon_per_level"),
    ("continual", lambda r: r["privacy"].update(charged="per_window"), "charged"),
    ("staircase", lambda r: _double(r["privacy"]["staircase"]["count"], "epsilon_per_group"), "epsilon_per_group"),
    ("local_dp", lambda r: _double(r["privacy"], "epsilon"), "epsilon"),
    ("mean_vector", lambda r: _double(r["privacy"]["mean_vector"], "delta"), "mean_vector.delta"),
    ("sample_aggregate", lambda r: _double(r["privacy"]["sample_aggregate"], "epsilon"), "sample_aggregate.epsilon"),
]


@pytest.mark.parametrize(("name", "doctor", "words"), DOCTORED, ids=[f"{n}-{w}" for n, _, w in DOCTORED])
def test_a_doctored_statement_is_found(name, doctor, words):
    query, records = _records(name)
    for record in records:
        before = copy.deepcopy(record)
        doctor(record)
        if record != before:
            problems = claim_problems(record, query)
            assert any(words in p for p in problems), (words, problems)
            return
    pytest.fail(f"no record of {name} to doctor")
