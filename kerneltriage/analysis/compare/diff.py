"""``kerneltriage diff``: did the kernel pay? Two reports, before and after a change.

Candidates are matched across the runs by what they compute, not by kernel names (which
change when an op is replaced): the same kind, then the same place in the model (module
path) and the same main tensor shape. A naive attention region before matches the SDPA or
flash-attention candidates after; an eager RMSNorm region matches the fused kernel.

For each candidate the ``before`` report predicted a saving for, the diff sets the realized
saving (time before − time after of its matches, as a share of the step before) against the
prediction (share × (1 − 1/headroom)), and says what fraction of the predicted ceiling the
new code reached. New hot spots (the bottleneck moved) and regressions are listed, and runs
that are not comparable are flagged.
"""

from __future__ import annotations

import json
import os
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from kerneltriage.analysis.candidates.estimate import tensor_inputs
from kerneltriage.analysis.model import Candidate, Report, json_safe
from kerneltriage.analysis.vocabulary import Verdict

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

SCHEMA = "kerneltriage.diff/1"
_REGRESSION = 0.05  # slower by more than this share of its own time


@dataclass
class Match:
    name: str
    kind: str
    ids: dict[str, list[str]]  # {"before": [...], "after": [...]}
    time_ms_per_step: dict[str, float]
    predicted_saving_share: float
    realized_saving_share: float
    ceiling_ms_per_step: float | None
    ceiling_reached: float | None  # ceiling ÷ time after (1.0: at the predicted ceiling)
    verdict_before: str
    how: str  # how the match was made
    # What `kerneltriage verify` measured on the run before for these candidates (their
    # ``verification`` mappings), empty when it was not run.
    verified: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class Diff:
    """``kerneltriage diff`` as an object (schema ``kerneltriage.diff/1``)."""

    before: str
    after: str
    step_time_ms: dict[str, float]
    gpu_busy_ms: dict[str, float]
    kinds: dict[str, dict[str, float]]  # kind -> {before, after} ms per step
    candidates: list[Match]
    new_hot_spots: list[dict[str, Any]]
    regressions: list[dict[str, Any]]
    warnings: list[str] = field(default_factory=list)
    # eager → torch.compile: each compiled kernel against the eager ops it replaced (None when
    # the run after has no compiled code)
    compiled: dict[str, Any] | None = None
    # AFTER profiled with BEFORE's fixes applied (``profile --apply``): each fix's prediction and
    # its realized saving alone (``verify`` on BEFORE) against what they realized together (the
    # step time BEFORE → AFTER); None when AFTER carries no applied fixes.
    ladder: dict[str, Any] | None = None
    schema: str = SCHEMA

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        return json_safe({"schema": data.pop("schema"), **data})

    @property
    def step_saving_share(self) -> float:
        b, a = self.step_time_ms["before"], self.step_time_ms["after"]
        return (b - a) / b if b else 0.0

    def to_frame(self) -> pd.DataFrame:
        """One row per matched candidate (columns: ``frames.DIFF_COLUMNS``)."""
        from kerneltriage.analysis.frames import diff_frame

        return diff_frame(self)


def main_shape(c: Candidate) -> tuple | None:
    """What identifies the computation: q's shape for attention, every input's shape for a
    single op (a GEMM is its activation and its weight), the input activation for a region."""
    if c.q is not None:
        return tuple(c.q)
    if not c.example:
        return None
    op = c.example[0]
    tensors = tensor_inputs(op.get("dims"), op.get("types"))
    if not tensors:
        return None
    if c.level == "op":
        return tuple(tuple(d) for d, _ in tensors)
    return tuple(tensors[0][0])


def _place(c: Candidate) -> str | None:
    return c.module


