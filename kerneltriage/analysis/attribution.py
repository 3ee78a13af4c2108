"""Attribution: every GPU activity → the step it belongs to → the op that launched it → its
top-level op → (for backward kernels) the forward op it differentiates → a module or region.

The chain, with the trace fields it uses:

- kernel ``correlation`` = runtime call ``correlation`` (cudaLaunchKernel, cuLaunchKernelEx …);
- runtime call ``External id`` = the launching cpu op's ``External id`` (else: the innermost
  cpu op on the calling thread whose interval holds the call);
- cpu ops nest by time on each thread: the outermost cpu op is the *top-level* op
  (``aten::linear``, not ``aten::mm``); annotations on the stack give the module path
  (``kerneltriage.module:``) or a named region;
- a backward top-level op (``autograd::engine::evaluate_function: MmBackward0``) carries the
  autograd ``Sequence number`` of the forward op that recorded the node; that forward op's
  top-level op is what the backward kernel is attributed to.

Steps are assigned by when a kernel was *launched* (its runtime call lies in the step's CPU
range), never by when it ran: with an asynchronous GPU, work of step N-1 still runs while the
CPU is inside step N. Kernels whose launch is not in the trace (launched before profiling
started) belong to no step's ops; the GPU is busy while they run, though, so ``idle.py``
counts them as busy time of the step whose wall they run in (``step_windows``).

Older traces: PyTorch 1.8-1.9 wrote every ``record_function`` range (``ProfilerStep#N``,
``Optimizer.step#…``, ``enumerate(DataLoader)#…``) with category "Operator", like an aten op,
and their backward top-level ops are the autograd nodes themselves (``CudnnConvolutionBackward``)
rather than ``autograd::engine::evaluate_function: …``. ``annotation_mask``/``op_mask`` and the
backward-root pattern read both.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from kerneltriage.annotate import MODULE_PREFIX, REGION_PREFIX, STEP_RANGE
from kerneltriage.ingest.tables import Timeline
from kerneltriage.patterns import Pattern, compile_user_pattern

PROFILER_STEP = re.compile(r"^ProfilerStep#\d+$")
_OPTIMIZER_STEP = re.compile(r"^Optimizer\.step#")
_OPTIMIZER = re.compile(r"^Optimizer\.(step|zero_grad)#")
# Ranges PyTorch itself opens with record_function. Whatever category a trace gives them
# (PyTorch 1.8-1.9: "Operator", read as cpu_op) they frame work and are never ops.
_FRAMING = re.compile("|".join((PROFILER_STEP.pattern, _OPTIMIZER.pattern, r"^enumerate\(DataLoader\)#")))
# A backward top-level op: today's evaluate_function wrapper, or (PyTorch <= 1.9) the autograd
# node itself on the backward thread.
_BACKWARD_ROOT = re.compile(
    r"^(autograd::engine::evaluate_function|torch::autograd::AccumulateGrad$|[A-Za-z0-9_]+Backward\d*$)"
)
_NEST_TOLERANCE_NS = 1000
#: A step shorter than this fraction of the median step is a stub (a ProfilerStep opened just
#: before the profiler stopped), not a step.
STUB_FRACTION = 0.1


@dataclass
class Step:
    index: int
    name: str
    start: int
    end: int

    @property
    def dur(self) -> int:
        return self.end - self.start


@dataclass
class Attribution:
    """Per-activity attribution (``kernels``: the timeline's kernel table plus columns below).

    Added columns: ``step`` (index into ``steps``, -1: outside every step), ``launch_start``,
    ``launch_tid``, ``op`` (cpu row of the launching op, -1), ``root`` (its top-level op, -1),
    ``fwd_root`` (forward top-level op: ``root`` itself for forward work, the differentiated
    op for backward work, -1 when unknown), ``phase`` ("fwd", "bwd", "opt", "none"),
    ``module`` and ``region`` (innermost module / named-region annotation of the forward op).
    """

    steps: list[Step]
    step_source: str
    kernels: pd.DataFrame
    cpu_parent: np.ndarray
    cpu_root: np.ndarray
    cpu_children_of_root: dict[int, list[int]]
    cpu_module: np.ndarray  # innermost module annotation of each cpu row (None)
    cpu_region: np.ndarray  # innermost named-region annotation of each cpu row (None)
    carried_over_ns: int
    warnings: list[str] = field(default_factory=list)

    def in_steps(self) -> pd.DataFrame:
        return self.kernels[self.kernels["step"] >= 0]


def _framing(cpu: pd.DataFrame) -> np.ndarray:
    # Matched once per distinct name: a trace has millions of rows but few names.
    names = cpu["name"]
    hits = [n for n in pd.unique(names) if _FRAMING.match(str(n))]
    return names.isin(hits).to_numpy(dtype=bool)


def annotation_mask(cpu: pd.DataFrame) -> np.ndarray:
    """Rows that are ranges around work (annotations), whatever category the trace gave them."""
    cat = cpu["cat"].to_numpy()
    return (cat == "user_annotation") | ((cat == "cpu_op") & _framing(cpu))


def op_mask(cpu: pd.DataFrame) -> np.ndarray:
    """Rows that are ops (aten, autograd, custom ops): cpu_op rows that are not framing ranges."""
    return (cpu["cat"].to_numpy() == "cpu_op") & ~_framing(cpu)


def is_step_range(name: str) -> bool:
    """A range that marks a step (ProfilerStep#N, kerneltriage.step): never an op or a cause."""
    return bool(PROFILER_STEP.match(name)) or name == STEP_RANGE


def find_steps(tl: Timeline, marker: str | None = None) -> tuple[list[Step], str, list[str]]:
    """The active steps: ProfilerStep#N, else optimizer steps, else kerneltriage.step ranges,
    else the whole trace (``marker``, a regex on annotation names, overrides all of these)."""
    warnings: list[str] = []
    ann = tl.cpu[annotation_mask(tl.cpu)]
    names = ann["name"].astype(str)

    def ranges(mask: pd.Series, source: str) -> tuple[list[Step], str, list[str]] | None:
        rows = ann[mask.to_numpy()]
        unfinished = rows[~rows["finished"]]
        if len(unfinished):
            warnings.append(
                f"{len(unfinished)} {source} range(s) still open when the profiler stopped; not counted as steps"
            )
        rows = rows[rows["finished"]].drop_duplicates(subset=["name", "start"]).sort_values("start")
        if rows.empty:
            return None
        steps = [
            Step(i, str(r.name), int(r.start), int(r.start + r.dur)) for i, r in enumerate(rows.itertuples())
        ]
        return _drop_stubs(tl, steps, source, warnings), source, warnings

    if marker:
        pattern = step_marker_pattern(marker)
        found = ranges(names.map(lambda n: bool(pattern.search(n))), f"--step-marker {marker}")
        if found:
            return found
        warnings.append(f"no annotation matches --step-marker {marker!r}")
    found = ranges(names.str.match(PROFILER_STEP), "ProfilerStep")
    if found:
        return found
    opt_all = ann[names.str.match(_OPTIMIZER_STEP).to_numpy()]
    opt = opt_all[opt_all["finished"].to_numpy()].sort_values("start")
    if len(opt) < len(opt_all):
        warnings.append(
            f"{len(opt_all) - len(opt)} optimizer step range(s) still open when the profiler stopped; not used"
        )
    if len(opt) >= 2:
        ends = (opt["start"] + opt["dur"]).to_numpy()
        steps = [Step(i, f"step {i}", int(a), int(b)) for i, (a, b) in enumerate(itertools.pairwise(ends))]
        return _drop_stubs(tl, steps, "optimizer steps", warnings), "optimizer steps", warnings
    found = ranges(names == STEP_RANGE, STEP_RANGE)
    if found:
        return found
    start, end = _extent(tl)
    warnings.append(
        "no step annotations (ProfilerStep, optimizer step, kerneltriage.step): the whole trace is one step"
    )
    return [Step(0, "whole trace", start, end)], "whole trace", warnings


def step_marker_pattern(marker: object) -> Pattern:
    """``--step-marker`` compiled for linear-time matching (RE2), or one ``InputError``."""
    from kerneltriage.errors import InputError

    if not isinstance(marker, str):
        raise InputError(f"--step-marker must be a regular expression (a string), got {marker!r}")
    try:
        re.compile(marker)
    except re.error as exc:
        raise InputError(f"--step-marker {marker!r} is not a valid regular expression ({exc})") from None
    return compile_user_pattern(marker, "--step-marker")


def _drop_stubs(tl: Timeline, steps: list[Step], source: str, warnings: list[str]) -> list[Step]:
    """Steps under ``STUB_FRACTION`` of the median step, dropped with a warning: a ProfilerStep
    the profiler opened just before it stopped holds no step's work, and averaging it in would
    halve the step time."""
    if len(steps) < 2:
        return steps
    median = float(np.median([s.dur for s in steps]))
    keep = [s for s in steps if s.dur >= STUB_FRACTION * median]
    stubs = [s for s in steps if s.dur < STUB_FRACTION * median]
    if not stubs:
        return steps
    # Kernels launched inside a stub fall outside every step: say how many.
    rt = tl.runtime
    launched = 0
    if len(rt) and len(tl.kernels):
        starts = rt["start"].to_numpy()
        inside = np.zeros(len(rt), dtype=bool)
        for s in stubs:
            inside |= (starts >= s.start) & (starts < s.end)
        launched = int(tl.kernels["correlation"].isin(rt.loc[inside, "correlation"]).sum())
    listed = ", ".join(f"{s.name} ({s.dur / 1e3:.0f} µs)" for s in stubs[:3])
    more = f" and {len(stubs) - 3} more" if len(stubs) > 3 else ""
    warnings.append(
        f"{len(stubs)} {source} range(s) shorter than {STUB_FRACTION:g} of the median step "
        f"({median / 1e6:.2f} ms) dropped as stubs: {listed}{more}"
        + (f"; the {launched} GPU activities launched in them are left out" if launched else "")
    )
    return [Step(i, s.name, s.start, s.end) for i, s in enumerate(keep)]


def _extent(tl: Timeline) -> tuple[int, int]:
    starts, ends = [], []
    for table in (tl.cpu, tl.kernels, tl.runtime):
        if len(table):
            starts.append(int(table["start"].min()))
            ends.append(int((table["start"] + table["dur"]).max()))
    return (min(starts), max(ends)) if starts else (0, 0)


def _nest(cpu: pd.DataFrame) -> tuple[np.ndarray, list[int]]:
    """Parent row of every cpu row on its thread (-1: top level), by interval containment,
    and an order of the rows in which every parent comes before its children."""
    n = len(cpu)
    parent = np.full(n, -1, dtype=np.int64)
    if n == 0:
        return parent, []
    order = np.lexsort(
        (-cpu["dur"].to_numpy(), cpu["start"].to_numpy(), cpu["tid"].to_numpy(), cpu["pid"].to_numpy())
    )
    start = cpu["start"].to_numpy()
    end = start + cpu["dur"].to_numpy()
    pid = cpu["pid"].to_numpy()
    tid = cpu["tid"].to_numpy()
    stack: list[int] = []
    last_thread = None
    order_list = order.tolist()
    for i in order_list:
        thread = (pid[i], tid[i])
        if thread != last_thread:
            stack.clear()
            last_thread = thread
        s, e = start[i], end[i]
        # Pop ranges that ended before this one starts, and ranges this one outlasts: such
        # partial overlaps happen between annotations (ProfilerStep#N+1 starts inside the
        # optimizer step whose hook started it). A child may end a little after its parent
        # from timestamp rounding, hence the tolerance.
        while stack and (end[stack[-1]] <= s or e > end[stack[-1]] + _NEST_TOLERANCE_NS):
            stack.pop()
        if stack:
            parent[i] = stack[-1]
        stack.append(i)
    # Sorted by start, longest first: a parent always precedes its children.
    return parent, order_list


def attribute(tl: Timeline, marker: str | None = None) -> Attribution:
    steps, source, warnings = find_steps(tl, marker)
    cpu = tl.cpu
    n = len(cpu)
    parent, order = _nest(cpu)
    names = cpu["name"].astype(str).to_numpy()
    is_op = op_mask(cpu)
    seqs = cpu["seq"].to_numpy()

    root = np.full(n, -1, dtype=np.int64)
    module = np.full(n, None, dtype=object)
    region = np.full(n, None, dtype=object)
    optimizer = np.zeros(n, dtype=bool)
    for i in order:
        p = parent[i]
        if p >= 0:
            root[i] = root[p] if root[p] >= 0 else (i if is_op[i] else -1)
            module[i], region[i], optimizer[i] = module[p], region[p], optimizer[p]
        elif is_op[i]:
            root[i] = i
        if not is_op[i]:
            name = names[i]
            if name.startswith(MODULE_PREFIX):
                module[i] = name[len(MODULE_PREFIX) :]
            elif name.startswith(REGION_PREFIX):
                region[i] = name[len(REGION_PREFIX) :]
            elif _OPTIMIZER.match(name):
                optimizer[i] = True
            # Other annotations (DistributedDataParallel.forward, FSDP ranges, a user's own
            # record_function) frame work but are not fusion candidates: only explicit
            # kerneltriage.region ranges group ops into one candidate.

    children: dict[int, list[int]] = {}
    for i in np.flatnonzero(root >= 0).tolist():
        children.setdefault(int(root[i]), []).append(i)

    # Backward top-level op → forward top-level op, through the autograd sequence number.
    is_bwd_root = (
        is_op
        & (root == np.arange(n))
        & cpu["name"].astype(str).str.match(_BACKWARD_ROOT).to_numpy(dtype=bool)
    )
    fwd_by_seq: dict[int, list[int]] = {}
    for i in np.flatnonzero(is_op & (seqs >= 0)).tolist():
        r = root[i]
        if r >= 0 and not is_bwd_root[r]:
            fwd_by_seq.setdefault(int(seqs[i]), []).append(i)
    starts = cpu["start"].to_numpy()
    fwd_of = np.full(n, -1, dtype=np.int64)
    for r in np.flatnonzero(is_bwd_root).tolist():
        seq = seqs[r]
        if seq < 0:
            seq = next((seqs[c] for c in children.get(r, []) if seqs[c] >= 0), -1)
        candidates = fwd_by_seq.get(int(seq), [])
        before = [c for c in candidates if starts[c] <= starts[r]]
        if before:
            fwd_of[r] = root[max(before, key=lambda c: starts[c])]

    kernels = _join_launches(tl, cpu, parent, root, fwd_of, is_bwd_root, optimizer, module, region, steps)
    carried = kernels[(kernels["launch_start"] < 0)]
    carried_ns = 0
    if len(carried):
        first_launched = kernels.loc[kernels["launch_start"] >= 0, "start"].min()
        early = carried[carried["start"] < first_launched] if pd.notna(first_launched) else carried
        carried_ns = int(early["dur"].sum())
        if len(early):
            # Counted by launch they belong to an earlier, unrecorded step; but the GPU is busy
            # while they run, so idle.py counts them as busy time of the step they run in.
            inside = _inside_windows(early, step_windows(steps, kernels))
            busy, rest = early[inside], early[~inside]
            parts = []
            if len(busy):
                parts.append(
                    f"{len(busy)} ({busy['dur'].sum() / 1e6:.1f} ms) run inside the steps: the GPU is busy "
                    "then, so they count as busy time, not idle, but belong to no candidate"
                )
            if len(rest):
                parts.append(
                    f"{len(rest)} ({rest['dur'].sum() / 1e6:.1f} ms) run outside every step and are left out"
                )
            warnings.append(
                f"{len(early)} GPU activities ({carried_ns / 1e6:.1f} ms) were launched before the profiled "
                "window (their launch is not in the trace): " + "; ".join(parts)
            )
    return Attribution(
        steps=steps,
        step_source=source,
        kernels=kernels,
        cpu_parent=parent,
        cpu_root=root,
        cpu_children_of_root=children,
        cpu_module=module,
        cpu_region=region,
        carried_over_ns=carried_ns,
        warnings=warnings,
    )


def step_windows(steps: list[Step], kernels: pd.DataFrame) -> list[tuple[int, int]]:
    """Each step's wall as an interval (ns): its CPU range, or its GPU period when that is
    longer (from its first kernel to the next step's first kernel; the last step: to its last
    kernel's end). The lengths are ``triage.step_walls``; kernels count by launch (``step``)."""
    k = kernels[kernels["step"] >= 0]
    first = k.groupby("step")["start"].min().to_dict()
    last = (k["start"] + k["dur"]).groupby(k["step"]).max().to_dict()
    out = []
    for i, s in enumerate(steps):
        if s.index not in first:
            out.append((s.start, s.end))
            continue
        nxt = steps[i + 1].index if i + 1 < len(steps) else None
        end = first[nxt] if nxt is not None and nxt in first else last[s.index]
        period = int(end - first[s.index])
        out.append((s.start, s.end) if s.dur >= period else (int(first[s.index]), int(end)))
    return out


def _inside_windows(k: pd.DataFrame, windows: list[tuple[int, int]]) -> np.ndarray:
    """Activities that overlap any of the windows."""
    start = k["start"].to_numpy()
    end = start + k["dur"].to_numpy()
    inside = np.zeros(len(k), dtype=bool)
    for a, b in windows:
        inside |= (start < b) & (end > a)
    return inside


def _join_launches(
    tl, cpu, parent, root, fwd_of, is_bwd_root, optimizer, module, region, steps
) -> pd.DataFrame:
    k = tl.kernels.copy()
    rt = tl.runtime.drop_duplicates(subset=["correlation"], keep="first")
    rt = rt[rt["correlation"] >= 0].set_index("correlation")
    launch = rt.reindex(k["correlation"].to_numpy())
    k["launch_start"] = launch["start"].fillna(-1).astype("int64").to_numpy()
    k["launch_tid"] = launch["tid"].fillna(-1).astype("int64").to_numpy()
    ext = launch["ext_id"].fillna(-1).astype("int64").to_numpy()

    # External id → cpu op row (ops only: annotations share the id space).
    ops = cpu[op_mask(cpu)]
    by_ext = pd.Series(ops.index.to_numpy(), index=ops["ext_id"].to_numpy())
    by_ext = by_ext[~by_ext.index.duplicated(keep="first")]
    op = by_ext.reindex(ext).fillna(-1).astype("int64").to_numpy().copy()
    op[ext < 0] = -1
    missing = np.flatnonzero((op < 0) & (k["launch_start"].to_numpy() >= 0))
    if len(missing):
        op[missing] = _innermost_at(
            cpu, parent, k["launch_tid"].to_numpy()[missing], k["launch_start"].to_numpy()[missing]
        )

    k["op"] = op
    has_op = op >= 0
    # Index only where there is something to index: a timeline may have no cpu rows at all
    # (an Nsight Systems export without NVTX ranges).
    r = np.full(len(k), -1, dtype=np.int64)
    r[has_op] = root[op[has_op]]
    k["root"] = r
    bwd = np.zeros(len(k), dtype=bool)
    bwd[r >= 0] = is_bwd_root[r[r >= 0]]
    fwd_root = r.copy()
    fwd_root[bwd] = fwd_of[r[bwd]]
    k["fwd_root"] = fwd_root
    opt = np.zeros(len(k), dtype=bool)
    opt[has_op] = optimizer[op[has_op]]
    k["phase"] = np.where(opt, "opt", np.where(bwd, "bwd", np.where(has_op, "fwd", "none")))
    # Module / region of the forward op (backward work inherits its forward op's place).
    anchor = np.where(fwd_root >= 0, fwd_root, op)
    k["module"] = [module[a] if a >= 0 else None for a in anchor.tolist()]
    k["region"] = [region[a] if a >= 0 else None for a in anchor.tolist()]
    # For ops launched inside annotations but outside any cpu op (Triton kernels called from
    # Python), the annotation still names the region.
    if (~has_op).any() and len(cpu):
        inner = _innermost_at(
            cpu, parent, k["launch_tid"].to_numpy(), k["launch_start"].to_numpy(), ops_only=False
        )
        for i in np.flatnonzero(~has_op & (inner >= 0)).tolist():
            a = inner[i]
            k.at[k.index[i], "module"] = module[a]
            k.at[k.index[i], "region"] = region[a]
            if optimizer[a]:
                k.at[k.index[i], "phase"] = "opt"

    step_idx = np.full(len(k), -1, dtype=np.int64)
    ls = k["launch_start"].to_numpy()
    for s in steps:
        step_idx[(ls >= s.start) & (ls < s.end)] = s.index
    k["step"] = step_idx
    return k.reset_index(drop=True)


def _innermost_at(
    cpu: pd.DataFrame, parent: np.ndarray, tids: np.ndarray, times: np.ndarray, ops_only: bool = True
) -> np.ndarray:
    """For each (thread, time): the innermost cpu row on that thread holding the time (-1).

    The latest row starting at or before ``t`` holds ``t`` unless it already ended; then the
    innermost holder is its nearest ancestor that still holds ``t`` (rows nest per thread).
    """
    out = np.full(len(times), -1, dtype=np.int64)
    if len(cpu) == 0 or len(times) == 0:
        return out
    start = cpu["start"].to_numpy()
    end = start + cpu["dur"].to_numpy()
    is_op = op_mask(cpu)
    tid_all = cpu["tid"].to_numpy()
    for tid in np.unique(tids):
        rows = np.flatnonzero(tid_all == tid)
        if len(rows) == 0:
            continue
        rows = rows[np.argsort(start[rows], kind="stable")]
        want = np.flatnonzero((tids == tid) & (times >= 0))
        pos = np.searchsorted(start[rows], times[want], side="right") - 1
        for j, p in zip(want.tolist(), pos.tolist()):
            if p < 0:
                continue
            t = times[j]
            r = int(rows[p])
            while r >= 0 and (end[r] < t or (ops_only and not is_op[r])):
                r = int(parent[r])
            out[j] = r
    return out
