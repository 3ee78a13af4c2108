"""Grouping: ops and regions of every step into candidate groups.

Each step's forward ops are segmented into fused regions and single ops (``regions.py``;
ops inside a named region form one segment). Segments are grouped across layers and steps by
(kind, variant, ops, key shape); backward kernels join their forward op's group; optimizer
kernels, ops without a forward op, communication and unattributed kernels form groups of
their own. A ``Group`` names its candidate and holds the kernels and instances it covers.
"""

from __future__ import annotations

import copy
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from kerneltriage.analysis.candidates.estimate import tensor_inputs
from kerneltriage.analysis.candidates.labels import compiled_kernel_label, kernel_label, segment_name
from kerneltriage.analysis.rules import Rules
from kerneltriage.analysis.timeline.attribution import Attribution
from kerneltriage.analysis.timeline.compiled import FLAVOURS, decode_inductor, inductor_work
from kerneltriage.analysis.timeline.op_kinds import RootKinds
from kerneltriage.analysis.timeline.regions import OpInfo, Segment, enclosing_module, segment
from kerneltriage.ingest.kernel_names import base_name
from kerneltriage.ingest.tables import Timeline

_BACKWARD_PREFIX = "autograd::engine::evaluate_function: "
# The kernel columns grouping reads.
_COLUMNS = ["name", "kind", "step", "phase", "op", "root", "fwd_root", "dur", "module", "region"]


@dataclass
class Group:
    """The kernels and instances of one candidate, before any number is computed."""

    key: tuple
    kind: str
    level: str
    variant: str | None = None
    name: str = ""
    ops: list[str] = field(default_factory=list)
    segments: list[tuple[int, Segment]] = field(default_factory=list)  # (step, segment)
    kernel_index: list[int] = field(default_factory=list)
    library: bool = False
    attrs: dict[str, Any] = field(default_factory=dict)
    full_name: str | None = None  # the kernel's own name where ``name`` shortens it (a mangled symbol)


def _compute_types(
    timeline: Timeline, attr: Attribution, roots: set[int], rules: Rules
) -> dict[int, str | None]:
    """The dtype a GEMM-like top-level op computes in: its innermost matmul's input type
    (the rules' ``regions.gemm_leaf_ops``; under autocast ``aten::linear`` sees float inputs
    and casts them inside). Of several, the last in row order."""
    types = timeline.cpu["types"].to_numpy()
    out: dict[int, str | None] = dict.fromkeys(roots)
    leaves = np.flatnonzero(attr.cpu_name_mask(lambda n: rules.match(n, "gemm_leaf_ops")) & (types >= 0))
    for c, r in zip(leaves.tolist(), attr.cpu_root[leaves].tolist()):
        if r in out:
            t = timeline.arg(int(types[c]))
            if t:
                out[r] = t[0]
    return out


