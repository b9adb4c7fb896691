"""The audit harness's own bookkeeping (pure): which continual windows it samples, and that its local-DP
reports are ones the worker takes."""

from __future__ import annotations

import numpy as np
import pytest

from tests.audit.neighbours import SCENARIOS, TOPIC_PARTITIONS, _config, records
from tests.audit.releases import audited_windows

CONTINUAL = next(s for s in SCENARIOS if s.name == "continual")


@pytest.mark.parametrize("start_ms", [1_795_438_896_000, 1_795_438_897_000])  # even and odd seconds
def test_continual_samples_are_whole_periods(start_ms):
    """Periods of 2 s start at even seconds; a sample is the sum of a period's two running totals, read at
    its second window, whatever the parity of the stream's start (half the runs once started on an odd
    second and waited forever)."""
    chosen = audited_windows(CONTINUAL, start_ms, 20)
    assert len(chosen) >= 9
    for w in chosen:
        first, second = start_ms + (w - 1) * 1000, start_ms + w * 1000
        # the windows' places in their period, as the worker numbers them: 1 then 2 of the same period
        assert ((first // 1000) % 2 + 1, (second // 1000) % 2 + 1) == (1, 2), w
        assert first // 2000 == second // 2000, w


@pytest.mark.parametrize("scenario", [s for s in SCENARIOS if s.topic in ("local", "local_oue")], ids=lambda s: s.name)
def test_local_scenarios_send_reports_their_worker_takes(scenario):
    """The harness randomizes as ``produce --local-dp`` does; were its reports not tagged as the worker's engine
    requires, every one would be rejected and the audit would compare two empty streams."""
    from kafka.partitioner.default import murmur2

    from stream_dp.config.loader import parse_config
    from stream_dp.windows import RawBatch
    from stream_dp.worker.assemble.runtimes import build_runtimes

    start_ms = 1_795_438_896_000
    config = _config("run", {s.topic: f"in-{s.topic}" for s in SCENARIOS}, {s.name: f"out-{s.name}" for s in SCENARIOS},
                     start_ms)
    config["queries"] = [q for q in config["queries"] if q["name"] == f"run_{scenario.name}"]
    partitions = TOPIC_PARTITIONS[scenario.topic]
    for with_target in (False, True):  # D and D', each to a worker of its own
        (runtime,) = build_runtimes(parse_config(config), secret=b"audit-harness-secret-0123",
                                    clock_ms=lambda: start_ms + 10**6)
        runtime.engine.set_partition_count(partitions)
        runtime.engine.assign(list(range(partitions)))
        sent = records(scenario.topic, start_ms, 3, with_target=with_target)
        batch = RawBatch([value for _, value, _, _ in sent],
                         np.array([(murmur2(key) & 0x7FFFFFFF) % partitions for key, _, _, _ in sent]),
                         np.arange(len(sent)), np.array([stamp for _, _, stamp, _ in sent]),
                         [key for key, _, _, _ in sent])
        result = runtime.engine.process(batch)
        assert [(r.reason, r.detail) for r in result.rejections] == [] and result.accepted == len(sent)
