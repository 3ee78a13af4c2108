"""Exposed communication: what each step's collectives leave uncovered by compute, the DDP
bucket whose all-reduce ends the step, and the settings offered where communication is exposed.

- **The step's collectives** are those its ``ProfilerStep`` range launched (the kernel's
  launch, through its correlation id); a trace without launches assigns them by their start on
  the GPU. The GPU runs behind the host, so a step's GPU window holds the previous step's last
  collectives: only the launch says which step a collective belongs to.
- **The last collective** of a DDP step is the all-reduce of its last bucket, the gradients the
  backward computes last (the first layers' and the embedding's). Its size is the recorded input
  of the op that launched it (``record_param_comms`` or ``c10d::allreduce_``: the bucket's flat
  tensor), its element size the NCCL kernel's data type; which parameters it holds is read from
  the modules' parameter sizes in forward order (``regions.jsonl``), as DDP fills its buckets in
  the order the backward makes the gradients ready.
- **The settings**: DDP's ``gradient_as_bucket_view`` / ``static_graph`` / ``bucket_cap_mb`` on the
  all-reduce; on an FSDP job (its ``FSDP::`` or ``FullyShardedDataParallel.`` ranges) whose
  all-gathers and reduce-scatters are exposed, FSDP2's explicit prefetch (with keeping the last
  layer gathered as the alternative) or FSDP1's constructor settings, on the all-gather. Each is
  offered where the exposed time, less the wait for other ranks, is ``min_share`` of the step.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from kerneltriage.analysis.model import Candidate, Report
from kerneltriage.ingest.tables import Timeline

COMMUNICATION = "communication"  # the kind the rules give collectives
#: What ``communication_fix`` names as the built-in: DistributedDataParallel's own settings.
DDP_BUILTIN = "torch.nn.parallel.DistributedDataParallel(gradient_as_bucket_view=True, static_graph=True)"
#: FSDP2's (``fully_shard``) and FSDP1's settings, the built-ins of an exposed all-gather.
FSDP2_BUILTIN = "torch.distributed.fsdp.fully_shard: FSDPModule.set_modules_to_forward_prefetch / set_reshard_after_forward"
FSDP1_BUILTIN = "torch.distributed.fsdp.FullyShardedDataParallel(forward_prefetch=True)"
#: The data-parallel wrapper a trace's ranges name: FSDP2 records ``FSDP::pre_forward (layers.0)``
#: and the like, FSDP1 ``FullyShardedDataParallel._pre_forward``, DDP
#: ``DistributedDataParallel.forward``.
FULLY_SHARD, FSDP1, DDP = "fully_shard", "FullyShardedDataParallel", "DistributedDataParallel"

_KINDS = (
    ("all-reduce", re.compile(r"all_?reduce", re.IGNORECASE)),
    ("all-gather", re.compile(r"all_?gather", re.IGNORECASE)),
    ("reduce-scatter", re.compile(r"reduce_?scatter", re.IGNORECASE)),
)
FSDP_COLLECTIVES = ("all-gather", "reduce-scatter")
_REDUCTIONS = ("all-reduce", "reduce-scatter")
#: NCCL kernels name their data type as one token (``…_Sum_f32_RING_LL``, ``…_Sum_float(…)``).
_DTYPES: dict[str, tuple[str, int]] = {
    **dict.fromkeys(("f32", "float", "float32"), ("float32", 4)),
    **dict.fromkeys(("bf16", "bfloat16"), ("bfloat16", 2)),
    **dict.fromkeys(("f16", "half", "float16"), ("float16", 2)),
    **dict.fromkeys(("f64", "double", "float64"), ("float64", 8)),
    **dict.fromkeys(("i64", "u64", "int64", "uint64"), ("int64", 8)),
    **dict.fromkeys(("i32", "u32", "int32", "uint32"), ("int32", 4)),
    **dict.fromkeys(("i8", "u8", "int8", "uint8"), ("int8", 1)),
}
#: A module whose parameters fill this share of the last bucket or more is named as what keeps
#: it from being split.
DOMINANT = 0.5
MIB = 1 << 20  # DDP's bucket_cap_mb counts MiB


def collective_kind(name: str) -> str:
    """``all-reduce``, ``all-gather``, ``reduce-scatter`` or ``other`` (send/recv, all-to-all,
    broadcast), from a kernel's or an op's name."""
    for kind, pattern in _KINDS:
        if pattern.search(name):
            return kind
    return "other"


def kernel_dtype(name: str) -> tuple[str, int] | None:
    """(dtype, bytes) an NCCL kernel's name gives, or None."""
    for token in re.split(r"[_(]", name.partition("(")[0]):
        if token.lower() in _DTYPES:
            return _DTYPES[token.lower()]
    return None


