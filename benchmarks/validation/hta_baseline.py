"""Reference figures from Holistic Trace Analysis (HTA) for every real third-party trace.

For each folder of ../shared/external-traces this loads the traces the way HTA does
(`Trace(trace_dir=...)`: every trace file in a folder is one rank, ranked by the `"rank": N` in
its distributedInfo) and records, per rank, what HTA reports: the ProfilerStep iterations it
keeps, its temporal breakdown (idle / compute / non-compute), its GPU kernel-type breakdown and
the top-5 kernels by total time. Files of one folder that HTA would map to the same rank (two
unrelated captures) are analysed one by one, each from its own temp dir under /tmp.

Runs with HTA's own virtualenv (outside the repo), not the project's:

    python3 -m venv ~/hta-venv
    ~/hta-venv/bin/pip install HolisticTraceAnalysis==0.5.0 'pandas==2.3.3'  # HTA 0.5.0 breaks on pandas 3
    ~/hta-venv/bin/python benchmarks/validation/hta_baseline.py            # all traces
    ~/hta-venv/bin/python benchmarks/validation/hta_baseline.py --only hta-cnn-v100

Each trace unit runs in its own child process (one at a time) with a wall-clock limit; a unit
that runs past it is recorded as "timeout". Exceptions HTA raises are recorded, not hidden.
Writes benchmarks/results/validation/hta_<folder>[_<file-stem>].json and hta_summary.md.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
TRACES = (ROOT / ".." / "shared" / "external-traces").resolve()
OUT = ROOT / "benchmarks" / "results" / "validation"
NAME_MAX = 120
TIMEOUT_S = 600
NO_ROUNDING = "HTA_DISABLE_NS_ROUNDING"
# Kineto's GPU-side categories (PyTorch 1.9 spelled them Kernel/Memcpy/Memset).
GPU_CATS = {"kernel", "gpu_memcpy", "gpu_memset", "Kernel", "Memcpy", "Memset"}
STEP_RE = re.compile(r"ProfilerStep\s*#\s*(\d+)")


def _trace_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.name.endswith((".json", ".json.gz")))


def _stem(path: Path) -> str:
    name = path.name
    for suffix in (".json.gz", ".json", ".pt.trace"):
        name = name.removesuffix(suffix)
    return name


def plan_units(folder: Path) -> list[tuple[str, list[Path]]]:
    """Group a folder's files into the runs HTA should load together.

    HTA maps each file to the first `"rank": N` in its text (rank 0 when none) and silently keeps
    only the last file of a rank it sees twice; such folders hold separate captures, so each file
    becomes its own unit.
    """
    from hta.common.trace_file import create_rank_to_trace_dict

    files = _trace_files(folder)
    _, rank_map = create_rank_to_trace_dict([str(p) for p in files])
    if len(rank_map) == len(files):
        return [(f"hta_{folder.name}", files)]
    return [(f"hta_{folder.name}_{_stem(p)}", [p]) for p in files]


def _pct(x: float) -> float:
    return round(float(x), 2)


def _ms(us: float) -> float:
    return round(float(us) / 1000.0, 3)


def _kernel_types(df: Any) -> list[dict[str, Any]]:
    return [
        {
            "kernel_type": str(r["kernel_type"]),
            "time_ms": _ms(r["sum"]),
            "pct": round(float(r["percentage"]), 1),
        }
        for _, r in df.iterrows()
    ]


def _rank_kernel_types(trace_df: Any, sym_table: list[str]) -> list[dict[str, Any]]:
    """HTA's kernel-type breakdown for one rank (its public call sums all ranks together)."""
    from hta.analyzers.breakdown_analysis import BreakdownAnalysis
    from hta.utils.utils import KernelType, get_kernel_type

    gpu = trace_df[trace_df["stream"].ne(-1)].copy()
    gpu["kernel_type"] = gpu["name"].apply(lambda i: get_kernel_type(sym_table[i]))
    types = [KernelType.COMPUTATION.name, KernelType.COMMUNICATION.name, KernelType.MEMORY.name]
    df = BreakdownAnalysis._get_gpu_kernel_type_time(gpu, types)
    df = df.sort_values("sum", ascending=False, ignore_index=True)
    df["percentage"] = df["sum"] / df["sum"].sum() * 100
    return _kernel_types(df)


