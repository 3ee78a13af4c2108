"""kerneltriage against Holistic Trace Analysis (HTA) on the real third-party traces: writes
docs/VALIDATION.md (issue 15).

For every trace of ../shared/external-traces this runs kerneltriage (``build_reports`` on the
folder, or on each file when the folder as a whole is refused) and puts its figures beside HTA's
from benchmarks/results/validation/hta_*.json (made by hta_baseline.py, in HTA's own venv): steps,
step time, idle, kernel time and the top-5 kernels. It then lists every candidate with at least 3 %
of the step with kerneltriage's verdict and an expert's assessment from assessments.yaml.

    . .venv/bin/activate
    python benchmarks/validation/compare.py --out docs/VALIDATION.md
    python benchmarks/validation/compare.py --only hta-cnn-v100 > /tmp/v.md     # a few traces

A trace kerneltriage cannot read gets a row that says why; the script goes on. Progress goes to
stderr.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
TRACES = ROOT / ".." / "shared" / "external-traces"
HTA_DIR = ROOT / "benchmarks" / "results" / "validation"
ASSESSMENTS = Path(__file__).with_name("assessments.yaml")
MIN_SHARE = 0.03  # candidates listed: at least this share of the step
MATCH_CHARS = 100  # kernels of the two tools are the same kernel when these first characters agree
NAME_CHARS = 80  # candidate names in the tables
KERNEL_CHARS = 90  # kernel names in the tables
NO_ROUNDING = "with_HTA_DISABLE_NS_ROUNDING=1"
DASH = "—"


# --------------------------------------------------------------------------- Markdown helpers


def cell(text: Any) -> str:
    """Plain text safe inside a table cell: no line breaks, no bare pipes, no HTML."""
    s = " ".join(str(text).split())
    return s.replace("\\", "\\\\").replace("|", "\\|").replace("<", "&lt;").replace("*", "\\*")


def code(text: str, limit: int | None = None) -> str:
    """A code span for a table cell (GFM reads ``\\|`` inside it as a literal pipe)."""
    s = " ".join(str(text).split()).replace("`", "'")
    if limit and len(s) > limit:
        s = s[: limit - 1] + "…"
    return "`" + s.replace("|", "\\|") + "`"


def num(value: Any, fmt: str = ".2f") -> str:
    return DASH if value is None else format(value, fmt)


def pct(share: float | None, fmt: str = ".1f") -> str:
    return DASH if share is None else format(100 * share, fmt)


def table(head: list[str], rows: list[list[str]]) -> list[str]:
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return out


# --------------------------------------------------------------------------- kerneltriage side


@dataclasses.dataclass
class Unit:
    """One rank of one trace as kerneltriage reads it."""

    folder: str
    file: str | None  # the trace file's name
    rank: int | None
    ranks: int  # ranks read together with this one
    report: dict[str, Any] | None = None
    error: str | None = None
    seconds: float = 0.0
    fallback: str | None = None  # why the folder was read file by file

    @property
    def label(self) -> str:
        return self.folder if self.fallback is None or self.file is None else f"{self.folder}/{self.file}"


class _Timeout(Exception):
    pass


def _alarm(_signum: int, _frame: Any) -> None:
    raise _Timeout


def trace_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.is_file() and p.name.endswith((".json", ".json.gz")))


def report_dict(report: Any) -> dict[str, Any]:
    """``Report.to_json()``; the dataclass's own fields if that fails (the analysis is changing
    under this script, and a broken serializer should not hide the figures)."""
    try:
        return report.to_json()
    except Exception as exc:
        print(f"  Report.to_json() failed ({type(exc).__name__}: {exc}); using its fields", file=sys.stderr)
        data = dataclasses.asdict(report)
        data["gpu"] = {"name": report.gpu.name} if getattr(report, "gpu", None) is not None else None
        return data


def _build(path: Path, timeout_s: int) -> tuple[dict[int, dict[str, Any]] | None, str | None, float]:
    from kerneltriage.api import build_reports

    t0 = time.perf_counter()
    signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(timeout_s)
    try:
        reports = build_reports(path)
        return {int(r): report_dict(rep) for r, rep in reports.items()}, None, time.perf_counter() - t0
    except _Timeout:
        return None, f"timeout: no result after {timeout_s} s", time.perf_counter() - t0
    except Exception as exc:
        return None, f"{type(exc).__name__}: {exc}", time.perf_counter() - t0
    finally:
        signal.alarm(0)


def _file_of(report: dict[str, Any], rank: int) -> str | None:
    traces = (report.get("source") or {}).get("traces") or {}
    path = traces.get(str(rank)) or traces.get(rank)
    return Path(path).name if path else None


def run_kerneltriage(folder: Path, timeout_s: int) -> list[Unit]:
    """The folder as one run (one unit per rank), or, when kerneltriage refuses the folder, each
    trace file on its own."""
    print(f"kerneltriage: {folder.name}", file=sys.stderr)
    reports, error, seconds = _build(folder, timeout_s)
    if reports is not None:
        return [
            Unit(folder.name, _file_of(rep, rank), rank, len(reports), rep, seconds=seconds / len(reports))
            for rank, rep in sorted(reports.items())
        ]
    files = trace_files(folder)
    if len(files) < 2:
        return [Unit(folder.name, files[0].name if files else None, None, 0, error=error, seconds=seconds)]
    units = []
    for f in files:
        print(f"kerneltriage: {folder.name}/{f.name}", file=sys.stderr)
        reps, err, secs = _build(f, timeout_s)
        if reps is None:
            units.append(Unit(folder.name, f.name, None, 0, error=err, seconds=secs, fallback=error))
            continue
        units += [
            Unit(folder.name, f.name, rank, len(reps), rep, seconds=secs / len(reps), fallback=error)
            for rank, rep in sorted(reps.items())
        ]
    return units


def kernel_times(report: dict[str, Any]) -> Counter[str]:
    """Each kernel's time per step (ms), summed over the candidates, by full name."""
    times: Counter[str] = Counter()
    for c in report.get("candidates") or []:
        for k in c.get("kernels") or []:
            times[k.get("full_name") or k.get("name") or "?"] += k.get("time_ms_per_step") or 0.0
    return times


