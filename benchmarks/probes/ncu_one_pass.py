"""Phase 2 in one pass or two, counted on recorded traces (CPU, no GPU needed).

Two passes: every launch (first of each problem size) of the hot kernels that run several sizes
under one launch configuration, then one launch per configuration of the rest. One pass: the
first launch of each op signature of every hot instantiation. Prints, per trace, how many
launches each would profile; a second pass costs its process's first step and warm-up under
ncu, 4-7 s from its gate on an H200 (BENCHMARKS.md), against about 0.4 s a launch.

    python benchmarks/probes/ncu_one_pass.py examples/runs/*/trace.json.gz examples/runs/*/trace.rank0.json.gz
"""

from __future__ import annotations

import argparse
from pathlib import Path

from kerneltriage.analysis.rules import load_rules
from kerneltriage.analysis.timeline.attribution import attribute
from kerneltriage.analysis.timeline.hot_kernels import select_hot_kernels
from kerneltriage.analysis.timeline.sizes import first_of_size, launch_sizes
from kerneltriage.ingest.kernel_names import base_name
from kerneltriage.ingest.kineto import read_trace


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("traces", nargs="+", type=Path)
    parser.add_argument("--coverage", type=float, default=0.97)
    args = parser.parse_args()
    rules = load_rules(None)
    print(
        "| trace | hot kernels | two passes (every-launch + per configuration) | one pass (first of each size) |"
    )
    print("| --- | --- | --- | --- |")
    for path in args.traces:
        timeline = read_trace(path)
        hot = select_hot_kernels(timeline, rules, coverage=args.coverage, max_kernels=64, first_of_size=True)
        k = attribute(timeline).kernels
        k = k[(k["step"] >= 0) & (k["kind"] == "kernel")]
        k = k.assign(base=k["name"].map(base_name))
        step = k[k["step"] == k["step"].min()]
        rows = step[hot.chosen(step)]
        one = int(first_of_size(rows, launch_sizes(timeline, rows)).sum())
        two = hot.configs - hot.variable_configs + hot.variable_launches
        print(
            f"| {path.parent.name}/{path.name} | {len(hot.names)} | {hot.variable_launches} + {two - hot.variable_launches} = {two} | {one} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