def _steps(trace_df: Any, sym_table: list[str]) -> dict[str, Any]:
    """ProfilerStep rows HTA keeps for a rank, split by category.

    Newer PyTorch writes each step twice: a CPU `user_annotation` and a GPU-side
    `gpu_user_annotation` (no stream arg, so HTA treats it as a CPU op too). The iteration time is
    taken from the CPU rows.
    """
    names = trace_df["name"].map(lambda i: sym_table[i])
    cats = trace_df["cat"].map(lambda i: sym_table[i])
    is_step = names.map(lambda n: STEP_RE.match(n) is not None)
    rows = trace_df[is_step].assign(_name=names[is_step], _cat=cats[is_step]).sort_values("ts")
    cpu = rows[rows["_cat"] != "gpu_user_annotation"]
    durs = [float(d) for d in cpu["dur"]]
    return {
        "steps": len(cpu),
        "step_names": [str(n) for n in cpu["_name"]],
        "step_ms": [_ms(d) for d in durs],
        "iteration_ms": _ms(sum(durs) / len(durs)) if durs else None,
        "gpu_annotation_steps": int((rows["_cat"] == "gpu_user_annotation").sum()),
    }


def _where(exc: BaseException) -> str:
    """Innermost HTA frame of the exception (and the innermost frame, when that lies elsewhere)."""
    tb = traceback.extract_tb(exc.__traceback__)
    fmt = lambda f: f"{f.filename.split('site-packages/')[-1]}:{f.lineno} in {f.name}"
    hta = [f for f in tb if "/hta/" in f.filename]
    parts = [fmt(hta[-1])] if hta else []
    if tb and (not hta or tb[-1] is not hta[-1]):
        parts.append(fmt(tb[-1]))
    return " -> ".join(parts)


def analyse(files: list[Path]) -> dict[str, Any]:
    """Run HTA on one unit (files loaded together as ranks); never raises."""
    from hta.common.trace import Trace
    from hta.trace_analysis import TraceAnalysis

    errors: list[dict[str, str]] = []

    def record(stage: str, exc: BaseException) -> None:
        errors.append(
            {
                "stage": stage,
                "error": f"{type(exc).__name__}: {exc}",
                "where": _where(exc),
            }
        )

    out: dict[str, Any] = {"ranks": [], "per_rank": {}, "errors": errors}
    with tempfile.TemporaryDirectory(prefix="hta_unit_", dir="/tmp") as tmp:
        for p in files:
            os.symlink(p, Path(tmp) / p.name)
        t0 = time.perf_counter()
        try:
            # Same steps as TraceAnalysis(trace_dir=tmp), parsing ranks in this one process
            # (TraceAnalysis.__init__ forks a pool for >1 rank; the figures are identical).
            t = Trace(trace_dir=tmp)
            t.load_traces(include_last_profiler_step=False, use_multiprocessing=False)
            ta = TraceAnalysis.__new__(TraceAnalysis)
            ta.t = t
        except Exception as exc:
            record("load", exc)
            return out
        out["load_s"] = round(time.perf_counter() - t0, 2)
        out["ranks"] = [int(r) for r in t.get_ranks()]
        out["rank_files"] = {str(r): Path(f).name for r, f in sorted(t.trace_files.items())}
        sym = t.symbol_table.get_sym_table()
        out["profiler_step_names_in_files"] = sorted(
            {s for s in sym if STEP_RE.match(s)}, key=lambda s: int(STEP_RE.match(s).group(1))
        )
        per = out["per_rank"]
        for r in out["ranks"]:
            per[str(r)] = {}

        try:
            out["hta_profiler_steps"] = [int(s) for s in ta.get_profiler_steps()]
        except Exception as exc:
            record("get_profiler_steps", exc)

        for r in out["ranks"]:
            df = t.get_trace(r)
            try:
                per[str(r)].update(_steps(df, sym))
            except Exception as exc:
                record(f"steps rank {r}", exc)
            # HTA's breakdowns take every row with an integer "stream" arg as GPU work; list
            # the rows of other categories it takes that way (Inductor's cpu_op launch records).
            gpu = df[df["stream"].ne(-1)]
            cats = gpu["cat"].map(lambda i: sym[i])
            odd = gpu[~cats.isin(GPU_CATS)]
            per[str(r)]["non_gpu_rows_with_stream"] = {
                str(c): {"count": len(g), "time_ms": _ms(g["dur"].sum())}
                for c, g in odd.groupby(cats[odd.index])
            }
            try:
                per[str(r)]["kernel_type_breakdown"] = _rank_kernel_types(df, sym)
            except Exception as exc:
                record(f"kernel type breakdown rank {r}", exc)

        try:
            tb = ta.get_temporal_breakdown(visualize=False)
            for _, row in tb.iterrows():
                per[str(int(row["rank"]))].update(
                    {
                        "idle_pct": _pct(row["idle_time_pctg"]),
                        "compute_pct": _pct(row["compute_time_pctg"]),
                        "non_compute_pct": _pct(row["non_compute_time_pctg"]),
                        "idle_ms": _ms(row["idle_time(us)"]),
                        "compute_ms": _ms(row["compute_time(us)"]),
                        "non_compute_ms": _ms(row["non_compute_time(us)"]),
                        "span_ms": _ms(row["kernel_time(us)"]),
                    }
                )
        except Exception as exc:
            record("get_temporal_breakdown", exc)

        try:
            # duration_ratio=1 and an unbounded num_kernels: no kernel is folded into "others".
            kt, kd = ta.get_gpu_kernel_breakdown(
                visualize=False, duration_ratio=1.0, num_kernels=10**9, include_memory_kernels=True
            )
            out["kernel_type_breakdown_all_ranks"] = _kernel_types(kt)
            for r in out["ranks"]:
                k = kd[kd["rank"] == r].sort_values("sum (us)", ascending=False)
                total = float(k["sum (us)"].sum())
                per[str(r)]["kernel_time_ms"] = _ms(total)
                per[str(r)]["distinct_kernels"] = len(k)
                per[str(r)]["top5"] = [
                    {
                        "name": str(row["name"])[:NAME_MAX],
                        "kernel_type": str(row["kernel_type"]),
                        "share": round(float(row["sum (us)"]) / total, 4) if total else None,
                        "time_ms": _ms(row["sum (us)"]),
                    }
                    for _, row in k.head(5).iterrows()
                ]
        except Exception as exc:
            record("get_gpu_kernel_breakdown", exc)
    return out


