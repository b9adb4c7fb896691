"""stream-dp end to end: worker processes against the real Kafka and Redis.

    .venv/bin/python tests/perf/bench_worker.py [--events 200000] [--repeat 5] [--kinds 1,p2,live_1,live_2] [--profile] [--ab DIR]

Produces a fresh topic (4 partitions, ~70-byte JSON events keyed by unit and placed
by murmur2 as Kafka's default partitioner does, records stamped with the event time,
one-minute windows of event time) and runs ``stream-dp run`` on it: decode, window,
bound, charge every unit's budget in Redis at each window close, combine, noise
(OpenDP), ledger, publish. The events end with one per partition just after the
last window (``CLOSERS_AFTER_MS``): their record timestamps close it as a continuing
stream would, so no idle timeout is waited for. Each run uses a new consumer group,
query, namespace and internal topics, so it starts from nothing.

Kinds of run (``RUNS``): one worker process, or ``stream-dp run --processes 2``, on
the pre-produced topic; and both on a live topic, where the workers start on an
empty topic and the events are produced once their consumer group has settled.

* **End to end** (pre-produced topic; the number compared with raw consumers): the
  events divided by the seconds from the first input assignment the worker logs
  (it polls from then on) to the moment the last data window's last record is read
  from the output topic -- every stage, the release of the last window included, is
  inside the clock. With ``--processes 2`` the first rebalance (the second process
  joining, the new owners re-reading open windows) is inside it too.
* **Steady**: events/s counted by ``stream_dp_events_total`` (scraped every 100 ms)
  from the first scrape with events (live topic: the end of producing) to the last
  scrape before the final count.
* **CPU-s per million events**: user + system CPU of the worker process(es) over the
  end-to-end clock (from /proc, sampled every 100 ms).
* **Drain**: seconds from the last event consumed until every data window's records
  are on the output topic.

The budget limits are 1000 per hour, so no unit is excluded (the excluded count is
printed to show it); a run with any late or rejected event fails. With ``--profile``
one extra single-worker run is sampled with py-spy. With ``--ab DIR`` every round
also runs single workers from the copy of ``stream_dp`` in DIR (e.g. a patched
checkout) and prints its end-to-end rate over this tree's.
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
#: The events end with one per partition this long after the last window's end (the allowed
#: lateness, 5 s, and one more): their record timestamps close it, as a continuing stream would.
CLOSERS_AFTER_MS = 6_000


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
    services: perfkit.Services, topic: str | None, events: perfkit.SyntheticEvents, *, groups: int, processes: int,
    workdir: Path, profile_to: Path | None = None, timeout_s: float = 600, pythonpath: Path | None = None,
) -> dict[str, Any]:
    """One run of ``stream-dp run --processes N`` over all ``events``; cleans up what it created.

    ``topic``: a topic holding the events; None: a new topic that the events are
    produced to once the workers' consumer group has settled (the "live" mode
    of the scaling measurement: no start-up rebalance inside the measurement,
    which then starts once the last event is produced).
    ``pythonpath``: run the workers from the copy of ``stream_dp`` in that directory.

    End to end (pre-produced topic): the clock runs from the first input assignment the
    worker logs (its ingest loop polls from then on) to the moment the last data window's
    last record is read from the output topic, so reading, windowing, budget charges,
    combining, noise, ledger and publishing are all inside it.
    """
    name = perfkit.unique_name(f"w{processes}")
    live = topic is None
    partitions = int(events.partition.max()) + 1
    if topic is None:
        topic = f"{name}-in"
        perfkit.create_topic(services.bootstrap, topic, partitions)
    config = perfkit.write_config(
        workdir / f"{name}.yaml",
        perfkit.worker_config(name, topic, groups=groups, idle_timeout=f"{IDLE_TIMEOUT_S}s",
                              publish_from_ms=events.first_window_ms),
    )
    data_windows = [events.first_window_ms + k * perfkit.WINDOW_MS for k in range(events.windows)]
    group_id = f"{name}-g"
    proc: perfkit.WorkerProcess | None = None
    poller: watch.Poller | None = None
    reader: watch.OutputReader | None = None
    profiler = None
    try:
        proc = perfkit.WorkerProcess(config, services=services, group_id=group_id, internal_prefix=f"{name}.",
                                     metrics_port=perfkit.free_port(), log_path=workdir / f"{name}.log",
                                     pythonpath=pythonpath, processes=processes)
        poller = watch.Poller([proc.port], pid=proc.pid).start()
        reader = watch.OutputReader(services.bootstrap, f"{name}-out", expected_per_window=groups)
        produced_at = None
        if live:
            wait_group_stable(services.bootstrap, group_id, processes, partitions)
            perfkit.produce(services.bootstrap, topic, events)
            produced_at = time.monotonic()
        if not poller.wait_for(1, timeout_s=60):
            raise RuntimeError(f"workers consumed nothing within 60 s; log:\n{proc.log_tail()}")
        if profile_to is not None:  # from the first event on: start-up imports are not the steady state
            profiler = watch.start_profiler(watch.process_tree(proc.pid)[-1], profile_to)
        consumed_at = poller.wait_consumed(len(events), timeout_s=timeout_s)
        if consumed_at is None:
            raise RuntimeError(f"workers did not consume all {len(events)} events; log:\n{proc.log_tail()}")
        released = reader.wait_windows(data_windows, timeout_s=IDLE_TIMEOUT_S + 120)
        if profiler is not None:
            watch.stop_profiler(profiler)
        released_at = max(reader.completed_at.values()) if released else float("nan")
        released_wall = max(reader.completed_wall[w] for w in data_windows) if released else float("nan")
        started_wall = watch.first_assignment_wall(proc.log_text())
        if started_wall is None:
            raise RuntimeError(f"the worker log does not say when its partitions were assigned:\n{proc.log_tail()}")
        time.sleep(0.3)  # one more CPU sample after the last release
        texts = [watch.scrape(proc.port)]
        metric = lambda n, **kw: sum(watch.metric_sum(t, n, **kw) for t in texts)  # noqa: E731
        watch.check_release_record(reader.samples[data_windows[0]])
        seconds = released_wall - started_wall
        cpu_s = poller.cpu_at(released_wall) - poller.cpu_at(started_wall)
        result = {
            "processes": processes,
            "rate": poller.rate(since=produced_at),
            "e2e_s": seconds,
            "e2e_rate": len(events) / seconds if not live else float("nan"),
            "cpu_s": cpu_s,
            "cpu_s_per_million": cpu_s / len(events) * 1e6,
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
            "peak_rss_bytes": [peak_rss_bytes(pid) for pid in watch.process_tree(proc.pid)],
            "redis": redis_state_bytes(services.redis_url, name),
        }
        if result["rejected"] or result["late"]:
            raise RuntimeError(f"{result['rejected']:.0f} events rejected and {result['late']:.0f} late: the data are "
                               f"wrong for this benchmark; log:\n{proc.log_tail()}")
        return result
    finally:
        if profiler is not None:
            watch.stop_profiler(profiler)
        if reader is not None:
            reader.close()
        if poller is not None:
            poller.stop()
        if proc is not None:
            proc.stop()
        perfkit.delete_topics(services.bootstrap, f"{name}-")
        perfkit.delete_topics(services.bootstrap, f"{name}.")
        perfkit.delete_groups(services.bootstrap, [group_id, f"{group_id}-release", f"{name}-out-reader"])
        perfkit.cleanup_redis(services.redis_url, name, name)


RUNS = {
    # key: (label, processes, live)
    "1": ("1 worker, pre-produced topic", 1, False),
    "p2": ("--processes 2, pre-produced topic", 2, False),
    "live_1": ("1 worker, live topic", 1, True),
    "live_2": ("--processes 2, live topic", 2, True),
}


def measure(
    services: perfkit.Services, topic: str, events: perfkit.SyntheticEvents, *, groups: int, repeat: int,
    workdir: Path, kinds: list[str] | None = None,
) -> dict[str, Any]:
    """Per round, one run of each of ``kinds`` (default: every kind of ``RUNS``), in turn."""
    kinds = list(RUNS) if kinds is None else kinds
    runs: dict[str, list[dict[str, Any]]] = {k: [] for k in kinds}
    for round_ in range(repeat):
        for kind in kinds:
            runs[kind].append(run_kind(services, topic, events, kind, groups=groups, workdir=workdir, round_=round_))
    return summarize_runs(runs)


def run_kind(services: perfkit.Services, topic: str, events: perfkit.SyntheticEvents, kind: str, *, groups: int,
             workdir: Path, round_: int) -> dict[str, Any]:
    label, processes, live = RUNS[kind]
    result = run_once(services, None if live else topic, events, groups=groups, processes=processes, workdir=workdir)
    e2e = "" if live else f"end to end {result['e2e_rate']:>9,.0f} events/s ({result['e2e_s']:.2f} s), "
    print(f"  stream-dp, {label:<34} round {round_ + 1}: {e2e}steady {result['rate']:>9,.0f} events/s, "
          f"{result['cpu_s_per_million']:.2f} CPU-s/M events, drain {result['drain_s']:.1f} s, "
          f"{result['units_excluded']:.0f} units excluded", flush=True)
    return result


def summarize_runs(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for kind, results in runs.items():
        if not results:
            continue
        last = results[-1]
        out[kind] = {
            "label": RUNS[kind][0],
            "live": RUNS[kind][2],
            "rate": perfkit.summarize([r["rate"] for r in results]),
            "e2e_rate": perfkit.summarize([r["e2e_rate"] for r in results]),
            "cpu_s_per_million": perfkit.summarize([r["cpu_s_per_million"] for r in results]),
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
    result = run_once(services, topic, events, groups=groups, processes=1, workdir=workdir, profile_to=out)
    summary = watch.profile_summary(out)
    summary["breakdown"] = watch.profile_breakdown(out, watch.INGEST_CATEGORIES)
    summary["rate_under_profiler"] = result["e2e_rate"]
    summary["file"] = str(out)
    return summary


def ab(services: perfkit.Services, topic: str, events: perfkit.SyntheticEvents, *, groups: int, repeat: int,
       other: Path, workdir: Path) -> dict[str, Any]:
    """Single workers from this tree and from ``other``, alternating; the ratio of their median rates."""
    rates: dict[str, list[float]] = {"this tree": [], str(other): []}
    for round_ in range(repeat):
        for label, path in (("this tree", None), (str(other), other)):
            result = run_once(services, topic, events, groups=groups, processes=1, workdir=workdir, pythonpath=path)
            rates[label].append(result["e2e_rate"])
            print(f"  A/B {label}: round {round_ + 1}: {result['e2e_rate']:,.0f} events/s end to end", flush=True)
    summaries = {label: perfkit.summarize(r) for label, r in rates.items()}
    ratio = summaries[str(other)]["median"] / summaries["this tree"]["median"]
    print(f"A/B: {other} runs at {ratio:.2f} x this tree's rate (medians of {repeat})")
    return {"rates": summaries, "ratio": ratio}


def print_profile(summary: dict[str, Any], top: int = 12) -> None:
    print(f"py-spy, one worker ({summary['samples']} busy samples; {summary['rate_under_profiler']:,.0f} events/s end to end "
          "while sampled)")
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
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--kinds", default=",".join(RUNS), help=f"runs per round, among {', '.join(RUNS)}")
    parser.add_argument("--profile", action="store_true", help="also sample one single-worker run with py-spy")
    parser.add_argument("--ab", type=Path, metavar="DIR", help="also run workers from the stream_dp copy in DIR")
    args = parser.parse_args()

    services = perfkit.Services.from_env()
    services.check()
    topic = perfkit.unique_name("worker-in")
    events = perfkit.synthetic_events(args.events, units=args.units, groups=args.groups, windows=args.windows,
                                      partitions=args.partitions, seed=1, closers_after_ms=CLOSERS_AFTER_MS)
    workdir = Path(tempfile.mkdtemp(prefix="bench-worker-"))
    try:
        perfkit.create_topic(services.bootstrap, topic, args.partitions)
        seconds = perfkit.produce(services.bootstrap, topic, events)
        print(f"produced {len(events):,} events to {topic} in {seconds:.1f} s; logs in {workdir}")
        kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
        result = measure(services, topic, events, groups=args.groups, repeat=args.repeat, workdir=workdir, kinds=kinds)
        for r in result.values():
            e2e = r["e2e_rate"]
            print(f"{r['label']}: end to end {e2e['median']:,.0f} events/s (min {e2e['min']:,.0f}, max {e2e['max']:,.0f}), "
                  f"steady {r['rate']['median']:,.0f} events/s, {r['cpu_s_per_million']['median']:.2f} CPU-s/M events, "
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
