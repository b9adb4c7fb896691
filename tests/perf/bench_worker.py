"""stream-dp end to end: worker processes against the real Kafka and Redis.

    .venv/bin/python tests/perf/bench_worker.py [--events 200000] [--repeat 3] [--no-scaling] [--profile] [--ab DIR]

Produces a fresh topic (4 partitions, ~70-byte JSON events keyed by unit, one-
minute windows of event time) and runs ``stream-dp run`` on it: decode,
window, bound, charge every unit's budget in Redis at each window close,
combine, noise (OpenDP), ledger, publish. Each repetition uses a new consumer
group, query, namespace and internal topics, so it starts from nothing.

Scaling (1 vs 2 worker processes, 4 partitions): two workers started on a
pre-produced topic spend seconds in their first rebalance, and the new owner
of a partition re-reads its open windows, so these runs use a live topic
instead: the workers start on an empty topic, the events are produced once
their consumer group has settled, and the rate counts from the end of
producing (the backlog) to the last event.

Rate: events/s counted by the workers' ``stream_dp_events_total`` (scraped
every 100 ms) from the first scrape in which every worker has counted events
to the last scrape before the final count, so process start-up and, with
two workers, the first rebalance are not counted (events a new partition
owner re-reads after that rebalance are). Drain: seconds from the last event consumed until every data window's
records are on the output topic; it includes the ``idle_timeout`` (10 s) that
closes the last window once input stops. The budget limits are 1000 per hour,
so no unit is excluded (the excluded count is printed to show it). With
``--profile`` one extra single-worker run is sampled with py-spy. With
``--ab DIR`` every round also runs single workers from the copy of
``stream_dp`` in DIR (e.g. a patched checkout) and prints its rate over this
tree's.
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

IDLE_TIMEOUT_S = 10


def peak_rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as handle:
        for line in handle:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def redis_state_bytes(redis_url: str, namespace: str) -> dict[str, int]:
    """MEMORY USAGE of a namespace's unit states and of its charge records."""
    import redis

    client = redis.Redis.from_url(redis_url)
    try:
        sizes = {}
        for kind, pattern in (("states", f"dp:s:{namespace}:*"), ("charge_records", f"dp:c:{namespace}:*")):
            keys = list(client.scan_iter(match=pattern, count=5_000))
            pipe = client.pipeline(transaction=False)
            for key in keys:
                pipe.memory_usage(key, samples=0)
            sizes[kind] = sum(v or 0 for v in pipe.execute()) if keys else 0
        return sizes
    finally:
        client.close()


def wait_group_stable(bootstrap: str, group_id: str, members: int, partitions: int, timeout_s: float = 90) -> None:
    """Wait until the consumer group has ``members`` members sharing all ``partitions`` partitions."""
    client = perfkit.admin(bootstrap)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            group = client.describe_consumer_groups([group_id])[group_id].result(timeout=10)
            assigned = sum(len(m.assignment.topic_partitions) for m in group.members)
            if str(group.state).endswith("STABLE") and len(group.members) == members and assigned == partitions:
                return
        except Exception:  # the group does not exist yet
            pass
        time.sleep(0.2)
    raise RuntimeError(f"consumer group {group_id} did not settle on {members} members within {timeout_s} s")


