"""How fast does kerneltriage read a large Kineto trace, in any JSON layout, and with how much memory?

Builds big traces by repeating the real H200 capture's events (times shifted by the capture's
span, ids and correlations shifted so nothing collides, step names renumbered) and writes the
same events in several layouts:

- ``pretty``: Kineto's own layout, one event per line (what the profiler writes);
- ``oneline``: the whole document on one line, as ``json.dump`` writes it;
- ``compact``: one line without spaces, as minifiers and ``orjson.dumps`` write it;
- ``pretty.gz``: the pretty file gzipped (level 6), as Kineto writes ``.json.gz``.

Each reading (``read_trace``) runs in a fresh child process, which reports its wall time, the
CPU time of itself and its workers (less sensitive than wall time to other load on the
machine), and peak RSS: its own, and its worker processes' largest. Beside them: a
single-process ``orjson.loads`` of the one-line file, and optionally the full
``kerneltriage report``. Prints a Markdown table.

    python benchmarks/bench_ingest.py                       # ~1 GB per layout, into /tmp
    python benchmarks/bench_ingest.py --target-mb 256 --layouts pretty,oneline
    python benchmarks/bench_ingest.py --reuse --keep --report   # traces kept from a last run

Targets (on a 2-core CPU machine): 1 GB read in <= 20 s with <= 1.5 GB peak RSS, and every
layout within 1.2x of the pretty one in time and memory (issue 21); the whole ``kerneltriage
report`` of 1 GB in <= 10 s with <= 1 GB peak RSS (``--report``).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "data" / "gpt-naive-h200" / "trace.json.gz"
ID_KEYS = ("External id", "correlation", "Sequence number", "Record function id", "Ev Idx")
LAYOUTS = ("pretty", "oneline", "compact", "pretty.gz")


def _copies(events: list[dict]) -> tuple[float, int, int]:
    """The capture's time span and id spans: shifting by them makes each copy distinct."""
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
    return span, id_span, flow_span


def _shifted(e: dict, rep: int, span: float, id_span: int, flow_span: int) -> dict:
    e2 = dict(e)
    if isinstance(e2.get("ts"), (int, float)):
        e2["ts"] = e2["ts"] + rep * span
    if isinstance(e2.get("id"), int):
        e2["id"] = e2["id"] + rep * flow_span
    args = e2.get("args")
    if isinstance(args, dict):
        args = dict(args)
        for k in ID_KEYS:
            if isinstance(args.get(k), int) and args[k] >= 0:
                args[k] += rep * id_span
        e2["args"] = args
    name = e2.get("name", "")
    if isinstance(name, str) and name.startswith("ProfilerStep#"):
        e2["name"] = f"ProfilerStep#{int(name[13:]) + 2 * rep}"
    return e2


def _path(out_dir: Path, layout: str) -> Path:
    name, _, gz = layout.partition(".")
    return out_dir / f"bench_trace_{name}.json{'.gz' if gz else ''}"


