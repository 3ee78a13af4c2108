"""What one profiled launch costs Nsight Compute against the process's GPU memory footprint.

Kernel replay restores the memory a kernel may have written before each replay pass, so a
launch's cost may grow with what the process holds on the GPU, not with the kernel. Each
variant is one process under ncu (the roofline metrics phase 2 collects, bf16 tensor counters)
that holds some memory, then launches a small elementwise kernel 30 times, each timed on the
host from launch to synchronize (under ncu that is the launch's whole profiling):

- ``none``: nothing held beyond the kernel's own 8 MiB;
- ``live``: ``--gib`` GiB held in a live tensor;
- ``cached``: that tensor freed, its memory kept by PyTorch's caching allocator (what a
  training step's activations leave between steps);
- ``emptied``: freed and handed back with ``torch.cuda.empty_cache()``;
- ``pieces``: ``--gib`` GiB held in ``--pieces`` live tensors, each a segment of the caching
  allocator of its own (a training step's parameters, optimizer state and activations are
  thousands): whether a launch's cost grows with the regions ncu saves, not only their bytes;
- ``pieces_expandable``: the same with ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``,
  whose allocator maps one growing segment instead.

    python benchmarks/probes/ncu_footprint.py OUT_DIR [--gib 40] [--pieces 4096]
        [--variants none,live,cached,emptied,pieces,pieces_expandable]

Needs: one CUDA GPU with that much free memory, Nsight Compute's ncu on PATH. OUT_DIR gets
``ncu_footprint.json`` and ``ncu_footprint.txt``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

LAUNCHES = 30


def child(variant: str, gib: float, pieces: int, out: Path) -> None:
    import torch

    x = torch.randn(2 * 1024 * 1024, device="cuda")  # 8 MiB
    held = None
    if variant.startswith("pieces"):
        size = int(gib * 2**30) // pieces
        held = [torch.ones(size, dtype=torch.uint8, device="cuda") for _ in range(pieces)]
    elif variant != "none":
        held = torch.empty(int(gib * 2**30), dtype=torch.uint8, device="cuda")
        held.fill_(1)  # touched: the pages exist
        if variant in ("cached", "emptied"):
            del held
            held = None
        if variant == "emptied":
            torch.cuda.empty_cache()
    torch.cuda.synchronize()
    seconds = []
    for _ in range(LAUNCHES):
        start = time.perf_counter()
        x.mul_(1.0001)
        torch.cuda.synchronize()
        seconds.append(time.perf_counter() - start)
    out.write_text(
        json.dumps(
            {
                "variant": variant,
                "reserved_gib": torch.cuda.memory_reserved() / 2**30,
                "allocated_gib": torch.cuda.memory_allocated() / 2**30,
                "launch_s": seconds,
            }
        )
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--gib", type=float, default=40.0)
    parser.add_argument("--pieces", type=int, default=4096)
    parser.add_argument("--variants", default="none,live,cached,emptied,pieces,pieces_expandable")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--child-out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.gib, args.pieces, args.child_out)
        return
    from kerneltriage.profile import nsight_compute as ncu_tools

    ncu = ncu_tools.find_ncu()
    if ncu is None:
        sys.exit("ncu not found on PATH")
    metrics = ncu_tools.metric_list(ncu_tools.available_metrics(ncu), ["bf16"])
    args.out.mkdir(parents=True, exist_ok=True)
    results = []
    for variant in args.variants.split(","):
        target = args.out / f"child_{variant}.json"
        cmd = [
            ncu,
            "--clock-control",
            "none",
            "--force-overwrite",
            "-o",
            str(args.out / f"footprint_{variant}"),
            "--metrics",
            ",".join(metrics),
            "-k",
            "regex:elementwise",
            sys.executable,
            __file__,
            str(args.out),
            "--gib",
            str(args.gib),
            "--pieces",
            str(args.pieces),
            "--child",
            variant,
            "--child-out",
            str(target),
        ]
        env = dict(os.environ)
        if variant.endswith("_expandable"):
            env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
        start = time.perf_counter()
        done = subprocess.run(cmd, capture_output=True, text=True, check=False, env=env)
        wall = time.perf_counter() - start
        if done.returncode != 0 or not target.is_file():
            results.append({"variant": variant, "error": done.stderr[-800:] + done.stdout[-800:]})
            continue
        row = json.loads(target.read_text())
        launches = row.pop("launch_s")
        row.update(
            wall_s=round(wall, 2),
            launch_median_s=round(statistics.median(launches), 4),
            launch_min_s=round(min(launches), 4),
            launch_max_s=round(max(launches), 4),
        )
        results.append(row)
    (args.out / "ncu_footprint.json").write_text(json.dumps(results, indent=1))
    lines = [
        f"{LAUNCHES} profiled launches of an 8 MiB mul_, {len(metrics)} metrics; --gib {args.gib}, "
        f"--pieces {args.pieces}"
    ]
    for r in results:
        if "error" in r:
            lines.append(f"{r['variant']}: failed: {r['error'][-300:]}")
        else:
            lines.append(
                f"{r['variant']:8s} reserved {r['reserved_gib']:6.2f} GiB  allocated {r['allocated_gib']:6.2f} GiB  "
                f"per launch median {r['launch_median_s']:.4f} s (min {r['launch_min_s']:.4f}, "
                f"max {r['launch_max_s']:.4f})  process {r['wall_s']:.1f} s"
            )
    text = "\n".join(lines) + "\n"
    (args.out / "ncu_footprint.txt").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