def run_once(
    services: perfkit.Services, topic: str | None, events: perfkit.SyntheticEvents, *, groups: int, workers: int,
    workdir: Path, profile_to: Path | None = None, timeout_s: float = 600, pythonpath: Path | None = None,
) -> dict[str, Any]:
    """One run of ``workers`` worker processes over all ``events``; cleans up what it created.

    ``topic``: a topic holding the events; None: a new topic that the events are
    produced to once the workers' consumer group has settled (the "live" mode
    of the scaling measurement: no start-up rebalance inside the measurement,
    which then starts once the last event is produced).
    ``pythonpath``: run the workers from the copy of ``stream_dp`` in that directory.
    """
    name = perfkit.unique_name(f"w{workers}")
    live = topic is None
    partitions = int(events.partition.max()) + 1
    if topic is None:
        topic = f"{name}-in"
        perfkit.create_topic(services.bootstrap, topic, partitions)
    config = perfkit.write_config(
        workdir / f"{name}.yaml",
        perfkit.worker_config(name, topic, groups=groups, idle_timeout=f"{IDLE_TIMEOUT_S}s"),
    )
    data_windows = [events.first_window_ms + k * perfkit.WINDOW_MS for k in range(events.windows)]
    group_id = f"{name}-g"
    procs: list[perfkit.WorkerProcess] = []
    poller: watch.Poller | None = None
    reader: watch.OutputReader | None = None
    profiler = None
    try:
        procs = [
            perfkit.WorkerProcess(config, services=services, group_id=group_id, internal_prefix=f"{name}.",
                                  metrics_port=perfkit.free_port(), log_path=workdir / f"{name}-{i}.log",
                                  pythonpath=pythonpath)
            for i in range(workers)
        ]
        poller = watch.Poller([p.port for p in procs]).start()
        produced_at = None
        if live:
            wait_group_stable(services.bootstrap, group_id, workers, partitions)
            perfkit.produce(services.bootstrap, topic, events)
            produced_at = time.monotonic()
        if not poller.wait_for(1, timeout_s=60):
            raise RuntimeError(f"workers consumed nothing within 60 s; log:\n{procs[0].log_tail()}")
        if profile_to is not None:  # from the first event on: start-up imports are not the steady state
            profiler = watch.start_profiler(procs[0].pid, profile_to)
        reader = watch.OutputReader(services.bootstrap, f"{name}-out", expected_per_window=groups)
        consumed_at = poller.wait_consumed(len(events), timeout_s=timeout_s)
        if consumed_at is None:
            raise RuntimeError(f"workers did not consume all {len(events)} events; log:\n{procs[0].log_tail()}")
        if profiler is not None:
            watch.stop_profiler(profiler)
        released = reader.wait_windows(data_windows, timeout_s=IDLE_TIMEOUT_S + 120)
        released_at = max(reader.completed_at.values()) if released else float("nan")
        texts = [watch.scrape(p.port) for p in procs]
        metric = lambda n, **kw: sum(watch.metric_sum(t, n, **kw) for t in texts)  # noqa: E731
        watch.check_release_record(reader.samples[data_windows[0]])
        result = {
            "workers": workers,
            "rate": poller.rate(since=produced_at),
            "live": live,
            "drain_s": released_at - consumed_at,
            "released_all": released,
            "records": sum(reader.counts.get(w, 0) for w in data_windows),
            "accepted": metric("stream_dp_events_total", outcome="accepted"),
            "late": metric("stream_dp_events_total", outcome="late"),
            "rejected": metric("stream_dp_events_total", outcome="rejected"),
            "units_charged": metric("stream_dp_window_units_total", outcome="charged"),
            "units_excluded": metric("stream_dp_window_units_total", outcome="excluded"),
            "noise_s": metric("stream_dp_noise_seconds_sum"),
            "peak_rss_bytes": [peak_rss_bytes(p.pid) for p in procs],
            "redis": redis_state_bytes(services.redis_url, name),
        }
        return result
    finally:
        if profiler is not None:
            watch.stop_profiler(profiler)
        if reader is not None:
            reader.close()
        if poller is not None:
            poller.stop()
        for proc in procs:
            proc.stop()
        perfkit.delete_topics(services.bootstrap, f"{name}-")
        perfkit.delete_topics(services.bootstrap, f"{name}.")
        perfkit.delete_groups(services.bootstrap, [group_id, f"{group_id}-release", f"{name}-out-reader"])
        perfkit.cleanup_redis(services.redis_url, name, name)


RUNS = {
    # key: (label, workers, live)
    "1": ("1 worker, pre-produced topic", 1, False),
    "live_1": ("1 worker, live topic", 1, True),
    "live_2": ("2 workers, live topic", 2, True),
}


def measure(
    services: perfkit.Services, topic: str, events: perfkit.SyntheticEvents, *, groups: int, repeat: int,
    workdir: Path, scaling: bool = True,
) -> dict[str, Any]:
    """Per round: one worker on the shared pre-produced ``topic``; with ``scaling``, also
    1 and 2 workers in live mode (see ``run_once``), whose ratio is the scaling."""
    kinds = list(RUNS) if scaling else ["1"]
    runs: dict[str, list[dict[str, Any]]] = {k: [] for k in kinds}
    for round_ in range(repeat):
        for kind in kinds:
            label, workers, live = RUNS[kind]
            result = run_once(services, None if live else topic, events, groups=groups, workers=workers, workdir=workdir)
            runs[kind].append(result)
            print(f"  stream-dp, {label:<29} round {round_ + 1}: {result['rate']:>10,.0f} events/s, "
                  f"drain {result['drain_s']:.1f} s, {result['units_excluded']:.0f} units excluded, "
                  f"late {result['late']:.0f}", flush=True)
    out: dict[str, Any] = {}
    for kind, results in runs.items():
        last = results[-1]
        out[kind] = {
            "label": RUNS[kind][0],
            "rate": perfkit.summarize([r["rate"] for r in results]),
            "drain_s": perfkit.summarize([r["drain_s"] for r in results]),
            "units_excluded": max(r["units_excluded"] for r in results),
            "late": max(r["late"] for r in results),
            "accepted": last["accepted"],
            "records": last["records"],
            "peak_rss_mb": max(max(r["peak_rss_bytes"]) for r in results) / 2**20,
            "redis_state_bytes": last["redis"]["states"],
            "redis_charge_record_bytes": last["redis"]["charge_records"],
            "noise_s": last["noise_s"],
            "runs": results,
        }
    return out


