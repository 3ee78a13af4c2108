"""How long does the parent take to finish phase 1's trace, between phase 1 and phase 2?

After phase 1's script ends, ``kerneltriage profile`` finishes its timed trace
(``profile/trace_fixup.finish_trace``: module ranges relabelled, the shapes step's input shapes
copied onto every recorded step's ops) before phase 2's plan can read it, so this time is on
the profile's path. This profiles ``examples/train_hf_t5.py`` at T5-base's depth (12 encoder
and 12 decoder layers, 519 module calls a step) with narrow widths as a CPU dry run, which
records T5-base's op sequence at CPU speed; turns its trace back into what the process wrote
(module ranges as ``cpu_op``, no shapes); then times ``finish_trace`` on a fresh copy of it,
``--repeats`` times. CPU only: any machine (about a minute on 2 cores).

    python benchmarks/bench_trace_fixup.py OUT_DIR
    python benchmarks/bench_trace_fixup.py OUT_DIR --run RUN     # a run directory of yours

Writes ``OUT_DIR/trace_fixup.json`` and prints one line per repeat and the median.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kerneltriage.annotate import MODULE_PREFIX  # noqa: E402
from kerneltriage.profile.trace_fixup import SHAPE_ARGS, finish_trace  # noqa: E402

#: T5-base's depth, narrow: the op sequence of T5-base at a CPU's speed.
T5_DEPTH = ["--layers", "12", "--d-model", "64", "--d-ff", "128", "--heads", "4", "--vocab", "256"]
T5_DEPTH += ["--src", "32", "--tgt", "16", "--batch", "2", "--device", "cpu"]


def profile_t5(out: Path) -> Path:
    """A CPU dry run of the T5 example at T5-base's depth (its run directory)."""
    run = out / "t5_depth_run"
    cmd = [sys.executable, "-m", "kerneltriage", "profile", "--cpu", "--no-ncu", "--force", "--out", str(run)]
    cmd += ["--", sys.executable, str(ROOT / "examples" / "train_hf_t5.py"), *T5_DEPTH]
    subprocess.run(
        cmd, check=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True
    )
    return run


def as_written(trace: Path, dst: Path) -> int:
    """``trace`` as the profiled process wrote it, before the parent finished it: module
    ranges filed as ``cpu_op``, no shape arguments. Returns its number of events."""
    data = orjson.loads(gzip.decompress(trace.read_bytes()))
    for e in data["traceEvents"]:
        if e.get("cat") == "user_annotation" and str(e.get("name", "")).startswith(MODULE_PREFIX):
            e["cat"] = "cpu_op"
        for k in SHAPE_ARGS:
            (e.get("args") or {}).pop(k, None)
    data.pop("record_shapes", None)
    dst.write_bytes(gzip.compress(orjson.dumps(data), compresslevel=1))  # as the process does
    return len(data["traceEvents"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="folder for the results")
    parser.add_argument("--run", type=Path, help="a run directory (default: the T5-depth CPU run, made here)")
    parser.add_argument("--repeats", type=int, default=5, help="timings (the median is shown)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    run = args.run or profile_t5(args.out)
    shapes = run / "logs" / "shapes.rank0.json.gz"
    if not (run / "trace.json.gz").is_file() or not shapes.is_file():
        sys.exit(f"{run}: needs trace.json.gz and logs/shapes.rank0.json.gz (a kerneltriage profile run)")
    with tempfile.TemporaryDirectory() as tmp:
        written = Path(tmp) / "written.json.gz"
        events = as_written(run / "trace.json.gz", written)
        seconds, stats = [], {}
        for _ in range(args.repeats):
            trace = Path(tmp) / "trace.json.gz"
            shutil.copy(written, trace)
            started = time.perf_counter()
            stats = finish_trace(trace, shapes)
            seconds.append(time.perf_counter() - started)
            print(f"finish_trace: {seconds[-1]:.2f} s")
    result = {
        "run": str(run),
        "events": events,
        "fixup": stats,
        "seconds": [round(s, 3) for s in seconds],
        "median_s": round(statistics.median(seconds), 3),
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "load_average_1min": os.getloadavg()[0],
    }
    (args.out / "trace_fixup.json").write_text(json.dumps(result, indent=2) + "\n")
    print(
        f"{events:,} events, {stats.get('ops', 0):,} ops in {stats.get('steps', 0)} recorded steps: "
        f"median {result['median_s']:.2f} s (range {min(seconds):.2f}-{max(seconds):.2f} s, {args.repeats} repeats)"
    )


if __name__ == "__main__":
    main()
