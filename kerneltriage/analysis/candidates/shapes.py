"""Shape signatures of a candidate's instances and their stability.

A signature is the input shapes of an instance (q, k, v for attention regions); without
recorded shapes (Nsight Systems traces without shape records) the launch configurations
stand in. Stability is judged in ``verdict.py`` from the distinct signatures and their shares.
"""

from __future__ import annotations

from collections import Counter, defaultdict

import numpy as np
import pandas as pd

from kerneltriage.analysis.candidates.estimate import tensor_inputs
from kerneltriage.analysis.candidates.grouping import Group
from kerneltriage.analysis.model import Shapes
from kerneltriage.analysis.timeline.regions import Segment
from kerneltriage.ingest.tables import LAUNCH_CONFIG

_ROW_WISE = {"norm", "softmax", "elementwise", "reduction", "cross-entropy", "embedding"}


def candidate_shapes(g: Group, k: pd.DataFrame) -> Shapes:
    """The distinct shape signatures of ``g``'s instances (``k``: its kernels), most time first."""
    by_time: dict[tuple, float] = defaultdict(float)
    counts: Counter = Counter()
    fallback = False
    if g.segments:
        # An Inductor kernel's instance is its launch (anchored on its launch record).
        compiled = bool(g.attrs.get("inductor"))
        fr, root = k["fwd_root"].to_numpy(), k["root"].to_numpy()
        anchors = k["op"].to_numpy() if compiled else np.where(fr >= 0, fr, root)
        steps = k["step"].to_numpy()
        sums = pd.Series(k["dur"].to_numpy()).groupby([steps, anchors]).sum()
        seg_time = dict(zip(sums.index.tolist(), map(float, sums.tolist())))
        signatures = _signatures([seg for _, seg in g.segments])
        launches = _launch_configs(k, steps, anchors) if not all(signatures) else {}
        for (step, seg), sig in zip(g.segments, signatures):
            if not sig:
                # No recorded shapes (Nsight Systems without emit_nvtx shapes): judge stability
                # from the launch configurations instead.
                fallback = True
                configs = sorted(c for r in seg.rows for c in launches.get((step, r), []))
                sig = tuple((f"k{j}.grid+block", c) for j, c in enumerate(configs))
            t = sum(seg_time.get((step, r), 0.0) for r in seg.rows)
            by_time[sig] += t
            counts[sig] += 1
    else:
        for (gx, gy, gz, bx, by, bz), frame in k.groupby(LAUNCH_CONFIG):
            sig = (("grid", (gx, gy, gz)), ("block", (bx, by, bz)))
            by_time[sig] += float(frame["dur"].sum())
            counts[sig] += len(frame)
    total = sum(by_time.values()) or 1.0
    ordered = sorted(by_time, key=lambda s: -by_time[s])
    varying = _varying(ordered)
    return Shapes(
        distinct=len(ordered),
        dominant_coverage=0.0,  # filled in by verdict.decide, which knows max_shapes
        varying_dims=varying,
        signatures=[
            {"shape": _sig_text(s), "share": by_time[s] / total, "count": counts[s]} for s in ordered[:12]
        ],
        row_wise_stable=g.kind in _ROW_WISE
        and bool(ordered)
        and not fallback
        and not any(v.endswith("[-1]") for v in varying),
        from_launch_config=fallback or not g.segments,
    )


def _launch_configs(
    k: pd.DataFrame, steps: np.ndarray, anchors: np.ndarray
) -> dict[tuple[int, int], list[tuple[int, ...]]]:
    """Each instance's launch configurations (grid and block), in launch order."""
    launches: dict[tuple[int, int], list[tuple[int, ...]]] = defaultdict(list)
    columns = [k[c].tolist() for c in LAUNCH_CONFIG]
    for step, anchor, *cfg in zip(steps.tolist(), anchors.tolist(), *columns):
        if cfg[0] >= 0:
            launches[(step, anchor)].append(tuple(cfg))
    return launches


def _signatures(segments: list[Segment]) -> list[tuple]:
    """``_signature`` of each segment; instances of one shape (the trace interns argument
    lists) are read once."""
    known: dict[tuple, tuple] = {}
    out = []
    for seg in segments:
        if seg.kind == "attention" and seg.level == "region" and "q" in seg.attrs:
            out.append(_signature(seg))
            continue
        ops = seg.ops if seg.level == "op" else seg.ops[:1]
        key = tuple((id(op.dims), id(op.types)) for op in ops)
        if key not in known:
            known[key] = _signature(seg)
        out.append(known[key])
    return out


def _signature(seg: Segment) -> tuple:
    if seg.kind == "attention" and seg.level == "region" and "q" in seg.attrs:
        a = seg.attrs
        return (("q", tuple(a["q"])), ("k", tuple(a["k"])), ("v", tuple(a["v"])))
    ops = seg.ops if seg.level == "op" else seg.ops[:1]
    out = []
    for op in ops:
        for i, (d, _t) in enumerate(tensor_inputs(op.dims, op.types)):
            out.append((f"arg{i}", tuple(d)))
    return tuple(out)


def _varying(signatures: list[tuple]) -> list[str]:
    if len(signatures) < 2:
        return []
    varying = []
    names = [n for n, _ in signatures[0]]
    for pos, name in enumerate(names):
        dims = [s[pos][1] for s in signatures if len(s) > pos]
        if len({len(d) for d in dims}) > 1:
            varying.append(f"{name}.rank")
            continue
        for j in range(len(dims[0])):
            if len({d[j] for d in dims}) > 1:
                varying.append(f"{name}[{j - len(dims[0])}]" if j == len(dims[0]) - 1 else f"{name}[{j}]")
    return varying


def _sig_text(sig: tuple) -> str:
    return " ".join(f"{n}={'x'.join(map(str, d))}" for n, d in sig)