def group_candidates(timeline: Timeline, attr: Attribution, rules: Rules) -> dict[tuple, Group]:
    """Groups by key: every in-step kernel in exactly one of them."""
    names = attr.cpu_names
    op_info = _op_info_maker(timeline)
    k = attr.kernels
    in_step = k[_COLUMNS][k["step"].to_numpy() >= 0]
    groups: dict[tuple, Group] = {}

    # Communication kernels are their own candidates, whatever op launched them: they are
    # never a Triton candidate, and folding them into that op would hide them.
    communication = [rules.classify(None, n) == "communication" for n in attr.kernel_name_uniques]
    comm_names = {n for n, c in zip(attr.kernel_name_uniques, communication) if c}
    is_comm = np.append(np.array(communication, dtype=bool), False)[attr.kernel_name_codes]
    comm = pd.Series(is_comm[in_step.index.to_numpy()], index=in_step.index) & (in_step["kind"] == "kernel")
    fwd_mask = (in_step["fwd_root"] >= 0) & in_step["phase"].isin(["fwd", "bwd"]) & ~comm
    fwd = in_step[fwd_mask]
    kinds = RootKinds.of(fwd, rules, names, attr)

    # Compiled graphs (torch.compile) are not one opaque op: their kernels are candidates
    # kernel by kernel (below, with the rest).
    compiled_roots = {int(r) for r in fwd["fwd_root"].unique() if rules.match(names[r], "compiled_ops")}
    if compiled_roots:
        fwd_mask &= ~in_step["fwd_root"].isin(compiled_roots)
        fwd = in_step[fwd_mask]

    row_group = _group_forward_ops(groups, fwd, timeline, attr, rules, kinds, op_info)
    # Kernels of forward/backward work: their forward op's group (one lookup per instance).
    steps, roots = fwd["step"].to_numpy(), fwd["fwd_root"].to_numpy()
    codes, pairs = pd.factorize(steps * (len(names) + 1) + roots)
    keys = list(groups)
    number = {key: i for i, key in enumerate(keys)}
    of_pair = np.array(
        [number[row_group[(int(p) // (len(names) + 1), int(p) % (len(names) + 1))]] for p in pairs],
        dtype=np.int64,
    )
    for i, part in _split_by(of_pair[codes], fwd.index.to_numpy()):
        groups[keys[i]].kernel_index.extend(part.tolist())

    rest = in_step[~fwd_mask]
    launches = _group_other_kernels(groups, rest, rules, names, comm_names, compiled_roots, op_info)
    for key, rows in launches.items():
        if groups[key].attrs.get("inductor"):
            _inductor_segments(groups[key], rows, timeline, rules, names)
        else:
            _launch_op_segments(groups[key], rows, rules, names, op_info)
    _dominant_first(groups, fwd)
    return {key: g for key, g in groups.items() if g.kernel_index}


def _split_by(codes: np.ndarray, values: np.ndarray) -> list[tuple[int, np.ndarray]]:
    """``values`` split by their code, in code order, each part in its original order."""
    order = np.argsort(codes, kind="stable")
    held, first = np.unique(codes[order], return_index=True)
    return list(zip(held.tolist(), np.split(values[order], first[1:])))


def _op_info_maker(timeline: Timeline) -> Callable[..., OpInfo]:
    """``op_info(row, name, kind, compute_type=None)``: an ``OpInfo`` with the shapes, types
    and concrete inputs the trace recorded for CPU op ``row``."""
    cpu = timeline.cpu
    dims_ix, types_ix, concrete_ix, strides_ix = (
        cpu[c].to_numpy() for c in ("dims", "types", "concrete", "strides")
    )

    def op_info(row: int, name: str, kind: str, compute_type: str | None = None) -> OpInfo:
        return OpInfo(
            row,
            name,
            kind,
            timeline.arg(int(dims_ix[row])),
            timeline.arg(int(types_ix[row])),
            timeline.arg(int(concrete_ix[row])),
            compute_type,
            strides=timeline.arg(int(strides_ix[row])),
        )

    return op_info


def _group_forward_ops(
    groups: dict[tuple, Group],
    fwd: Any,
    timeline: Timeline,
    attr: Attribution,
    rules: Rules,
    kinds: RootKinds,
    op_info: Callable[..., OpInfo],
) -> dict[tuple[int, int], tuple]:
    """Each step's forward top-level ops segmented (regions, single ops) into ``groups``;
    returns the group key of every (step, forward top-level op row)."""
    names = kinds.names
    cpu = timeline.cpu
    starts = cpu["start"].to_numpy()
    arguments = np.stack([cpu[c].to_numpy() for c in ("dims", "types", "concrete")], axis=1)
    row_group: dict[tuple[int, int], tuple] = {}
    compute_types = _compute_types(timeline, attr, set(fwd["fwd_root"].unique().tolist()), rules)
    # Steps repeat: a sequence of ops is segmented once, and its cuts serve every step that
    # runs the same ops with the same shapes.
    cuts: dict[tuple, list[_Cut] | None] = {}
    for step, roots in _split_by(fwd["step"].to_numpy(), fwd["fwd_root"].to_numpy()):
        rows = sorted(set(roots.tolist()), key=lambda r: starts[r])
        ops = []
        for r in rows:
            kind, boundary = kinds.kind(r)
            info = op_info(r, names[r], kind, compute_types.get(r))
            info.boundary = boundary
            info.module = attr.cpu_module[r]
            ops.append(info)
        region_of = [attr.cpu_region[r] for r in rows]
        sequence = tuple(
            zip(
                (o.name for o in ops),
                (o.kind for o in ops),
                (o.boundary for o in ops),
                (o.module for o in ops),
                (o.compute_type for o in ops),
                region_of,
                map(tuple, arguments[rows].tolist()),
            )
        )
        known = cuts.get(sequence)
        if known is None:
            segments = _segments_with_regions(ops, region_of, rules)
            keys = [_segment_key(seg) for seg in segments]
            if sequence not in cuts:
                cuts[sequence] = _cuts(segments, keys, ops)
        else:
            segments = [cut.segment(ops) for cut in known]
            keys = [cut.key for cut in known]
        for seg, key in zip(segments, keys):
            g = groups.get(key)
            if g is None:
                g = groups[key] = _new_group(key, seg, rules)
            g.segments.append((int(step), seg))
            if seg.level == "region" and seg.kind != "attention":
                _note_enclosing_module(g, seg)
            for r in seg.rows:
                row_group[(int(step), r)] = key
    return row_group


@dataclass
class _Cut:
    """One segment of a step's ops, as a template: its place among the ops and all it holds
    but them."""

    start: int
    stop: int
    level: str
    kind: str
    variant: str | None
    attrs: dict[str, Any]
    ideal: Any
    key: tuple
    label: str
    stats_bytes: float = 0.0

    def segment(self, ops: list[OpInfo]) -> Segment:
        attrs = copy.deepcopy(self.attrs) if self.attrs else {}
        return Segment(
            self.level,
            self.kind,
            self.variant,
            ops[self.start : self.stop],
            attrs,
            copy.copy(self.ideal),
            self.label,
            self.stats_bytes,
        )


def _cuts(segments: list[Segment], keys: list[tuple], ops: list[OpInfo]) -> list[_Cut] | None:
    """``segments`` of ``ops`` as templates; None when one is not a run of consecutive ops."""
    out = []
    at = {id(op): i for i, op in enumerate(ops)}
    for seg, key in zip(segments, keys):
        start = at.get(id(seg.ops[0]), -1) if seg.ops else -1
        stop = start + len(seg.ops)
        if start < 0 or any(a is not b for a, b in zip(seg.ops, ops[start:stop])) or stop > len(ops):
            return None
        out.append(
            _Cut(
                start,
                stop,
                seg.level,
                seg.kind,
                seg.variant,
                copy.deepcopy(seg.attrs),
                copy.copy(seg.ideal),
                key,
                segment_name(seg),
                seg.stats_bytes,
            )
        )
    return out


def _note_enclosing_module(g: Group, seg: Segment) -> None:
    """The modules a compile must cover to fuse every instance of the region (layers folded)."""
    holder = enclosing_module(seg.ops)
    holder = holder and re.sub(r"\.\d+(?=\.|:|$)", ".*", holder)
    held = g.attrs.setdefault("enclosing_modules", [])
    if holder and holder not in held:
        held.append(holder)


def _group_other_kernels(
    groups: dict[tuple, Group],
    rest: Any,
    rules: Rules,
    names: Any,
    comm_names: set[str],
    compiled_roots: set[int],
    op_info: Callable[..., OpInfo],
) -> dict[tuple, list[tuple[int, int]]]:
    """The rest into ``groups``: optimizer ops, backward ops with no forward op, communication,
    compiled-graph, annotated or bare kernels. Returns each compiled group's launches (step,
    launch op row)."""
    seen_roots: set[tuple[int, int]] = set()
    launches: dict[tuple, list[tuple[int, int]]] = {}
    for index, step, phase, root, fwd_root, name, region, module, activity, launch_op in zip(
        rest.index,
        rest["step"].tolist(),
        rest["phase"].tolist(),
        rest["root"].tolist(),
        rest["fwd_root"].tolist(),
        rest["name"].tolist(),
        rest["region"].tolist(),
        rest["module"].tolist(),
        rest["kind"].tolist(),
        rest["op"].tolist(),
    ):
        root_name = names[root] if root >= 0 else None
        kind, label, key, level = _other_kernel_key(
            name,
            activity,
            phase,
            root_name,
            region,
            module,
            rules,
            communication=name in comm_names and activity == "kernel",
            compiled=int(fwd_root) in compiled_roots
            or (root_name is not None and rules.match(root_name, "compiled_ops")),
        )
        g = groups.get(key)
        if g is None:
            g = groups[key] = _new_other_group(key, kind, level, label, name, activity, rules)
        if key[0] == "compiled":
            launches.setdefault(key, []).append((step, int(launch_op)))
        if level == "op" and (step, root) not in seen_roots:
            # The op itself is the instance (optimizer ops, backward ops with no forward).
            seen_roots.add((step, root))
            g.segments.append((step, Segment("op", kind, None, [op_info(root, label, kind)])))
        g.kernel_index.append(index)
    return launches


def _other_kernel_key(
    name: str,
    activity: str,
    phase: str,
    root_name: str | None,
    region: Any,
    module: Any,
    rules: Rules,
    *,
    communication: bool,
    compiled: bool,
) -> tuple[str, str, tuple, str]:
    """(kind, label, group key, level) of a kernel outside the forward ops' groups."""
    if communication:
        kind, label = "communication", base_name(name)
        return kind, label, ("kernel", kind, label), "kernel"
    if compiled:
        # A kernel of a compiled graph: one candidate per distinct kernel.
        kind = rules.kernel_kind(name, activity)
        label = compiled_kernel_label(kernel_label(name), rules.regions.inductor_op_names)
        return kind, label, ("compiled", kind, base_name(name)), "kernel"
    if root_name is not None:
        label = root_name
        if label.startswith(_BACKWARD_PREFIX):
            label = label[len(_BACKWARD_PREFIX) :]
        kind = rules.classify_op(label) or rules.classify(None, name, activity)
        return kind, label, ("op", kind, label, phase == "opt"), "op"
    region = region if isinstance(region, str) else None  # NaN: no region (pandas' missing)
    module = module if isinstance(module, str) else None
    if region is not None or module is not None:
        # Kernels launched from Python inside a module or region (Triton kernels): one
        # candidate per place in the model, layers folded (blocks.0.attn → blocks.*.attn).
        place = region or module_label([module])
        assert place is not None  # one module: always a label
        kind = rules.classify(None, name, activity)
        return kind, place, ("annotation", place, kind), "region"
    kind = rules.classify(None, name, activity)
    label = kernel_label(name)
    return kind, label, ("kernel", kind, label), "kernel"


def _new_other_group(
    key: tuple, kind: str, level: str, label: str, name: str, activity: str, rules: Rules
) -> Group:
    g = Group(key, kind, level, name=label, ops=[label] if level == "op" else [])
    if level == "kernel" and name.strip().startswith("_Z"):
        g.full_name = name.strip()  # labelled by its demangled head and a digest (kernel_label)
    g.library = level == "op" and rules.is_library_op(label)
    if key[0] == "compiled":
        g.attrs["compiled"] = True
        if rules.kernel_class(name, activity).library == "Inductor":
            g.attrs["inductor"] = True
    return g


_SHAPED_KINDS = ("gemm", "attention", "convolution")


def _launch_op_segments(g: Group, launches: list[tuple[int, int]], rules: Rules, names, op_info) -> None:
    """A library kernel inside a compiled graph (a hipBLASLt GEMM, an attention kernel) is
    launched by an aten op that recorded its shapes (the kernel's launch shares its External
    id / correlation): each launch is an instance with that op's shapes. Only where every launch
    has such an op of the kernel's own kind; otherwise the group keeps no instances."""
    if g.kind not in _SHAPED_KINDS or not launches:
        return
    segments = []
    for step, row in launches:
        if row < 0 or rules.classify_op(names[row]) != g.kind:
            return
        info = op_info(row, names[row], g.kind)
        if not tensor_inputs(info.dims, info.types):
            return
        segments.append((step, Segment("op", g.kind, None, [info])))
    g.segments = segments
    g.ops = sorted({s.ops[0].name for _, s in segments})
    g.attrs["shapes_from"] = "launching op (External id)"


def _inductor_segments(
    g: Group, launches: list[tuple[int, int]], timeline: Timeline, rules: Rules, names
) -> None:
    """One instance per launch of an Inductor kernel, with the work its arguments imply.

    Inductor's launch record (a profiler range named after the kernel) carries the kernel's
    arguments: the fused ops' external inputs and outputs. Launches recorded without them
    (a trace whose shapes step ran fewer ops) borrow the arguments of the kernel's most
    frequent recorded launch: one generated kernel serves one set of static shapes. With no
    recorded launch at all, the estimate is unavailable and ``attrs["estimate"]`` says why."""
    cpu = timeline.cpu
    label = base_name(g.key[2])
    vocab = rules.regions.inductor_op_names
    decoded = decode_inductor(label, vocab)
    if decoded is not None:
        g.attrs["inductor_flavour"] = FLAVOURS[decoded[0]]
        g.attrs["fused_ops"] = decoded[1]
    recorded: dict[tuple, tuple[Any, Any, Any, Any]] = {}
    per_launch: list[tuple[int, int, tuple | None]] = []
    for step, row in launches:
        sig = None
        if row >= 0 and names[row] == label:
            dims = timeline.arg(int(cpu["dims"].iat[row]))
            types = timeline.arg(int(cpu["types"].iat[row]))
            if isinstance(dims, list) and dims:
                strides = timeline.arg(int(cpu["strides"].iat[row]))
                concrete = timeline.arg(int(cpu["concrete"].iat[row]))
                sig = (repr(dims), repr(types), repr(strides))
                recorded.setdefault(sig, (dims, types, strides, concrete))
        per_launch.append((step, row, sig))
    if not recorded:
        g.attrs["estimate"] = (
            "the trace records no arguments for this kernel's launches"
            if decoded is not None
            else "the kernel's name does not say which ops it fuses (an Inductor name of PyTorch 2.0: "
            "triton__0d1d2d…) and the trace records no arguments for its launches"
        )
        return
    counts: dict[tuple, int] = {}
    for _, _, sig in per_launch:
        if sig is not None:
            counts[sig] = counts.get(sig, 0) + 1
    common = max(counts, key=counts.__getitem__)
    works: dict[tuple, Any] = {}
    why = ""
    for sig, (dims, types, strides, _) in recorded.items():
        works[sig], why = inductor_work(label, dims, types, strides, vocab)
    if any(w is None for w in works.values()):
        g.attrs["estimate"] = why
        return
    borrowed = 0
    for step, row, sig in per_launch:
        if row < 0:
            continue  # no launch op in the trace: nothing to anchor the instance to
        if sig is None:
            sig, borrowed = common, borrowed + 1
        dims, types, strides, concrete = recorded[sig]
        op = OpInfo(row, label, g.kind, dims, types, concrete, strides=strides)
        g.segments.append((step, Segment("region", g.kind, None, [op], {}, works[sig])))
    if borrowed:
        g.attrs["arguments_borrowed"] = borrowed


def _dominant_first(groups: dict[tuple, Group], fwd) -> None:
    """Name a group, and give its example, after the instance shape that holds most of its
    time, not the first one seen (TimeSformer's attention runs 3% of its time at one shape
    and 97% at another)."""
    sums = (
        pd.Series(fwd["dur"].to_numpy()).groupby([fwd["step"].to_numpy(), fwd["fwd_root"].to_numpy()]).sum()
    )
    time_of = dict(zip(sums.index.tolist(), sums.tolist()))
    for g in groups.values():
        if len(g.segments) < 2 or g.level == "kernel":
            continue
        by_shape: dict[str, float] = {}
        first_of: dict[str, tuple[int, Segment]] = {}
        for step, seg in g.segments:
            label = segment_name(seg)
            by_shape[label] = by_shape.get(label, 0.0) + sum(time_of.get((step, r), 0.0) for r in seg.rows)
            first_of.setdefault(label, (step, seg))
        best = max(by_shape, key=by_shape.__getitem__)
        if best == g.name or "region" in g.attrs:
            continue
        step, seg = first_of[best]
        g.segments.remove((step, seg))
        g.segments.insert(0, (step, seg))
        g.name = best
        if seg.level == "region" and seg.kind == "attention":
            g.attrs.update(seg.attrs)


def _segments_with_regions(ops: list[OpInfo], region_of: list[str | None], rules: Rules) -> list[Segment]:
    """Ops inside one named region (kerneltriage.region or a user record_function) form one
    segment; the rest is segmented structurally."""
    out: list[Segment] = []
    i = 0
    while i < len(ops):
        name = region_of[i]
        if name is None:
            j = i
            while j < len(ops) and region_of[j] is None:
                j += 1
            out.extend(segment(ops[i:j], rules))
            i = j
            continue
        j = i
        while j < len(ops) and region_of[j] == name:
            j += 1
        inner = segment(ops[i:j], rules)
        if len(inner) == 1:
            inner[0].attrs["region"] = name
            out.extend(inner)
        else:
            kinds = [s.kind for s in inner]
            kind = (
                "attention"
                if "attention" in kinds
                else next(
                    (k for k in ("norm", "gemm", *rules.regions.kind_priority) if k in kinds),
                    "other",
                )
            )
            out.append(Segment("region", kind, None, ops[i:j], {"region": name}, None))
        i = j
    return out


def _key_shape(seg: Segment) -> tuple:
    if seg.kind == "attention" and seg.level == "region":
        a = seg.attrs
        return (a.get("heads"), a.get("head_dim"), a.get("dtype"), a.get("mask"), a.get("softcap"))
    op = seg.ops[0]
    tensors = tensor_inputs(op.dims, op.types)
    if not tensors:
        return ()
    key: list[tuple[Any, ...]] = [("x", tensors[0][0][-1] if tensors[0][0] else None, tensors[0][1])]
    for d, t in tensors[1:]:
        key.append(("p", tuple(d), t) if len(d) <= 2 else ("x", d[-1] if d else None, t))
    return tuple(key)


def _segment_key(seg: Segment) -> tuple:
    if seg.level == "op":
        return ("op", seg.kind, seg.ops[0].name, _key_shape(seg))
    return ("region", seg.kind, seg.variant, seg.attrs.get("region"), seg.signature_ops, _key_shape(seg))


def _new_group(key: tuple, seg: Segment, rules: Rules) -> Group:
    g = Group(key, seg.kind, seg.level, seg.variant, ops=list(seg.signature_ops), attrs=dict(seg.attrs))
    g.library = seg.level == "op" and rules.is_library_op(seg.ops[0].name)
    g.name = segment_name(seg)
    return g


def module_label(modules: list[str]) -> str | None:
    """``blocks.0.attn:Attention``, ``blocks.1.attn:Attention`` → ``blocks.*.attn (Attention)``."""
    modules = [m for m in modules if isinstance(m, str)]  # NaN: a missing module
    if not modules:
        return None
    counts = Counter(re.sub(r"\.\d+(?=\.|:|$)", ".*", m) for m in modules)
    label, _ = counts.most_common(1)[0]
    path, _, cls = label.partition(":")
    return f"{path} ({cls})" if cls else path
