"""List the distinct GPU kernel names of Kineto traces with their class and library.

    python benchmarks/probes/kernel_names.py ../shared/external-traces examples/runs
    python benchmarks/probes/kernel_names.py --unknown ../shared/external-traces
    python benchmarks/probes/kernel_names.py --top 5 ../shared/external-traces

Arguments are trace files (``*.json`` / ``*.json.gz``) or folders searched for them. Kernels are
``"ph": "X"`` events of category ``kernel`` (``Kernel`` in PyTorch 1.9), memcpy / memset
activities, and kernel names found only in CPU-side launch records (``args.kernel`` of
cudaLaunchKernel / hipModuleLaunchKernel, as in CUDA-graph captures). The probe that checks
kerneltriage/data/kernel_classes.yaml against real names.
"""

from __future__ import annotations

import argparse
import gzip
import sys
from collections import defaultdict
from pathlib import Path

import orjson

from kerneltriage.analysis.kernel_classes import classify_kernel

ACTIVITY = {
    "kernel": "kernel",
    "Kernel": "kernel",
    "gpu_memcpy": "memcpy",
    "Memcpy": "memcpy",
    "gpu_memset": "memset",
    "Memset": "memset",
}


def trace_files(paths: list[str]) -> list[Path]:
    out: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            out += sorted(q for q in p.rglob("*.json*") if "trace" in q.name or q.suffix == ".gz")
        else:
            out.append(p)
    return [p for p in out if p.name.endswith((".json", ".json.gz"))]


def kernel_names(path: Path) -> dict[tuple[str, str], list[float]]:
    """(activity, name) → [launches, total µs]; launch-only names have 0 µs."""
    data = orjson.loads(gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes())
    events = data.get("traceEvents", []) if isinstance(data, dict) else data
    names: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0, 0.0])
    launched: set[str] = set()
    for e in events:
        if not isinstance(e, dict):
            continue
        activity = ACTIVITY.get(e.get("cat"))
        if activity and e.get("ph") == "X":
            row = names[(activity, e.get("name", ""))]
            row[0] += 1
            row[1] += float(e.get("dur", 0) or 0)
        elif isinstance(e.get("args"), dict) and isinstance(e["args"].get("kernel"), str):
            launched.add(e["args"]["kernel"])
    for name in launched:
        names.setdefault(("kernel", name), [0, 0.0])
    return dict(names)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("paths", nargs="+")
    ap.add_argument("--unknown", action="store_true", help="only names classed unknown")
    ap.add_argument("--top", type=int, default=0, help="only the N kernels of most total time per trace")
    ap.add_argument("--width", type=int, default=140, help="cut names to this many characters")
    args = ap.parse_args()
    for path in trace_files(args.paths):
        names = kernel_names(path)
        rows = sorted(names.items(), key=lambda kv: (-kv[1][1], kv[0][1]))
        if args.top:
            rows = [r for r in rows if r[0][0] == "kernel"][: args.top]
        total = sum(t for _, (_, t) in names.items()) or 1.0
        print(f"\n== {path}  ({len(names)} distinct, {total / 1e3:.1f} ms)")
        for (activity, name), (count, dur) in rows:
            kc = classify_kernel(name, activity)
            if args.unknown and kc.kind != "unknown":
                continue
            lib = kc.library or "-"
            print(
                f"{dur / total:6.1%} {int(count):6d}  {kc.kind:18s} {lib:16s} {'V' if kc.vendor_library else ' '}"
                f"  {name[: args.width]}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
