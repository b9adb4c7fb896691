"""The sample-and-aggregate sandbox: a child process per function, per-block limits, nothing of the worker in it.

Real processes (spawn), no mocks: each misbehaviour of a user function must
cost only its own block.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from stream_dp.dp.sample_aggregate import parse_function_path
from stream_dp.worker.sandbox.runner import FunctionLoadError, FunctionSandbox

ROOT = Path(__file__).resolve().parents[3]


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


def test_a_failure_is_logged_as_a_builtin_class_never_a_name_or_value_the_function_makes_up(caplog):
    """The log line names what failed with a builtin class only: an exception class the function defines (its
    name is text the function chooses, here made of the block's values) is logged as its nearest builtin base."""
    for name, blocks, logged in [
        ("raises_its_values", _blocks([1.5, -2], [3]), {"LookupError (subclass)": 2}),
        ("raises_a_library_error", _blocks([1]), {"ValueError (subclass)": 1}),
        ("fails_on_negative", _blocks([-1]), {"ArithmeticError": 1}),
    ]:
        sandbox = FunctionSandbox(f"tests.worker._functions:{name}")
        try:
            caplog.clear()
            assert np.isnan(sandbox.run(blocks)).all()
            assert sandbox.take_failures() == {"error": len(blocks)}, name
        finally:
            sandbox.close()
        (record,) = caplog.records
        message = record.getMessage()
        assert message == f"tests.worker._functions:{name} failed on " + ", ".join(
            f"{n} block(s): {what}" for what, n in logged.items()), message
    assert not any(mark in caplog.text for mark in ("V_", "1p5", "1.5", "m2", "-2", "StatisticsError"))
    # nor is the text of an answer the block's process wrote itself in the sandbox's place
    sandbox = FunctionSandbox("tests.worker._reaching_out:forges_an_error_naming_its_values")
    try:
        caplog.clear()
        assert np.isnan(sandbox.run(_blocks([1.5]))).all()
        assert sandbox.take_failures() == {"error": 1}
    finally:
        sandbox.close()
    assert caplog.records[0].getMessage().endswith("1 block(s): an answer not written by the sandbox"), caplog.text
    assert "1.5" not in caplog.text


def test_only_a_real_number_is_an_answer(caplog):
    """The function must return a number (README): text, a bool or a numpy bool is a failed block, logged by its
    builtin class; ints and floats, Python's or numpy's, are answers."""
    for name, logged in [("returns_the_count_as_text", r"str"), ("returns_a_bool", r"bool"),
                         ("returns_a_numpy_bool", r"numpy\.bool_?")]:  # numpy 2 names it numpy.bool
        sandbox = FunctionSandbox(f"tests.worker._functions:{name}")
        try:
            caplog.clear()
            assert np.isnan(sandbox.run(_blocks([1, 2], [3]))).all(), name
            assert sandbox.take_failures() == {"error": 2}, name
        finally:
            sandbox.close()
        assert re.search(rf"failed on 2 block\(s\): returned {logged}, not a number$", caplog.records[0].getMessage()), \
            caplog.text
    sandbox = FunctionSandbox("tests.worker._functions:returns_numbers_of_every_kind")
    try:
        assert sandbox.run(_blocks([0], [1, 1], [2, 2, 2], [3, 3, 3, 3])).tolist() == [1.0, 2.0, 3.0, 4.0]
        assert sandbox.take_failures() == {}
    finally:
        sandbox.close()


# Where a secret may be: the worker's settings by their names, in any case (the settings are read whatever
# the case: ``redis_url`` sets the Redis URL as ``REDIS_URL`` does), and any other variable of the process.
SECRET_VARIABLES = ("STREAM_DP_CONTRIBUTION_SECRET", "REDIS_URL", "stream_dp_contribution_secret", "redis_url",
                    "Kafka_Sasl_Password", "PAYMENTS_API_TOKEN")
# What the README says the sandbox's environment holds (the PYTHONPATH it is given, and of the worker's own
# environment these names only).
README_PASSED_ON = {"PATH", "HOME", "TMPDIR", "TZ", "LANG", "LANGUAGE", "PYTHONPATH", "PYTHONHASHSEED", "PYTHONHOME"}


def _passed_on_per_readme(name: str) -> bool:
    return name in README_PASSED_ON or (name.startswith("LC_") and name[3:].isupper())


def test_no_secret_of_the_worker_environment_reaches_the_function(monkeypatch, capfd):
    from tests.worker._functions import SECRET_MARK

    for name in SECRET_VARIABLES:
        monkeypatch.setenv(name, f"redis://user:{SECRET_MARK}@example:6379/0" if "redis" in name.lower() else SECRET_MARK)
    monkeypatch.setenv("TZ", "Europe/Paris")  # what the function may need is still there
    for name in ("sees_a_secret", "sees_a_secret_in_proc", "environment_names"):
        sandbox = FunctionSandbox(f"tests.worker._functions:{name}")
        try:
            assert sandbox.run(_blocks([1])).tolist() == [0.0], name
        finally:
            sandbox.close()
    (line,) = [line for line in capfd.readouterr().err.splitlines() if line.startswith("ENVIRONMENT")]
    names = line.split()[1:]
    assert not [name for name in names if not _passed_on_per_readme(name)], names
    assert {"PATH", "TZ", "PYTHONPATH"} <= set(names), names


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


@pytest.mark.parametrize(("path", "message"), [
    ("tests.worker._functions:needs_two", r"^function tests\.worker\._functions:needs_two\(values: 'np\.ndarray', "
                                          r"other: 'np\.ndarray'\) -> 'float' cannot be called with one argument, a "
                                          r"block's values \(missing a required argument: 'other'\); name a function "
                                          r"of one argument, e\.g\. def f\(values\)"),
    ("tests.worker._functions:needs_a_keyword", r"needs_a_keyword\(.*\) -> 'float' cannot be called with one argument.*'scale'"),
    ("tests.worker._functions:takes_nothing", r"takes_nothing\(\) -> 'float' cannot be called with one argument, "
                                              r"a block's values \(too many positional arguments\)"),
    ("tests.worker._functions:AnError", r"^function tests\.worker\._functions:AnError is a class, and calling it makes "
                                        r"an instance, not a number; name a function"),
])
def test_a_function_no_block_could_get_a_number_from_is_refused_when_loaded(path, message):
    """Each of these loads, and would fail every block of every release: refused before any block runs."""
    sandbox = FunctionSandbox(path)
    try:
        with pytest.raises(FunctionLoadError, match=message):
            sandbox.check()
    finally:
        sandbox.close()


@pytest.mark.parametrize("path", ["tests.worker._functions:with_a_default", "statistics:median", "numpy:median",
                                  "numpy:sqrt"])  # a ufunc has no signature to read: left to the calls
def test_a_function_of_one_argument_and_optional_others_loads(path):
    sandbox = FunctionSandbox(path)
    try:
        sandbox.check()
    finally:
        sandbox.close()


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


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/PID/mem")
def test_no_block_can_find_another_blocks_values_in_memory():
    """A function that reads raw memory (a C extension, or /proc/self/mem as here) must not find another block's
    values there: only block 2 carries the marker; blocks 1, 3 and 4 must find no copy in their own process, and no
    block one in the long-lived sandbox process it was forked from (which a function could read as well)."""
    from tests.worker._memory_probe import marker_block

    blocks = [np.array([1.0, 2.0, 3.0]), marker_block(3), np.array([4.0, 5.0]), np.array([6.0])]
    found = {}
    for name in ("copies_in_own_memory", "copies_in_the_sandbox_process"):
        sandbox = FunctionSandbox(f"tests.worker._memory_probe:{name}", timeout_s=60.0)
        try:
            found[name] = sandbox.run(blocks).tolist()
            assert sandbox.take_failures() == {}, name
        finally:
            sandbox.close()
    own, sandbox_process = found["copies_in_own_memory"], found["copies_in_the_sandbox_process"]
    assert own[1] >= 1, found  # the probe does find the marker where it is
    assert [own[0], own[2], own[3]] == [0, 0, 0], found
    if sandbox_process[0] >= 0:  # -1: this system does not let a process read its parent's memory
        assert sandbox_process == [0, 0, 0, 0], found


def _still_running(pid: int, within_s: float = 5.0) -> bool:
    """Whether ``pid`` still runs ``within_s`` from now (a SIGKILLed process runs no more code, but takes a moment
    to be torn down)."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat", "rb") as handle:
                if handle.read().rsplit(b")", 1)[1].split()[0] == b"Z":  # a zombie has ended, only not been reaped
                    return False
        except FileNotFoundError:
            return False
        time.sleep(0.05)
    return True


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/PID/stat and /proc/self/fd")
def test_what_a_block_starts_or_writes_itself_stays_in_that_block():
    """A process a call leaves running ends with its block (else it could watch the next one); bytes a function writes
    to its answer pipe are at most its own block's answer, and the blocks after it answer as usual."""
    sandbox = FunctionSandbox("tests.worker._reaching_out:starts_a_process")
    try:
        (pid,) = sandbox.run(_blocks([1])).tolist()
        assert not _still_running(int(pid))
    finally:
        sandbox.close()
    sandbox = FunctionSandbox("tests.worker._reaching_out:forges_on_seven")
    try:
        assert sandbox.run(_blocks([1], [7], [1, 2], [7, 7, 7], [3])).tolist() == [1.0, 99.0, 2.0, 99.0, 1.0]
        assert sandbox.take_failures() == {}
    finally:
        sandbox.close()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="opens /proc/PID/fd")
