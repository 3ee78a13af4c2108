"""How long does ``kerneltriage report`` take on a folder of many rank traces, and with how much
memory, serial against parallel?

Builds N rank traces (default 64 × ~100 MB) from the 2-GPU DDP capture shipped in
``examples/runs/gpt-ddp-2gpu-h200``: its two ranks' events are repeated (times, ids and step
names shifted as in ``bench_ingest.py``) into a few distinct bodies. Each body perturbs the
kernels' durations a little (1% per body), and one body makes its softmax kernels (naive attention's) 40% slower,
so its ranks are stragglers. Each rank's file is Kineto's own layout with ``distributedInfo``
naming its rank, named ``rank-N.json`` as HTA's examples are, and written in full (no links),
so every rank is read from its own bytes.

Then ``kerneltriage report DIR --format json`` runs in a child process, once per mode:

- ``serial``: ``--workers 1``: one rank at a time in the report's own process, each reduced to
  its report before the next is read;
- ``parallel``: ``--workers W`` (default: one per core): W worker processes, each reading and
  reducing one rank at a time;
- optionally ``--scheduler local`` (a Dask LocalCluster) and ``before`` (every rank's tables
  held at once, as ``report`` did before issue 21, on a few ranks only: its memory grows with
  the number of ranks).

Peak RSS is of the whole process tree (the report and every worker it starts), sampled from
/proc every 50 ms: the sum of the processes' RSS, which counts pages they share (forked
workers) more than once, so it is an upper bound. Prints a Markdown table.

    python benchmarks/bench_ranks.py                          # 64 ranks × 100 MB in /tmp/ranks64
    python benchmarks/bench_ranks.py --ranks 8 --target-mb 20 --dir /tmp/ranks8
    python benchmarks/bench_ranks.py --reuse --keep --modes parallel,serial:16,dask:16,before:4

Never commit the traces: they are GBs.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import random
import resource
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "examples" / "runs" / "gpt-ddp-2gpu-h200"
sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_ingest import _copies, _shifted  # noqa: E402

BODIES = 8  # distinct event bodies; rank r gets body r % BODIES
STRAGGLER_BODY = 5  # its softmax kernels (naive attention's) run 40% slower
MODES = ("serial", "parallel", "dask", "before")


def _body(events: list[dict], target_bytes: int, variant: int, path: Path) -> int:
    """Write the events part (without brackets) of one body: the capture's events repeated to
    about ``target_bytes``, kernel durations perturbed. Returns the copies written."""
    span, id_span, flow_span = _copies(events)
    rng = random.Random(variant)
    scale = 1.0 + 0.01 * variant
    written = reps = 0
    with open(path, "w") as f:
        while written < target_bytes:
            for i, e in enumerate(events):
                e2 = _shifted(e, reps, span, id_span, flow_span)
                if e2.get("cat") == "kernel" and isinstance(e2.get("dur"), (int, float)):
                    factor = scale * (1.0 + 0.02 * (rng.random() - 0.5))
                    if variant == STRAGGLER_BODY and "softmax" in e2["name"]:
                        factor *= 1.4
                    e2["dur"] = round(e2["dur"] * factor, 3)
                text = json.dumps(e2)
                if reps or i:
                    f.write(",\n  ")
                    written += 4
                f.write(text)
                written += len(text)
            reps += 1
    return reps


def build(n_ranks: int, target_mb: float, out: Path) -> None:
    """Write ``rank-0.json`` … ``rank-{N-1}.json`` into ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    docs = [json.loads(gzip.decompress((SOURCE / f"trace.rank{r}.json.gz").read_bytes())) for r in (0, 1)]
    bodies = []
    for v in range(min(BODIES, n_ranks)):
        doc = docs[v % 2]
        path = out / f".body{v}.part"
        t = time.perf_counter()
        reps = _body(doc["traceEvents"], int(target_mb * 1e6), v, path)
        print(
            f"body {v}: {reps} copies of rank {v % 2}'s capture in {time.perf_counter() - t:.0f} s",
            flush=True,
        )
        bodies.append(path)
    for r in range(n_ranks):
        doc = dict(docs[r % BODIES % 2])
        doc.pop("traceEvents")
        info = dict(doc["distributedInfo"])
        info.update(rank=r, world_size=n_ranks)
        doc["distributedInfo"] = info
        # Kineto's layout: metadata first, then the events, one per line.
        head = json.dumps(doc, indent=2)[:-2] + ',\n  "traceEvents": [\n  '
        with open(out / f"rank-{r}.json", "wb") as f:
            f.write(head.encode())
            with open(bodies[r % len(bodies)], "rb") as body:
                shutil.copyfileobj(body, f, 16 << 20)
            f.write(b'\n  ],\n  "traceName": "bench"\n}\n')
    for path in bodies:
        path.unlink()