# --------------------------------------------------------------------------- HTA side


@dataclasses.dataclass
class HTA:
    """HTA's figures for one rank of one trace file."""

    path: str  # the JSON, relative to the repository
    rank: str
    data: dict[str, Any]  # the whole JSON
    entry: dict[str, Any]  # per_rank[rank], HTA's defaults
    unrounded: dict[str, Any]  # the same with HTA_DISABLE_NS_ROUNDING=1

    def errors(self) -> list[str]:
        out = []
        for label, errs in (
            ("", self.data.get("errors") or []),
            (" (no rounding)", (self.data.get(NO_ROUNDING) or {}).get("errors") or []),
        ):
            for e in errs:
                where = f" ({e['where']})" if e.get("where") else ""
                out.append(f"HTA{label} {e.get('stage', '?')}: {e.get('error', '?')}{where}")
        return out


def load_hta(directory: Path) -> dict[tuple[str, str], HTA]:
    """(folder, trace file name) → HTA's figures for that file's rank."""
    index: dict[tuple[str, str], HTA] = {}
    for path in sorted(directory.glob("hta_*.json")):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            print(f"skipping {path.name}: {exc}", file=sys.stderr)
            continue
        paths = data.get("trace_paths") or []
        if not paths:
            continue
        folder = paths[0].split("/")[0]
        rank_files = data.get("rank_files") or {}
        unrounded = (data.get(NO_ROUNDING) or {}).get("per_rank") or {}
        for rank, entry in (data.get("per_rank") or {}).items():
            name = rank_files.get(rank) or (Path(paths[0]).name if len(paths) == 1 else None)
            if name:
                rel = str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)
                index[(folder, name)] = HTA(rel, rank, data, entry, unrounded.get(rank) or {})
    return index


def find_hta(index: dict[tuple[str, str], HTA], unit: Unit) -> HTA | None:
    if unit.file and (unit.folder, unit.file) in index:
        return index[(unit.folder, unit.file)]
    same = [h for (folder, _), h in index.items() if folder == unit.folder]
    return same[0] if len(same) == 1 else None


# --------------------------------------------------------------------------- assessments