def _child(unit: str, files: list[str], dest: str) -> None:
    from importlib.metadata import version

    result = {
        "unit": unit,
        "hta_version": version("HolisticTraceAnalysis"),
        "pandas": version("pandas"),
        NO_ROUNDING: os.environ.get(NO_ROUNDING, "0"),
        "date": datetime.date.today().isoformat(),
        "trace_paths": [str(Path(f).relative_to(TRACES)) for f in files],
    }
    t0 = time.perf_counter()
    result.update(analyse([Path(f) for f in files]))
    result["wall_s"] = round(time.perf_counter() - t0, 2)
    Path(dest).write_text(json.dumps(result, indent=1) + "\n")


def run_unit(
    unit: str, files: list[Path], timeout: int, dest: Path, env: dict[str, str] | None = None
) -> dict[str, Any]:
    dest.unlink(missing_ok=True)
    cmd = [sys.executable, __file__, "--child", unit, "--dest", str(dest), *map(str, files)]
    try:
        proc = subprocess.run(
            cmd, capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})}
        )
    except subprocess.TimeoutExpired:
        proc = None
    if proc is not None and proc.returncode == 0 and dest.exists():
        return json.loads(dest.read_text())
    from importlib.metadata import version

    why = "timeout" if proc is None else f"child exited {proc.returncode}: {proc.stderr[-2000:]}"
    result = {
        "unit": unit,
        "hta_version": version("HolisticTraceAnalysis"),
        "pandas": version("pandas"),
        "date": datetime.date.today().isoformat(),
        "trace_paths": [str(f.relative_to(TRACES)) for f in files],
        "ranks": [],
        "per_rank": {},
        "errors": [{"stage": "run", "error": why}],
    }
    dest.write_text(json.dumps(result, indent=1) + "\n")
    return result


def _fmt(x: Any, spec: str = "") -> str:
    return "–" if x is None else format(x, spec)


def _errs(errors: list[dict[str, str]]) -> str:
    text = "; ".join(f"{e['stage']}: {e['error'][:120]} ({e.get('where', '')})" for e in errors)
    return " ".join(text.replace("|", "/").split())