def build(target_bytes: int, out_dir: Path, layouts: list[str]) -> tuple[dict[str, Path], int, int]:
    """Write the layouts asked for, the same events in each; sized so ``pretty`` is ~target."""
    data = json.loads(gzip.decompress(FIXTURE.read_bytes()))
    events = data.pop("traceEvents")
    span, id_span, flow_span = _copies(events)
    text = [layout for layout in layouts if layout in LAYOUTS[:3]]
    if "pretty.gz" in layouts and "pretty" not in text:
        text.append("pretty")
    paths = {layout: _path(out_dir, layout) for layout in text}
    files = {layout: open(path, "w") for layout, path in paths.items()}  # noqa: SIM115
    # Kineto writes its top-level keys first and traceEvents last but one.
    head = {
        "pretty": json.dumps(data, indent=2)[:-2] + ',\n  "traceEvents": [\n  ',
        "oneline": json.dumps(data)[:-1] + ', "traceEvents": [',
        "compact": json.dumps(data, separators=(",", ":"))[:-1] + ',"traceEvents":[',
    }
    sep = {"pretty": ",\n  ", "oneline": ", ", "compact": ","}
    tail = {"pretty": '\n  ],\n  "traceName": "bench"\n}\n', "oneline": '], "traceName": "bench"}'}
    tail["compact"] = '],"traceName":"bench"}'
    for layout, f in files.items():
        f.write(head[layout])
    written = reps = n_events = 0
    while written < target_bytes:
        for i, e in enumerate(events):
            e2 = _shifted(e, reps, span, id_span, flow_span)
            spaced = json.dumps(e2)
            first = reps == 0 and i == 0
            written += len(spaced) + 4
            n_events += 1
            for layout, f in files.items():
                if not first:
                    f.write(sep[layout])
                f.write(json.dumps(e2, separators=(",", ":")) if layout == "compact" else spaced)
        reps += 1
    for layout, f in files.items():
        f.write(tail[layout])
        f.close()
    if "pretty.gz" in layouts:
        paths["pretty.gz"] = _path(out_dir, "pretty.gz")
        with open(paths["pretty"], "rb") as src, gzip.open(paths["pretty.gz"], "wb", compresslevel=6) as dst:
            shutil.copyfileobj(src, dst, 8 << 20)
    if "pretty" in paths and "pretty" not in layouts:  # written only to be gzipped
        paths.pop("pretty").unlink()
    return paths, reps, n_events


_USAGE = """
def usage(wall, **extra):
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime
    print(json.dumps({"wall": wall, "cpu": cpu, "rss": me.ru_maxrss * 1024,
                      "workers_rss": kids.ru_maxrss * 1024, **extra}))
"""

_READ = (
    """
import json, re, resource, sys, time
t = time.perf_counter()
from kerneltriage.ingest import json_stream, kineto
if sys.argv[2:] == ["exact"]:  # no guessed cuts: the exact scan cuts every piece (the fallback)
    json_stream._CANDIDATE = re.compile(rb"(?!)")
tl = kineto.read_trace(sys.argv[1])
"""
    + _USAGE
    + """
usage(time.perf_counter() - t, rows=[len(tl.kernels), len(tl.cpu), len(tl.runtime), len(tl.gpu_annotations)])
"""
)

_ORJSON = (
    """
import json, resource, sys, time
import orjson
t = time.perf_counter()
with open(sys.argv[1], "rb") as f:
    doc = orjson.loads(f.read())
"""
    + _USAGE
    + """
usage(time.perf_counter() - t, events=len(doc["traceEvents"]))
"""
)


def _child(code: str, path: Path, *args: str) -> dict:
    proc = subprocess.run(
        [sys.executable, "-c", code, str(path), *args], capture_output=True, text=True, check=False, cwd=ROOT
    )
    if proc.returncode != 0:
        raise SystemExit(f"child failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run_report(path: Path) -> dict:
    """The whole `kerneltriage report`, timed from outside; RSS of the largest process."""
    start = time.perf_counter()
    proc = subprocess.run(
        [
            "/usr/bin/time",
            "-f",
            "%M %U %S",
            sys.executable,
            "-m",
            "kerneltriage",
            "report",
            str(path),
            "--format",
            "json",
        ],
        capture_output=True,
        text=True,
        check=False,
        cwd=ROOT,
    )
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"report failed ({proc.returncode}): {proc.stderr[-2000:]}")
    rss, user, system = proc.stderr.strip().splitlines()[-1].split()
    steps = json.loads(proc.stdout)["steps"]
    return {
        "wall": wall,
        "cpu": float(user) + float(system),
        "rss": int(rss) * 1024,
        "workers_rss": 0,
        "steps": steps,
    }