def profile(services: perfkit.Services, topic: str, events: perfkit.SyntheticEvents, *, groups: int,
            workdir: Path) -> dict[str, Any]:
    """One single-worker run under py-spy; shares of busy samples by function."""
    out = workdir / "worker-profile.txt"
    result = run_once(services, topic, events, groups=groups, workers=1, workdir=workdir, profile_to=out)
    summary = watch.profile_summary(out)
    summary["breakdown"] = watch.profile_breakdown(out, watch.INGEST_CATEGORIES)
    summary["rate_under_profiler"] = result["rate"]
    summary["file"] = str(out)
    return summary


def ab(services: perfkit.Services, topic: str, events: perfkit.SyntheticEvents, *, groups: int, repeat: int,
       other: Path, workdir: Path) -> dict[str, Any]:
    """Single workers from this tree and from ``other``, alternating; the ratio of their median rates."""
    rates: dict[str, list[float]] = {"this tree": [], str(other): []}
    for round_ in range(repeat):
        for label, path in (("this tree", None), (str(other), other)):
            result = run_once(services, topic, events, groups=groups, workers=1, workdir=workdir, pythonpath=path)
            rates[label].append(result["rate"])
            print(f"  A/B {label}: round {round_ + 1}: {result['rate']:,.0f} events/s", flush=True)
    summaries = {label: perfkit.summarize(r) for label, r in rates.items()}
    ratio = summaries[str(other)]["median"] / summaries["this tree"]["median"]
    print(f"A/B: {other} runs at {ratio:.2f} x this tree's rate (medians of {repeat})")
    return {"rates": summaries, "ratio": ratio}


def print_profile(summary: dict[str, Any], top: int = 12) -> None:
    print(f"py-spy, one worker ({summary['samples']} busy samples; {summary['rate_under_profiler']:,.0f} events/s while sampled)")
    print("  by stage:")
    for name, share, seconds in summary["breakdown"]:
        print(f"    {share * 100:5.1f}%  {seconds:6.2f} s  {name}")
    for kind in ("self", "inclusive"):
        print(f"  {kind}:")
        for name, share in summary[kind][:top]:
            print(f"    {share * 100:5.1f}%  {name}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--units", type=int, default=100_000)
    parser.add_argument("--groups", type=int, default=1_000)
    parser.add_argument("--windows", type=int, default=10, help="one-minute windows the events span")
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--no-scaling", action="store_true", help="leave out the 1 vs 2 workers runs on live topics")
    parser.add_argument("--profile", action="store_true", help="also sample one single-worker run with py-spy")
    parser.add_argument("--ab", type=Path, metavar="DIR", help="also run workers from the stream_dp copy in DIR")
    args = parser.parse_args()

    services = perfkit.Services.from_env()
    services.check()
    topic = perfkit.unique_name("worker-in")
    events = perfkit.synthetic_events(args.events, units=args.units, groups=args.groups, windows=args.windows,
                                      partitions=args.partitions, seed=1)
    workdir = Path(tempfile.mkdtemp(prefix="bench-worker-"))
    try:
        perfkit.create_topic(services.bootstrap, topic, args.partitions)
        seconds = perfkit.produce(services.bootstrap, topic, events)
        print(f"produced {len(events):,} events to {topic} in {seconds:.1f} s; logs in {workdir}")
        result = measure(services, topic, events, groups=args.groups, repeat=args.repeat, workdir=workdir,
                         scaling=not args.no_scaling)
        for r in result.values():
            print(f"{r['label']}: {r['rate']['median']:,.0f} events/s (spread {r['rate']['spread'] * 100:.1f}%), "
                  f"drain {r['drain_s']['median']:.1f} s, peak RSS {r['peak_rss_mb']:.0f} MB, "
                  f"Redis {r['redis_state_bytes'] / max(1, len(set(events.unit.tolist()))):.1f} bytes/active unit")
        if args.ab:
            ab(services, topic, events, groups=args.groups, repeat=args.repeat, other=args.ab.resolve(), workdir=workdir)
        if args.profile:
            print_profile(profile(services, topic, events, groups=args.groups, workdir=workdir))
    finally:
        perfkit.delete_topics(services.bootstrap, topic)


if __name__ == "__main__":
    main()