class _TreeRSS(threading.Thread):
    """Samples the summed RSS of a process and all its descendants (Linux /proc)."""

    def __init__(self, pid: int, every: float = 0.05):
        super().__init__(daemon=True)
        self.pid, self.every, self.peak, self.peak_procs = pid, every, 0, 0
        self.done = threading.Event()

    def _tree(self) -> list[int]:
        children: dict[int, list[int]] = {}
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/stat") as f:
                    stat = f.read()
            except OSError:
                continue
            ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
            children.setdefault(ppid, []).append(int(entry))
        tree, todo = [], [self.pid]
        while todo:
            pid = todo.pop()
            tree.append(pid)
            todo.extend(children.get(pid, []))
        return tree

    @staticmethod
    def _rss(pid: int) -> int:
        try:
            with open(f"/proc/{pid}/statm") as f:
                return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        except OSError:
            return 0

    def run(self) -> None:
        while not self.done.is_set():
            tree = self._tree()
            total = sum(self._rss(pid) for pid in tree)
            if total > self.peak:
                self.peak, self.peak_procs = total, len(tree)
            self.done.wait(self.every)


def _cpu_of_children() -> float:
    """CPU seconds of every waited-for descendant (a report's workers are waited by it)."""
    use = resource.getrusage(resource.RUSAGE_CHILDREN)
    return use.ru_utime + use.ru_stime


def run_report(folder: Path, args: list[str]) -> dict:
    """``kerneltriage report FOLDER --format json ARGS`` in a child: wall and CPU time, peak
    RSS of the process tree."""
    cmd = [sys.executable, "-m", "kerneltriage", "report", str(folder), "--format", "json", *args]
    cpu = _cpu_of_children()
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT)
    sampler = _TreeRSS(proc.pid)
    sampler.start()
    out, err = proc.communicate()
    wall = time.perf_counter() - start
    sampler.done.set()
    sampler.join()
    if proc.returncode != 0:
        raise SystemExit(f"report failed ({proc.returncode}): {err.decode()[-2000:]}")
    doc = json.loads(out)
    if "summary" not in doc:  # one rank
        doc = {"ranks": {"0": doc}, "summary": {"stragglers": [], "candidates": []}}
    summary = doc["summary"]
    return {
        "wall": wall,
        "cpu": _cpu_of_children() - cpu,
        "rss": sampler.peak,
        "procs": sampler.peak_procs,
        "ranks": len(doc["ranks"]),
        "stragglers": len(summary["stragglers"]),
        "verdicts": {c["name"]: sorted(set(c["verdicts"].values())) for c in summary["candidates"][:5]},
    }


_BEFORE = """
import json, sys
from kerneltriage.api import load
reps = load(sys.argv[1], ranks=list(range(int(sys.argv[2])))).reports()
print(json.dumps({"ranks": len(reps)}))
"""


