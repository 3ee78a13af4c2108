"""Flat pandas tables of a profile and its reports, for notebooks and CSV/Parquet exports.

One row per thing, one scalar per cell, columns named as in the JSON schemas (a nested key
is flattened: ``roofline.source`` → ``headroom_source``, ``shapes.distinct`` →
``shapes_distinct``). The column lists are the module's constants; README "Python API"
documents them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from kerneltriage.analysis.timeline.attribution import Attribution, op_mask

# Reports, diffs and rank summaries are read by attribute (typed ``Any``): ``model`` builds
# its frames here, so this module imports none of them back.
if TYPE_CHECKING:  # pragma: no cover
    from kerneltriage.analysis.rules import Rules
    from kerneltriage.ingest.tables import Timeline

CANDIDATE_COLUMNS = (
    "rank",  # position in the ranking (1 = first), as in the JSON
    "id",
    "name",
    "kind",
    "level",
    "variant",
    "verdict",
    "reason",
    "builtin",
    "fix",  # code to paste for use-builtin and compile verdicts
    "recipe_id",  # the fixes.yaml recipe behind the fix (or the one a parameter blocked)
    "note",
    "time_share",
    "gpu_share",
    "time_ms_per_step",
    "fwd_ms_per_step",
    "bwd_ms_per_step",
    "instances_per_step",
    "headroom",
    "headroom_source",
    "expected_saving_share",
    "expected_saving_ms",
    "bound",
    "ceiling_ms",
    "launch_bound",
    "bytes",
    "flops",
    "intensity",
    "achieved_gbs",
    "achieved_tflops",
    "precision",
    "measured_dram_bytes",
    "counters_coverage",
    "shapes_distinct",
    "shapes_dominant_coverage",
    "shapes_varying_dims",
    "dominant_shape",
    "headroom_passed",
    "hotness_passed",
    "stability_passed",
    "module",
    "ops",
    "kernel_count",
    "top_kernel",
    "verification_status",  # kerneltriage verify: verified | refuted | inconclusive | not verified | changes-results
    "realized_saving_share",
    "realized_low",  # the realized saving's 95% interval (runs and steps)
    "realized_high",
    "realized_spread_ms",  # interquartile range of the fixed runs' steps
)

KERNEL_COLUMNS = (
    "rank",  # process rank (0 for a single process)
    "step",  # recorded step the kernel was launched in; -1: outside every step
    "name",
    "kind",  # kernel | memcpy | memset
    "class",  # the rules' kind: attention, gemm, norm, …, communication, memcpy, other
    "phase",  # fwd | bwd | opt | none
    "op",  # top-level op that launched it (aten::linear, not aten::mm); "" when unknown
    "launch_op",  # the innermost op that launched it (aten::mm)
    "module",
    "region",
    "device",
    "stream",
    "start_us",  # since the rank's first recorded event
    "dur_us",
    "grid",
    "block",
    "registers",
    "shared_mem",
)

OP_COLUMNS = (
    "rank",
    "step",  # the recorded step the op starts in; -1: outside every step
    "name",
    "phase",  # phase of the kernels it launched (fwd | bwd | opt); none: it launched none
    "module",
    "region",
    "forward_op",  # for a backward op: the forward op it differentiates
    "input_shapes",  # 4x2048x1024, 1024 (non-tensor inputs left empty)
    "input_types",
    "start_us",  # since the rank's first recorded event
    "cpu_us",  # the op's own CPU range
    "kernels",  # GPU activities it launched
    "gpu_us",  # their total duration
)

GAP_COLUMNS = ("cause", "ms_per_step", "count_per_step", "example_ms")

DIFF_COLUMNS = (
    "name",
    "kind",
    "ids_before",
    "ids_after",
    "time_ms_per_step_before",
    "time_ms_per_step_after",
    "predicted_saving_share",
    "realized_saving_share",
    "ceiling_ms_per_step",
    "ceiling_reached",
    "verdict_before",
    "how",
    # The second rung (``profile --apply``): the applied fixes that covered this candidate before.
    "fixes_applied",
    "fixes_predicted_share",
    "fixes_realized_alone_share",
)

RANK_COLUMNS = ("rank", "step_time_ms", "gpu_busy_pct", "communication_ms", "exposed_communication_ms")
RANK_CANDIDATE_COLUMNS = (
    "name",
    "kind",
    "mean_share",
    "max_share",
    "mean_ms",
    "max_ms",
    "skew",
    "ids",  # 0:C1 1:C1
    "verdicts",  # 0:use-builtin 1:use-builtin
)


def _frame(rows: list[dict[str, Any]], columns: tuple[str, ...]) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=list(columns))


# --- reports ---------------------------------------------------------------------------------


def candidate_row(c: Any) -> dict[str, Any]:
    r, s = c.roofline, c.shapes

    def passed(name: str) -> bool | None:
        cond = c.conditions.get(name)
        return None if cond is None else cond.passed

    top = max(c.kernels, key=lambda k: k.time_ms_per_step, default=None)
    v = getattr(c, "verification", None) or {}
    return {
        "rank": c.rank,
        "id": c.id,
        "name": c.name,
        "kind": c.kind,
        "level": c.level,
        "variant": c.variant,
        "verdict": c.verdict,
        "reason": c.reason,
        "builtin": c.builtin,
        "fix": getattr(c, "fix", None),
        "recipe_id": (getattr(c, "recipe", None) or {}).get("id"),
        "note": c.note,
        "time_share": c.time_share,
        "gpu_share": c.gpu_share,
        "time_ms_per_step": c.time_ms_per_step,
        "fwd_ms_per_step": c.fwd_ms_per_step,
        "bwd_ms_per_step": c.bwd_ms_per_step,
        "instances_per_step": c.instances_per_step,
        "headroom": c.headroom,
        "headroom_source": r.source,
        "expected_saving_share": c.expected_saving_share,
        "expected_saving_ms": c.expected_saving_ms,
        "bound": r.bound,
        "ceiling_ms": r.ceiling_ms,
        "launch_bound": r.launch_bound,
        "bytes": r.bytes,
        "flops": r.flops,
        "intensity": r.intensity,
        "achieved_gbs": r.achieved_gbs,
        "achieved_tflops": r.achieved_tflops,
        "precision": r.precision,
        "measured_dram_bytes": r.measured_dram_bytes,
        "counters_coverage": r.counters_coverage,
        "shapes_distinct": s.distinct,
        "shapes_dominant_coverage": s.dominant_coverage,
        "shapes_varying_dims": ", ".join(s.varying_dims),
        "dominant_shape": str(s.signatures[0].get("shape", "")) if s.signatures else None,
        "headroom_passed": passed("headroom"),
        "hotness_passed": passed("hotness"),
        "stability_passed": passed("stability"),
        "module": c.module,
        "ops": " → ".join(c.ops),
        "kernel_count": len(c.kernels),
        "top_kernel": top.name if top else None,
        "verification_status": v.get("status"),
        "realized_saving_share": v.get("realized_saving_share"),
        "realized_low": v.get("realized_low"),
        "realized_high": v.get("realized_high"),
        "realized_spread_ms": (v.get("fixed") or {}).get("spread_ms"),
    }


# Numbers that may be unknown (NaN, never None), so that frames of several ranks concatenate
# into float columns.
_FLOAT_COLUMNS = (
    "headroom",
    "ceiling_ms",
    "bytes",
    "flops",
    "intensity",
    "achieved_gbs",
    "achieved_tflops",
    "measured_dram_bytes",
    "realized_saving_share",
    "realized_low",
    "realized_high",
    "realized_spread_ms",
)


def candidates_frame(candidates: list[Any]) -> pd.DataFrame:
    """One row per candidate, in the report's order."""
    frame = _frame([candidate_row(c) for c in candidates], CANDIDATE_COLUMNS)
    return frame.astype({col: "float64" for col in _FLOAT_COLUMNS})


