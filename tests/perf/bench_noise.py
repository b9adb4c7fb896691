"""Benchmark: time to noise one window release (count + sum per group) with OpenDP.

Prints, per mechanism and number of groups, the seconds of one release and
groups per second, with the noise drawn in the calling thread and on a thread
pool, and the ratio against numpy's (insecure, reference-only) generator
drawing the same amount of noise in the same run. Then the fixed cost of one
small release, the float grid chosen by the plan against OpenDP's exact grid,
and partition selection run vectorised against OpenDP's hashmap measurement.

    .venv/bin/python tests/perf/bench_noise.py                      # ~1 minute
    .venv/bin/python tests/perf/bench_noise.py --sizes 10000 100000 1000000
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from stream_dp.dp import ClipRange, ContributionBounds, OpenDPNoise, PartitionSelection, ReleasePlan
from stream_dp.dp.measurements import NoiseKind, exact_float_vector_measurement, laplace_threshold_measurement

BOUNDS = ContributionBounds(max_groups_per_unit=3, max_events_per_group=2)
CLIP = ClipRange(0.0, 100.0)


def best_of(repeat: int, run: Callable[[], object]) -> float:
    """Fastest of ``repeat`` runs, in seconds (the machine is shared)."""
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        run()
        times.append(time.perf_counter() - started)
    return min(times)


def synthetic_window(groups: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(groups)  # synthetic data only; never used for noise
    distinct = rng.integers(1, 200, groups)
    counts = distinct + rng.integers(0, distinct + 1)
    return counts.astype(np.int64), counts * rng.uniform(0.0, 100.0, groups), distinct.astype(np.int64)


def build_plan(mechanism: str, max_groups: int) -> ReleasePlan:
    return ReleasePlan.build(
        mechanism=mechanism, epsilon=1.0, delta=0.0 if mechanism == "laplace" else 1e-7,
        bounds=BOUNDS, clip=CLIP, aggregations={"count", "sum"}, max_groups=max_groups,
    )


def numpy_baseline(mechanism: str, groups: int) -> Callable[[], object]:
    generator = np.random.default_rng()  # reference only: numpy noise is not acceptable for releases

    def draw() -> object:
        if mechanism == "laplace":
            return generator.laplace(size=groups), generator.laplace(size=groups)
        return generator.normal(size=groups), generator.normal(size=groups)

    return draw


def bench_releases(sizes: list[int], mechanisms: list[str], threads: int, repeat: int) -> list[dict]:
    rows = []
    print(f"{'mechanism':<9} {'groups':>9} {'mode':<12} {'seconds':>8} {'groups/s':>11} {'x numpy':>8}")
    with ThreadPoolExecutor(max_workers=threads) as executor:
        modes = {"sequential": OpenDPNoise(), f"{threads} threads": OpenDPNoise(executor=executor)}
        for mechanism in mechanisms:
            plan = build_plan(mechanism, max(sizes))
            for groups in sizes:
                counts, sums, distinct = synthetic_window(groups)
                baseline = best_of(repeat, numpy_baseline(mechanism, groups))
                for mode, noise in modes.items():
                    seconds = best_of(repeat, lambda: plan.release(counts, sums, distinct, noise))
                    print(f"{mechanism:<9} {groups:>9} {mode:<12} {seconds:>8.3f} {groups / seconds:>11.0f}"
                          f" {seconds / baseline:>8.0f}")
                    rows.append({"mechanism": mechanism, "groups": groups, "mode": mode, "seconds": seconds,
                                 "groups_per_s": groups / seconds, "x_numpy": seconds / baseline})
    return rows


def bench_overhead(repeat: int) -> list[dict]:
    rows = []
    noise = OpenDPNoise()
    for mechanism in ("laplace", "gaussian"):
        plan = build_plan(mechanism, 1_000_000)
        for groups in (1, 10, 100):
            counts, sums, distinct = synthetic_window(groups)
            plan.release(counts, sums, distinct, noise)  # measurements built and cached
            calls = 200
            seconds = best_of(repeat, lambda: [plan.release(counts, sums, distinct, noise) for _ in range(calls)])
            print(f"per-release overhead {mechanism:<8} {groups:>4} groups: {seconds / calls * 1e6:8.0f} us")
            rows.append({"mechanism": mechanism, "groups": groups, "us_per_release": seconds / calls * 1e6})
    return rows


def bench_float_grid(groups: int, repeat: int) -> None:
    values = synthetic_window(groups)[1]
    noise = OpenDPNoise()
    for mechanism in ("laplace", "gaussian"):
        plan = build_plan(mechanism, groups)
        assert plan.sum_noise is not None
        scale, k = plan.sum_noise.scale, plan.sum_noise.float_grid_k
        assert k is not None
        kind: NoiseKind = "laplace" if mechanism == "laplace" else "gaussian"
        chosen = best_of(repeat, lambda: noise.floats(values, kind=kind, scale=scale, k=k))
        exact = exact_float_vector_measurement(kind, scale, groups)
        finest = best_of(repeat, lambda: exact(values))
        print(f"float {mechanism:<8} {groups} sums: grid 2^{k} {chosen:.3f} s, exact grid {finest:.3f} s "
              f"({finest / chosen:.1f}x slower); rounding costs {plan.sum_noise.rounding_cost:.2e} of "
              f"{plan.sum_noise.cost:.3f} {'epsilon' if mechanism == 'laplace' else 'rho'}")


def bench_selection(groups: int, repeat: int) -> None:
    distinct = synthetic_window(groups)[2]
    selection = PartitionSelection.calibrate(epsilon=0.5, delta=1e-6, bounds=BOUNDS)
    noise = OpenDPNoise()
    vectorised = best_of(repeat, lambda: selection.select(distinct, noise))
    hashmap = laplace_threshold_measurement(selection.scale, selection.threshold)
    entries = dict(zip(range(groups), distinct.tolist()))
    opendp_map = best_of(repeat, lambda: hashmap(entries))
    print(f"selection {groups} groups: vectorised {vectorised:.3f} s, OpenDP hashmap {opendp_map:.3f} s "
          f"({opendp_map / vectorised:.1f}x slower)")


def measure(sizes: list[int], mechanisms: list[str], threads: int = 2, repeat: int = 2, side_groups: int = 20_000) -> dict:
    """Releases and per-release overhead (returned), float grid and selection (printed)."""
    out = {"releases": bench_releases(sizes, mechanisms, threads, repeat), "overhead": bench_overhead(repeat)}
    bench_float_grid(side_groups, repeat)
    bench_selection(side_groups, repeat)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000], help="groups per release")
    parser.add_argument("--mechanisms", nargs="+", default=["laplace", "gaussian"], choices=["laplace", "gaussian"])
    parser.add_argument("--threads", type=int, default=2, help="thread pool size for the threaded mode")
    parser.add_argument("--repeat", type=int, default=2, help="runs per measurement; the fastest is shown")
    parser.add_argument("--side-groups", type=int, default=20_000,
                        help="groups for the float-grid and selection comparisons")
    args = parser.parse_args()
    measure(args.sizes, args.mechanisms, args.threads, args.repeat, args.side_groups)


if __name__ == "__main__":
    main()