def data_parallel(timeline: Timeline) -> str | None:
    """``fully_shard`` (FSDP2), ``FullyShardedDataParallel`` (FSDP1) or
    ``DistributedDataParallel`` when the trace's ranges name one (FSDP first), else None."""
    if timeline.cpu.empty:
        return None
    names = timeline.cpu["name"].astype(str)
    for prefix, wrapper in (
        ("FullyShardedDataParallel.", FSDP1),
        ("FSDP::", FULLY_SHARD),
        ("DistributedDataParallel.", DDP),
    ):
        if names.str.startswith(prefix).any():
            return wrapper
    return None


# --- each step's collectives ---------------------------------------------------------------


def last_collective(timeline: Timeline, is_comm: Callable[[str], bool]) -> dict[str, Any] | None:
    """Each step's last collective and its exposed time (not overlapped by any compute kernel),
    averaged over the ``ProfilerStep#`` steps: in DDP the last bucket's all-reduce, with its
    size where the trace records it (``elements``, ``dtype``, ``bytes``). Beside it, each
    collective kind's exposed time per step (``exposed_ms_by_collective``) and the data-parallel
    wrapper the trace names (``data_parallel``), which the fixes read. None without step ranges or
    collectives."""
    from kerneltriage.analysis.timeline.idle import union

    cpu, k = timeline.cpu, timeline.kernels
    if cpu.empty or k.empty:
        return None
    steps = cpu[cpu["name"].astype(str).str.startswith("ProfilerStep#")]
    k = k[k["kind"] == "kernel"]
    names = k["name"].astype(str)
    comm = names.map(is_comm).to_numpy(dtype=bool)
    if steps.empty or not comm.any():
        return None
    starts = k["start"].to_numpy().astype(np.int64)
    ends = starts + k["dur"].to_numpy().astype(np.int64)
    covered = _coverage(union(starts[~comm], ends[~comm]))
    c_starts, c_ends = starts[comm], ends[comm]
    c_names = names.to_numpy()[comm]
    launches = _launches(timeline, k["correlation"].to_numpy()[comm])
    ops = _collective_ops(timeline, launches)
    kinds = np.array([_kind(str(n), op) for n, op in zip(c_names, ops)])
    by_launch = bool((launches["start"] >= 0).any())
    when = launches["start"] if by_launch else c_starts
    order = np.argsort(steps["start"].to_numpy(), kind="stable")
    lo_all = steps["start"].to_numpy().astype(np.int64)[order]
    hi_own = lo_all + steps["dur"].to_numpy().astype(np.int64)[order]
    exposed, counts, lasts = [], [], []
    by_kind: dict[str, float] = {}
    for i, lo in enumerate(lo_all):
        # By launch, a step's own range bounds it; by GPU start, the next step's start does.
        hi = hi_own[i] if by_launch else (lo_all[i + 1] if i + 1 < len(lo_all) else np.iinfo(np.int64).max)
        inside = (when >= lo) & (when < hi)
        if not inside.any():
            continue
        last = int(np.argmax(np.where(inside, when, -1)))
        s, e = int(c_starts[last]), int(c_ends[last])
        exposed.append(e - s - covered(s, e))
        counts.append(int(inside.sum()))
        lasts.append(last)
        for kind in set(kinds[inside].tolist()):
            mine = inside & (kinds == kind)
            spans = union(c_starts[mine], c_ends[mine])
            by_kind[kind] = by_kind.get(kind, 0.0) + sum(b - a - covered(a, b) for a, b in spans)
    if not exposed:
        return None
    n = len(exposed)
    out: dict[str, Any] = {
        "exposed_ms": float(np.mean(exposed)) / 1e6,
        "collectives_per_step": int(np.median(counts)),
        "collective": str(kinds[lasts[-1]]),
        **_message(timeline, [(int(launches["ext"][i]), ops[i], str(c_names[i])) for i in lasts]),
        "exposed_ms_by_collective": {kind: by_kind[kind] / n / 1e6 for kind in sorted(by_kind)},
    }
    wrapper = data_parallel(timeline)
    if wrapper:
        out["data_parallel"] = wrapper
    return out


