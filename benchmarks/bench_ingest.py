"""How fast does `kerneltriage report` read and analyse a large trace, and how much memory?

Builds a big Kineto trace by repeating the real H200 capture's events (times shifted by the
capture's span, ids and correlations shifted so nothing collides, step names renumbered), in
Kineto's own layout, then runs `kerneltriage report BIG --format json` in a child process and
reports its wall time and peak RSS.

    python benchmarks/bench_ingest.py --target-mb 1024            # ~1 GB uncompressed
    python benchmarks/bench_ingest.py --target-mb 1024 --keep /tmp/big.json

Targets (issue 2, on a 2-core CPU machine): 1 GB in <= 60 s with <= 3 GB peak RSS.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "data" / "gpt-naive-h200" / "trace.json.gz"
ID_KEYS = ("External id", "correlation", "Sequence number", "Record function id", "Ev Idx")


def build(target_bytes: int, out: Path) -> tuple[int, int]:
    data = json.loads(gzip.decompress(FIXTURE.read_bytes()))
    events = data.pop("traceEvents")
    timed = [e for e in events if isinstance(e.get("ts"), (int, float))]
    t0 = min(e["ts"] for e in timed)
    span = max(e["ts"] + e.get("dur", 0) for e in timed) - t0 + 1000.0
    id_span = 1 + max(
        int(e.get("args", {}).get(k, 0) or 0)
        for e in events
        for k in ID_KEYS
        if isinstance(e.get("args", {}).get(k, 0), int)
    )
    flow_span = 1 + max(int(e.get("id", 0)) for e in events if isinstance(e.get("id"), int))
    header = json.dumps(data, indent=2)[:-2]  # drop the closing "\n}"
    written = reps = 0
    with open(out, "w") as f:
        f.write(header + ',\n  "traceEvents": [\n')
        first = True
        while written < target_bytes:
            for e in events:
                e2 = dict(e)
                if "ts" in e2 and isinstance(e2["ts"], (int, float)):
                    e2["ts"] = e2["ts"] + reps * span
                if isinstance(e2.get("id"), int):
                    e2["id"] = e2["id"] + reps * flow_span
                args = e2.get("args")
                if isinstance(args, dict):
                    args = dict(args)
                    for k in ID_KEYS:
                        if isinstance(args.get(k), int) and args[k] >= 0:
                            args[k] += reps * id_span
                    e2["args"] = args
                name = e2.get("name", "")
                if isinstance(name, str) and name.startswith("ProfilerStep#"):
                    e2["name"] = f"ProfilerStep#{int(name[13:]) + 2 * reps}"
                line = ("  " if first else ",\n  ") + json.dumps(e2)
                first = False
                f.write(line)
                written += len(line)
            reps += 1
        f.write('\n  ],\n  "traceName": "bench"\n}\n')
    return out.stat().st_size, reps


def run_report(path: Path) -> tuple[float, float, str]:
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "kerneltriage", "report", str(path), "--format", "json", "--top", "5"],
        capture_output=True,
        text=True,
        check=False,
    )
    wall = time.perf_counter() - start
    rss_gb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024 / 1024  # KiB on Linux
    if proc.returncode != 0:
        raise SystemExit(f"report failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return wall, rss_gb, proc.stdout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target-mb", type=float, default=1024.0)
    parser.add_argument("--keep", type=Path, help="write the big trace here and keep it")
    args = parser.parse_args()
    out = args.keep or Path(tempfile.mkdtemp()) / "big_trace.json"
    t = time.perf_counter()
    size, reps = build(int(args.target_mb * 1e6), out)
    print(
        f"built {out} in {time.perf_counter() - t:.1f} s: {size / 1e9:.2f} GB, {reps} copies of the capture"
    )
    wall, rss, text = run_report(out)
    report = json.loads(text)
    print(
        f"kerneltriage report: {wall:.1f} s wall, {rss:.2f} GB peak RSS; {report['steps']} steps, "
        f"first candidate {report['candidates'][0]['name']!r} ({report['candidates'][0]['verdict']})"
    )
    print(f"cores: {os.cpu_count()}, python {sys.version.split()[0]}")
    if not args.keep:
        out.unlink()


if __name__ == "__main__":
    main()
