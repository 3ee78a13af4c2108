"""How long does the profiled process spend gzipping its trace, at torch's level and at ours?

torch's ``export_chrome_trace("….json.gz")`` has Kineto write the JSON, then gzips it at level 9
(``gzip.open`` default) in the script's process; kerneltriage's runner gzips Kineto's JSON at
``hooks.TRACE_GZIP_LEVEL`` instead (the parent rewrites the timed trace anyway). This builds a
trace in Kineto's layout from the shipped H200 capture (``bench_ingest.build``, ``pretty``),
then times both ways of compressing it and reading it back. CPU only: any machine.

    python benchmarks/bench_trace_write.py OUT_DIR                  # a 150 MB trace
    python benchmarks/bench_trace_write.py OUT_DIR --target-mb 500

Writes ``OUT_DIR/trace_write.json`` and prints a Markdown table.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_ingest import build  # noqa: E402

from kerneltriage.profile.hooks import TRACE_GZIP_LEVEL  # noqa: E402


def _torch_way(src: Path, dst: Path) -> None:
    """What ``torch.profiler``'s ``.gz`` export does after Kineto's JSON is written."""
    with open(src, "rb") as fin, gzip.open(dst, "wb") as fout:
        fout.writelines(fin)


def _ours(src: Path, dst: Path) -> None:
    with open(src, "rb") as fin, gzip.open(dst, "wb", compresslevel=TRACE_GZIP_LEVEL) as fout:
        shutil.copyfileobj(fin, fout, 1 << 20)


def _read(path: Path) -> None:
    with gzip.open(path, "rb") as f:
        while f.read(1 << 22):
            pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="folder for the results")
    parser.add_argument("--target-mb", type=float, default=150.0, help="size of the JSON trace")
    parser.add_argument("--repeats", type=int, default=3, help="timings of each way (the median is shown)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        paths, _, events = build(int(args.target_mb * 2**20), Path(tmp), ["pretty"])
        src = paths["pretty"]
        size = src.stat().st_size
        rows = []
        for name, way in (("torch's .gz export (level 9)", _torch_way), (f"level {TRACE_GZIP_LEVEL}", _ours)):
            dst = Path(tmp) / "out.json.gz"
            write, read = [], []
            for _ in range(args.repeats):
                t = time.perf_counter()
                way(src, dst)
                write.append(time.perf_counter() - t)
                t = time.perf_counter()
                _read(dst)
                read.append(time.perf_counter() - t)
            rows.append(
                {
                    "way": name,
                    "write_s": sorted(write)[len(write) // 2],
                    "read_s": sorted(read)[len(read) // 2],
                    "gz_mb": dst.stat().st_size / 2**20,
                }
            )
    result = {
        "json_mb": size / 2**20,
        "events": events,
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "load_average_1min": os.getloadavg()[0],
        "rows": rows,
    }
    (args.out / "trace_write.json").write_text(json.dumps(result, indent=2) + "\n")
    print(
        f"{size / 2**20:.0f} MB of JSON ({events:,} events), {os.cpu_count()} cores, Python {platform.python_version()}\n"
    )
    print("| way | write (median) | read back | .gz size |")
    print("| --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['way']} | {r['write_s']:.2f} s | {r['read_s']:.2f} s | {r['gz_mb']:.1f} MB |")


if __name__ == "__main__":
    main()