def _coverage(spans: list[tuple[int, int]]) -> Callable[[int, int], int]:
    """How much of ``[s, e]`` the sorted, disjoint ``spans`` cover (a lookup, not a scan)."""
    if not spans:
        return lambda _s, _e: 0
    lo = np.array([a for a, _ in spans], dtype=np.int64)
    hi = np.array([b for _, b in spans], dtype=np.int64)
    before = np.concatenate(([0], np.cumsum(hi - lo)))

    def upto(t: int) -> int:
        i = int(np.searchsorted(lo, t, side="right")) - 1
        return 0 if i < 0 else int(before[i] + min(t, hi[i]) - lo[i])

    return lambda s, e: max(0, upto(e) - upto(s))


def _launches(timeline: Timeline, correlations: np.ndarray) -> dict[str, np.ndarray]:
    """Each kernel's launch: its time, thread, and the external id of the op that launched it
    (-1 where the trace holds no launch: a kernel launched before the profiled window, a
    GPU-only trace)."""
    rt = timeline.runtime
    out = {key: np.full(len(correlations), -1, dtype=np.int64) for key in ("start", "tid", "ext")}
    if rt.empty:
        return out
    rt = rt[rt["correlation"] >= 0].drop_duplicates("correlation")
    at = pd.Index(rt["correlation"].to_numpy()).get_indexer(correlations)
    found = (at >= 0) & (correlations >= 0)
    for key, column in (("start", "start"), ("tid", "tid"), ("ext", "ext_id")):
        out[key][found] = rt[column].to_numpy()[at[found]]
    return out


#: A collective's own ops around its launch: ``c10d::allreduce_``, ``nccl:all_reduce``, …
_COLLECTIVE_OP = r"^(?:c10d::|nccl:)"

#: One collective's op around its launch: (name, dims index, types index).
Op = tuple[str, int, int]


def _collective_ops(timeline: Timeline, launches: dict[str, np.ndarray]) -> list[Op | None]:
    """For each collective, the innermost ``c10d::`` / ``nccl:`` op of the launching thread
    around its launch (one with recorded shapes first): what it is where the kernel's name does
    not say (RCCL's ``ncclDevKernel_Generic``), and its size where the launching op records none."""
    out: list[Op | None] = [None] * len(launches["start"])
    cpu = timeline.cpu
    ops = cpu[cpu["name"].astype(str).str.match(_COLLECTIVE_OP)] if not cpu.empty else cpu
    if ops.empty:
        return out
    lo = ops["start"].to_numpy()
    hi = lo + ops["dur"].to_numpy()
    tid, dims, types = ops["tid"].to_numpy(), ops["dims"].to_numpy(), ops["types"].to_numpy()
    names = ops["name"].astype(str).to_numpy()
    for i, (t, thread) in enumerate(zip(launches["start"], launches["tid"])):
        if t < 0:
            continue
        around = np.flatnonzero((tid == thread) & (lo <= t) & (hi >= t))
        if not len(around):
            continue
        shaped = around[dims[around] >= 0]
        pick = shaped if len(shaped) else around
        j = int(pick[np.argmax(lo[pick])])
        out[i] = (str(names[j]), int(dims[j]), int(types[j]))
    return out


def _kind(kernel: str, op: Op | None) -> str:
    kind = collective_kind(kernel)
    return collective_kind(op[0]) if kind == "other" and op is not None else kind


#: An op's recorded type of its first argument → (dtype, bytes).
_TYPE_NAMES: dict[str, tuple[str, int]] = {
    "float": ("float32", 4),
    "double": ("float64", 8),
    "c10::BFloat16": ("bfloat16", 2),
    "c10::Half": ("float16", 2),
    "long int": ("int64", 8),
    "int": ("int32", 4),
}


