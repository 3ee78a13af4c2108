"""What a Kineto trace holds that the analysis cannot use as it is, repaired in place with a
warning: correlation ids several CUDA calls share, External ids ops of different names share
(a trace rewritten or merged), and a clock that runs below zero.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from kerneltriage.errors import TraceFormatError
from kerneltriage.ingest.tables import Timeline


def drop_colliding_correlations(timeline: Timeline) -> None:
    """Each CUDA runtime call has a correlation id of its own (a kernel shares its launch's,
    several kernels one graph launch's). An id that several runtime calls share cannot say
    which launched a kernel: those links are dropped (-1), with a warning; when most launches
    collide, nothing could be matched and the trace is refused."""
    runtime = timeline.runtime
    if len(runtime) < 2:
        return
    # The same call written twice (a trace merged twice) is one call: the invariants drop it.
    calls_of = runtime.loc[runtime["correlation"] > 0, ["correlation", "pid", "tid", "start", "dur"]]
    ids = calls_of.drop_duplicates()["correlation"]
    counts = ids.value_counts()
    shared = counts[counts > 1]
    if shared.empty:
        return
    calls = int(shared.sum())
    worst, times = int(shared.index[0]), int(shared.iloc[0])
    if calls > 0.5 * len(ids):
        raise TraceFormatError(
            f"{calls} of {len(ids)} CUDA runtime calls share their correlation ids (id {worst}: "
            f"{times} calls): kernels cannot be matched to their launches (a rewritten trace?)",
            path=timeline.source,
        )
    colliding = shared.index.to_numpy()
    runtime.loc[runtime["correlation"].isin(colliding), "correlation"] = -1
    kernels = timeline.kernels
    kernels.loc[kernels["correlation"].isin(colliding), "correlation"] = -1
    timeline.warnings.append(
        f"correlation id collisions: {len(colliding)} id(s) shared by {calls} CUDA runtime calls "
        f"(id {worst}: {times} calls): their kernels are not linked to a launch"
    )


def drop_colliding_ids(timeline: Timeline) -> None:
    """Kineto gives every CPU op an External id of its own, and a launch its op's id. Ids that
    several ops of different names share (a rewritten or merged trace) would put one op's
    kernels on another: they are dropped (-1) from the ops and launches that hold them, so
    the kernels are placed on the op that ran when they were launched, with a warning."""
    cpu = timeline.cpu
    if cpu.empty:
        return
    ext = cpu["ext_id"].to_numpy()
    ops = np.flatnonzero((cpu["cat"] == "cpu_op").to_numpy() & (ext > 0))
    if len(ops) < 2:
        return
    repeated = pd.Series(ext[ops]).duplicated(keep=False).to_numpy()
    if not repeated.any():
        return
    shared = cpu.iloc[ops[repeated]]
    names = shared.groupby("ext_id")["name"].nunique()
    colliding = names[names > 1]
    if colliding.empty:
        return
    ids = colliding.index.to_numpy()
    worst = int(shared["ext_id"].value_counts().loc[ids].idxmax())
    holders = shared.loc[shared["ext_id"] == worst, "name"].astype(str)
    n_ops = int(shared["ext_id"].isin(ids).sum())
    cpu.loc[cpu["ext_id"].isin(ids), "ext_id"] = -1
    runtime = timeline.runtime
    if len(runtime):
        runtime.loc[runtime["ext_id"].isin(ids), "ext_id"] = -1
    examples = ", ".join(sorted(set(holders))[:3])
    timeline.warnings.append(
        f"External id collisions: {len(ids)} id(s) shared by CPU ops of different names ({n_ops} ops; "
        f"External id {worst} by {len(holders)} ops such as {examples}): those ids are ignored, and "
        "their kernels are placed on the op running when they were launched"
    )


def from_zero(timeline: Timeline) -> None:
    """Timestamps are read relative to the trace: a trace whose clock is negative (a valid
    trace shifted, or a clock of another origin) is moved to start at 0, since a negative
    time means "no launch" to the attribution. Durations and order are unchanged."""
    tables = [timeline.kernels, timeline.runtime, timeline.cpu, timeline.gpu_annotations]
    starts = [int(t["start"].min()) for t in tables if len(t)]
    if not starts or min(starts) >= 0:
        return
    offset = -min(starts)
    for table in tables:
        if len(table):
            table["start"] = table["start"] + offset