def compare(before: Report, after: Report, names: tuple[str, str] = ("before", "after")) -> Diff:
    warnings = _comparability(before, after)
    matches = _match(before, after)
    step_b, step_a = before.step_time_ms, after.step_time_ms
    out: list[Match] = []
    matched_after: set[str] = set()
    for b_list, a_list, how in matches:
        matched_after.update(c.id for c in a_list)
        t_b = sum(c.time_ms_per_step for c in b_list)
        t_a = sum(c.time_ms_per_step for c in a_list)
        predicted = sum(c.expected_saving_share for c in b_list)
        ceiling = sum(c.roofline.ceiling_ms or 0.0 for c in b_list) or None
        lead = max(b_list, key=lambda c: c.time_ms_per_step)
        name = lead.name
        if how == "kind total (compiled)" and len(b_list) > 1:
            name = f"all {lead.kind} ({len(b_list)} eager candidates, the largest {lead.name})"
        out.append(
            Match(
                name=name,
                kind=lead.kind,
                ids={"before": [c.id for c in b_list], "after": [c.id for c in a_list]},
                time_ms_per_step={"before": t_b, "after": t_a},
                predicted_saving_share=predicted,
                realized_saving_share=(t_b - t_a) / step_b if step_b else 0.0,
                ceiling_ms_per_step=ceiling,
                ceiling_reached=(ceiling / t_a) if ceiling and t_a else None,
                verdict_before=lead.verdict + (f" ({lead.reason})" if lead.verdict == Verdict.SKIP else ""),
                how=how,
                verified=[dict(c.verification) for c in b_list if c.verification],
            )
        )
    out.sort(key=lambda m: (-m.predicted_saving_share, -m.time_ms_per_step["before"]))
    min_share = before.thresholds.min_share
    new_hot = [
        {
            "id": c.id,
            "name": c.name,
            "kind": c.kind,
            "time_ms_per_step": c.time_ms_per_step,
            "time_share": c.time_share,
        }
        for c in after.candidates
        if c.id not in matched_after and c.time_share >= min_share
    ]
    regressions = [
        {"name": m.name, "kind": m.kind, "time_ms_per_step": m.time_ms_per_step}
        for m in out
        if m.time_ms_per_step["after"] > (1 + _REGRESSION) * m.time_ms_per_step["before"]
        and m.time_ms_per_step["after"] - m.time_ms_per_step["before"] > 0.001 * step_b
    ]
    steps = ladder(before, after, out, names)
    if steps and steps["warning"]:
        warnings.append(steps["warning"])
    kinds: dict[str, dict[str, float]] = defaultdict(lambda: {"before": 0.0, "after": 0.0})
    for side, rep in (("before", before), ("after", after)):
        for kind, ms in rep.kind_breakdown.items():
            kinds[kind][side] = ms
    return Diff(
        before=names[0],
        after=names[1],
        step_time_ms={"before": step_b, "after": step_a},
        gpu_busy_ms={"before": before.gpu_busy_ms, "after": after.gpu_busy_ms},
        kinds=dict(sorted(kinds.items(), key=lambda kv: -max(kv[1].values()))),
        candidates=out,
        new_hot_spots=new_hot,
        regressions=regressions,
        warnings=warnings,
        compiled=_compiled_section(before, after, out)
        if _compiled(after) and not _compiled(before)
        else None,
        ladder=steps,
    )