def _message(timeline: Timeline, lasts: list[tuple[int, Op | None, str]]) -> dict[str, Any]:
    """The last collective's size, the most common over the steps: the elements of the first
    tensor argument recorded on the op that launched it (``record_param_comms``), else on its
    ``c10d::`` / ``nccl:`` op; in a reduction kernel's data type, else that op's first
    argument's."""
    cpu = timeline.cpu
    wanted = [ext for ext, _op, _kernel in lasts if ext >= 0]
    launching = (
        cpu[cpu["ext_id"].isin(wanted) & (cpu["dims"] >= 0)] if wanted and not cpu.empty else cpu.iloc[:0]
    )
    by_ext: dict[int, int] = {}
    for ext, dims in zip(launching["ext_id"].to_numpy(), launching["dims"].to_numpy()):
        size = _first_tensor_elements(timeline.arg(int(dims)))
        if size:
            by_ext.setdefault(int(ext), size)
    found: list[tuple[int, tuple[str, int] | None]] = []
    for ext, op, kernel in lasts:
        size = by_ext.get(ext) or (_first_tensor_elements(timeline.arg(op[1])) if op else None)
        if size:
            # A reduction's kernel names the data type it adds; others move bytes (``int8``).
            own = kernel_dtype(kernel) if collective_kind(kernel) in _REDUCTIONS else None
            found.append((size, own or (_op_dtype(timeline, op) if op else None)))
    if not found:
        return {}
    elements, dtype = Counter(found).most_common(1)[0][0]
    out: dict[str, Any] = {"elements": elements}
    if dtype is not None:
        out["dtype"], out["bytes"] = dtype[0], elements * dtype[1]
    return out


def _op_dtype(timeline: Timeline, op: Op) -> tuple[str, int] | None:
    types = timeline.arg(op[2])
    first = types[0] if isinstance(types, list) and types else None
    return _TYPE_NAMES.get(first) if isinstance(first, str) else None


def _first_tensor_elements(dims: Any) -> int | None:
    """Elements of an op's first tensor argument: a shape (``[n, m]``) or a tensor list's
    shapes (``[[n], [m]]``, summed)."""
    if not isinstance(dims, list) or not dims or not isinstance(dims[0], list) or not dims[0]:
        return None
    first = dims[0]
    shapes = first if all(isinstance(x, list) for x in first) else [first]
    try:
        return sum(math.prod(int(v) for v in shape) for shape in shapes) or None
    except (TypeError, ValueError):
        return None


# --- the last bucket -----------------------------------------------------------------------


def module_parameters(regions: Sequence[Mapping[str, Any]]) -> list[list[Any]]:
    """``[[module path, parameter bytes], …]`` of the modules that own parameters, in the order
    their first call was recorded (``regions.jsonl``: the forward order), each module once."""
    seen: set[str] = set()
    out: list[list[Any]] = []
    for line in regions:
        path, size = line.get("path"), line.get("param_bytes")
        if not isinstance(path, str) or path in seen or not isinstance(size, int) or size <= 0:
            continue
        seen.add(path)
        out.append([path, size])
    return out


def bucket_modules(bucket_bytes: int, modules: Sequence[Sequence[Any]]) -> tuple[list[tuple[str, int]], bool]:
    """The modules whose parameters DDP's last bucket holds: the first ones in forward order
    (the backward makes their gradients ready last) up to ``bucket_bytes``, and whether their
    sizes add up to the bucket exactly. A module the bucket's end cuts through counts its part.
    Nothing when the modules recorded hold less than the bucket."""
    held: list[tuple[str, int]] = []
    total = 0
    for path, size in modules:
        if total >= bucket_bytes:
            break
        take = min(int(size), bucket_bytes - total)
        held.append((str(path), take))
        total += take
    if total < bucket_bytes:
        return [], False
    exact = sum(int(size) for path, size in modules[: len(held)]) == bucket_bytes
    return held, exact


def _size(nbytes: float) -> str:
    if nbytes >= MIB:
        return f"{nbytes / MIB:.1f} MB"
    return f"{nbytes / 1024:.0f} KB" if nbytes >= 1024 else f"{nbytes:.0f} B"


