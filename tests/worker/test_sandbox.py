"""The sample-and-aggregate sandbox: a child process per function, per-block limits, nothing of the worker in it.

Real processes (spawn), no mocks: each misbehaviour of a user function must
cost only its own block.
"""

from __future__ import annotations

import numpy as np
import pytest

from stream_dp.dp.sample_aggregate import parse_function_path
from stream_dp.worker.sandbox import FunctionLoadError, FunctionSandbox


def _blocks(*values):
    return [np.array(v, dtype=np.float64) for v in values]


def test_a_well_behaved_function_answers_every_block_in_order():
    sandbox = FunctionSandbox("tests.worker._functions:mean_or_zero")
    try:
        out = sandbox.run(_blocks([1, 2, 3], [], [10.5]))
        assert out.tolist() == [2.0, 0.0, 10.5]
        assert sandbox.take_failures() == {}
    finally:
        sandbox.close()


def test_each_misbehaviour_costs_its_own_block_only(caplog):
    cases = {
        "fails_on_negative": (_blocks([1, 2], [-1], [3]), [3.0, None, 3.0], {"error": 1}),
        "slow_on_large": (_blocks([1], [5000], [1, 2]), [1.0, None, 2.0], {"timeout": 1}),
        "exits_on_seven": (_blocks([7], [1, 2], [7, 7], [1]), [None, 2.0, None, 1.0], {"crashed": 2}),
        "nan_always": (_blocks([1]), [None], {"not_finite": 1}),
    }
    for name, (blocks, expected, failures) in cases.items():
        sandbox = FunctionSandbox(f"tests.worker._functions:{name}", timeout_s=2.0)
        try:
            out = sandbox.run(blocks)
            assert [None if np.isnan(v) else v for v in out.tolist()] == expected, name
            assert sandbox.take_failures() == failures, name
        finally:
            sandbox.close()
    assert "ArithmeticError" in caplog.text  # the exception's type is logged, never its message or the data


def test_the_worker_settings_do_not_reach_the_function(monkeypatch):
    monkeypatch.setenv("STREAM_DP_CONTRIBUTION_SECRET", "do-not-leak-0123456789abcdef")
    monkeypatch.setenv("REDIS_URL", "redis://user:password@example:6379/0")
    for name in ("sees_worker_settings", "sees_worker_settings_in_proc"):
        sandbox = FunctionSandbox(f"tests.worker._functions:{name}")
        try:
            assert sandbox.run(_blocks([1])).tolist() == [0.0], name
        finally:
            sandbox.close()


def test_a_function_that_prints_does_not_break_the_answers():
    sandbox = FunctionSandbox("tests.worker._functions:prints_to_stdout")
    try:
        assert sandbox.run(_blocks([1, 2], [3])).tolist() == [2.0, 1.0]
        assert sandbox.take_failures() == {}
    finally:
        sandbox.close()


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("tests.worker._functions:missing", "AttributeError"),
        ("tests.worker._nowhere:f", "ModuleNotFoundError"),
        ("tests.worker._functions:NOT_A_FUNCTION", "not a function"),
    ],
)
def test_a_function_that_cannot_be_loaded_is_refused_with_the_reason(path, message):
    sandbox = FunctionSandbox(path)
    with pytest.raises(FunctionLoadError, match=message):
        sandbox.check()
    # at release time the same failure costs every block, and says so
    assert np.isnan(sandbox.run(_blocks([1], [2]))).all()
    assert sandbox.take_failures() == {"load_error": 2}


@pytest.mark.parametrize("path", ["statistics.median", "a:", ":f", "a b:c", "x:1y"])
def test_import_paths_are_checked_up_front(path):
    with pytest.raises(ValueError, match="package.module:function"):
        parse_function_path(path)


def test_no_block_sees_what_an_earlier_block_or_window_left_behind():
    """Each block runs in a fresh copy of the loaded function: state a function keeps between calls (a
    cache, a global) cannot carry one block's units into another block's output, in this window or a later
    one, nor can a failure restart depend on the data."""
    sandbox = FunctionSandbox("tests.worker._functions:remembers_what_it_saw")
    calls = FunctionSandbox("tests.worker._functions:counts_its_calls")
    try:
        assert sandbox.run(_blocks([1], [2, 2], [3])).tolist() == [1.0, 2.0, 3.0]
        assert sandbox.run(_blocks([40])).tolist() == [40.0]  # the next window
        assert calls.run(_blocks([1], [2], [3])).tolist() == [1.0, 1.0, 1.0]
    finally:
        sandbox.close()
        calls.close()
