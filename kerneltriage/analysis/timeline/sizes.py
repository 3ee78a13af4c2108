"""Problem sizes of kernel launches, as the trace records them: a launch's size is its
launching op's name with the op's recorded input shapes, types, strides and scalar values.

Two launches of one kernel and launch configuration with the same size do the same work, so
one profiled launch stands for both. This is what lets Nsight Compute profile a persistent
GEMM (one grid whatever the problem) once per problem size instead of at every launch: the
profiled process opens an NVTX range around the first call of each distinct op signature in
its step (``profile/first_of_size.py``), and the join maps each counter row onto the first
launch of its size (``first_of_size``) and from there onto every launch of that size.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from kerneltriage.ingest.tables import Timeline

#: The op columns that make up a size (indices into ``Timeline.args``, interned: equal values,
#: equal indices).
_SIZE_COLUMNS = ("dims", "types", "strides", "concrete")


def launch_sizes(timeline: Timeline, kernels: pd.DataFrame) -> np.ndarray:
    """Per row of ``kernels`` (an attribution table: ``op`` indexes ``timeline.cpu``): an id of
    its size, equal for equal sizes; -1 where the launching op or its shapes were not recorded."""
    ops = kernels["op"].to_numpy()
    out = np.full(len(ops), -1, dtype=np.int64)
    cpu = timeline.cpu
    if not len(ops) or cpu.empty:
        return out
    dims = cpu["dims"].to_numpy()
    known = ops >= 0
    known[known] = dims[ops[known]] >= 0
    if not known.any():
        return out
    at = ops[known]
    frame = pd.DataFrame(
        {"name": cpu["name"].to_numpy()[at], **{c: cpu[c].to_numpy()[at] for c in _SIZE_COLUMNS}}
    )
    out[known] = frame.groupby(["name", *_SIZE_COLUMNS], sort=False, dropna=False).ngroup().to_numpy()
    return out


def first_of_size(launches: pd.DataFrame, sizes: np.ndarray) -> np.ndarray:
    """Which rows of ``launches`` (kernel rows with ``step``, ``op`` and ``correlation``) were
    launched by the first op of their size in their step: the launches a process that profiles
    the first call of each op signature profiles. Rows of unknown size (-1) count as first:
    nothing says the process skipped them."""
    if not len(launches):
        return np.zeros(0, dtype=bool)
    frame = pd.DataFrame(
        {
            "step": launches["step"].to_numpy(),
            "op": launches["op"].to_numpy(),
            "size": sizes,
            "order": launches["correlation"].to_numpy(),
        }
    )
    sized = frame[frame["size"] >= 0].sort_values("order", kind="stable")
    first_ops = sized.drop_duplicates(["step", "size"])[["step", "op"]]
    chosen = set(zip(first_ops["step"].tolist(), first_ops["op"].tolist()))
    pairs = zip(frame["step"].tolist(), frame["op"].tolist())
    return np.fromiter(
        (size < 0 or pair in chosen for pair, size in zip(pairs, frame["size"].tolist())),
        dtype=bool,
        count=len(frame),
    )