def bucket_text(last: Mapping[str, Any], modules: Sequence[Sequence[Any]] | None) -> str:
    """The last bucket in words: its size and, where the modules' parameter sizes are known,
    which modules' gradients it holds."""
    nbytes, elements, dtype = last.get("bytes"), last.get("elements"), last.get("dtype")
    if not nbytes:
        if elements:
            return f"in DDP the last bucket, {elements:,} gradients, the ones the backward computes last"
        return "in DDP the last bucket, the gradients the backward computes last (the first layers' and the embedding's)"
    text = f"in DDP the last bucket, {_size(nbytes)} ({elements:,} {dtype} gradients)"
    held, exact = bucket_modules(int(nbytes), modules or [])
    if not held:
        return text + ", the gradients the backward computes last (the first layers' and the embedding's)"
    shown = ", ".join(f"{path} ({_size(size)})" for path, size in held[:4])
    more = f" and {len(held) - 4} more" if len(held) > 4 else ""
    about = "" if exact else "about "
    return (
        f"{text}: {about}the parameters of {shown}{more}, the first modules of the forward "
        "(regions.jsonl), whose gradients the backward makes last"
    )


def _dominant(last: Mapping[str, Any], modules: Sequence[Sequence[Any]] | None) -> tuple[str, int] | None:
    """The module whose parameters fill most of the last bucket, if one does."""
    nbytes = last.get("bytes")
    if not nbytes:
        return None
    held, _ = bucket_modules(int(nbytes), modules or [])
    top = max(held, key=lambda m: m[1], default=None)
    return top if top is not None and top[1] >= DOMINANT * nbytes else None


# --- the settings offered ------------------------------------------------------------------


def communication_fix(report: Report, recipes: Sequence[Any]) -> None:
    """The settings of the data-parallel wrapper where a rank's exposed communication, less the
    wait for other ranks where that is known, is at least ``min_share`` of its step: DDP's on
    the all-reduce, FSDP's on the all-gather of a job whose ranges name FSDP. The verdict stays
    ``skip`` (communication): the fix line and the note say what to set and how much of the step
    is exposed. The all-reduce that ends a DDP step is named (its bucket) whenever it is exposed."""
    step = report.step_time_ms
    if step <= 0:
        return
    split = report.source.get("communication") or {}
    wait = float(split.get("wait_ms_per_step") or 0.0)
    comm = report.communication_ms_per_step
    transfer_share = 1.0 - wait / comm if comm > 0 else 1.0
    last = report.source.get("last_collective") or {}
    modules = report.source.get("module_parameters")
    if last.get("data_parallel") in (FULLY_SHARD, FSDP1):
        _fsdp_fix(report, recipes, last, transfer_share, wait)
        return
    bucket = _bucket_note(report, last, modules) if last.get("data_parallel") == DDP else None
    exposed = report.exposed_communication_ms_per_step * transfer_share
    if exposed < report.thresholds.min_share * step:
        return
    reduces = _of_kind(report, ("all-reduce",))
    if not reduces or _has_fix(_of_kind(report, None)):
        return
    c = max(reduces, key=lambda x: x.time_ms_per_step)
    if not _offer(c, DDP_BUILTIN, report, recipes):
        return
    waited = f", after {wait:.2f} ms of waiting for other ranks is taken out" if wait > 0 else ""
    notes = [
        f"communication exposed {exposed:.2f} ms per step ({exposed / step:.1%} of the step{waited}): "
        "DDP's gradient_as_bucket_view, static_graph and bucket_cap_mb decide how much of the all-reduce "
        "the backward hides"
    ]
    if last.get("exposed_ms") and bucket is not c:
        notes.append(f"{_last_sentence(last, modules)}; smaller buckets start it earlier")
    notes.append(_cap_reasoning(last, modules))
    c.note = "; ".join(x for x in (c.note, *notes) if x)


def _of_kind(report: Report, kinds: tuple[str, ...] | None) -> list[Candidate]:
    return [
        c
        for c in report.candidates
        if c.kind == COMMUNICATION and (kinds is None or collective_kind(c.name) in kinds)
    ]


def _offer(c: Candidate, builtin: str, report: Report, recipes: Sequence[Any]) -> bool:
    """The first recipe that matches ``c`` with ``builtin`` as its built-in, on it; False (and
    ``c`` as it was) when none matches or every one is blocked."""
    from kerneltriage.analysis.fixes.fix_choice import choose
    from kerneltriage.analysis.fixes.fix_environment import environment

    before = c.builtin
    c.builtin = builtin
    recipe = choose(c, tuple(recipes), environment(report.gpu, report.source, None), {})
    if recipe is None or recipe.get("blocked"):
        c.builtin = before
        return False
    c.fix = recipe.pop("text")
    for key in ("needs", "declined", "fuses_residual_add"):
        recipe.pop(key, None)
    c.recipe = recipe
    return True