def ladder(
    before: Report, after: Report, matches: list[Match], names: tuple[str, str] = ("before", "after")
) -> dict[str, Any] | None:
    """The fixes AFTER was profiled with (its manifest's ``applied_fixes``, in ``source``), each
    with its prediction, its realized saving alone (``verify`` on BEFORE, where measured) and in
    this pair (its matched candidates' time), against the combination: the step saving BEFORE →
    AFTER. Fixes applied as one (identical ``apply`` mappings: ``verify`` measured them in one
    run, against their combined prediction) count once in the sums. None without applied fixes."""
    fixes = after.source.get("applied_fixes") or []
    if not fixes:
        return None
    by_id = {c.id.upper(): c for c in before.candidates}
    rows: list[dict[str, Any]] = []
    groups: dict[str, list[dict[str, Any]]] = {}
    for f in fixes:
        fid = str(f.get("id", ""))
        c = by_id.get(fid.upper())
        v = (c.verification if c is not None else None) or {}
        realized = v.get("realized_saving_share")
        if realized is None:
            realized = f.get("realized_saving_share")
        predicted = f.get("predicted_saving_share")
        if predicted is None:
            predicted = v.get("predicted_saving_share")
        if predicted is None and c is not None:
            predicted = c.expected_saving_share
        pair = [m for m in matches if fid in m.ids["before"]]
        apply = f.get("apply") or {}
        row = {
            "id": fid,
            "name": c.name if c is not None else None,
            "recipe_id": f.get("recipe_id"),
            "kind": apply.get("kind"),
            "status": v.get("status") or f.get("status"),
            "predicted_saving_share": predicted,
            "realized_saving_share": realized,
            "pair_realized_saving_share": sum(m.realized_saving_share for m in pair) if pair else None,
            "applied_with": [],
        }
        rows.append(row)
        groups.setdefault(json.dumps(apply, sort_keys=True, default=str), []).append(row)
    for members in groups.values():
        for row in members:
            row["applied_with"] = [r["id"] for r in members if r is not row]
    firsts = [members[0] for members in groups.values()]
    unmeasured = [r["id"] for r in firsts if r["realized_saving_share"] is None]
    measured = [r["realized_saving_share"] for r in firsts if r["realized_saving_share"] is not None]
    sum_realized = sum(measured) if measured else None  # None: no fix was measured alone
    sum_predicted = sum(r["predicted_saving_share"] or 0.0 for r in firsts)
    step_b, step_a = before.step_time_ms, after.step_time_ms
    combined = (step_b - step_a) / step_b if step_b else 0.0
    parent = after.source.get("parent_run")
    here = before.source.get("path")
    same = bool(parent and here) and os.path.abspath(str(parent)) == os.path.abspath(str(here))
    return {
        "fixes": rows,
        "parent_run": parent,
        "before_is_parent": same,
        "combined_realized_saving_share": combined,
        "sum_realized_saving_share": sum_realized,
        "sum_predicted_saving_share": sum_predicted,
        # Together minus the sum alone: negative when the fixes overlap (they take from the same
        # time), positive when together they saved more than apart.
        "interaction_share": combined - sum_realized if sum_realized is not None and not unmeasured else None,
        "unmeasured": unmeasured,
        "warning": None
        if same or not parent
        else f"{names[1]} was profiled with the fixes of {parent}, not of {names[0]}: the fixes' predictions "
        "and savings alone are that run's",
    }


def _compiled(report: Report) -> bool:
    return any(c.compiled for c in report.candidates)


_COMPILED_HOWS = ("fused ops (Inductor)", "kind total (compiled)")


