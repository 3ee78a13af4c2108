"""Which kernels phase 2 (Nsight Compute) profiles: the hot kernels of the phase-1 timeline.

The kernels covering ``coverage`` of GPU time in the recorded steps (capped by
``max_kernels`` base names), communication kernels left out: ncu serializes kernels, which can
hang collectives. Kernels are counted as instantiations (full names): one template's
instantiations run different ops (``vectorized_elementwise_kernel`` of a multiply, of a copy,
of a fill…), and the cold ones need no counters; each costs ncu a launch per configuration.

Kernels whose one launch configuration runs several problem sizes are listed apart, for a pass
that profiles every launch, within a budget of launches per step; those the budget cannot hold
are named with their launch counts, never dropped silently.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field

import pandas as pd

from kerneltriage.analysis.candidates.estimate import TENSOR_PRECISION, kernel_precision
from kerneltriage.analysis.kernel_classes import memory_bound
from kerneltriage.analysis.rules import Rules
from kerneltriage.analysis.timeline.attribution import attribute
from kerneltriage.analysis.timeline.sizes import first_of_size as first_of_size_mask
from kerneltriage.analysis.timeline.sizes import launch_sizes
from kerneltriage.ingest.kernel_names import base_name
from kerneltriage.ingest.tables import LAUNCH_CONFIG, Timeline


@dataclass
class HotKernels:
    names: list[str]  # base names, hottest first
    configs: int  # distinct (kernel, grid, block) among them in one step: the expected row count
    coverage: float  # share of in-step GPU kernel time they cover
    left_out: list[str]  # communication kernels excluded on purpose
    # Kernels whose one launch configuration runs different problem sizes (persistent GEMMs
    # launch #SMs blocks whatever the size): one profiled launch cannot stand for the others,
    # so a pass of its own, run first, profiles every launch of these in the step.
    variable: list[str] = field(default_factory=list)
    variable_launches: int = 0
    variable_configs: int = 0  # the configurations of ``configs`` that belong to ``variable``
    # Variable-size kernels the launch budget could not hold (base name -> launches per step):
    # they get one launch per configuration, whose counters fit only launches of that size.
    over_budget: dict[str, int] = field(default_factory=dict)
    # The tensor-core source precisions ("bf16", "fp16", "tf32", "fp8", "fp64") the hot kernels
    # can run, from their launching ops' input types and their names; None when some hot
    # kernel that may use tensor cores has no recorded types (then every precision is counted).
    tensor_precisions: list[str] | None = None
    # The every-launch pass profiles the first launch of each problem size only (the process
    # marks the first call of each op signature: ``sizes.py``); ``variable_launches`` then
    # counts those, ``variable_every`` every launch of the variable kernels a step.
    variable_first_of_size: bool = False
    variable_every: int = 0
    # Base names of which only some instantiations are hot -> those (full names, as the trace
    # spells them); a base name not in it is profiled whole.
    instances: dict[str, list[str]] = field(default_factory=dict)
    # Per-configuration kernels (not ``variable``) all of whose hot instantiations are
    # memory-bound by what they compute (``kernel_classes.memory_bound``), and their configurations of
    # ``configs``: their FLOPs never set their ceiling (``ncu_passes.py``).
    light: list[str] = field(default_factory=list)
    light_configs: int = 0

    def chosen(self, frame: pd.DataFrame) -> pd.Series:
        """Which kernel rows (``name``, ``base``) are the hot kernels' launches."""
        picked = frame["base"].isin(self.names)
        if self.instances:
            partial = frame["base"].isin(self.instances)
            named = frame["name"].isin({n for names in self.instances.values() for n in names})
            picked &= ~partial | named
        return picked


#: Launches of one (kernel, grid, block) whose durations differ by more than this factor run
#: different problem sizes.
VARIABLE_SPREAD = 2.0
#: ... and only when they take at least this share of the step's kernel time.
VARIABLE_MIN_SHARE = 0.02
#: Launches per step the every-launch pass may take. Each costs about 0.32 s of ncu time on an
#: H200 with the roofline metrics (BENCHMARKS.md), so 256 ≈ 80 s. The 8-layer Llama of the
#: profiling issue needs 113 (two persistent GEMMs, 56 and 57 launches a step); 48, the old
#: budget, left both without counters.
MAX_VARIABLE_LAUNCHES = 256


