"""One launch configuration per elementwise instantiation: which op calls Nsight Compute may skip.

ATen's elementwise kernels (``vectorized_elementwise_kernel``, ``unrolled_elementwise_kernel``,
``elementwise_kernel``) give each thread the same few elements, so a launch's bytes and FLOPs
grow with its threads: counters measured at one size, scaled by the threads, stand for another
size of the same instantiation. A training step runs each instantiation at several sizes (T5-base:
83 of its 110 per-configuration launches were elementwise, of 27 instantiations), and every
profiled launch costs Nsight Compute about 0.5 s.

One exception: a launch whose data fits in L2 leaves its writes there, so its DRAM bytes are its
reads only (``benchmarks/probes/ncu_skip_ranges.py``, H200: a scalar multiply moved 32 B a
thread below L2 and 61 B above it). So each instantiation keeps the configuration holding most of
its time among its launches that move more than L2 holds, and likewise among those that move
less; the join (``join.py``) scales the others from the kept one nearest in threads.

The profiled process cannot see kernels, only ops: it opens an NVTX range that ncu is told to
exclude around the calls of ``skip`` ops (``profile/first_of_size.py``). An op is named by its
name and the shapes of its tensor arguments, as the trace records them (``op_key``), and is
skipped only where every launch under every call so named in the trace (its own and its
children's) is a hot elementwise launch of a configuration not kept, or a cold launch. A call
the process names differently is profiled: a mismatch costs time, never counters.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kerneltriage.analysis.timeline.attribution import attribute
from kerneltriage.analysis.timeline.hot_kernels import HotKernels
from kerneltriage.ingest.kernel_names import base_name
from kerneltriage.ingest.tables import LAUNCH_CONFIG, Timeline

#: ATen kernels that give every thread the same number of elements (not grid-stride loops):
#: their counters scale with their threads.
ELEMENTWISE_BASES = frozenset(
    {"vectorized_elementwise_kernel", "unrolled_elementwise_kernel", "elementwise_kernel"}
)


@dataclass
class OneSize:
    """What phase 2 skips: ``skip`` the op keys whose calls ncu excludes; ``scaled`` the
    instantiations (as the trace spells them) left with configurations to scale; ``skipped``
    the configurations of the hot kernels no longer profiled, ``skipped_by_base`` by base name
    (what a split over several GPUs balances)."""

    skip: list[tuple[str, tuple[tuple[int, ...], ...]]] = field(default_factory=list)
    scaled: list[str] = field(default_factory=list)
    skipped: int = 0
    skipped_by_base: dict[str, int] = field(default_factory=dict)


def op_key(name: str, dims: Any) -> tuple[str, tuple[tuple[int, ...], ...]]:
    """An op call's name and the shapes of its tensor arguments, in argument order, as the
    trace's ``Input Dims`` list them (scalars and 0-d tensors, both ``[]``, left out)."""
    return name, tuple(_shapes(dims))


def _shapes(dims: Any) -> list[tuple[int, ...]]:
    if not isinstance(dims, (list, tuple)) or not dims:
        return []
    if all(isinstance(d, int) and not isinstance(d, bool) for d in dims):
        return [tuple(int(d) for d in dims)]
    out: list[tuple[int, ...]] = []
    for d in dims:
        out += _shapes(d)
    return out


def one_size_per_instantiation(timeline: Timeline, hot: HotKernels, large_ns: float) -> OneSize:
    """The op calls phase 2's per-configuration pass may skip (see the module's docstring).
    ``large_ns``: a launch at least this long moves more than L2 holds (L2 over bandwidth)."""
    attr = attribute(timeline)
    k = attr.kernels
    k = k[(k["step"] >= 0) & (k["kind"] == "kernel")]
    if k.empty or timeline.cpu.empty:
        return OneSize()
    k = k.assign(base=k["name"].map(base_name))
    hot_rows = hot.chosen(k)
    elementwise = hot_rows & k["base"].isin(ELEMENTWISE_BASES - set(hot.variable))
    if not elementwise.any():
        return OneSize()
    ew = k[elementwise]
    per_config = ew.groupby(["name", *LAUNCH_CONFIG])["dur"].agg(["sum", "mean"]).reset_index()
    per_config["large"] = per_config["mean"] >= large_ns
    kept = per_config.loc[per_config.groupby(["name", "large"])["sum"].idxmax()]
    kept_keys = set(map(tuple, kept[["name", *LAUNCH_CONFIG]].itertuples(index=False, name=None)))
    config_keys = list(map(tuple, ew[["name", *LAUNCH_CONFIG]].itertuples(index=False, name=None)))
    droppable = np.zeros(len(k), dtype=bool)
    droppable[np.flatnonzero(elementwise.to_numpy())] = [key not in kept_keys for key in config_keys]

    # Op keys: every launch of every call so named must be droppable (a launch of another
    # kernel, or of no recorded op, keeps its op's calls). The process sees one op of each
    # launch's chain (the first below autograd that is not a composite: ``aten::clone`` for a
    # copy, ``aten::_to_copy`` for a cast), so the launching op's aten ancestors are named too.
    cpu = timeline.cpu
    parent = attr.cpu_parent
    names, dims, cats = cpu["name"].to_numpy(), cpu["dims"].to_numpy(), cpu["cat"].to_numpy()
    keys: dict[int, tuple | None] = {}

    def key_of(op: int) -> tuple | None:
        if op not in keys:
            keys[op] = op_key(str(names[op]), timeline.arg(int(dims[op]))) if dims[op] >= 0 else None
        return keys[op]

    def chain(op: int) -> list[tuple]:
        out = []
        while op >= 0 and cats[op] == "cpu_op" and str(names[op]).startswith("aten::"):
            key = key_of(op)
            if key is not None:
                out.append(key)
            op = int(parent[op])
        return out

    chains = [chain(int(op)) for op in k["op"].to_numpy()]
    verdict: dict[tuple, bool] = {}
    for named, drop in zip(chains, droppable.tolist()):
        for key in named:
            verdict[key] = verdict.get(key, True) and drop
    skip = sorted(key for key, drop in verdict.items() if drop)
    skipped_keys = set(skip)
    # A configuration no longer profiled: none of its launches is left outside a skipped call.
    profiled: set[tuple] = set()
    for named, key in zip([c for c, e in zip(chains, elementwise.to_numpy()) if e], config_keys):
        if not skipped_keys.intersection(named):
            profiled.add(key)
    left = {key for key in config_keys if key not in profiled}
    scaled = sorted({key[0] for key in left})
    by_base: dict[str, int] = {}
    for key in left:
        by_base[base_name(key[0])] = by_base.get(base_name(key[0]), 0) + 1
    return OneSize(skip=skip, scaled=scaled, skipped=len(left), skipped_by_base=by_base)