def gaps_frame(gaps: list[Any]) -> pd.DataFrame:
    return _frame(
        [
            {
                "cause": g.cause,
                "ms_per_step": g.ms_per_step,
                "count_per_step": g.count_per_step,
                "example_ms": g.example_ms,
            }
            for g in gaps
        ],
        GAP_COLUMNS,
    )


def _applied(d: Any, before_ids: list[str]) -> dict[str, Any]:
    """The ``profile --apply`` fixes (``Diff.ladder``) covering any of these candidates: their
    ids, and their predictions and savings alone summed (each fix once)."""
    fixes = [f for f in ((d.ladder or {}).get("fixes") or []) if f["id"] in before_ids]
    if not fixes:
        return {"fixes_applied": "", "fixes_predicted_share": None, "fixes_realized_alone_share": None}
    alone = [f["realized_saving_share"] for f in fixes if f["realized_saving_share"] is not None]
    return {
        "fixes_applied": ", ".join(f["id"] for f in fixes),
        "fixes_predicted_share": sum(f["predicted_saving_share"] or 0.0 for f in fixes),
        "fixes_realized_alone_share": sum(alone) if alone else None,
    }


def diff_frame(d: Any) -> pd.DataFrame:
    """One row per matched candidate of a ``Diff``, in its order (largest prediction first),
    with the fixes a second-rung run was profiled with where they covered it."""
    rows = [
        {
            "name": m.name,
            "kind": m.kind,
            "ids_before": ", ".join(m.ids["before"]),
            "ids_after": ", ".join(m.ids["after"]),
            "time_ms_per_step_before": m.time_ms_per_step["before"],
            "time_ms_per_step_after": m.time_ms_per_step["after"],
            "predicted_saving_share": m.predicted_saving_share,
            "realized_saving_share": m.realized_saving_share,
            "ceiling_ms_per_step": m.ceiling_ms_per_step,
            "ceiling_reached": m.ceiling_reached,
            "verdict_before": m.verdict_before,
            "how": m.how,
            **_applied(d, m.ids["before"]),
        }
        for m in d.candidates
    ]
    return _frame(rows, DIFF_COLUMNS)