@dataclasses.dataclass
class Assessment:
    index: int
    traces: list[str]
    candidate: str | None
    kernel: str | None
    reason: str | None
    rank: int | None
    verdict: str | None
    text: str
    used: bool = False

    def matches(self, folder: str, rank: int | None, cand: dict[str, Any]) -> bool:
        if folder not in self.traces or (self.rank is not None and self.rank != rank):
            return False
        if self.candidate is not None and not str(cand.get("name", "")).startswith(self.candidate):
            return False
        if self.reason is not None and not str(cand.get("reason", "")).startswith(self.reason):
            return False
        if self.kernel is not None:
            names = [k.get("full_name") or k.get("name") or "" for k in cand.get("kernels") or []]
            if not any(n.startswith(self.kernel) for n in names):
                return False
        return True

    @property
    def specificity(self) -> tuple[int, int, int]:
        return (
            self.rank is not None,
            len(self.candidate or "") + len(self.kernel or "") + len(self.reason or ""),
            -self.index,
        )


def load_assessments(path: Path) -> tuple[list[Assessment], list[str]]:
    import yaml

    if not path.exists():
        return [], [f"{path.name} not found: no assessments"]
    raw = yaml.safe_load(path.read_text()) or {}
    out, problems = [], []
    for i, e in enumerate(raw.get("assessments") or []):
        traces = e.get("trace")
        traces = [traces] if isinstance(traces, str) else list(traces or [])
        text = e.get("assessment")
        if not traces or not text or (e.get("candidate") is None and e.get("kernel") is None):
            problems.append(f"entry {i + 1} needs trace, assessment and candidate or kernel: {e!r}")
            continue
        out.append(
            Assessment(
                i,
                [str(t) for t in traces],
                None if e.get("candidate") is None else str(e["candidate"]),
                None if e.get("kernel") is None else str(e["kernel"]),
                None if e.get("reason") is None else str(e["reason"]),
                e.get("rank"),
                e.get("verdict"),
                " ".join(str(text).split()),
            )
        )
    return out, problems


def assess(assessments: list[Assessment], unit: Unit, cand: dict[str, Any]) -> tuple[str | None, str | None]:
    """(the assessment's text, why it needs another look: None when it applies as written)."""
    found = [a for a in assessments if a.matches(unit.folder, unit.rank, cand)]
    if not found:
        return None, "no assessment"
    best = max(found, key=lambda a: a.specificity)
    best.used = True
    if best.verdict and best.verdict != cand.get("verdict"):
        return best.text, f"written for verdict {best.verdict}, now {cand.get('verdict')}"
    return best.text, None


# --------------------------------------------------------------------------- the page