def _json_size(path: Path) -> int:
    """Bytes of JSON (the uncompressed size, for a .gz: its last 4 bytes hold it modulo 4 GiB)."""
    if path.suffix != ".gz":
        return path.stat().st_size
    with open(path, "rb") as f:
        f.seek(-4, os.SEEK_END)
        return int.from_bytes(f.read(4), "little")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target-mb", type=float, default=1024.0, help="size of the pretty file")
    parser.add_argument("--layouts", default=",".join(LAYOUTS), help=f"from {', '.join(LAYOUTS)}")
    parser.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()), help="where traces go")
    parser.add_argument("--reuse", action="store_true", help="use traces already in --dir")
    parser.add_argument("--keep", action="store_true", help="keep the traces afterwards")
    parser.add_argument("--no-orjson", action="store_true", help="skip the single-process baseline")
    parser.add_argument("--report", action="store_true", help="also time `kerneltriage report`")
    parser.add_argument("--exact", action="store_true", help="also read with exact cuts only (the fallback)")
    args = parser.parse_args()
    layouts = [x for x in args.layouts.split(",") if x]
    unknown = set(layouts) - set(LAYOUTS)
    if unknown:
        parser.error(f"unknown layouts: {', '.join(sorted(unknown))}")

    paths = {layout: _path(args.dir, layout) for layout in layouts}
    if not (args.reuse and all(p.exists() for p in paths.values())):
        t = time.perf_counter()
        paths, reps, n_events = build(int(args.target_mb * 1e6), args.dir, layouts)
        print(f"built in {time.perf_counter() - t:.0f} s: {reps} copies of the capture, {n_events:,} events")
    rows = []

    def measure(what: str, path: Path, run) -> None:
        load = os.getloadavg()[0]  # other work on the machine inflates wall times
        rows.append((what, path, run(path), load))

    for layout, path in paths.items():
        measure(f"read_trace, {layout}", path, lambda p: _child(_READ, p))
        if args.exact:
            measure(f"read_trace, {layout}, exact cuts only", path, lambda p: _child(_READ, p, "exact"))
        if args.report:
            measure(f"kerneltriage report, {layout}", path, run_report)
    plain = [p for p in paths.values() if p.suffix != ".gz"]
    if not args.no_orjson and plain:
        base = paths.get("oneline") or plain[0]
        measure(f"orjson.loads, one process ({base.stem.split('_')[-1]})", base, lambda p: _child(_ORJSON, p))
    load_after = os.getloadavg()[0]

    from importlib.metadata import PackageNotFoundError, version

    def installed(name: str) -> str:
        try:
            return f"{name} {version(name)}"
        except PackageNotFoundError:
            return f"no {name}"

    # pandas >= 3 with pyarrow stores the string columns (names) as Arrow strings: more memory.
    packages = ", ".join(installed(name) for name in ("orjson", "numpy", "pandas", "pyarrow"))
    print(
        f"\n{os.cpu_count()} cores, Python {platform.python_version()}, {packages}; "
        f"1-minute load average at the end {load_after:.2f}\n"
    )
    print(
        "| what | JSON | load before | wall | CPU (all processes) | MB/s | peak RSS | workers' peak RSS | rows |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for what, path, r, load in rows:
        size = _json_size(path)
        workers = f"{r['workers_rss'] / 1e9:.2f} GB" if r["workers_rss"] else "—"
        detail = r.get("rows") or r.get("events") or r.get("steps")
        print(
            f"| {what} | {size / 1e9:.2f} GB | {load:.1f} | {r['wall']:.1f} s | {r['cpu']:.1f} s | {size / 1e6 / r['wall']:.0f} | "
            f"{r['rss'] / 1e9:.2f} GB | {workers} | {detail} |"
        )
    print(
        "\nrows: kernels, CPU ops, runtime calls, GPU annotations (read_trace); events (orjson); steps (report)"
    )
    if not args.keep:
        for path in paths.values():
            path.unlink()


if __name__ == "__main__":
    main()