def test_a_block_cannot_open_the_sandbox_processs_pipes():
    # The sandbox process is not dumpable and a block's process has no capabilities: /proc/PPID/fd is closed
    # to it. Open, a block read the next block's request there and answered for it, shifting every answer after.
    sandbox = FunctionSandbox("tests.worker._reaching_out:opens_the_sandbox_pipes")
    try:
        assert sandbox.run(_blocks([1], [2, 3], [4])).tolist() == [0.0, 0.0, 0.0]
    finally:
        sandbox.close()


def test_an_answer_is_passed_on_through_a_cleared_buffer_where_splice_is_missing(monkeypatch):
    from stream_dp.worker.sandbox import child as sandbox_child

    monkeypatch.delattr(os, "splice", raising=False)
    block_end, block_write = os.pipe()
    worker_read, worker_end = os.pipe()
    try:
        record = sandbox_child.encode("ok", 2.5)
        os.write(block_write, record + b"anything after")
        sandbox_child._forward(block_end, worker_end)
        assert os.read(worker_read, 4096) == record
        assert bytes(sandbox_child._RELAY) == bytes(len(record))
    finally:
        for fd in (block_end, block_write, worker_read, worker_end):
            os.close(fd)


SANDBOXED_QUERY = """
namespaces:
  users: {budgets: [{horizon: 1h, epsilon: 1.0}]}
queries:
  - name: probe
    input_topic: events.probe
    output_topic: dp.probe
    privacy_unit: {namespace: users, field: user_id}
    timestamp_field: ts
    window: {size: 1m}
    group_by: [page]
    groups: {public: [a]}
    bounds: {max_groups_per_unit: 1, max_events_per_group: 1}
    aggregations:
      sample_aggregate: {function: "tests.worker._secret_probe:statistic", field: value, blocks: 2, output_range: [0, 1]}
    epsilon: 1.0
"""