def _last_sentence(last: Mapping[str, Any], modules: Sequence[Sequence[Any]] | None) -> str:
    return (
        f"the step's last collective (of {last.get('collectives_per_step')}) is exposed "
        f"{float(last['exposed_ms']):.2f} ms: {bucket_text(last, modules)}"
    )


def _bucket_note(
    report: Report, last: Mapping[str, Any], modules: Sequence[Sequence[Any]] | None
) -> Candidate | None:
    """The exposed last all-reduce of the step, named by its bucket, on its candidate (the
    all-reduce candidate of the same kernel); the candidate, or None where the trace shows no
    size or no exposed time."""
    if not last.get("exposed_ms") or last.get("collective") != "all-reduce" or not last.get("elements"):
        return None
    reduces = sorted(_of_kind(report, ("all-reduce",)), key=lambda x: -x.time_ms_per_step)
    if not reduces:
        return None
    c = reduces[0]
    c.note = "; ".join(x for x in (c.note, _last_sentence(last, modules)) if x)
    return c


def _cap_reasoning(last: Mapping[str, Any], modules: Sequence[Sequence[Any]] | None) -> str:
    """What bucket_cap_mb can do for the last bucket's all-reduce."""
    nbytes = last.get("bytes")
    if not nbytes:
        return ""
    top = _dominant(last, modules)
    if top is not None:
        return (
            f"bucket_cap_mb: {top[0]}'s parameters are {_size(top[1])} of the bucket's {_size(nbytes)}, and a bucket holds "
            "whole parameters, so no bucket_cap_mb starts this all-reduce before that gradient is ready"
        )
    return (
        f"bucket_cap_mb: the last bucket is {_size(nbytes)}; a cap below that splits it, so the all-reduce of "
        "its first part starts while the backward still computes the rest"
    )


def _fsdp_fix(
    report: Report, recipes: Sequence[Any], last: Mapping[str, Any], transfer_share: float, wait: float
) -> None:
    """FSDP's prefetch settings on the all-gather, where the FSDP collectives' exposed time (at
    most the rank's exposed communication), less the wait, is ``min_share`` of the step. The
    prediction is the all-gathers' exposed time: what earlier all-gathers can hide at most."""
    from kerneltriage.analysis.judge.verdict import rank_in_order

    step = report.step_time_ms
    by_kind = last.get("exposed_ms_by_collective") or {}
    total = report.exposed_communication_ms_per_step
    exposed = min(sum(float(by_kind.get(k) or 0.0) for k in FSDP_COLLECTIVES), total) * transfer_share
    gathered = min(float(by_kind.get("all-gather") or 0.0), total) * transfer_share
    if exposed < report.thresholds.min_share * step or gathered <= 0:
        return
    gathers = _of_kind(report, ("all-gather",))
    if not gathers or _has_fix(_of_kind(report, None)):
        return
    c = max(gathers, key=lambda x: x.time_ms_per_step)
    fsdp2 = last.get("data_parallel") == FULLY_SHARD
    if not _offer(c, FSDP2_BUILTIN if fsdp2 else FSDP1_BUILTIN, report, recipes):
        return
    scattered = min(float(by_kind.get("reduce-scatter") or 0.0), total) * transfer_share
    waited = f", after {wait:.2f} ms of waiting for other ranks is taken out" if wait > 0 else ""
    how = (
        "explicit prefetch issues each layer's all-gather while the layer before it computes; keeping the last "
        "layer gathered saves its all-gather at the start of the backward"
        if fsdp2
        else "FSDP1's forward_prefetch issues the next unit's all-gather before this unit's forward"
    )
    c.note = "; ".join(
        x
        for x in (
            c.note,
            f"FSDP's collectives exposed {exposed:.2f} ms per step ({exposed / step:.1%} of the step{waited}): "
            f"all-gather {gathered:.2f} ms, reduce-scatter {scattered:.2f} ms; {how}",
        )
        if x
    )
    c.expected_saving_share = gathered / step
    c.attrs["saving_basis"] = (
        f"the all-gathers' exposed time ({gathered:.2f} ms per step, not overlapped by compute{waited}): "
        "the most an earlier all-gather can hide"
    )
    rank_in_order(report.candidates)


def _has_fix(candidates: Sequence[Candidate]) -> bool:
    return any(c.fix for c in candidates)