def _compiled_section(before: Report, after: Report, matches: list[Match]) -> dict[str, Any]:
    """Did compile pay, op by op: every match that involves compiled kernels (eager time →
    compiled time, and the speed-up), and the `compile` verdicts of the run before checked
    against what compiling realized."""
    by_id = {c.id: c for c in after.candidates}
    rows: list[dict[str, Any]] = []
    for m in matches:
        after_c = [by_id[i] for i in m.ids["after"] if i in by_id]
        if not any(c.compiled for c in after_c) and m.how not in _COMPILED_HOWS:
            continue
        t = m.time_ms_per_step
        rows.append(
            {
                "eager": m.name,
                "kind": m.kind,
                "eager_ids": m.ids["before"],
                "compiled_ids": m.ids["after"],
                "compiled_kernels": [c.kernels[0].name if c.kernels else c.name for c in after_c][:12],
                "eager_ms_per_step": t["before"],
                "compiled_ms_per_step": t["after"],
                "speedup": t["before"] / t["after"] if t["after"] else None,
                "verdict_before": m.verdict_before,
                "predicted_saving_share": m.predicted_saving_share,
                "realized_saving_share": m.realized_saving_share,
                "how": m.how,
            }
        )
    rows.sort(key=lambda r: -r["eager_ms_per_step"])
    # Every actionable verdict before (compile first): did compiling realize its prediction?
    checks: list[dict[str, Any]] = []
    for m in matches:
        if m.verdict_before.startswith(Verdict.SKIP) or not m.predicted_saving_share:
            continue
        checks.append(
            {
                "name": m.name,
                "verdict_before": m.verdict_before,
                "predicted_saving_share": m.predicted_saving_share,
                "realized_saving_share": m.realized_saving_share,
                "held": m.realized_saving_share >= 0.5 * m.predicted_saving_share,
                "compiled": any(i in by_id and by_id[i].compiled for i in m.ids["after"]),
            }
        )
    checks.sort(
        key=lambda c: (not c["verdict_before"].startswith(Verdict.COMPILE), -c["predicted_saving_share"])
    )
    compiled_after = sum(c.time_ms_per_step for c in after.candidates if c.compiled)
    matched_after = {i for r in rows for i in r["compiled_ids"]}
    unmatched = [c for c in after.candidates if c.compiled and c.id not in matched_after]
    return {
        "rows": rows,
        "compile_predictions": checks,
        "compiled_ms_per_step": compiled_after,
        "unmatched_compiled_ms_per_step": sum(c.time_ms_per_step for c in unmatched),
        "unmatched_compiled_ids": [c.id for c in unmatched],
    }


def _match(before: Report, after: Report) -> list[tuple[list[Candidate], list[Candidate], str]]:
    """Pairs (before candidates, after candidates, how), kind by kind, most specific key first.

    Within one key, one candidate before takes every candidate after (an op replaced by a
    forward and a backward kernel); equal numbers pair up in order of time; otherwise the
    largest before candidate takes them and the rest have no counterpart.
    """
    pairs: list[tuple[list[Candidate], list[Candidate], str]] = []
    # Eager → compiled: a compiled kernel is named by itself, its module is the whole model and
    # its shapes are its arguments; it is matched by the ops it fuses instead (below).
    to_compiled = _compiled(after) and not _compiled(before)

    def plain(key):
        return lambda c: None if to_compiled and c.compiled else key(c)

    keys = (
        (lambda c: c.name, "same name"),
        (
            plain(lambda c: (_place(c), main_shape(c)) if _place(c) or main_shape(c) else None),
            "module and shape",
        ),
        (plain(_place), "module"),
        (plain(main_shape), "shape"),
    )
    left_b: list[Candidate] = []
    left_a: list[Candidate] = []
    kinds = {c.kind for c in before.candidates} | {c.kind for c in after.candidates}
    for kind in sorted(kinds):
        bs = [c for c in before.candidates if c.kind == kind]
        as_ = [c for c in after.candidates if c.kind == kind]
        for key, how in keys:
            b_by: dict[Any, list[Candidate]] = defaultdict(list)
            a_by: dict[Any, list[Candidate]] = defaultdict(list)
            for c in bs:
                if key(c) is not None:
                    b_by[key(c)].append(c)
            for c in as_:
                if key(c) is not None:
                    a_by[key(c)].append(c)
            for k, b_group in b_by.items():
                a_group = a_by.get(k)
                if not a_group:
                    continue
                b_group = sorted(b_group, key=lambda c: -c.time_ms_per_step)
                a_group = sorted(a_group, key=lambda c: -c.time_ms_per_step)
                if len(b_group) == len(a_group):
                    pairs.extend(([b], [a], how) for b, a in zip(b_group, a_group))
                else:
                    pairs.append(([b_group[0]], a_group, how))
                    b_group = b_group[:1]
                for c in b_group:
                    bs.remove(c)
                for c in a_group:
                    as_.remove(c)
        if to_compiled:
            left_b += bs
            left_a += as_
            continue
        if bs and as_ and len(bs) == 1:
            pairs.append((bs, as_, "kind (one candidate of this kind before)"))
            bs, as_ = [], []
        for c in bs:  # gone after the change: all of its time was saved
            pairs.append(([c], [], "no counterpart after"))
    if to_compiled:
        pairs += _match_compiled(left_b, left_a)
    return pairs