def git(*args: str) -> str:
    try:
        return subprocess.run(
            ["git", *args], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return ""


DEFINITIONS = """\
- **Span of the figures.** HTA measures each rank over the whole kept trace: from the start of the
  first GPU event to the end of the last one. kerneltriage measures per step and averages over the
  steps. A step's wall is the longer of its CPU `ProfilerStep` range and its GPU period, which runs
  from its first kernel to the next step's first kernel.
- **Idle.** HTA: span − union of all GPU intervals. Host time before the first kernel or after the
  last is not idle, so `tracelens-timesformer-h100`, which has 218 ms of preprocessing before its
  first kernel, shows 1.3 % idle. kerneltriage: step wall − GPU-busy time inside the step, so the
  same host time is idle.
- **Which steps count.** HTA filters only when a trace has two or more `ProfilerStep` names. It then
  keeps CPU ops that start before the latest `ProfilerStep` start, plus the GPU work they launched,
  which usually drops the last step. With 0 or 1 step names it keeps everything. kerneltriage uses
  every finished `ProfilerStep`, then optimizer steps, then `kerneltriage.step` ranges. If there are
  none, the whole trace is one step. Steps under 0.1 × the median step are dropped as stubs.
  kerneltriage's step count is therefore often HTA's + 1.
- **Iteration time.** HTA has no iteration-time API. The baseline uses the mean duration of HTA's kept
  CPU `ProfilerStep` rows. kerneltriage's step time is the mean step wall. That is longer than the CPU
  range when the GPU runs behind the CPU.
- **Timestamps.** HTA rounds ns-resolution timestamps to whole µs (`ts = ceil`, `end = floor`), so
  each event loses up to 2 µs. On ns traces this lowers kernel time by 0.1–12 % and raises idle,
  which is why the table also gives HTA's idle with `HTA_DISABLE_NS_ROUNDING=1`. kerneltriage keeps
  ns.
- **What is GPU work.** For HTA it is every row with an integer `stream` arg. That includes
  Inductor's CPU-side launch records (`tracelens-vllm-graph-capture-mi300x`, `tracelens-compile-mi300x`,
  `tracelens-moe-8rank-b200`) and `cuda_sync` rows (`hta-alexnet-a100`). kerneltriage counts only
  events of category `kernel`, `gpu_memcpy` and `gpu_memset`.
- **Steps of a kernel.** kerneltriage assigns each kernel to the step that *launched* it, so step N−1's
  work that runs inside step N's window still belongs to step N−1. HTA does not split by step.
- **Work launched before the profiled window.** HTA counts it whenever it falls in the kept span: the
  `tracelens-qwen05b-h100` span is 49.65 ms against a 47.15 ms step. kerneltriage counts it as GPU-busy
  time in the step whose wall it runs in, but in no candidate, so the candidates' kernel time can
  fall below GPU busy. Without step annotations it goes into the one whole-trace step as kernels
  with no op.
- **Shares of kernel time.** HTA's top-5 share is a kernel's summed duration ÷ the sum of every GPU
  row's duration except OTHER (`Context Sync` and similar). Overlapping kernels count twice, and the
  figure covers the kept trace. This page's kerneltriage share is a kernel's time per step ÷ the sum
  of all candidates' kernel time per step. Overlaps also count twice, and kernels that belong to no
  step or no candidate are left out.
- **Ranks.** HTA takes a file's rank from the first `"rank": N` in its text and keeps only the last
  file it sees for each rank. kerneltriage takes the rank from `distributedInfo` or the file name,
  and refuses a folder whose files claim the same rank, so `kineto-resnet50-v100-pt19` is reported
  file by file. Both tools' figures are per rank here. HTA's own kernel-type table (not used here)
  sums over all ranks.
- **Duplicated step annotations.** Newer PyTorch also writes each `ProfilerStep` as a GPU-side
  `gpu_user_annotation`. HTA treats that row as a CPU op, so in `tracelens-resnet-ckpt-8rank-mi300x`
  it keeps all three steps. kerneltriage takes steps from CPU-side annotations only.
"""


def header(units: list[Unit], hta: dict[tuple[str, str], HTA], seconds: float) -> list[str]:
    commit = git("rev-parse", "--short", "HEAD") or "unknown"
    dirty = git("status", "--porcelain", "--", "kerneltriage")
    versions = sorted({(h.data.get("hta_version"), h.data.get("pandas")) for h in hta.values()})
    dates = sorted({str(h.data.get("date")) for h in hta.values()})
    hta_text = ", ".join(f"HTA {v} (pandas {p})" for v, p in versions) or "no HTA results found"
    files = {(u.folder, u.file) for u in units}
    folders = {u.folder for u in units}
    return [
        "# Validation: kerneltriage against Holistic Trace Analysis",
        "",
        f"Generated {datetime.date.today().isoformat()} by `benchmarks/validation/compare.py` from "
        f"kerneltriage commit `{commit}`{' with uncommitted changes under kerneltriage/' if dirty else ''}. "
        f"The HTA side is {hta_text}, run on {', '.join(dates) or DASH} "
        f"by `benchmarks/validation/hta_baseline.py`. It covers {len(folders)} trace folders, "
        f"{len(files)} trace files and {len(units)} rank reports, and took {seconds:.0f} s.",
        "",
        "The traces are real third-party PyTorch profiler (Kineto) traces in `../shared/external-traces`.",
        "Each folder's `SOURCE.md` says where it comes from. HTA's figures are a reference, not ground",
        "truth: the two tools define idle, steps and kernel time differently (see *Where definitions",
        "differ*), and HTA gets some traces wrong (see `benchmarks/validation/README.md`, *Findings*).",
        "",
        "To regenerate (HTA once, in its own venv outside the repository, then this page):",
        "",
        "```sh",
        "python3 -m venv ~/hta-venv",
        "~/hta-venv/bin/pip install HolisticTraceAnalysis==0.5.0 'pandas==2.3.3'",
        "~/hta-venv/bin/python benchmarks/validation/hta_baseline.py",
        ". .venv/bin/activate",
        "python benchmarks/validation/compare.py --out docs/VALIDATION.md",
        "```",
        "",
        "The assessments come from `benchmarks/validation/assessments.yaml` (its header explains the format).",
        "",
    ]


def summary(units: list[Unit], hta: dict[tuple[str, str], HTA]) -> list[str]:
    rows = []
    for u in units:
        h = find_hta(hta, u)
        r = u.report or {}
        e = h.entry if h else {}
        n = h.unrounded if h else {}
        notes = []
        if u.error:
            notes.append(f"kerneltriage failed: {u.error[:300]}")
        if h is None:
            notes.append("no HTA result for this file")
        elif h.errors():
            notes += h.errors()
        kt_kernels = sum(kernel_times(r).values()) if u.report else None
        rows.append(
            [
                code(u.label),
                DASH if u.rank is None else str(u.rank),
                str(u.ranks) if u.ranks else DASH,
                str(r.get("steps", DASH)) if u.report else DASH,
                str(e.get("steps", DASH)) if h else DASH,
                num(r.get("step_time_ms")),
                num(e.get("iteration_ms")),
                num(r.get("idle_pct")),
                num(e.get("idle_pct")),
                num(n.get("idle_pct")),
                num(r.get("gpu_busy_ms")),
                num(kt_kernels),
                num(e.get("kernel_time_ms")),
                cell("; ".join(notes)) if notes else "",
            ]
        )
    head = [
        "trace",
        "rank",
        "ranks read (kt)",
        "steps (kt)",
        "steps (HTA)",
        "step ms (kt)",
        "iteration ms (HTA)",
        "idle % (kt)",
        "idle % (HTA)",
        "idle % (HTA, no rounding)",
        "GPU busy ms/step (kt)",
        "kernel ms/step (kt)",
        "kernel ms, kept trace (HTA)",
        "notes",
    ]
    return [
        "## Summary",
        "",
        "kt = kerneltriage. kerneltriage's figures are per step (the mean over its steps). HTA's idle",
        "and kernel time cover the whole kept trace. *kernel ms/step (kt)* sums the kernels of all",
        "candidates. It can fall below *GPU busy* when work launched before the profiled window runs",
        "inside a step, and it can exceed it when kernels overlap.",
        "",
        *table(head, rows),
        "",
    ]


def pair_kernels(times: Counter[str], hta_top: list[dict[str, Any]]) -> dict[int, str]:
    """HTA's top-5 entry → kerneltriage's kernel of the same name, one to one. Names agree when
    equal, else when HTA's (cut at 120 characters) is a prefix, else in their first MATCH_CHARS
    characters; several that agree (tuned GEMMs often share 120 characters) pair in order of time."""
    taken: set[str] = set()
    pairs: dict[int, str] = {}
    for j, t in enumerate(hta_top):
        name = str(t.get("name", ""))
        tests = (
            lambda n, name=name: n == name,
            lambda n, name=name: n.startswith(name),
            lambda n, name=name: n[:MATCH_CHARS] == name[:MATCH_CHARS],
        )
        for test in tests:
            same = [n for n in times if n not in taken and test(n)]
            if same:
                best = max(same, key=lambda n: times[n])
                pairs[j] = best
                taken.add(best)
                break
    return pairs


def display_names(names: list[str], limit: int) -> dict[str, str]:
    """Each name cut to ``limit`` characters; names whose cuts collide show the part where they
    differ instead (``head…differing part…``)."""
    plain = {n: n if len(n) <= limit else n[: limit - 1] + "…" for n in names}
    cut = dict(plain)
    for n in names:
        rivals = [m for m in names if m != n and plain[m] == plain[n]]
        if not rivals:
            continue
        d = min(
            next((i for i, (a, b) in enumerate(zip(n, m)) if a != b), min(len(n), len(m))) for m in rivals
        )
        head = limit // 2
        cut[n] = n[:head] + "…" + n[max(head, d - 8) : max(head, d - 8) + limit - head - 2] + "…"
    return cut


def top5_table(unit: Unit, h: HTA | None) -> list[str]:
    times = kernel_times(unit.report or {})
    total = sum(times.values())
    kt_top = [name for name, _ in times.most_common(5)]
    hta_top = (h.entry.get("top5") or []) if h else []
    pairs = pair_kernels(times, hta_top)
    hta_of = {name: j for j, name in pairs.items()}

    def share(name: str | None) -> float | None:
        return times[name] / total if name is not None and total else None

    def delta(a: float | None, b: float | None) -> str:
        if a is None or b is None:
            return DASH
        d = 100 * (a - b)
        return "0.0" if abs(d) < 0.05 else f"{d:+.1f}"

    shown = kt_top + [str(t.get("name", "")) for j, t in enumerate(hta_top) if pairs.get(j) not in kt_top]
    label = display_names(list(dict.fromkeys(shown)), KERNEL_CHARS)
    rows = []
    for i, name in enumerate(kt_top):
        j = hta_of.get(name)
        hs = None if j is None else hta_top[j].get("share")
        rows.append(
            [
                code(label[name]),
                f"{pct(share(name))} (#{i + 1})",
                DASH if j is None else f"{pct(hs)} (#{j + 1})",
                delta(share(name), hs),
            ]
        )
    for j, t in enumerate(hta_top):
        if pairs.get(j) in kt_top:
            continue
        name, hs = str(t.get("name", "")), t.get("share")
        kt = share(pairs.get(j))
        rows.append([code(label[name]), pct(kt), f"{pct(hs)} (#{j + 1})", delta(kt, hs)])
    if not rows:
        return ["No kernels on either side.", ""]
    return [
        *table(["kernel", "share % (kt, #)", "share % (HTA, #)", "Δ pp (kt − HTA)"], rows),
        "",
    ]


def headroom_cell(c: dict[str, Any]) -> str:
    """The headroom and its basis (``attrs.headroom_basis``): counters, a shape model of this
    trace's shapes (and where they came from), a measured attention rate, or the launch floor;
    the precision and SM fill of the ceiling; a disagreement below 1. None: why none."""
    head = c.get("headroom")
    basis = (c.get("attrs") or {}).get("headroom_basis")
    if head is None or not basis:
        why = str(((c.get("conditions") or {}).get("headroom") or {}).get("detail") or "")
        return f"— ({why.split(';')[0][:90]})" if why else DASH
    parts = [basis["kind"]]
    if basis.get("table"):
        t = basis["table"]
        lo, hi = t["rows"]
        rows = f"S={lo}" if lo == hi else f"S={lo}–{hi}"
        parts.append(f"{t['backend']} {t['tflops']:.0f} TFLOP/s at S={t['seq_len']} ({rows})")
    elif basis["source"] in ("estimate", "fused estimate"):
        parts.append(basis.get("shapes") or "")
    if basis.get("precision"):
        parts.append(str(basis["precision"]))
    if basis.get("fill") is not None and basis["fill"] < 0.95:
        parts.append(f"tiles fill {basis['fill']:.0%} of SMs")
    text = f"{head:.2f}× ({'; '.join(p for p in parts if p)})"
    return f"{text}: disagrees (below 1)" if basis.get("disagreement") else text


def candidates_table(unit: Unit, assessments: list[Assessment], pending: list[list[str]]) -> list[str]:
    cands = [
        c for c in (unit.report or {}).get("candidates") or [] if (c.get("time_share") or 0) >= MIN_SHARE
    ]
    if not cands:
        return [f"No candidate has {MIN_SHARE:.0%} of the step or more.", ""]
    label = display_names(list(dict.fromkeys(str(c.get("name", "")) for c in cands)), NAME_CHARS)
    rows = []
    for c in cands:
        headroom = headroom_cell(c)
        verdict = str(c.get("verdict"))
        if c.get("builtin"):
            verdict += f" → {c['builtin']}"
        text, issue = assess(assessments, unit, c)
        if issue:
            pending.append(
                [
                    code(unit.label),
                    DASH if unit.rank is None else str(unit.rank),
                    str(c.get("id")),
                    code(label[str(c.get("name", ""))]),
                    pct(c.get("time_share")),
                    cell(c.get("verdict")),
                    cell(issue),
                ]
            )
        if text is None:
            shown = DASH
        elif issue:
            shown = f"⚠ {cell(issue)}: {cell(text)}"
        else:
            shown = cell(text)
        rows.append(
            [
                str(c.get("id")),
                code(label[str(c.get("name", ""))]),
                cell(c.get("kind")),
                pct(c.get("time_share")),
                cell(headroom),
                cell(verdict),
                cell(c.get("reason") or ""),
                shown,
            ]
        )
    return [
        *table(
            ["id", "candidate", "kind", "% of step", "headroom", "verdict", "reason (kt)", "assessment"], rows
        ),
        "",
    ]


def section(
    unit: Unit, hta: dict[tuple[str, str], HTA], assessments: list[Assessment], pending: list
) -> list[str]:
    title = unit.label + ("" if unit.rank is None or unit.ranks < 2 else f", rank {unit.rank}")
    out = [f"### {title}", ""]
    if unit.fallback:
        out += [f"Read file by file. kerneltriage refused the folder: {cell(unit.fallback[:400])}", ""]
    if unit.error:
        return [*out, f"**kerneltriage failed:** {cell(unit.error[:1000])}", ""]
    r = unit.report or {}
    h = find_hta(hta, unit)
    gpu = (r.get("gpu") or {}).get("name") if isinstance(r.get("gpu"), dict) else None
    facts = [
        f"file `{unit.file}`" if unit.file else "no trace file",
        f"GPU: {cell(gpu) if gpu else 'unknown (no ceilings)'}",
        f"{r.get('steps')} step(s) from {cell(r.get('step_source'))}",
        f"step {num(r.get('step_time_ms'))} ms",
        f"idle {num(r.get('idle_pct'))} %",
        f"HTA: {'`' + h.path + '`' if h else 'no result'}",
    ]
    out += [" · ".join(facts) + ".", ""]
    warnings = r.get("warnings") or []
    if warnings:
        out += ["kerneltriage's warnings:", ""]
        out += [f"- {cell(w if len(w) <= 400 else w[:399] + '…')}" for w in warnings]
        out += [""]
    out += ["Top-5 kernels by share of kernel time:", "", *top5_table(unit, h)]
    out += [
        f"Candidates with {MIN_SHARE:.0%} of the step or more, in kerneltriage's order:",
        "",
        *candidates_table(unit, assessments, pending),
    ]
    return out


def render(
    units: list[Unit], hta: dict, assessments: list[Assessment], problems: list[str], seconds: float
) -> str:
    pending: list[list[str]] = []
    lines = header(units, hta, seconds)
    lines += summary(units, hta)
    lines += ["## Where definitions differ", "", DEFINITIONS]
    lines += ["## Per trace", ""]
    for u in units:
        lines += section(u, hta, assessments, pending)
    lines += ["## Not yet assessed", ""]
    if pending:
        lines += [
            f"These candidates have {MIN_SHARE:.0%} of the step or more, and either no entry in",
            "`assessments.yaml` matches them or the matching entry was written for another verdict.",
            "",
            *table(["trace", "rank", "id", "candidate", "% of step", "verdict", "why"], pending),
            "",
        ]
    else:
        lines += ["None: every candidate listed above has an assessment written for its verdict.", ""]
    unused = [a for a in assessments if not a.used]
    if unused or problems:
        lines += ["### Assessments that match no candidate", ""]
        lines += [
            f"- entry {a.index + 1} ({', '.join(a.traces)}): candidate {code(a.candidate or DASH)}, "
            f"kernel {code(a.kernel or DASH)}, reason {code(a.reason or DASH)}"
            for a in unused
        ]
        lines += [f"- {cell(p)}" for p in problems]
        lines += [""]
    return "\n".join(lines).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--traces", type=Path, default=TRACES, help="folder of trace folders")
    ap.add_argument("--hta", type=Path, default=HTA_DIR, help="folder of hta_*.json")
    ap.add_argument("--assessments", type=Path, default=ASSESSMENTS)
    ap.add_argument("--only", nargs="+", metavar="FOLDER", help="just these trace folders")
    ap.add_argument("--timeout", type=int, default=600, help="seconds per kerneltriage run")
    ap.add_argument("--out", type=Path, help="write here instead of stdout")
    args = ap.parse_args(argv)

    t0 = time.perf_counter()
    folders = sorted(p for p in args.traces.resolve().iterdir() if p.is_dir())
    if args.only:
        folders = [p for p in folders if p.name in args.only]
    hta = load_hta(args.hta)
    assessments, problems = load_assessments(args.assessments)
    units: list[Unit] = []
    for folder in folders:
        units += run_kerneltriage(folder, args.timeout)
    seconds = time.perf_counter() - t0
    page = render(units, hta, assessments, problems, seconds)
    if args.out:
        args.out.write_text(page)
    else:
        sys.stdout.write(page)
    failed = [u.label for u in units if u.error]
    print(f"done in {seconds:.1f} s; {len(units)} rank reports; failed: {failed or 'none'}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
