"""Why processes of one script run at different step times: where the host put them.

Processes of a host-paced script settle at different step times and stay there (ConvNeXt-T
on an H100: about 28.8 or about 34 ms, each process steady within tens of µs; T5-base 142-160
ms). Each process here is the script alone (its own step times through ``KT_EXAMPLE_STATS``),
started under one *variant* of placement, round-robin so that drift falls on every variant:

- ``free``: as a user starts it (a random hash seed, any CPU);
- ``seed0``: ``PYTHONHASHSEED=0`` (dict and set layouts the same in every process);
- ``local``: ``taskset`` to the CPUs local to the GPU (``/sys/bus/pci/devices/…/local_cpulist``);
- ``half0`` / ``half1``: ``taskset`` to the first or second half of the CPUs the process may use.

While a process runs, a sampler reads every 0.2 s the CPU its main thread is on
(``/proc/PID/stat``) and the host's steal time (``/proc/stat``: time a hypervisor gave this
machine's CPUs to others), so a slow process can be matched to where it ran.

    python3 benchmarks/probes/process_placement.py --out OUT_DIR --repeats 3 \\
        --variants free,seed0,local -- python3 examples/train_vit.py --model convnext_tiny --steps 60

Needs a CUDA GPU and the script's dependencies; Linux (``taskset``, ``/proc``). Writes
OUT_DIR/placement.jsonl (one line a process), OUT_DIR/machine.txt and prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def _cpu_list(text: str) -> list[int]:
    cpus: list[int] = []
    for part in text.strip().split(","):
        if "-" in part:
            a, b = part.split("-")
            cpus.extend(range(int(a), int(b) + 1))
        elif part:
            cpus.append(int(part))
    return cpus


def gpu_local_cpus() -> list[int]:
    """The CPUs the kernel lists as local to GPU 0's PCI device (all CPUs where it has none)."""
    try:
        bus = subprocess.run(
            ["nvidia-smi", "--query-gpu=pci.bus_id", "--format=csv,noheader", "-i", "0"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        bus = bus.lower()[-12:]  # 00000000:19:00.0 → 0000:19:00.0
        text = Path(f"/sys/bus/pci/devices/{bus}/local_cpulist").read_text()
        local = [c for c in _cpu_list(text) if c in os.sched_getaffinity(0)]
        if local:
            return local
    except (OSError, subprocess.CalledProcessError, ValueError):
        pass
    return sorted(os.sched_getaffinity(0))


def steal_ticks() -> int:
    fields = Path("/proc/stat").read_text().splitlines()[0].split()
    return int(fields[8]) if len(fields) > 8 else 0


class Sampler(threading.Thread):
    """Which CPU the process's main thread is on, and the host's steal time, every 0.2 s."""

    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.pid = pid
        self.cpus: dict[int, int] = {}
        self.stop = threading.Event()
        self.steal0 = steal_ticks()
        self.steal = 0

    def run(self) -> None:
        while not self.stop.wait(0.2):
            try:
                fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
                cpu = int(fields[36])  # field 39 of proc(5), counted after the command's name
            except (OSError, IndexError, ValueError):
                continue
            self.cpus[cpu] = self.cpus.get(cpu, 0) + 1
        self.steal = steal_ticks() - self.steal0


def run_one(variant: str, command: list[str], out: Path, index: int, local: list[int]) -> dict:
    stats = out / f"stats.{index}.jsonl"
    env = dict(os.environ, KT_EXAMPLE_STATS=str(stats))
    prefix: list[str] = []
    allowed = sorted(os.sched_getaffinity(0))
    if variant == "seed0":
        env["PYTHONHASHSEED"] = "0"
    elif variant == "local":
        prefix = ["taskset", "-c", ",".join(map(str, local))]
    elif variant in ("half0", "half1"):
        half = allowed[: len(allowed) // 2] if variant == "half0" else allowed[len(allowed) // 2 :]
        prefix = ["taskset", "-c", ",".join(map(str, half))]
    elif variant != "free":
        raise SystemExit(f"unknown variant {variant!r}")
    start = time.time()
    with open(out / f"log.{index}.txt", "w") as log:
        proc = subprocess.Popen([*prefix, *command], env=env, stdout=log, stderr=subprocess.STDOUT)
        sampler = Sampler(proc.pid)
        sampler.start()
        code = proc.wait()
        sampler.stop.set()
        sampler.join()
    from kerneltriage.analysis.timeline import steady

    steps: list[float] = []
    if stats.is_file():
        lines = stats.read_text().splitlines()
        steps = json.loads(lines[-1]).get("step_ms") or [] if lines else []
    s = steady.steady(steps[3:]) if len(steps) > 8 else None
    return {
        "index": index,
        "variant": variant,
        "exit": code,
        "seconds": round(time.time() - start, 1),
        "steady_ms": round(s.median, 3) if s else None,
        "steady_steps": len(s.values) if s else 0,
        "cut": s.skipped if s else None,
        "p10_ms": round(statistics.quantiles(steps[3:], n=10)[0], 3) if len(steps) > 13 else None,
        "p90_ms": round(statistics.quantiles(steps[3:], n=10)[-1], 3) if len(steps) > 13 else None,
        "cpus": {str(k): v for k, v in sorted(sampler.cpus.items(), key=lambda kv: -kv[1])},
        "steal_ticks": sampler.steal,
        "steps_ms": steps,
    }


def machine(out: Path) -> None:
    parts = []
    for cmd in (
        ["lscpu"],
        ["nvidia-smi", "topo", "-m"],
        ["nvidia-smi", "--query-gpu=name,clocks.sm,clocks.max.sm,pci.bus_id", "--format=csv"],
        ["cat", "/proc/loadavg"],
    ):
        try:
            parts.append(
                "$ " + " ".join(cmd) + "\n" + subprocess.run(cmd, capture_output=True, text=True).stdout
            )
        except OSError as exc:
            parts.append(f"$ {' '.join(cmd)}: {exc}")
    (out / "machine.txt").write_text("\n".join(parts))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--variants", default="free,seed0,local")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--budget-s", type=float, default=1e9, help="start no process past this many seconds")
    p.add_argument("command", nargs=argparse.REMAINDER)
    args = p.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        p.error("give the script's command after --")
    args.out.mkdir(parents=True, exist_ok=True)
    machine(args.out)
    local = gpu_local_cpus()
    variants = args.variants.split(",")
    t0 = time.time()
    rows = []
    index = 0
    for _ in range(args.repeats):
        for variant in variants:
            if time.time() - t0 > args.budget_s:
                break
            row = run_one(variant, command, args.out, index, local)
            rows.append(row)
            with open(args.out / "placement.jsonl", "a") as f:
                f.write(json.dumps(row) + "\n")
            top = ",".join(list(row["cpus"])[:3])
            print(
                f"{index:3d} {variant:6s} steady {row['steady_ms']} ms (p10 {row['p10_ms']}, p90 {row['p90_ms']}) "
                f"cpus {top} steal {row['steal_ticks']} ({row['seconds']} s)",
                flush=True,
            )
            index += 1
    print(f"\nGPU-local CPUs: {local}")
    for variant in variants:
        got = [r["steady_ms"] for r in rows if r["variant"] == variant and r["steady_ms"]]
        if got:
            spread = (max(got) - min(got)) / statistics.median(got)
            print(f"{variant:6s} n={len(got)} medians {sorted(got)} spread {spread:.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