LINUX_ONLY = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc and prctl are Linux's")


@LINUX_ONLY
def test_a_function_cannot_read_the_secret_out_of_the_worker_process(tmp_path):
    """The worker holds the secret in its real environment (as a container's env would give it); the function's
    module, imported in the sandbox when ``stream-dp`` loads it, walks up its ancestors' /proc/PID/environ and
    /proc/PID/mem. Run as root, as here, what refuses it is the sandbox's dropped capabilities (without them the
    probe finds the secret); a worker run as another user is guarded by being not dumpable (next tests)."""
    from tests.worker._secret_probe import SECRET_MARK

    config, out = tmp_path / "queries.yaml", tmp_path / "secret_probe.txt"
    config.write_text(SANDBOXED_QUERY)
    env = {**os.environ, "STREAM_DP_CONTRIBUTION_SECRET": SECRET_MARK.decode(), "TMPDIR": str(tmp_path)}
    done = subprocess.run([sys.executable, "-m", "stream_dp.cli.main", "check-config", str(config)],
                          capture_output=True, text=True, cwd=ROOT, env=env, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    found = out.read_text()
    assert found.startswith("not found"), found
    assert "PermissionError" in found, found  # the stream-dp process itself was tried and refused


_HOLDER = """
import sys, time
from stream_dp.worker.guard.process import drop_capabilities, make_undumpable
drop_capabilities()  # as a worker run by an ordinary user: no capabilities at all
if sys.argv[1] == "guarded":
    make_undumpable()
print("ready", flush=True)
time.sleep(60)
"""
_READER = """
import sys
from stream_dp.worker.guard.process import drop_capabilities
drop_capabilities()
try:
    print("read" if sys.argv[2].encode() in open(f"/proc/{sys.argv[1]}/environ", "rb").read() else "no secret")
except PermissionError:
    print("refused")
"""


@LINUX_ONLY
@pytest.mark.parametrize("guard, expected", [("guarded", "refused"), ("unguarded", "read")])
def test_a_process_of_the_same_user_cannot_read_an_undumpable_ones_environment(guard, expected):
    """Two capability-less processes of one user: the reader gets the holder's environment unless the holder made
    itself not dumpable (the unguarded case shows the read is otherwise possible)."""
    secret = "holder-secret-0123456789abcdef"
    holder = subprocess.Popen([sys.executable, "-c", _HOLDER, guard], stdout=subprocess.PIPE, text=True, cwd=ROOT,
                              env={**os.environ, "STREAM_DP_CONTRIBUTION_SECRET": secret})
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "ready"
        done = subprocess.run([sys.executable, "-c", _READER, str(holder.pid), secret], capture_output=True,
                              text=True, cwd=ROOT, timeout=60, check=True)
        assert done.stdout.strip() == expected, done.stderr
    finally:
        holder.kill()
        holder.wait(10)
        if holder.stdout is not None:
            holder.stdout.close()


@LINUX_ONLY
def test_every_stream_dp_command_makes_its_process_undumpable(tmp_path):
    config = tmp_path / "queries.yaml"
    config.write_text(SANDBOXED_QUERY)
    script = ("import sys\nfrom stream_dp.cli.main import main\nfrom stream_dp.worker.guard.process import is_dumpable\n"
              "before = is_dumpable()\nmain(['check-config', sys.argv[1]])\nprint(before, is_dumpable())")
    done = subprocess.run([sys.executable, "-c", script, str(config)], capture_output=True, text=True, cwd=ROOT,
                          timeout=120, check=True)
    assert done.stdout.split()[-2:] == ["True", "False"], done.stdout + done.stderr
