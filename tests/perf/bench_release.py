"""Release latency: from the watermark passing a window's end to the window's last record on the output topic.

    .venv/bin/python tests/perf/bench_release.py [--groups 1000,10000,100000,1000000] [--repeat 3]
    .venv/bin/python tests/perf/bench_release.py --groups 100000 --ab DIR [--rounds 2]   # this tree vs DIR's stream_dp

For each number of groups G, one worker (public groups /g0 .. /g{G-1}, one-
minute windows, allowed lateness 1 s, idle timeout 1 h so that only events
close windows) runs on a fresh 4-partition topic. For each of ``--repeat``
consecutive windows (at most 2 for a million groups or more):

1. the window's events are produced (``max(2 G, --events-per-window)`` events,
   half as many units, uniform over the groups) and the harness waits until the
   worker has counted all of them (``stream_dp_events_total``);
2. one event per partition with time ``window end + allowed lateness`` is
   produced: it moves every partition's watermark to the window's end. The
   clock starts just before this send;
3. the clock stops when the output topic holds G records of the window (a
   consumer in this process, fetch wait 10 ms).

The latency therefore includes the closing events' trip through Kafka, the
budget charge of the window's units in Redis, the partials round trip, noise,
ledger and publishing. The worker's own ``stream_dp_release_latency_seconds``
(window closed in the ingest stage to last record sent) is printed beside it.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import perfkit  # noqa: E402
import watch  # noqa: E402
from stream_dp.windows.record_clock import PRODUCER_QUORUM  # noqa: E402

LATENESS_MS = 1_000
PARTITIONS = 4


def _send_closers(services: perfkit.Services, topic: str, ts_ms: int) -> float:
    """``PRODUCER_QUORUM`` events at ``ts_ms`` on every partition, each of a unit of its own whose key murmur2
    places on that partition (a unit on another partition is dead-lettered and moves no clock): as many units
    as move a trusted producer clock; returns the monotonic time just before sending."""
    from confluent_kafka import Producer

    units = perfkit._units_on_each_partition(PARTITIONS, first=2 * 10**9, per_partition=PRODUCER_QUORUM).tolist()
    producer = Producer({"bootstrap.servers": services.bootstrap, "acks": "all", "linger.ms": 0, "log_level": 3})
    producer.list_topics(topic, timeout=10)  # connect first: the clock should not count the handshake
    started = time.monotonic()
    for i, unit in enumerate(units):
        partition = i // PRODUCER_QUORUM
        # Stamped with its event time as a live producer's record would be: a wall-clock stamp would move the
        # worker's record clock past every later (back-dated) window of the run and close them as they fill.
        value = b'{"user_id":"u%d","ts":%d,"page":"/g0","value":1.0}' % (unit, ts_ms)
        producer.produce(topic, value=value, key=b"u%d" % unit, partition=partition, timestamp=ts_ms)
    if producer.flush(30):
        raise RuntimeError(f"closing events to {topic} were not acknowledged")
    return started


STAGES = ("charge", "partial_send", "decode", "combine", "noise", "encode", "ledger", "render", "publish")


def _worker_latency(port: int, name: str) -> tuple[float, float, dict[str, float]]:
    """The worker's release latency histogram (sum, count) and its seconds so far in each release stage."""
    text = watch.scrape(port)
    stages = {stage: watch.metric_sum(text, "stream_dp_release_stage_seconds_sum", query=name, operation=stage)
              for stage in STAGES}
    return (watch.metric_sum(text, "stream_dp_release_latency_seconds_sum", query=name),
            watch.metric_sum(text, "stream_dp_release_latency_seconds_count", query=name), stages)


