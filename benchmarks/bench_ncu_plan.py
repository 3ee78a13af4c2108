"""What phase 2's plan costs on a run directory: the trace read, the hot kernels chosen, the
elementwise sizes left to scaling, each timed apart (CPU only; the plan runs in the parent
between phase 1 and phase 2, on the profile's path).

    python benchmarks/bench_ncu_plan.py RUN [--repeat 3] [--profile]

``--profile`` adds the functions that took the most time (cProfile, cumulative).
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import time
from pathlib import Path


def plan_once(run: Path, coverage: float) -> dict[str, float]:
    from kerneltriage.analysis.gpus import resolve_gpu
    from kerneltriage.analysis.rules import load_rules
    from kerneltriage.analysis.timeline.hot_kernels import select_hot_kernels
    from kerneltriage.analysis.timeline.one_size import one_size_per_instantiation
    from kerneltriage.ingest.source import read_timeline

    seconds: dict[str, float] = {}
    t = time.perf_counter()
    timeline = read_timeline(run / "trace.json.gz")
    seconds["read"] = time.perf_counter() - t
    t = time.perf_counter()
    hot = select_hot_kernels(
        timeline, load_rules(None), coverage=coverage, max_kernels=64, first_of_size=True
    )
    seconds["hot kernels"] = time.perf_counter() - t
    t = time.perf_counter()
    spec = resolve_gpu("H200")
    large_ns = spec.l2_mb * 1e6 / spec.peak_bandwidth_gbs if spec is not None else 15_000.0
    one_size_per_instantiation(timeline, hot, large_ns)
    seconds["one size"] = time.perf_counter() - t
    seconds["all"] = sum(seconds.values())
    return seconds


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("run", type=Path)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--coverage", type=float, default=0.97)
    p.add_argument("--profile", action="store_true")
    args = p.parse_args()
    runs = [plan_once(args.run, args.coverage) for _ in range(args.repeat)]
    size = (args.run / "trace.json.gz").stat().st_size / 1e6
    print(f"{args.run.name}: trace.json.gz {size:.1f} MB, median of {args.repeat} (min-max):")
    for key in runs[0]:
        values = [r[key] for r in runs]
        print(f"  {key:12s} {statistics.median(values):.3f} s ({min(values):.3f}-{max(values):.3f})")
    if args.profile:
        prof = cProfile.Profile()
        prof.enable()
        plan_once(args.run, args.coverage)
        prof.disable()
        pstats.Stats(prof).sort_stats("cumulative").print_stats(25)


if __name__ == "__main__":
    main()
