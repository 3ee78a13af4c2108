"""Attribution: every GPU activity → the step it belongs to → the op that launched it → its
top-level op → (for backward kernels) the forward op it differentiates → a module or region.

The chain, with the trace fields it uses:

- kernel ``correlation`` = runtime call ``correlation`` (cudaLaunchKernel, cuLaunchKernelEx …);
- runtime call ``External id`` = the launching cpu op's ``External id`` (else: the innermost
  cpu op on the calling thread whose interval holds the call);
- cpu ops nest by time on each thread (``cpu_tree.py``): the outermost cpu op is the *top-level* op
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
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from kerneltriage.analysis.timeline.cpu_tree import forward_of, innermost_at, levels, nest
from kerneltriage.annotate import MODULE_PREFIX, REGION_PREFIX, STEP_RANGE
from kerneltriage.ingest.tables import TEXT, Timeline
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
_PHASES = np.array(["opt", "bwd", "fwd", "none"], dtype=object)
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
    cpu_module: np.ndarray  # innermost module annotation of each cpu row (None)
    cpu_region: np.ndarray  # innermost named-region annotation of each cpu row (None)
    carried_over_ns: int
    warnings: list[str] = field(default_factory=list)
    # Read once per report by every later step (a 1 GB trace has over a million cpu rows):
    cpu_names: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=object))
    cpu_name_codes: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.intp))  # of the names
    cpu_name_uniques: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=object))
    cpu_is_op: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool))
    cpu_is_annotation: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool))
    windows: list[tuple[int, int]] = field(default_factory=list)  # ``step_windows``
    kernel_name_codes: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.intp))
    kernel_name_uniques: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=object))

    def in_steps(self) -> pd.DataFrame:
        return self.kernels[self.kernels["step"] >= 0]

    def cpu_name_mask(self, test: Callable[[str], Any]) -> np.ndarray:
        """``name_mask`` of the cpu rows' names."""
        return _mask_of(self.cpu_name_codes, self.cpu_name_uniques, test)

    def kernel_name_mask(self, test: Callable[[str], Any]) -> np.ndarray:
        """``name_mask`` of the kernels' names."""
        return _mask_of(self.kernel_name_codes, self.kernel_name_uniques, test)


def name_mask(names: pd.Series | np.ndarray, test: Callable[[str], Any]) -> np.ndarray:
    """``test`` of every name as a boolean array, run once per distinct name (a trace has
    millions of rows but few names); a missing name is False."""
    return _mask_of(*factorize_text(names), test)