def _rows(name: str, res: dict[str, Any]) -> list[str]:
    alt = res.get(f"with_{NO_ROUNDING}=1") or {"per_rank": {}, "errors": []}
    errs = _errs(res["errors"])
    if alt["errors"]:
        errs += f" [{NO_ROUNDING}=1: {_errs(alt['errors'])}]"
    out = []
    for rank, pr in (res["per_rank"] or {"–": {}}).items():
        apr = alt["per_rank"].get(rank, {})
        top = (pr.get("top5") or [{}])[0]
        kernel = (top.get("name") or "–")[:60].replace("|", "/")
        out.append(
            f"| {name} | {rank} | {len(res['ranks'])} | {_fmt(pr.get('steps'))} "
            f"| {_fmt(pr.get('iteration_ms'), '.2f')} | {_fmt(pr.get('idle_pct'), '.2f')} "
            f"| {_fmt(pr.get('compute_pct'), '.2f')} | {_fmt(pr.get('non_compute_pct'), '.2f')} "
            f"| {_fmt(pr.get('kernel_time_ms'), '.2f')} | `{kernel}` "
            f"| {_fmt(top.get('share'), '.1%')} | {_fmt(apr.get('idle_pct'), '.2f')} "
            f"| {_fmt(apr.get('kernel_time_ms'), '.2f')} | {errs} |"
        )
    return out


def summary(results: list[dict[str, Any]]) -> str:
    version = results[0]["hta_version"] if results else "?"
    pandas = next((r["pandas"] for r in results if r.get("pandas")), "?")
    lines = [
        f"# HTA {version} (pandas {pandas}) reference figures for ../shared/external-traces",
        "",
        "Made by `benchmarks/validation/hta_baseline.py` (definitions in benchmarks/validation/README.md).",
        "Steps = CPU ProfilerStep rows left after HTA's load filter (with two or more ProfilerStep names it",
        "keeps only CPU ops that start before the latest ProfilerStep row, and the GPU events they launched);",
        "iteration = their mean duration; idle/compute/non-compute = HTA `get_temporal_breakdown`, as shares",
        "of the span from the first to the last kept GPU event; kernel ms = sum of kernel durations in HTA's",
        "`get_gpu_kernel_breakdown`; top-1 share = the largest kernel's total time / kernel ms.",
        "",
        "The last two figures come from a second run with HTA's `HTA_DISABLE_NS_ROUNDING=1` (no rounding of",
        "ns-resolution timestamps to whole µs); the others from HTA's defaults.",
        "",
        "| trace | rank | ranks | steps | iteration ms | idle % | compute % | non-compute % | kernel ms "
        "| top-1 kernel | top-1 share | idle % (no rounding) | kernel ms (no rounding) | errors |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for res in results:
        lines += _rows(res["unit"].removeprefix("hta_"), res)
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="*", help="folder names to run (default: all)")
    ap.add_argument("--timeout", type=int, default=TIMEOUT_S, help="seconds per trace unit")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--dest", help=argparse.SUPPRESS)
    ap.add_argument("files", nargs="*", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        _child(args.child, args.files, args.dest)
        return

    OUT.mkdir(parents=True, exist_ok=True)
    folders = sorted(p for p in TRACES.iterdir() if p.is_dir())
    if args.only:
        folders = [p for p in folders if p.name in args.only]
    for folder in folders:
        for unit, files in plan_units(folder):
            t0 = time.perf_counter()
            dest = OUT / f"{unit}.json"
            res = run_unit(unit, files, args.timeout, dest)
            # HTA rounds float (ns) timestamps to whole µs (ceil start, floor end), which shortens
            # every event and gives sub-µs ones a negative duration; its own switch turns it off.
            with tempfile.TemporaryDirectory(dir="/tmp") as tmp:
                alt = run_unit(unit, files, args.timeout, Path(tmp) / "alt.json", {NO_ROUNDING: "1"})
            res[f"with_{NO_ROUNDING}=1"] = {k: alt[k] for k in ("per_rank", "errors")}
            dest.write_text(json.dumps(res, indent=1) + "\n")
            print(f"{unit}: {time.perf_counter() - t0:.1f} s, {len(res['errors'])} error(s)", flush=True)
    # The summary covers every unit on disk, so a partial (--only) run keeps the others' rows.
    results = [json.loads(p.read_text()) for p in sorted(OUT.glob("hta_*.json"))]
    (OUT / "hta_summary.md").write_text(summary(results))


if __name__ == "__main__":
    main()