def ranks_frame(summary: Any) -> pd.DataFrame:
    return _frame([{col: getattr(row, col) for col in RANK_COLUMNS} for row in summary.ranks], RANK_COLUMNS)


def rank_candidates_frame(summary: Any) -> pd.DataFrame:
    rows = []
    for c in summary.candidates:
        rows.append(
            {
                **{col: getattr(c, col) for col in RANK_CANDIDATE_COLUMNS[:7]},
                "ids": " ".join(f"{r}:{i}" for r, i in sorted(c.ids.items())),
                "verdicts": " ".join(f"{r}:{v}" for r, v in sorted(c.verdicts.items())),
            }
        )
    return _frame(rows, RANK_CANDIDATE_COLUMNS)


# --- timelines -------------------------------------------------------------------------------


def _origin(tl: Timeline) -> int:
    starts = [int(t["start"].min()) for t in (tl.kernels, tl.cpu) if len(t)]
    return min(starts) if starts else 0


def _names(cpu: pd.DataFrame, rows: np.ndarray) -> list[str]:
    names = cpu["name"].to_numpy()
    return [str(names[i]) if i >= 0 else "" for i in rows.tolist()]


def kernels_frame(tl: Timeline, attr: Attribution, rules: Rules, rank: int) -> pd.DataFrame:
    """One row per GPU activity (kernel, memcpy, memset) of one rank's timeline."""
    k = attr.kernels
    origin = _origin(tl)
    op_names = _names(tl.cpu, k["root"].to_numpy())
    launch_names = _names(tl.cpu, k["op"].to_numpy())
    kinds = k["kind"].astype(str).tolist()
    classes = [
        rules.classify(op or None, str(name), kind)
        for op, name, kind in zip(op_names, k["name"].astype(str).tolist(), kinds)
    ]
    frame = pd.DataFrame(
        {
            "rank": np.full(len(k), rank, dtype=np.int64),
            "step": k["step"].to_numpy(),
            "name": k["name"].astype(str).to_numpy(),
            "kind": kinds,
            "class": classes,
            "phase": k["phase"].astype(str).to_numpy(),
            "op": op_names,
            "launch_op": launch_names,
            "module": _objects(k["module"]),
            "region": _objects(k["region"]),
            "device": k["device"].to_numpy(),
            "stream": k["stream"].to_numpy(),
            "start_us": (k["start"].to_numpy() - origin) / 1e3,
            "dur_us": k["dur"].to_numpy() / 1e3,
            "grid": [f"{x}x{y}x{z}" for x, y, z in zip(k["grid_x"], k["grid_y"], k["grid_z"])],
            "block": [f"{x}x{y}x{z}" for x, y, z in zip(k["block_x"], k["block_y"], k["block_z"])],
            "registers": k["registers"].to_numpy(),
            "shared_mem": k["shared_mem"].to_numpy(),
        },
        columns=list(KERNEL_COLUMNS),
    )
    return frame.sort_values("start_us", kind="stable").reset_index(drop=True)