def factorize_text(values: pd.Series | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(codes, distinct values) of a text column, in order of first appearance; -1 for a missing
    value. A dict of the strings themselves: their hashes are cached and a table's rows share
    one string per value, where pandas' string hash table re-hashes every (long) kernel name."""
    ids: dict[str, int] = {}
    values = values.to_numpy() if isinstance(values, pd.Series) else values
    codes = np.fromiter(
        (ids.setdefault(v, len(ids)) if v.__class__ is str else -1 for v in values), np.intp, len(values)
    )
    return codes, np.array(list(ids), dtype=object)


def _mask_of(codes: np.ndarray, uniques: Any, test: Callable[[str], Any]) -> np.ndarray:
    hits = np.fromiter((bool(test(u)) for u in uniques), dtype=bool, count=len(uniques))
    return np.append(hits, False)[codes]


def _framing(cpu: pd.DataFrame) -> np.ndarray:
    return name_mask(cpu["name"], lambda n: _FRAMING.match(str(n)))


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


def find_steps(
    tl: Timeline, marker: str | None = None, annotations: np.ndarray | None = None
) -> tuple[list[Step], str, list[str]]:
    """The active steps: ProfilerStep#N, else optimizer steps, else kerneltriage.step ranges,
    else the whole trace (``marker``, a regex on annotation names, overrides all of these).
    ``annotations``: ``annotation_mask`` of the cpu table, when known already."""
    warnings: list[str] = []
    ann = tl.cpu[annotation_mask(tl.cpu) if annotations is None else annotations]
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


def _own_places(uniques: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """What an annotation names itself, per distinct name (and -1, no name): its module,
    region and optimizer range; the caller reads it for annotation rows only."""
    module = np.full(len(uniques) + 1, None, dtype=object)
    region = np.full(len(uniques) + 1, None, dtype=object)
    optimizer = np.zeros(len(uniques) + 1, dtype=bool)
    for j, name in enumerate(uniques):
        if not isinstance(name, str):
            continue
        if name.startswith(MODULE_PREFIX):
            module[j] = name[len(MODULE_PREFIX) :]
        elif name.startswith(REGION_PREFIX):
            region[j] = name[len(REGION_PREFIX) :]
        elif _OPTIMIZER.match(name):
            optimizer[j] = True
        # Other annotations (DistributedDataParallel.forward, FSDP ranges, a user's own
        # record_function) frame work but are not fusion candidates: only explicit
        # kerneltriage.region ranges group ops into one candidate.
    return module, region, optimizer


def attribute(tl: Timeline, marker: str | None = None) -> Attribution:
    cpu = tl.cpu
    n = len(cpu)
    codes, uniques = factorize_text(cpu["name"])
    # One string object per distinct name, shared by its rows (a missing name is NaN).
    names = np.append(uniques, np.nan)[codes]
    framing = _mask_of(codes, uniques, lambda x: _FRAMING.match(str(x)))
    cats = factorize_text(cpu["cat"])
    cpu_op = _mask_of(*cats, lambda c: c == "cpu_op")
    is_op = cpu_op & ~framing
    is_annotation = _mask_of(*cats, lambda c: c == "user_annotation") | (cpu_op & framing)
    steps, source, warnings = find_steps(tl, marker, is_annotation)
    parent, depth = nest(cpu)
    seqs = cpu["seq"].to_numpy()

    # Each row inherits its parent's top-level op, module, region and optimizer range (level
    # by level, outermost first); an annotation then names its own module or region.
    root = np.full(n, -1, dtype=np.int64)
    module = np.full(n, None, dtype=object)
    region = np.full(n, None, dtype=object)
    optimizer = np.zeros(n, dtype=bool)
    own_module, own_region, own_optimizer = _own_places(uniques)
    # Only what some annotation names (most traces name no module or region).
    places = [
        (into, values, pd.notna(values)) for into, values in ((module, own_module), (region, own_region))
    ]
    places = [place for place in places if place[2].any()]
    optimizers = bool(own_optimizer.any())
    for rows in levels(depth):
        own_root = np.where(is_op[rows], rows, -1)
        p = parent[rows]
        below = bool(p.size and p[0] >= 0)  # a level below the top: every row has a parent
        if below:
            inherited = root[p]
            root[rows] = np.where(inherited >= 0, inherited, own_root)
        else:
            root[rows] = own_root
        named = rows[~is_op[rows]]
        c = codes[named]
        for into, values, has in places:
            if below:
                into[rows] = into[p]
            hit = has[c]
            into[named[hit]] = values[c[hit]]
        if optimizers:
            if below:
                optimizer[rows] = optimizer[p]
            optimizer[named[own_optimizer[c]]] = True

    is_bwd_root = (
        is_op & (root == np.arange(n)) & _mask_of(codes, uniques, lambda x: _BACKWARD_ROOT.match(str(x)))
    )
    fwd_of = forward_of(root, is_op, is_bwd_root, seqs, cpu["start"].to_numpy())

    kernels = _join_launches(tl, is_op, parent, root, fwd_of, is_bwd_root, optimizer, module, region, steps)
    windows = step_windows(steps, kernels)
    kernel_codes, kernel_names = factorize_text(kernels["name"])
    carried = kernels[(kernels["launch_start"] < 0)]
    carried_ns = 0
    if len(carried):
        first_launched = kernels.loc[kernels["launch_start"] >= 0, "start"].min()
        early = carried[carried["start"] < first_launched] if pd.notna(first_launched) else carried
        carried_ns = int(early["dur"].sum())
        if len(early):
            # Counted by launch they belong to an earlier, unrecorded step; but the GPU is busy
            # while they run, so idle.py counts them as busy time of the step they run in.
            inside = _inside_windows(early, windows)
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
        cpu_module=module,
        cpu_region=region,
        carried_over_ns=carried_ns,
        warnings=warnings,
        cpu_names=names,
        cpu_name_codes=codes,
        cpu_name_uniques=uniques,
        cpu_is_op=is_op,
        cpu_is_annotation=is_annotation,
        windows=windows,
        kernel_name_codes=kernel_codes,
        kernel_name_uniques=kernel_names,
    )


def step_windows(steps: list[Step], kernels: pd.DataFrame) -> list[tuple[int, int]]:
    """Each step's wall as an interval (ns): its CPU range, or its GPU period when that is
    longer (from its first kernel to the next step's first kernel; the last step: to its last
    kernel's end). The lengths are ``triage.step_walls``; kernels count by launch (``step``)."""
    step = kernels["step"].to_numpy()
    held = step >= 0
    start = pd.Series(kernels["start"].to_numpy()[held])
    by_step = step[held]
    first = start.groupby(by_step).min().to_dict()
    last = (start + kernels["dur"].to_numpy()[held]).groupby(by_step).max().to_dict()
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
    tl, is_op, parent, root, fwd_of, is_bwd_root, optimizer, module, region, steps
) -> pd.DataFrame:
    cpu = tl.cpu
    k = tl.kernels.copy(deep=False)  # the columns added below are the attribution's own
    rt = tl.runtime[["correlation", "start", "tid", "ext_id"]].drop_duplicates(
        subset=["correlation"], keep="first"
    )
    rt = rt[rt["correlation"] >= 0].set_index("correlation")
    launch = rt.reindex(k["correlation"].to_numpy())
    launch_start = launch["start"].fillna(-1).astype("int64").to_numpy()
    launch_tid = launch["tid"].fillna(-1).astype("int64").to_numpy()
    k["launch_start"] = launch_start
    k["launch_tid"] = launch_tid
    ext = launch["ext_id"].fillna(-1).astype("int64").to_numpy()

    # External id → cpu op row (ops only: annotations share the id space).
    # (the first op of an id, in row order, when several share it)
    op_rows = np.flatnonzero(is_op)
    ids, first = np.unique(cpu["ext_id"].to_numpy()[op_rows], return_index=True)
    at = np.minimum(np.searchsorted(ids, ext), max(len(ids) - 1, 0))
    found = (ext >= 0) & (ids[at] == ext) if len(ids) else np.zeros(len(ext), dtype=bool)
    op = np.where(found, op_rows[first[at]] if len(ids) else -1, -1).astype(np.int64)
    missing = np.flatnonzero((op < 0) & (launch_start >= 0))
    if len(missing):
        op[missing] = innermost_at(cpu, is_op, parent, launch_tid[missing], launch_start[missing])

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
    phase = np.where(opt, 0, np.where(bwd, 1, np.where(has_op, 2, 3)))
    k["phase"] = pd.array(_PHASES[phase], dtype=TEXT)
    # Module / region of the forward op (backward work inherits its forward op's place).
    anchor = np.where(fwd_root >= 0, fwd_root, op)
    placed = anchor >= 0
    for column, of in (("module", module), ("region", region)):
        values = np.full(len(k), None, dtype=object)
        values[placed] = of[anchor[placed]]
        k[column] = values.tolist()
    # For ops launched inside annotations but outside any cpu op (Triton kernels called from
    # Python), the annotation still names the region.
    bare = np.flatnonzero(~has_op)
    if len(bare) and len(cpu):
        inner = innermost_at(cpu, is_op, parent, launch_tid[bare], launch_start[bare], ops_only=False)
        bare, inner = bare[inner >= 0], inner[inner >= 0]
        if len(bare):
            columns = k.columns.get_indexer(["module", "region", "phase"])
            k.iloc[bare, columns[0]] = module[inner]
            k.iloc[bare, columns[1]] = region[inner]
            in_optimizer = optimizer[inner]
            if in_optimizer.any():
                k.iloc[bare[in_optimizer], columns[2]] = "opt"
    k["step"] = _step_of(launch_start, steps)
    return k.reset_index(drop=True)


def _step_of(launch_start: np.ndarray, steps: list[Step]) -> np.ndarray:
    """The step each launch time lies in (-1: none); where steps overlap, the later one."""
    out = np.full(len(launch_start), -1, dtype=np.int64)
    if not steps:
        return out
    starts = np.array([s.start for s in steps], dtype=np.int64)
    ends = np.array([s.end for s in steps], dtype=np.int64)
    if (np.diff(starts) >= 0).all() and (np.diff(ends) >= 0).all():
        # In order: only the last step starting at or before a launch can hold it.
        at = np.searchsorted(starts, launch_start, side="right") - 1
        held = (at >= 0) & (launch_start < ends[np.maximum(at, 0)])
        out[held] = np.array([s.index for s in steps], dtype=np.int64)[at[held]]
        return out
    for s in steps:
        out[(launch_start >= s.start) & (launch_start < s.end)] = s.index
    return out
