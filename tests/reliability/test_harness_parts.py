"""The harness's own parts: the RESP request parser, the fault triggers and a worker process slot.

(The invariant checks are shown to fail on doctored evidence in ``test_checks``.)
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from tests.reliability.redis_proxy import RespRequestParser, Trigger, is_budget_charge, is_ledger_claim, is_mark_published
from tests.reliability.workers import WorkerProcess


def _resp(*args: bytes) -> bytes:
    return b"*%d\r\n" % len(args) + b"".join(b"$%d\r\n%s\r\n" % (len(a), a) for a in args)


def test_parser_splits_commands_across_any_chunking():
    stream = _resp(b"EVALSHA", b"abc", b"3", b"dp:c:ns:q/1/0", b"x\r\ny") + _resp(b"GET", b"k") + _resp(b"PING")
    for step in (1, 2, 7, len(stream)):
        parser = RespRequestParser()
        out = []
        for i in range(0, len(stream), step):
            out += parser.feed(stream[i:i + step])
        assert [c for c, _ in out] == [[b"EVALSHA", b"abc", b"3", b"dp:c:ns:q/1/0", b"x\r\ny"], [b"GET", b"k"], [b"PING"]]
        assert b"".join(raw for _, raw in out) == stream


def test_parser_refuses_what_redis_py_never_sends():
    with pytest.raises(ValueError, match="RESP array"):
        RespRequestParser().feed(b"PING\r\n")


def test_step_predicates_and_trigger_counting():
    charge = [b"EVALSHA", b"sha", b"3", b"dp:c:users:q/100/2", b"dp:t:users:0", b"dp:m:users"]
    claim = [b"EVALSHA", b"sha", b"1", b"stream-dp:ledger:{q}:100", b"payload", b"604800"]
    raise_mark = [b"EVALSHA", b"sha", b"1", b"stream-dp:ledger:{q}:released-through:0", b"100", b"604800"]
    mark = [b"HSET", b"stream-dp:ledger:{q}:100", b"state", b"published"]
    assert is_budget_charge(charge) and not is_budget_charge(claim)
    assert is_ledger_claim(claim) and not is_ledger_claim(raise_mark) and not is_ledger_claim(charge)
    marker = [b"EVALSHA", b"sha", b"1", b"stream-dp:ledger:store:{stream-dp:ledger:store.0.12}", b"token"]
    assert not is_ledger_claim(marker)  # the store markers are written once, not a window's claim
    assert is_mark_published(mark) and not is_mark_published(claim)
    trigger = Trigger(is_budget_charge, occurrence=2)
    assert not trigger.count(charge, 1) and trigger.count(charge, 2) and not trigger.count(charge, 3)
    assert trigger.fired_by == 2 and trigger.command == charge


def test_the_skewed_clock_of_the_clock_skew_fault_is_ahead_and_sleeps_work():
    """A process on ``faked_clock_env`` sees the wall clock ten minutes ahead, durations true, and can block in
    ``time.sleep`` (the worker's retry loops do): on libfaketime with its monotonic clock left alone, sleep
    failed with EINVAL and crashed the skewed worker on its first retry."""
    import os
    import subprocess
    import sys
    import time

    from tests.reliability.faults_hosts import SKEW_S, faked_clock_env

    script = "import time; w, m = time.time(), time.monotonic(); time.sleep(0.2); print(w, time.monotonic() - m)"
    before = time.time()
    out = subprocess.run([sys.executable, "-c", script], env={**os.environ, **faked_clock_env()}, check=True,
                         capture_output=True, text=True, timeout=60).stdout.split()
    assert float(out[0]) - before > SKEW_S - 60, out
    assert float(out[1]) >= 0.2, out


def test_a_kill_while_a_leave_waits_empties_the_slot_once(tmp_path):
    # A fault's thread kills a worker while another's SIGTERM waits for it (a combined run): the leave
    # returns the kill's exit code instead of failing on the emptied slot, and one exit is recorded.
    worker = WorkerProcess("w", tmp_path / "queries.yaml", dict(os.environ), tmp_path)
    worker._process = subprocess.Popen([sys.executable, "-c", "import signal, time; "
                                        "signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(30)"])
    time.sleep(0.5)  # its SIGTERM handler in place
    killer = threading.Timer(0.5, worker.kill)
    killer.start()
    try:
        assert worker.stop(timeout_s=10) == -signal.SIGKILL
    finally:
        killer.join()
    assert worker.exits == [-signal.SIGKILL]
    assert not worker.alive