def select_hot_kernels(
    timeline: Timeline,
    rules: Rules,
    *,
    coverage: float,
    max_kernels: int,
    max_variable_launches: int = MAX_VARIABLE_LAUNCHES,
    first_of_size: bool = False,
) -> HotKernels:
    """The base names of the kernels covering ``coverage`` of GPU kernel time in the steps;
    ``rules`` tell communication kernels apart.

    ``first_of_size``: the every-launch pass can profile the first launch of each problem size
    (an eager single-process script); it does when the trace recorded the size of every launch
    of the variable kernels, and the launch budget then counts those launches only."""
    attr = attribute(timeline)
    k = attr.kernels
    k = k[(k["step"] >= 0) & (k["kind"] == "kernel")]
    if k.empty:
        return HotKernels([], 0, 0.0, [])
    k = k.assign(base=k["name"].map(base_name))
    k = k.assign(kindof=[rules.classify(None, n) for n in k["name"]])
    comm = sorted(set(k.loc[k["kindof"] == "communication", "base"]))
    compute = k[k["kindof"] != "communication"]
    by_name = compute.groupby("name")["dur"].sum().sort_values(ascending=False)
    total = float(by_name.sum()) or 1.0
    base_of = compute.drop_duplicates("name").set_index("name")["base"]
    picked: dict[str, list[str]] = {}  # base name -> its hot instantiations, hottest first
    covered = 0.0
    for name, dur in by_name.items():
        if covered / total >= coverage:
            break
        base = str(base_of[name])
        if base not in picked and len(picked) >= max_kernels:
            continue
        picked.setdefault(base, []).append(str(name))
        covered += float(dur)
    base_time = compute[compute["base"].isin(picked)].groupby("base")["dur"].sum()
    chosen = sorted(picked, key=lambda b: -float(base_time[b]))
    every = compute.groupby("base")["name"].nunique()
    instances = {b: names for b, names in picked.items() if len(names) < int(every[b])}
    step_rows = compute[compute["step"] == compute["step"].min()]
    one_step = step_rows[HotKernels(chosen, 0, 0.0, [], instances=instances).chosen(step_rows)]
    key = ["name", *LAUNCH_CONFIG]
    # Kernels whose one configuration runs several sizes, if they matter: heaviest first, as
    # long as profiling every launch of their base name stays within the launch budget.
    groups = one_step.groupby(key)["dur"]
    spread = groups.max() / groups.min().clip(lower=1)
    weight = groups.sum() / max(1.0, float(one_step["dur"].sum()))
    heavy = spread[(spread > VARIABLE_SPREAD) & (weight >= VARIABLE_MIN_SHARE)].index
    candidates = sorted(
        {base_name(k[0]) for k in heavy}, key=lambda n: -one_step.loc[one_step["base"] == n, "dur"].sum()
    )
    # A variable kernel's pass takes every launch of its base name: all its instantiations.
    for name in candidates:
        if name in instances:
            del instances[name]
            more = step_rows[(step_rows["base"] == name) & ~step_rows.index.isin(one_step.index)]
            one_step = pd.concat([one_step, more])
            rest = compute["base"].eq(name) & ~compute["name"].isin(picked[name])
            covered += float(compute.loc[rest, "dur"].sum())
    counted = one_step["base"]
    if first_of_size and candidates:
        of = one_step[one_step["base"].isin(candidates)]
        sizes = launch_sizes(timeline, of)
        first_of_size = bool((sizes >= 0).all())
        if first_of_size:
            counted = of["base"][first_of_size_mask(of, sizes)]
    variable: list[str] = []
    over_budget: dict[str, int] = {}
    launches = every_launch = 0
    for name in candidates:
        count = int((counted == name).sum())
        if launches + count <= max_variable_launches:
            variable.append(name)
            launches += count
            every_launch += int((step_rows["base"] == name).sum())
        else:
            over_budget[name] = count
    configs = len(one_step.drop_duplicates(key))
    variable_configs = len(one_step[one_step["base"].isin(variable)].drop_duplicates(key))
    hot_rows = HotKernels(chosen, 0, 0.0, [], instances=instances).chosen(compute)
    precisions = tensor_precisions(timeline, compute[hot_rows])
    light = _memory_bound(compute[hot_rows], [n for n in chosen if n not in variable])
    light_configs = len(one_step[one_step["base"].isin(light)].drop_duplicates(key))
    return HotKernels(
        chosen,
        configs,
        covered / total,
        comm,
        variable,
        launches,
        variable_configs,
        over_budget,
        precisions,
        variable_first_of_size=bool(first_of_size and variable),
        variable_every=every_launch,
        instances=instances,
        light=light,
        light_configs=light_configs,
    )


def _memory_bound(launches: pd.DataFrame, names: list[str]) -> list[str]:
    """The base names of ``names`` whose every launch in ``launches`` (the hot instantiations)
    is of a kernel memory-bound by what it computes (``kernel_classes.memory_bound``)."""
    light = {str(n): memory_bound(str(n)) for n in launches["name"].unique()}
    of_base: dict[str, list[bool]] = {}
    for name, base in launches.drop_duplicates("name")[["name", "base"]].itertuples(index=False):
        of_base.setdefault(str(base), []).append(light[str(name)])
    return [n for n in names if of_base.get(n) and all(of_base[n])]