def _objects(values: Any) -> np.ndarray:
    """An object column with None (not NaN) where nothing is recorded."""
    array = np.array(values, dtype=object)  # a copy: the caller's values stay as they were
    array[pd.isna(array)] = None
    return array


def _shape_text(dims: Any) -> str:
    """``[[4, 2048], [], 1]`` → ``4x2048, , `` : tensors as AxB, scalars and others empty."""
    if not isinstance(dims, (list, tuple)):
        return ""
    parts = []
    for d in dims:
        if isinstance(d, (list, tuple)) and all(isinstance(x, int) for x in d):
            parts.append("x".join(map(str, d)) if d else "scalar")
        else:
            parts.append("")
    return ", ".join(parts)


def ops_frame(tl: Timeline, attr: Attribution, rank: int) -> pd.DataFrame:
    """One row per top-level CPU op (forward, backward and optimizer) of one rank's timeline,
    with the GPU time of the kernels it launched."""
    cpu = tl.cpu
    n = len(cpu)
    rows = np.flatnonzero(op_mask(cpu) & (attr.cpu_root == np.arange(n))) if n else np.array([], int)
    k = attr.kernels
    launched = k[k["root"] >= 0]
    per_root = launched.groupby("root")
    gpu_ns = per_root["dur"].sum()
    count = per_root.size()
    # The phase and place of an op are those of the kernels it launched (a backward op's
    # module is its forward op's); an op without kernels keeps its own module annotation.
    first = launched.drop_duplicates("root").set_index("root")
    fwd = first["fwd_root"].reindex(rows).fillna(-1).astype(np.int64).to_numpy()
    phase = first["phase"].reindex(rows).fillna("none").astype(str).to_numpy()
    module = first["module"].reindex(rows).to_numpy()
    region = first["region"].reindex(rows).to_numpy()
    own_module, own_region = attr.cpu_module[rows], attr.cpu_region[rows]
    module = np.where(pd.isna(module), own_module, module)
    region = np.where(pd.isna(region), own_region, region)
    starts = cpu["start"].to_numpy()[rows]
    step = np.full(len(rows), -1, dtype=np.int64)
    for s in attr.steps:
        step[(starts >= s.start) & (starts < s.end)] = s.index
    forward = [
        _names(cpu, np.array([f]))[0] if f >= 0 and f != r else ""
        for f, r in zip(fwd.tolist(), rows.tolist())
    ]
    dims = cpu["dims"].to_numpy()[rows]
    types = cpu["types"].to_numpy()[rows]
    frame = pd.DataFrame(
        {
            "rank": np.full(len(rows), rank, dtype=np.int64),
            "step": step,
            "name": cpu["name"].astype(str).to_numpy()[rows],
            "phase": phase,
            "module": _objects(module),
            "region": _objects(region),
            "forward_op": forward,
            "input_shapes": [_shape_text(tl.arg(int(i))) for i in dims],
            "input_types": [
                ", ".join(map(str, t)) if isinstance(t, list) else "" for t in map(tl.arg, map(int, types))
            ],
            "start_us": (starts - _origin(tl)) / 1e3,
            "cpu_us": cpu["dur"].to_numpy()[rows] / 1e3,
            "kernels": count.reindex(rows).fillna(0).astype(np.int64).to_numpy(),
            "gpu_us": gpu_ns.reindex(rows).fillna(0).to_numpy() / 1e3,
        },
        columns=list(OP_COLUMNS),
    )
    return frame.sort_values("start_us", kind="stable").reset_index(drop=True)


def candidates_table(reports_by_rank: dict[int, Any], top: int | None = None) -> pd.DataFrame:
    """The candidates of one report (``Report.to_frame``), or of several ranks one after the
    other with a leading ``process_rank`` column (``rank`` stays the position in the ranking).
    ``top``: the first N of each rank."""
    parts = []
    for r, rep in reports_by_rank.items():
        table = candidates_frame(rep.candidates[:top] if top else rep.candidates)
        if len(reports_by_rank) > 1:
            table.insert(0, "process_rank", r)
        parts.append(table)
    return pd.concat(parts, ignore_index=True) if len(parts) > 1 else parts[0]
