"""Two questions about profiling one launch configuration per elementwise instantiation.

1. **Exclusion.** Does an NVTX start/end range named in ``--nvtx-exclude`` keep Nsight
   Compute from profiling the launches inside it, inside the profiled step's include range,
   under ``--filter-mode per-launch-config --launch-count 1``? And does an excluded launch
   use up its configuration's one launch (so that a later launch of the same configuration
   outside the range is never profiled)?
2. **Scaling.** An elementwise kernel (``vectorized_elementwise_kernel``,
   ``elementwise_kernel``) launches one thread per few elements, so its DRAM bytes should
   grow with its threads. How far are the bytes a small launch's counters scaled up (or a
   large one's scaled down) from what ncu measures at the other size?

Each op (a scalar multiply in fp32, a bf16 add, a broadcast add in fp32) runs at six sizes
(4 Ki to 64 Mi elements) inside the include range, twice: once plain (``all``), once with
every size but the largest inside an exclude range and the largest first run inside it, then
again outside it (``skip``).

    python benchmarks/probes/ncu_skip_ranges.py OUT_DIR

Needs: one CUDA GPU, Nsight Compute's ncu on PATH. OUT_DIR gets ``ncu_skip_ranges.json``
and ``ncu_skip_ranges.txt``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

INCLUDE = "kerneltriage.ncu"
EXCLUDE = "kerneltriage.ncu.skip"
SIZES = [2**12, 2**16, 2**20, 2**22, 2**24, 2**26]


def child(mode: str) -> None:
    import torch

    nvtx = torch.cuda.nvtx
    ops = {
        "mul_fp32": lambda n: (torch.randn(n, device="cuda"),),
        "add_bf16": lambda n: (
            torch.randn(n, device="cuda", dtype=torch.bfloat16),
            torch.randn(n, device="cuda", dtype=torch.bfloat16),
        ),
        "add_broadcast_fp32": lambda n: (
            torch.randn(n // 256, 256, device="cuda"),
            torch.randn(256, device="cuda"),
        ),
    }
    run = {
        "mul_fp32": lambda a: a * 1.5,
        "add_bf16": lambda a, b: a + b,
        "add_broadcast_fp32": lambda a, b: a + b,
    }
    inputs = {(op, n): make(n) for op, make in ops.items() for n in SIZES}
    torch.cuda.synchronize()
    step = nvtx.range_start(INCLUDE)
    for op in ops:
        for n in SIZES:
            largest = n == SIZES[-1]
            skip = mode == "skip"
            handle = nvtx.range_start(EXCLUDE) if skip else None
            run[op](*inputs[(op, n)])
            if handle is not None:
                nvtx.range_end(handle)
            if skip and largest:  # the same configuration again, outside the exclude range
                run[op](*inputs[(op, n)])
    torch.cuda.synchronize()
    nvtx.range_end(step)


def profile(ncu: str, out: Path, mode: str, metrics: list[str]) -> list[dict]:
    rep = out / f"skip_{mode}"
    cmd = [
        ncu,
        "--force-overwrite",
        "-o",
        str(rep),
        "--clock-control",
        "none",
        "--nvtx",
        "--nvtx-include",
        INCLUDE,
        "--nvtx-exclude",
        EXCLUDE,
        "--kernel-name-base",
        "mangled",  # as phase 2 runs it: per-launch-config tells instantiations apart
        "--filter-mode",
        "per-launch-config",
        "--launch-count",
        "1",
        "--metrics",
        ",".join(metrics),
        sys.executable,
        __file__,
        "--child",
        mode,
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    (out / f"skip_{mode}.log").write_text(done.stdout + done.stderr)
    export = subprocess.run(
        [ncu, "--import", f"{rep}.ncu-rep", "--csv", "--page", "raw"],
        capture_output=True,
        text=True,
        check=False,
    )
    from kerneltriage.ingest.ncu_csv import parse_counters

    table = parse_counters(export.stdout, str(rep)).rows
    return [
        {
            "kernel": str(r.kernel_name)[:120],
            "grid": f"({r.grid_x}, {r.grid_y}, {r.grid_z})",
            "block": f"({r.block_x}, {r.block_y}, {r.block_z})",
            "dram_read": float(r.dram_read_bytes),
            "dram_write": float(r.dram_write_bytes),
            "ns": float(r.duration_ns),
        }
        for r in table.itertuples()
    ]


def _threads(row: dict) -> int:
    def prod(text: str) -> int:
        out = 1
        for part in text.strip("()").split(","):
            out *= int(part.strip() or 1)
        return out

    return prod(row["grid"]) * prod(row["block"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", nargs="?", type=Path)
    parser.add_argument("--child")
    args = parser.parse_args()
    if args.child:
        child(args.child)
        return
    from kerneltriage.profile import nsight_compute as ncu_tools

    ncu = ncu_tools.find_ncu()
    if ncu is None:
        sys.exit("ncu is not on PATH")
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    metrics = ncu_tools.metric_list(ncu_tools.available_metrics(ncu), ["bf16"])
    result = {mode: profile(ncu, out, mode, metrics) for mode in ("all", "skip")}
    lines = []
    for mode, rows in result.items():
        lines.append(f"## {mode}: {len(rows)} rows")
        for r in rows:
            total = (r["dram_read"] or 0) + (r["dram_write"] or 0)
            lines.append(
                f"{r['kernel'][:70]:70s} grid {r['grid']:>16s} block {r['block']:>12s} "
                f"threads {_threads(r):>10d} dram {total / 1e6:10.3f} MB "
                f"({total / max(_threads(r), 1):7.2f} B/thread) {(r['ns'] or 0) / 1e3:9.1f} us"
            )
    # Scaling: per kernel, bytes per thread at each size against the largest launch's.
    by_kernel: dict[str, list[dict]] = {}
    for r in result["all"]:
        by_kernel.setdefault(r["kernel"], []).append(r)
    lines.append("## bytes scaled by threads from the largest launch, against those measured")
    scaling = {}
    for kernel, rows in by_kernel.items():
        rows.sort(key=_threads)
        big = rows[-1]
        per_thread = ((big["dram_read"] or 0) + (big["dram_write"] or 0)) / _threads(big)
        ratios = []
        for r in rows:
            measured = (r["dram_read"] or 0) + (r["dram_write"] or 0)
            scaled = per_thread * _threads(r)
            ratios.append({"threads": _threads(r), "measured": measured, "scaled": scaled})
            lines.append(
                f"{kernel[:60]:60s} threads {_threads(r):>10d} measured {measured / 1e6:10.3f} MB "
                f"scaled {scaled / 1e6:10.3f} MB ratio {scaled / measured if measured else float('nan'):6.2f}"
            )
        scaling[kernel] = ratios
    (out / "ncu_skip_ranges.json").write_text(json.dumps({"rows": result, "scaling": scaling}, indent=1))
    (out / "ncu_skip_ranges.txt").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
