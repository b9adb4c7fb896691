"""Time of one window's quantiles release: groups x quantiles draws through the noise source.

    .venv/bin/python tests/perf/bench_quantiles.py                  # 1k and 10k groups, 3 quantiles, 256 bins
    .venv/bin/python tests/perf/bench_quantiles.py --groups 1000 --bins 64

Each group holds ``--values`` values (gamma-distributed over the bounds,
like latencies) in a sparse histogram, as the combined window hands it over;
the release draws one permute-and-flip selection per group and quantile
through ``OpenDPNoise.top_k``. Prints wall and CPU seconds and microseconds
per draw; nothing is asserted.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from stream_dp.dp import ContributionBounds, OpenDPNoise
from stream_dp.dp.quantiles import QuantilesPlan
from stream_dp.dp.histogram import HistogramSpec, SparseHistogram


def histograms(groups: int, values: int, spec: HistogramSpec, seed: int) -> SparseHistogram:
    rng = np.random.default_rng(seed)  # synthetic data only; noise never comes from numpy
    sizes = rng.integers(values // 2, values * 3 // 2, groups)
    group = np.repeat(np.arange(groups), sizes)
    value = np.minimum(rng.gamma(2.0, (spec.hi - spec.lo) / 12, len(group)) + spec.lo, spec.hi)
    return SparseHistogram.from_cells(groups, spec.bins, group, spec.bin_of(value))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--groups", type=int, nargs="+", default=[1_000, 10_000])
    parser.add_argument("--values", type=int, default=200, help="values per group, on average")
    parser.add_argument("--bins", type=int, default=256)
    parser.add_argument("--epsilon", type=float, default=1.0)
    args = parser.parse_args()
    spec = HistogramSpec(bins=args.bins, lo=0.0, hi=1000.0)
    plan = QuantilesPlan.build(epsilon=args.epsilon, q=[0.5, 0.9, 0.99], lo=spec.lo, hi=spec.hi, bins=spec.bins,
                               bounds=ContributionBounds(max_groups_per_unit=3, max_events_per_group=2))
    noise = OpenDPNoise()
    plan.release(histograms(10, args.values, spec, 0), noise)  # warm the measurement cache
    for groups in args.groups:
        hist = histograms(groups, args.values, spec, groups)
        wall, cpu = time.perf_counter(), time.process_time()
        plan.release(hist, noise)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        draws = groups * len(plan.q)
        print(f"{groups:>7} groups x {len(plan.q)} quantiles, {args.bins} bins: {wall:6.2f} s wall, {cpu:6.2f} s CPU "
              f"({wall / draws * 1e6:.0f} us per draw)")


if __name__ == "__main__":
    main()