_LIBRARY_KINDS = {"gemm", "convolution", "attention", "communication"}
_LAYOUT = {
    "view",
    "unsafe_view",
    "to",
    "to_copy",
    "t",
    "permute",
    "expand",
    "clone",
    "reshape",
    "unbind",
    "select",
    "slice",
    "transpose",
    "contiguous",
    "copy",
}


def _bare(op: str) -> str:
    """``aten::native_layer_norm_backward`` → ``layer_norm``: one spelling for eager op names
    and the ops in Inductor's kernel names (backward kernels match their forward op)."""
    name = op.split("::")[-1].strip("_")
    for suffix in ("_backward_data", "_backward"):
        if name.endswith(suffix):
            name = name[: -len(suffix)]
    if name.startswith("native_"):
        name = name[len("native_") :]
    if name.endswith("_") and len(name) > 1:
        name = name[:-1]
    return {"embedding_dense": "embedding", "nll_loss_forward": "nll_loss"}.get(name, name)


def _numels(c: Candidate) -> set[int]:
    out = set()
    for op in c.example:
        for d, _ in tensor_inputs(op.get("dims"), op.get("types")):
            n = 1
            for x in d:
                n *= int(x)
            if n >= 4096:  # a weight of one row or a scalar says nothing
                out.add(n)
    return out


def _match_compiled(
    bs: list[Candidate], as_: list[Candidate]
) -> list[tuple[list[Candidate], list[Candidate], str]]:
    """Compiled candidates against the eager ones left after the exact keys.

    An Inductor kernel goes to the eager candidate whose ops it fuses (its name's ops against
    the candidate's ops, backward ops as their forward op) and whose tensors have its largest
    argument's size, the most shared ops first; a kernel that only moves data (casts,
    transposes) needs the size. Library kernels in compiled code (GEMMs, attention) and
    kernels no eager candidate claims are matched kind by kind, as totals."""
    pairs: list[tuple[list[Candidate], list[Candidate], str]] = []
    eager_ops = {id(b): {_bare(o) for o in b.ops} - _LAYOUT for b in bs}
    eager_sizes = {id(b): _numels(b) for b in bs}
    taken: dict[tuple[int, ...], list[Candidate]] = {}
    rest_a: list[tuple[str, Candidate]] = []  # (kind it counts under, candidate)
    for a in as_:
        fused = a.fused_ops if a.inductor else None
        if not fused:
            rest_a.append((a.kind, a))
            continue
        ops = {_bare(o) for o in fused} - _LAYOUT
        size = max(_numels(a), default=None)
        scored = []
        for b in bs:
            shared = len(ops & eager_ops[id(b)])
            sized = size is not None and size in eager_sizes[id(b)]
            layout_only = not ops or not eager_ops[id(b)]
            if (shared and sized) or shared >= 2 or (layout_only and sized):
                scored.append(((shared, sized), b))
        if not scored:
            rest_a.append((a.kind, a))
            continue
        top = max(k for k, _ in scored)
        best = sorted((b for k, b in scored if k == top), key=lambda b: -b.time_ms_per_step)
        if best[0].kind in _LIBRARY_KINDS:
            # A cast or transpose around a library GEMM or attention: compiled code runs the
            # library kernel too, so it joins that kind's total.
            rest_a.append((best[0].kind, a))
            continue
        # Eager candidates the kernel fits equally well (the same norm in two places) share it.
        group = tuple(sorted(id(b) for b in best if b.kind == best[0].kind))
        taken.setdefault(group, []).append(a)
    by_id = {id(b): b for b in bs}
    claimed: set[int] = set()
    for group, kernels in taken.items():
        members = [by_id[i] for i in group if i not in claimed]
        if not members:
            rest_a += [(k.kind, k) for k in kernels]
            continue
        claimed.update(id(b) for b in members)
        pairs.append((sorted(members, key=lambda b: -b.time_ms_per_step), kernels, "fused ops (Inductor)"))
    rest_b = [b for b in bs if id(b) not in claimed]
    for kind in sorted({c.kind for c in rest_b} | {k for k, _ in rest_a}):
        kb = [c for c in rest_b if c.kind == kind]
        ka = [c for k, c in rest_a if k == kind]
        if kb and ka:
            pairs.append((kb, ka, "kind total (compiled)"))
        else:
            pairs.extend(([c], [], "no counterpart after") for c in kb)
    return pairs


