"""Why a profiled launch costs more while two GPUs of one host profile at once.

Phase 2 on two GPUs runs one ncu process per GPU, each with a lock of its own (``TMPDIR``,
``ncu_gpus.apart_env``); yet on pairs of H200s a launch cost 15-35% more while both profiled
than on one (BENCHMARKS.md). Each variant runs ``ncu`` with phase 2's metric set (bf16 tensor
counters) on a child that holds ``--gib`` in ``--pieces`` live tensors (kernel replay saves and
restores what a process holds) and launches an 8 MiB fp32 ``mul_`` and a 2048³ bf16 ``mm``
``--launches`` times each, timed on the host from launch to synchronize:

- ``alone``: one child on GPU 1;
- ``both``: a child on each of GPU 0 and GPU 1 at once, each ncu with its own ``TMPDIR``;
- ``shared``: the same with one ``TMPDIR`` for both (ncu's lock file shared: replays take turns);
- ``halves``: as ``both``, each ncu and its child held to half the host's CPUs (``taskset``).

Alongside: each ncu process tree's CPU seconds (``/proc``: ncu, its child and their threads) and
the GPUs' PCIe traffic (``nvidia-smi dmon -s t``), to tell a host-side limit from a GPU-side one.

    python benchmarks/probes/ncu_two_gpus.py OUT_DIR [--variants alone,both,shared,halves] [--gib 20 --pieces 64]

Needs: two CUDA GPUs of one host, Nsight Compute's ncu on PATH. OUT_DIR gets ``ncu_two_gpus.json``
and ``ncu_two_gpus.txt``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from ncu_metric_passes import timed_launches

VARIANTS = ("alone", "both", "shared", "halves")
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def child(out: Path, gib: float, pieces: int, launches: int) -> None:
    import torch

    held = (
        [torch.empty(int(gib * 2**30) // pieces, dtype=torch.uint8, device="cuda") for _ in range(pieces)]
        if gib
        else []
    )
    stamps: list[float] = []
    times = timed_launches(launches, stamps)
    out.write_text(
        json.dumps({"times": times, "stamps": stamps, "held_gib": sum(t.numel() for t in held) / 2**30})
    )


def _tree_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) of ``pid`` and its descendants still alive."""
    total = 0.0
    todo = [pid]
    while todo:
        p = todo.pop()
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12]) + int(fields[13]) + int(fields[14])) / CLOCK_TICKS
            for task in Path(f"/proc/{p}/task").iterdir():
                kids = task / "children"
                if kids.is_file():
                    todo += [int(k) for k in kids.read_text().split()]
        except (OSError, IndexError, ValueError):
            continue
    return total


class _Watch:
    """Samples a process tree's CPU seconds every 0.2 s; the last sample is what it used."""

    def __init__(self, pid: int) -> None:
        self.pid, self.cpu_s, self.stop = pid, 0.0, threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.is_set():
            self.cpu_s = max(self.cpu_s, _tree_cpu_s(self.pid))
            self.stop.wait(0.2)


def _cpus_halves() -> list[str]:
    cpus = sorted(os.sched_getaffinity(0))
    half = len(cpus) // 2
    return [",".join(map(str, cpus[:half])), ",".join(map(str, cpus[half:]))]