#: Kernel kinds that may run on tensor cores: their launching ops' input types decide which
#: precision counters Nsight Compute collects. Triton and unrecognized kernels may hold a
#: ``tl.dot`` or an MMA of their own.
TENSOR_KINDS = frozenset(
    {"gemm", "attention", "convolution", "moe", "triton", "compiler-generated", "unknown"}
)
#: The GPU table's precisions (``estimate.TENSOR_PRECISION`` of an op's type; a kernel's name)
#: -> ncu's tensor-core source precision. An fp32 op may run as TF32 (cuDNN's default; cuBLAS
#: where ``allow_tf32`` is set; ``tl.dot``'s default); an fp32 name is a SIMT kernel's.
_SOURCE = {"bf16": "bf16", "fp16_tensor": "fp16", "tf32": "tf32", "fp8": "fp8", "fp64": "fp64"}
_SOURCE_OF_TYPE = {**_SOURCE, "fp32": "tf32"}


def tensor_precisions(timeline: Timeline, launches: pd.DataFrame) -> list[str] | None:
    """The tensor-core source precisions ``launches`` (attributed kernel rows with ``kindof``
    and ``op``) can run in, sorted; None when one that may use tensor cores has no launching
    op with recorded input types, so that no precision can be ruled out.

    Each precision's tensor-pipe counter costs Nsight Compute a replay pass of every profiled
    launch (5 of the full set's 6 on an H200): a bf16 model's counters took 3 on an H100.
    """
    tensor = launches[launches["kindof"].isin(TENSOR_KINDS)]
    if tensor.empty:
        return []
    ops = tensor["op"].to_numpy()
    if (ops < 0).any():
        return None
    types = timeline.cpu["types"].to_numpy()[ops]
    if (types < 0).any():
        return None
    found: set[str] = set()
    for index, name in set(zip(types.tolist(), tensor["name"].tolist())):
        recorded = timeline.arg(int(index))
        if not isinstance(recorded, list):
            return None
        # The first tensor's type is the op's compute type (q of an attention, grad_output of
        # a convolution's backward); later fp32 tensors are side outputs such as logsumexp.
        first = next((t for t in recorded if t in TENSOR_PRECISION), None)
        if first:
            source = _SOURCE_OF_TYPE[TENSOR_PRECISION[first]]
            if source == "tf32" and kernel_precision(str(name)) == "fp32":
                continue  # an fp32 op on a kernel its name calls FP32 SIMT: no tensor pipe to count
            found.add(source)
    for name in tensor["name"].unique():
        by_name = _SOURCE.get(kernel_precision(str(name)) or "")
        if by_name:
            found.add(by_name)
    return sorted(found)


def without_counter_rows(hot: Iterable[str], counter_rows: Iterable[pd.DataFrame]) -> list[str]:
    """The hot kernels (base names) that no row of the Nsight Compute exports (``rows`` of
    ``Counters``) names: ncu profiled none of their launches. The profile's ncu phase asks
    this of the exports it wrote, the report's join of the counters it joins."""
    profiled: set[str] = set()
    for rows in counter_rows:
        profiled.update(base_name(str(n)) for n in rows["kernel_name"])
    return [name for name in hot if name not in profiled]


#: The longest kernel name a warning prints (a CUTLASS grouped GEMM's mangled name runs to
#: thousands of characters).
SHORT_NAME_LIMIT = 80
_LENGTH = re.compile(r"\d+")


def _source_names(text: str, pos: int) -> tuple[list[str], int]:
    """The ``<length><identifier>`` names of an Itanium nested name from ``pos`` on."""
    names = []
    while pos < len(text):
        m = _LENGTH.match(text, pos)
        if not m:
            break
        n = int(m.group())
        start = m.end()
        if n <= 0 or start + n > len(text):
            break
        names.append(text[start : start + n])
        pos = start + n
    return names, pos


def _demangle_head(symbol: str) -> str | None:
    """``_ZN7cutlass7Kernel2I50cutlass_80_…EEvNT_6ParamsE`` → ``cutlass::Kernel2<cutlass_80_…>``:
    the qualified name of an Itanium-mangled symbol and its first template argument, enough to
    say which kernel it is (no full demangler: the report needs no binutils)."""
    if not symbol.startswith("_Z"):
        return None
    pos = 2
    nested = symbol.startswith("_ZN")
    if nested:
        pos = 3
        while pos < len(symbol) and symbol[pos] in "rVKL":  # cv-qualifiers
            pos += 1
    names, pos = _source_names(symbol, pos)
    if not names:
        return None
    if not nested:
        names = names[:1]
    head = "::".join(names)
    if pos < len(symbol) and symbol[pos] == "I":
        inner = symbol[pos + 1 :]
        if inner.startswith("N"):
            inner = inner[1:]
        args, _ = _source_names(inner, 0)
        head += f"<{'::'.join(args)}…>" if args else "<…>"
    return head


def short_name(name: str, limit: int = SHORT_NAME_LIMIT) -> str:
    """A kernel's name as a warning prints it: demangled where it is an Itanium symbol, cut to
    ``limit`` characters with an ellipsis."""
    text = _demangle_head(name.strip()) or name.strip()
    return text if len(text) <= limit else text[: limit - 1] + "…"
