"""A continual query whose settings change within a period: its fingerprint, and the tree a window continues.

A period's charge and tree hold for the settings they were made under
(``stream_dp.worker.query.runtime.settings_fingerprint``). Under other settings the
period is a new one: the tree restarts at the next window and records say so
(``continual.tree_restarted_ms``); a changed list of public groups never
stops the release. Under the same settings -- a restart, a replay -- nothing
changes. Charging under changed settings: ``test_period_charging.py`` and
``test_period_emit.py``.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import numpy as np
import orjson
import pytest

from stream_dp.config import parse_config
from stream_dp.dp.vectorised_noise import VectorisedExactNoise
from stream_dp.worker.assemble.runtimes import build_runtimes
from stream_dp.worker.combine.combiner import CombinedWindow
from stream_dp.worker.query.runtime import settings_fingerprint
from stream_dp.worker.release.build import build_release
from stream_dp.worker.release.entry import decode_entry, encode_entry

SCHEMA = json.loads((Path(__file__).resolve().parents[3] / "deploy/schemas/release.schema.json").read_text())
MINUTE_MS = 60_000
PERIOD_START_MS = 1_700_000_040_000 // (8 * MINUTE_MS) * (8 * MINUTE_MS)
# Each group's events in every window: a running total tells which windows, and whose, it adds up.
PER_WINDOW = {"a": 1000, "b": 2000, "c": 3000, "d": 4000}


def query(**changes: Any) -> dict[str, Any]:
    base = {
        "name": "visits", "input_topic": "in", "output_topic": "out",
        "privacy_unit": {"namespace": "users", "field": "user_id"}, "timestamp_field": "ts",
        "window": {"size": "1m"}, "group_by": ["page"], "groups": {"public": ["a", "b", "c"]},
        "bounds": {"max_groups_per_unit": 1, "max_events_per_group": 1}, "aggregations": {"count": {}},
        "epsilon": 10.0, "continual": {"period": "8m", "max_windows_per_unit": 2},
    }
    return {**base, **changes}


def runtime(**changes: Any) -> Any:
    config = parse_config({"namespaces": {"users": {"budgets": [{"horizon": "1d", "epsilon": 100.0}]}},
                           "queries": [query(**changes)]})
    (built,) = build_runtimes(config, secret=b"k" * 32, clock_ms=lambda: 0)
    return built


class NoNoise:
    """Adds nothing: the released running totals are the true ones, so each group's total shows its label."""

    def integers(self, values: np.ndarray, **kwargs: Any) -> np.ndarray:
        return values.copy()


def seeded_noise(seed: int) -> VectorisedExactNoise:
    rng = np.random.default_rng(seed)
    return VectorisedExactNoise(bits=lambda n: rng.integers(0, 2**64, n, dtype=np.uint64, endpoint=False))


def window(rt: Any, start_ms: int) -> CombinedWindow:
    groups = rt.public_groups
    counts = np.array([PER_WINDOW[g[0]] for g in groups], dtype=np.int64)
    return CombinedWindow(rt.name, start_ms, start_ms + rt.config.window.size_ms, 0, list(groups), counts, None,
                          counts.copy(), [], int(counts.sum()), 0, start_ms + rt.config.window.size_ms)


def release(rt: Any, start_ms: int, previous: Any, noise: Any) -> tuple[list[dict], Any]:
    """The window's records, and its state as the next window reads it back from the ledger."""
    entry = build_release(rt, window(rt, start_ms), noise, start_ms + 2 * MINUTE_MS, previous)
    records = [orjson.loads(value) for _, value in entry.render()]
    for record in records:
        jsonschema.validate(record, SCHEMA)
    return records, decode_entry(encode_entry(entry)).state


def totals(records: list[dict]) -> dict[str, int]:
    return {r["group"]["page"]: r["count"] for r in records}


def run(rt: Any, starts: list[int], previous: Any, noise: Any) -> tuple[list[list[dict]], Any]:
    out = []
    for start in starts:
        records, previous = release(rt, start, previous, noise)
        out.append(records)
    return out, previous


def logged(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "stream_dp.worker.release.continual"]


def minute(i: int) -> int:
    return PERIOD_START_MS + i * MINUTE_MS


# -- the tree under changed settings ---------------------------------------------------------------


@pytest.mark.parametrize("changes", [
    {"groups": {"public": ["a", "b", "c", "d"]}},
    {"groups": {"public": ["a", "b"]}},
    {"groups": {"public": ["c", "a", "b"]}},
    {"groups": {"public": ["a", "b", "d"]}},  # as many groups, one of them another
    {"window": {"size": "2m"}},
    {"epsilon": 5.0},
    {"continual": {"period": "8m", "max_windows_per_unit": 3}},
], ids=["group-added", "group-removed", "groups-reordered", "group-renamed", "window-doubled", "epsilon",
        "max-windows"])