def run_groups(services: perfkit.Services, groups: int, *, windows: int, events_per_window: int,
               workdir: Path, profile_to: Path | None = None, pythonpath: Path | None = None) -> dict[str, Any]:
    """``windows`` releases of ``groups`` groups; with ``profile_to``, py-spy samples one more release,
    which is left out of the latencies; with ``pythonpath``, the worker runs that copy of ``stream_dp``."""
    name = perfkit.unique_name(f"rl{groups}")
    topic = f"{name}-in"
    n_events = max(2 * groups, events_per_window)
    measured = windows
    total = windows + (1 if profile_to is not None else 0)
    first_window_ms = (int(time.time() * 1000) // perfkit.WINDOW_MS - total - 3) * perfkit.WINDOW_MS
    config = perfkit.write_config(
        workdir / f"{name}.yaml",
        perfkit.worker_config(name, topic, groups=groups, allowed_lateness=f"{LATENESS_MS}ms", idle_timeout="1h",
                              publish_from_ms=first_window_ms),
    )
    worker = poller = reader = None
    latencies: list[float] = []
    inside: list[float] = []
    stage_runs: list[dict[str, float]] = []
    try:
        perfkit.create_topic(services.bootstrap, topic, PARTITIONS)
        worker = perfkit.WorkerProcess(config, services=services, group_id=f"{name}-g", internal_prefix=f"{name}.",
                                       metrics_port=perfkit.free_port(), log_path=workdir / f"{name}.log",
                                       pythonpath=pythonpath)
        poller = watch.Poller([worker.port]).start()
        reader = watch.OutputReader(services.bootstrap, f"{name}-out", expected_per_window=groups)
        produced = 0
        for k in range(total):
            start_ms = first_window_ms + k * perfkit.WINDOW_MS
            events = perfkit.synthetic_events(n_events, units=max(1, n_events // 2), groups=groups, windows=1,
                                              partitions=PARTITIONS, seed=100 + k, first_window_ms=start_ms)
            perfkit.produce(services.bootstrap, topic, events)
            produced += len(events)
            if not poller.wait_for(produced, timeout_s=300):
                raise RuntimeError(f"worker did not consume window {k}'s events; log:\n{worker.log_tail()}")
            before = _worker_latency(worker.port, name)
            profiler = None
            if profile_to is not None and k == measured:
                profiler = watch.start_profiler(worker.pid, profile_to)
                time.sleep(0.5)  # py-spy attaches
            started = _send_closers(services, topic, start_ms + perfkit.WINDOW_MS + LATENESS_MS)
            produced += PARTITIONS
            released = reader.wait_windows([start_ms], timeout_s=300)
            if profiler is not None:
                watch.stop_profiler(profiler)
            if not released:
                raise RuntimeError(f"window {k} of {groups} groups was not released within 300 s; log:\n{worker.log_tail()}")
            if k == measured:
                break  # the profiled release: its latency is not one of the measured ones
            latencies.append(reader.completed_at[start_ms] - started)
            watch.check_release_record(reader.samples[start_ms])
            deadline = time.monotonic() + 10
            after = _worker_latency(worker.port, name)
            while after[1] <= before[1] and time.monotonic() < deadline:  # histogram updates after the last send
                time.sleep(0.05)
                after = _worker_latency(worker.port, name)
            inside.append((after[0] - before[0]) / max(1.0, after[1] - before[1]))
            stages = {stage: after[2][stage] - before[2][stage] for stage in STAGES}
            stage_runs.append(stages)
            print(f"  release {groups:>7,} groups, window {k + 1}: {latencies[-1]:6.3f} s "
                  f"(worker's own measure {inside[-1]:.3f} s; stages "
                  + ", ".join(f"{stage} {seconds:.3f}" for stage, seconds in stages.items()) + ")", flush=True)
        return {"groups": groups, "events_per_window": n_events, "latency_s": perfkit.summarize(latencies),
                "worker_latency_s": perfkit.summarize(inside),
                # the worker's seconds in each release stage, median over the windows (where a missed goal points)
                "stages_s": {stage: perfkit.summarize([run[stage] for run in stage_runs])["median"] for stage in STAGES}}
    finally:
        if reader is not None:
            reader.close()
        if poller is not None:
            poller.stop()
        if worker is not None:
            worker.stop()
        perfkit.delete_topics(services.bootstrap, f"{name}-")
        perfkit.delete_topics(services.bootstrap, f"{name}.")
        perfkit.delete_groups(services.bootstrap, [f"{name}-g", f"{name}-g-release", f"{name}-out-reader"])
        perfkit.cleanup_redis(services.redis_url, name, name)


def measure(services: perfkit.Services, group_counts: list[int], *, repeat: int, events_per_window: int,
            workdir: Path, profile: bool = False) -> dict[str, Any]:
    """Latency per group count; with ``profile``, the largest count's last release is sampled with py-spy."""
    out: dict[str, Any] = {}
    for g in group_counts:
        profile_to = workdir / f"release-profile-{g}.txt" if profile and g == max(group_counts) else None
        # A million-group window takes 2M events to fill: two windows keep the run within minutes.
        windows = min(repeat, 2) if g >= 1_000_000 else repeat
        out[str(g)] = run_groups(services, g, windows=windows, events_per_window=events_per_window, workdir=workdir,
                                 profile_to=profile_to)
        if profile_to is not None:
            out[str(g)]["profile"] = watch.profile_summary(profile_to) | {
                "file": str(profile_to), "breakdown": watch.profile_breakdown(profile_to, watch.RELEASE_CATEGORIES)}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--groups", default="1000,10000,100000,1000000", help="comma-separated groups per window")
    parser.add_argument("--repeat", type=int, default=3, help="windows measured per group count")
    parser.add_argument("--events-per-window", type=int, default=20_000)
    parser.add_argument("--profile", action="store_true", help="sample the largest group count's last release with py-spy")
    parser.add_argument("--ab", type=Path, help="a directory holding another copy of stream_dp (e.g. an earlier commit's): "
                        "per group count, --rounds rounds each run one worker of this tree and one of that copy, "
                        "--repeat windows each, and print the latencies side by side with their ratio")
    parser.add_argument("--rounds", type=int, default=2, help="rounds of an --ab comparison")
    args = parser.parse_args()
    services = perfkit.Services.from_env()
    services.check()
    workdir = Path(tempfile.mkdtemp(prefix="bench-release-"))
    if args.ab is not None:
        compare(services, [int(g) for g in args.groups.split(",")], args.ab, rounds=args.rounds, windows=args.repeat,
                events_per_window=args.events_per_window, workdir=workdir)
        return
    result = measure(services, [int(g) for g in args.groups.split(",")], repeat=args.repeat,
                     events_per_window=args.events_per_window, workdir=workdir, profile=args.profile)
    print(f"{'groups':>8} {'events':>8} {'latency s (median)':>19} {'spread':>8} {'worker-side s':>14}")
    for r in result.values():
        print(f"{r['groups']:>8,} {r['events_per_window']:>8,} {r['latency_s']['median']:>19.3f} "
              f"{r['latency_s']['spread'] * 100:>7.1f}% {r['worker_latency_s']['median']:>14.3f}")
    for r in result.values():
        if "profile" in r:
            print_profile(r["profile"], f"py-spy, release of {r['groups']:,} groups")
    print(f"worker logs in {workdir}")


def compare(services: perfkit.Services, group_counts: list[int], other: Path, *, rounds: int, windows: int,
            events_per_window: int, workdir: Path) -> dict[str, Any]:
    """This tree's worker against ``other``'s, alternating in rounds, each on a fresh topic: medians per worker
    and the median of the per-round ratios (this tree over the other), so drifting load hits both alike."""
    out: dict[str, Any] = {}
    for g in group_counts:
        mine: list[float] = []
        theirs: list[float] = []
        ratios: list[float] = []
        for round_ in range(rounds):
            runs = {}
            for label, path in (("this tree", None), (str(other), other)) if round_ % 2 == 0 else \
                    ((str(other), other), ("this tree", None)):
                print(f"round {round_ + 1}, {g:,} groups: {label}", flush=True)
                runs[path] = run_groups(services, g, windows=windows, events_per_window=events_per_window,
                                        workdir=workdir, pythonpath=path)["latency_s"]["median"]
            mine.append(runs[None])
            theirs.append(runs[other])
            ratios.append(runs[None] / runs[other])
            print(f"  round {round_ + 1}: this tree {runs[None]:.3f} s, {other} {runs[other]:.3f} s, "
                  f"ratio {ratios[-1]:.2f}", flush=True)
        out[str(g)] = {"this": perfkit.summarize(mine), "other": perfkit.summarize(theirs),
                       "ratio": perfkit.summarize(ratios)}
        print(f"{g:>9,} groups: this tree {out[str(g)]['this']['median']:.3f} s, {other} "
              f"{out[str(g)]['other']['median']:.3f} s (medians of each round's median); per-round ratio "
              + " ".join(f"{r:.2f}" for r in ratios), flush=True)
    return out


def print_profile(summary: dict[str, Any], title: str, top: int = 12) -> None:
    print(f"{title} ({summary['samples']} busy samples)")
    print("  by stage:")
    for name, share, seconds in summary["breakdown"]:
        print(f"    {share * 100:5.1f}%  {seconds:6.2f} s  {name}")
    for kind in ("self", "inclusive"):
        print(f"  {kind}:")
        for name, share in summary[kind][:top]:
            print(f"    {share * 100:5.1f}%  {name}")


if __name__ == "__main__":
    main()