def _comparability(before: Report, after: Report) -> list[str]:
    warnings = []
    names = [r.gpu.name if r.gpu is not None else "unknown GPU" for r in (before, after)]
    if names[0] != names[1] or before.gpu is None:
        warnings.append(f"different GPUs (or none known): {names[0]} vs {names[1]}")
    if before.gpu is not None and after.gpu is not None and names[0] == names[1]:
        gpus = (before.gpu, after.gpu)
        bw = [g.bandwidth for g in gpus]
        # A ceiling raised by a run's own measured kernels (roofline.py) differs run by run by a
        # few percent: the bandwidth check below judges that; the base source must agree.
        base = [str(g.source).split("; raised by ")[0] for g in gpus]
        if before.gpu.resolved_by != after.gpu.resolved_by or base[0] != base[1]:
            warnings.append(
                f"the ceilings come from different sources (before: {before.gpu.resolved_by}, {before.gpu.source}; "
                f"after: {after.gpu.resolved_by}, {after.gpu.source}): 'of ceiling' figures are not comparable"
            )
        elif abs(bw[0] - bw[1]) > 0.05 * bw[0]:
            # Two calibrations of one GPU model differ by a few percent; more is another machine state.
            warnings.append(
                f"the calibrated bandwidths differ by {abs(bw[0] - bw[1]) / bw[0]:.0%} "
                f"({bw[0] / 1e9:.0f} vs {bw[1] / 1e9:.0f} GB/s): 'of ceiling' figures are not comparable"
            )
    timed = [bool(r.source.get("timing")) for r in (before, after)]
    if timed[0] != timed[1]:
        how = {True: "its plain steps (profile's step timing)", False: "its recorded steps"}
        warnings.append(
            f"step times measured differently: before from {how[timed[0]]}, after from {how[timed[1]]}: "
            "the step saving mixes profiler overhead into one side"
        )
    if before.steps != after.steps:
        warnings.append(f"different numbers of recorded steps: {before.steps} vs {after.steps}")
    vb, va = before.source.get("versions") or {}, after.source.get("versions") or {}
    for key in sorted(set(vb) & set(va)):
        if vb[key] != va[key]:
            warnings.append(f"different {key} versions: {vb[key]} vs {va[key]}")
    shapes_b = {main_shape(c) for c in before.candidates if c.kind in ("gemm", "embedding")} - {None}
    shapes_a = {main_shape(c) for c in after.candidates if c.kind in ("gemm", "embedding")} - {None}
    tokens_b = {s[0][:-1] for s in shapes_b if s and isinstance(s[0], tuple)}
    tokens_a = {s[0][:-1] for s in shapes_a if s and isinstance(s[0], tuple)}
    if tokens_b and tokens_a and not tokens_b & tokens_a:
        warnings.append(
            f"the runs process different batch/sequence shapes ({sorted(tokens_b)[:2]} vs {sorted(tokens_a)[:2]}): "
            "step times are not comparable"
        )
    return warnings