def run_before(folder: Path, n: int) -> dict:
    """Every rank's timeline read first, then the reports (``api.load`` + ``reports``)."""
    cpu = _cpu_of_children()
    start = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-c", _BEFORE, str(folder), str(n)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=ROOT,
    )
    sampler = _TreeRSS(proc.pid)
    sampler.start()
    _, err = proc.communicate()
    wall = time.perf_counter() - start
    sampler.done.set()
    sampler.join()
    if proc.returncode != 0:
        raise SystemExit(f"before failed ({proc.returncode}): {err.decode()[-2000:]}")
    return {
        "wall": wall,
        "cpu": _cpu_of_children() - cpu,
        "rss": sampler.peak,
        "procs": sampler.peak_procs,
        "ranks": n,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=64)
    parser.add_argument("--target-mb", type=float, default=100.0, help="size of each rank's trace")
    parser.add_argument("--dir", type=Path, default=Path("/tmp/ranks64"))
    parser.add_argument("--reuse", action="store_true", help="use the traces already in --dir")
    parser.add_argument("--keep", action="store_true", help="keep the traces afterwards")
    parser.add_argument(
        "--modes",
        default="parallel,serial",
        help=f"from {', '.join(MODES)}; MODE:N reads ranks 0..N-1 only (before: 4 unless given)",
    )
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="for parallel and dask")
    parser.add_argument("--build-only", action="store_true")
    args = parser.parse_args()
    modes = [m.partition(":") for m in args.modes.split(",") if m]
    if {m for m, _, _ in modes} - set(MODES):
        parser.error(f"unknown modes in {args.modes}")
    files = sorted(args.dir.glob("rank-*.json")) if args.dir.is_dir() else []
    if not (args.reuse and len(files) == args.ranks):
        t = time.perf_counter()
        build(args.ranks, args.target_mb, args.dir)
        print(f"built {args.ranks} traces in {time.perf_counter() - t:.0f} s", flush=True)
        files = sorted(args.dir.glob("rank-*.json"))
    if args.build_only:
        return
    total = sum(f.stat().st_size for f in files)
    rows = []
    for mode, _, count in modes:
        load = os.getloadavg()[0]
        n = int(count) if count else (4 if mode == "before" else len(files))
        some = [arg for r in range(n) for arg in ("--rank", str(r))] if n < len(files) else []
        if mode == "serial":
            r = run_report(args.dir, ["--workers", "1", *some])
        elif mode == "parallel":
            r = run_report(args.dir, ["--workers", str(args.workers), *some])
        elif mode == "dask":
            r = run_report(args.dir, ["--scheduler", "local", "--workers", str(args.workers), *some])
        else:
            r = run_before(args.dir, n)
        print(f"{mode}: {r}", flush=True)
        rows.append((mode, r, load))
    print(
        f"\n{os.cpu_count()} cores, {os.sysconf('SC_PHYS_PAGES') * os.sysconf('SC_PAGE_SIZE') / 2**30:.0f} GiB, "
        f"Python {platform.python_version()}; {len(files)} traces, {total / 1e9:.2f} GB of JSON "
        f"({total / len(files) / 1e6:.0f} MB each)\n"
    )
    print(
        "| mode | ranks | load before | wall | s per rank | MB/s | CPU (all processes) "
        "| peak RSS (process tree) | processes |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for mode, r, load in rows:
        size = total * r["ranks"] / len(files)
        what = {
            "serial": "serial (`--workers 1`)",
            "parallel": f"parallel (`--workers {args.workers}`)",
            "dask": f"Dask LocalCluster (`--scheduler local --workers {args.workers}`)",
            "before": "before: every rank's tables held, then the reports",
        }[mode]
        print(
            f"| {what} | {r['ranks']} | {load:.1f} | {r['wall']:.1f} s | {r['wall'] / r['ranks']:.2f} s | "
            f"{size / 1e6 / r['wall']:.0f} | {r['cpu']:.0f} s | {r['rss'] / 1e9:.2f} GB | {r['procs']} |"
        )
    if not args.keep:
        shutil.rmtree(args.dir)


if __name__ == "__main__":
    main()