def run_variant(ncu: str, metrics: list[str], out: Path, variant: str, args: argparse.Namespace) -> dict:
    gpus = ["1"] if variant == "alone" else ["0", "1"]
    shared = tempfile.mkdtemp(prefix="ncu-lock-shared-")
    halves = _cpus_halves() if variant == "halves" else [None, None]
    procs = []
    dmon = subprocess.Popen(
        ["nvidia-smi", "dmon", "-s", "t", "-d", "1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    start = time.perf_counter()
    for i, gpu in enumerate(gpus):
        target = out / f"{variant}_gpu{gpu}.json"
        env = dict(os.environ, CUDA_VISIBLE_DEVICES=gpu)
        env["TMPDIR"] = shared if variant == "shared" else tempfile.mkdtemp(prefix=f"ncu-lock-{gpu}-")
        cmd = [ncu, "--clock-control", "none", "--force-overwrite", "-o", str(out / f"{variant}_gpu{gpu}")]
        cmd += [
            "--metrics",
            ",".join(metrics),
            sys.executable,
            __file__,
            str(out),
            "--child-out",
            str(target),
        ]
        cmd += ["--gib", str(args.gib), "--pieces", str(args.pieces), "--launches", str(args.launches)]
        cpus = halves[i] if len(gpus) > 1 else None
        if cpus:
            cmd = ["taskset", "-c", cpus, *cmd]
        log = open(out / f"{variant}_gpu{gpu}.log", "w")  # noqa: SIM115 - closed once its process ends
        p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
        procs.append((gpu, target, p, _Watch(p.pid), log))
    rows = []
    for gpu, target, p, watch, log in procs:
        p.wait()
        wall = time.perf_counter() - start
        watch.stop.set()
        watch.thread.join()
        log.close()
        if p.returncode != 0 or not target.is_file():
            rows.append({"gpu": gpu, "error": (out / f"{variant}_gpu{gpu}.log").read_text()[-600:]})
            continue
        data = json.loads(target.read_text())
        times = data["times"]
        rows.append(
            {
                "gpu": gpu,
                "held_gib": data["held_gib"],
                "launch_median_s": {k: round(statistics.median(v[2:]), 4) for k, v in times.items()},
                "first_last_stamp": [data["stamps"][0], data["stamps"][-1]],
                "cpu_s": round(watch.cpu_s, 1),
                "wall_s": round(wall, 2),
            }
        )
    dmon.terminate()
    traffic = _pcie(dmon.communicate(timeout=5)[0])
    overlap = None
    if len(rows) == 2 and all("first_last_stamp" in r for r in rows):
        (a0, a1), (b0, b1) = rows[0]["first_last_stamp"], rows[1]["first_last_stamp"]
        overlap = round(max(0.0, min(a1, b1) - max(a0, b0)) / max(a1 - a0, b1 - b0), 2)
    return {"variant": variant, "processes": rows, "pcie_mb_s": traffic, "profiled_overlap": overlap}


def _pcie(text: str) -> dict[str, float]:
    """Per GPU, the highest rx and tx MB/s ``nvidia-smi dmon -s t`` sampled."""
    most: dict[str, float] = {}
    for line in text.splitlines():
        parts = line.split()
        if not parts or parts[0].startswith("#") or len(parts) < 3:
            continue
        try:
            rx, tx = float(parts[1]), float(parts[2])
        except ValueError:
            continue
        most[f"gpu{parts[0]}_rx"] = max(most.get(f"gpu{parts[0]}_rx", 0.0), rx)
        most[f"gpu{parts[0]}_tx"] = max(most.get(f"gpu{parts[0]}_tx", 0.0), tx)
    return most


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--gib", type=float, default=20.0)
    parser.add_argument("--pieces", type=int, default=64)
    parser.add_argument("--launches", type=int, default=30)
    parser.add_argument("--child-out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child_out:
        child(args.child_out, args.gib, args.pieces, args.launches)
        return
    from kerneltriage.profile import nsight_compute as ncu_tools

    ncu = ncu_tools.find_ncu()
    if ncu is None:
        sys.exit("ncu not found on PATH")
    metrics = ncu_tools.metric_list(ncu_tools.available_metrics(ncu), ["bf16"])
    args.out.mkdir(parents=True, exist_ok=True)
    results = [run_variant(ncu, metrics, args.out, v, args) for v in args.variants.split(",")]
    (args.out / "ncu_two_gpus.json").write_text(json.dumps(results, indent=1))
    lines = [
        f"{args.launches} profiled launches each of an 8 MiB fp32 mul_ and a 2048^3 bf16 mm, {len(metrics)} metrics, "
        f"{args.gib:g} GiB held in {args.pieces} tensors; median of all but the first two"
    ]
    for r in results:
        for p in r["processes"]:
            if "error" in p:
                lines.append(f"{r['variant']:7s} GPU {p['gpu']}: failed: {p['error'][-300:]}")
                continue
            per = ", ".join(f"{k} {v:.4f} s" for k, v in p["launch_median_s"].items())
            lines.append(
                f"{r['variant']:7s} GPU {p['gpu']}: per launch {per}; CPU {p['cpu_s']} s over {p['wall_s']} s"
            )
        lines.append(f"{'':7s} profiled overlap {r['profiled_overlap']}, PCIe peak MB/s {r['pcie_mb_s']}")
    text = "\n".join(lines) + "\n"
    (args.out / "ncu_two_gpus.txt").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