def test_changed_settings_start_a_new_running_total_at_the_next_window(changes, caplog):
    before, after = runtime(), runtime(**changes)
    assert settings_fingerprint(before) != settings_fingerprint(after)
    released, state = run(before, [minute(0), minute(1)], None, NoNoise())
    assert totals(released[-1]) == {g: 2 * PER_WINDOW[g] for g in ("a", "b", "c")}
    size = after.config.window.size_ms // MINUTE_MS
    starts = [minute(2), minute(2 + size)]  # the next two windows on the new grid
    with caplog.at_level(logging.WARNING, logger="stream_dp.worker.release.continual"):
        released, _ = run(after, starts, state, NoNoise())
    groups = [g[0] for g in after.public_groups]
    # Each group's total covers the windows since the change, under its own label.
    assert [totals(r) for r in released] == [{g: PER_WINDOW[g] for g in groups}, {g: 2 * PER_WINDOW[g] for g in groups}]
    for records in released:
        assert {r["continual"]["tree_restarted_ms"] for r in records} == {minute(2)}
    assert [r[0]["continual"]["window_index"] for r in released] == ([3, 4] if size == 1 else [2, 3])
    (warning,) = logged(caplog)
    assert warning.levelno == logging.WARNING and "changed" in warning.getMessage()


def test_the_same_settings_after_a_restart_continue_the_tree_bit_for_bit(caplog):
    starts = [minute(i) for i in range(5)]
    uninterrupted, _ = run(runtime(), starts, None, seeded_noise(7))
    noise = seeded_noise(7)
    before, state = run(runtime(), starts[:3], None, noise)
    with caplog.at_level(logging.WARNING, logger="stream_dp.worker.release.continual"):
        after, _ = run(runtime(), starts[3:], state, noise)  # a worker built afresh from the same file
    assert before + after == uninterrupted
    assert all(r["continual"]["tree_restarted_ms"] is None for records in after for r in records)
    assert not logged(caplog)
    # And with no noise, the totals are the period's, from its first window.
    released, _ = run(runtime(), starts, None, NoNoise())
    assert totals(released[-1]) == {g: 5 * PER_WINDOW[g] for g in ("a", "b", "c")}


def test_a_state_stored_without_settings_starts_a_new_tree(caplog):
    _, (fields, arrays) = run(runtime(), [minute(0)], None, NoNoise())
    legacy = ({k: v for k, v in fields.items() if k != "settings"}, arrays)
    with caplog.at_level(logging.WARNING, logger="stream_dp.worker.release.continual"):
        (records,), _ = run(runtime(), [minute(1)], legacy, NoNoise())
    assert totals(records) == {g: PER_WINDOW[g] for g in ("a", "b", "c")}
    assert {r["continual"]["tree_restarted_ms"] for r in records} == {minute(1)}
    assert len(logged(caplog)) == 1


# -- the fingerprint -------------------------------------------------------------------------------


@pytest.mark.parametrize("changes", [
    {"epsilon": 5.0},
    {"continual": {"period": "8m", "max_windows_per_unit": 3}},
    {"continual": {"period": "16m", "max_windows_per_unit": 2}},
    {"window": {"size": "2m"}},
    {"window": {"size": "1m", "offset": "30s"}},
    {"groups": {"public": ["c", "b", "a"]}},
    {"groups": {"public": ["a", "b", "c", "d"]}},
    {"bounds": {"max_groups_per_unit": 1, "max_events_per_group": 2}},
    {"bounds": {"max_groups_per_unit": 2, "max_events_per_group": 1}},
    {"aggregations": {"count": {}, "sum": {"field": "v", "clip": [0, 10]}}},
    {"aggregations": {"count": {}, "sum": {"field": "v", "clip": [0, 20]}}},
    {"aggregations": {"count": {}, "sum": {"field": "w", "clip": [0, 10]}}},
    {"group_by": ["path"]},
    {"privacy_unit": {"namespace": "users", "field": "account"}},
])
def test_every_setting_of_the_charge_and_the_tree_is_in_the_fingerprint(changes):
    assert settings_fingerprint(runtime(**changes)) != settings_fingerprint(runtime())


def test_settings_apart_from_the_charge_and_the_tree_leave_the_fingerprint(tmp_path):
    base = settings_fingerprint(runtime())
    assert settings_fingerprint(runtime()) == base
    for changes in ({"output_topic": "elsewhere"}, {"release_timeout": "2m"}, {"mechanism": "geometric"},
                    {"window": {"size": "1m", "idle_timeout": "1m"}}):
        assert settings_fingerprint(runtime(**changes)) == base, changes
    # Another process computes the same value whatever its hash seed (nothing rests on set or dict order).
    script = ("import sys; sys.path.insert(0, sys.argv[1]); "
              "from test_continual_settings import runtime, settings_fingerprint; "
              "print(settings_fingerprint(runtime()))")
    for seed in ("0", "1", "12345"):
        out = subprocess.run([sys.executable, "-c", script, str(Path(__file__).parent)], check=True,
                             capture_output=True, text=True, cwd=tmp_path,
                             env={**os.environ, "PYTHONHASHSEED": seed})
        assert out.stdout.strip() == base
