"""Benchmark: VectorisedExactNoise against OpenDPNoise (sequential and on a thread pool), same run.

Prints, per source, the seconds and draws per second of
  * a Laplace window release of N groups (count + sum: 2N draws, through ReleasePlan.release),
  * partition selection over M candidate groups (M discrete Laplace draws),
and, for reference, the Gaussian release (where the vectorised source delegates to OpenDP).

    nice -n 19 .venv/bin/python tests/perf/bench_fast_noise.py                 # ~1 minute
    nice -n 19 .venv/bin/python tests/perf/bench_fast_noise.py --groups 100000 --candidates 1000000
"""

from __future__ import annotations

import argparse
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path


sys.path.insert(0, str(Path(__file__).resolve().parent))

from stream_dp.dp import (
    NoiseSource,
    OpenDPNoise,
    PartitionSelection,
    ReleasePlan,
    VectorisedExactNoise,
)

# the same window data, bounds and timing as bench_noise.py, so the two print comparable figures
from bench_noise import BOUNDS, CLIP, best_of, synthetic_window  # noqa: E402


def report(label: str, source: str, draws: int, seconds: float) -> None:
    print(f"{label:<28} {source:<22} {seconds:>8.3f} s {draws / seconds:>12,.0f} draws/s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--groups", type=int, default=100_000, help="groups per window release")
    parser.add_argument("--candidates", type=int, default=1_000_000, help="candidate groups for selection")
    parser.add_argument("--threads", type=int, default=2, help="OpenDP thread pool size")
    parser.add_argument("--repeat", type=int, default=2, help="runs per measurement; the fastest is shown")
    parser.add_argument("--skip-opendp-selection", action="store_true",
                        help="skip OpenDP on the selection vector (about 10 s per million draws)")
    args = parser.parse_args()

    counts, sums, _ = synthetic_window(args.groups)
    _, _, candidates = synthetic_window(args.candidates)
    selection = PartitionSelection.calibrate(epsilon=0.5, delta=1e-6, bounds=BOUNDS)
    with ThreadPoolExecutor(max_workers=args.threads) as executor:
        sources: dict[str, NoiseSource] = {
            "OpenDP, 1 thread": OpenDPNoise(),
            f"OpenDP, {args.threads} threads": OpenDPNoise(executor=executor),
            "vectorised exact": VectorisedExactNoise(executor=executor),
        }
        for mechanism in ("laplace", "gaussian"):
            plan = ReleasePlan.build(
                mechanism=mechanism, epsilon=1.0, delta=0.0 if mechanism == "laplace" else 1e-7,
                bounds=BOUNDS, clip=CLIP, aggregations={"count", "sum"}, max_groups=args.groups,
            )
            for name, noise in sources.items():
                plan.release(counts[:10], sums[:10], None, noise)  # measurements built and cached
                seconds = best_of(args.repeat, lambda: plan.release(counts, sums, None, noise))
                report(f"{mechanism} release {args.groups}x2", name, 2 * args.groups, seconds)
        for name, noise in sources.items():
            if args.skip_opendp_selection and name.startswith("OpenDP"):
                continue
            seconds = best_of(args.repeat, lambda: selection.select(candidates, noise))
            report(f"selection {args.candidates}", name, args.candidates, seconds)


if __name__ == "__main__":
    main()
