"""The report's data model (schema ``kerneltriage.report/1``): plain dataclasses that the
analysis fills and every renderer reads. ``to_json`` gives the documented JSON."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from kerneltriage.analysis.gpus import GPUSpec
from kerneltriage.analysis.rules import Thresholds
from kerneltriage.analysis.vocabulary import Verdict

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

SCHEMA = "kerneltriage.report/1"
KINDS = (
    "attention",
    "norm",
    "gemm",
    "elementwise",
    "reduction",
    "softmax",
    "cross-entropy",
    "embedding",
    "optimizer",
    "communication",
    "memcpy",
    "other",
)


@dataclass
class Condition:
    """One of the three conditions: its measured value against its threshold."""

    value: float | None
    threshold: float
    passed: bool | None  # None: could not be measured
    detail: str = ""


@dataclass
class Roofline:
    bytes: float | None
    flops: float | None
    intensity: float | None
    achieved_gbs: float | None
    achieved_tflops: float | None
    bound: str | None  # "memory" or "compute"
    ceiling_ms: float | None  # per step
    source: str  # "ncu", "estimate", "ncu+estimate", "fused estimate" or "none"
    precision: str | None = None
    measured_dram_bytes: float | None = None  # ncu DRAM bytes actually moved, per step
    counters_coverage: float = 0.0  # share of the candidate's time with joined counters
    launches_per_step: float = 0.0  # kernel launches the ceiling allows (one per fused instance)
    launch_floor_ms: float | None = None  # launches × the GPU's per-launch floor, per step
    work_ceiling_ms: float | None = None  # bytes and FLOPs alone, before the launch floor
    launch_bound: bool = False  # the launch floor, not the work, sets the ceiling
    fill: float = 1.0  # share of the SMs a GEMM's output tiles can occupy (wave quantization)


@dataclass
class Shapes:
    distinct: int
    dominant_coverage: float
    varying_dims: list[str]
    signatures: list[dict[str, Any]]  # [{"shape": …, "share": …, "count": …}] most time first
    row_wise_stable: bool = False
    from_launch_config: bool = False  # no recorded shapes: signatures are grid/block configurations


@dataclass
class KernelInfo:
    name: str
    full_name: str
    launches_per_step: float
    time_ms_per_step: float
    phase: str
    joined: bool


@dataclass
class Candidate:
    id: str
    name: str
    kind: str
    level: str  # "region", "op" or "kernel"
    variant: str | None
    time_ms_per_step: float
    time_share: float  # of the step's wall time
    gpu_share: float  # of the step's GPU-busy time
    fwd_ms_per_step: float
    bwd_ms_per_step: float
    instances_per_step: float
    ops: list[str]
    module: str | None
    kernels: list[KernelInfo]
    roofline: Roofline
    headroom: float | None
    shapes: Shapes
    conditions: dict[str, Condition]
    verdict: Verdict = Verdict.SKIP
    reason: str = ""
    builtin: str | None = None
    note: str = ""
    fix: str | None = None  # code to paste for use-builtin and compile verdicts, chosen for this model
    # The fix's recipe (fixes.yaml): id, params, scope, covers, blocked, apply, apply_why_not.
    recipe: dict[str, Any] | None = None
    expected_saving_share: float = 0.0
    rank: int = 0
    attrs: dict[str, Any] = field(default_factory=dict)
    # The ops of one instance, in order, as recorded: [{"name", "dims", "types", "concrete"}].
    example: list[dict[str, Any]] = field(default_factory=list)
    # What `kerneltriage verify` measured for its fix (an entry of RUN/verify.json: status,
    # predicted and realized saving, step times, loss check); None when it was not verified.
    verification: dict[str, Any] | None = None
    # What the report, ``diff`` and the HTML read of the analysis's findings, typed. The JSON
    # writes them inside ``attrs`` (``ATTRS_FIELDS``), where the schema has always had them.
    full_name: str | None = None  # the name before it was cut to NAME_LIMIT characters
    compiled: bool = False  # a kernel of a torch.compile graph
    inductor: bool = False  # ... that Inductor generated
    fused_ops: list[str] | None = None  # the ops an Inductor kernel's name says it fuses
    q: list[int] | None = None  # an attention region's query shape
    # The order the analysis gave the keys of ``attrs`` and the fields above, kept so the
    # JSON's ``attrs`` reads the same from one version to the next.
    attrs_order: tuple[str, ...] = field(default=(), repr=False, compare=False)

    def json_attrs(self) -> dict[str, Any]:
        """``attrs`` as the JSON writes it: with the typed fields that were set, in order."""
        typed: dict[str, Any] = {
            name: getattr(self, name) for name in ATTRS_FIELDS if getattr(self, name) not in (None, False)
        }
        out: dict[str, Any] = {}
        for key in (*self.attrs_order, *self.attrs, *typed):
            if key in out:
                continue
            if key in typed:
                out[key] = typed[key]
            elif key in self.attrs:
                out[key] = self.attrs[key]
        return out

    @property
    def acted_on(self) -> bool:
        """Actionable and not disproved: a fix verify refuted, or one that changes the
        model's results, is not worth acting on as pasted."""
        status = (self.verification or {}).get("status")
        return self.verdict != Verdict.SKIP and status not in ("refuted", "changes-results")

    @property
    def compile_headroom(self) -> float:
        """The headroom a compile takes: the roofline's, or less where the region holds a batch
        norm whose own passes stay (``attrs["fusion_headroom"]``, ``roofline.fusion_headroom``)."""
        h = self.headroom or 1.0
        return min(h, self.attrs.get("fusion_headroom") or h)

    @property
    def expected_saving_ms(self) -> float:
        return (
            self.expected_saving_share * (self.time_ms_per_step / self.time_share) if self.time_share else 0.0
        )


#: Candidate fields the JSON writes inside the candidate's ``attrs``.
ATTRS_FIELDS = ("full_name", "compiled", "inductor", "fused_ops", "q")


@dataclass
class Gap:
    cause: str  # what spans the gap, e.g. "host busy: aten::unflatten_dense_tensors"
    ms_per_step: float
    count_per_step: float
    example_ms: float
    kind: str = ""  # its class (analysis.idle.CAUSE_CLASSES)
    fix: str | None = None  # the known fix for the work that spans it (data/idle_causes.yaml)
    # ms per step in the recorded steps, before ``ms_per_step`` was scaled to the idle time of
    # the plain steps (None: not scaled; a trace without profile's timing)
    recorded_ms_per_step: float | None = None


@dataclass
class Idle:
    """The step's GPU idle time and what leads it.

    ``ms_per_step`` = step − busy; ``spread_ms``: the spread (interquartile range) of the step
    times it is measured from, its noise (None: one step). ``classes``: ms per step of each
    cause class, idle causes scaled to ``ms_per_step``, plus the exposed communication (GPU
    time, but time the step waits for). ``lead``: the class with the most time, when the idle
    and exposed communication together are clearly above the noise (``above_noise``).
    ``stall_ms_per_step``: single stalls, left out of the step that candidates' shares are
    computed against (``share_step_ms``).
    """

    ms_per_step: float
    spread_ms: float | None
    share: float  # of the step
    above_noise: bool
    classes: dict[str, float]
    lead: str | None
    lead_cause: str | None  # the biggest cause of the leading class, as the gaps name it
    lead_fix: str | None
    stall_ms_per_step: float
    share_step_ms: float


@dataclass
class Report:
    gpu: GPUSpec | None  # None: the trace names no known GPU and --gpu was not given
    source: dict[str, Any]
    steps: int
    step_source: str
    step_time_ms: float
    gpu_busy_ms: float
    gpu_busy_pct: float
    idle_pct: float
    gaps: list[Gap]
    join: dict[str, Any] | None
    unattributed_ms_per_step: float
    unattributed_share: float  # of GPU-busy time
    kind_breakdown: dict[str, float]  # kind -> ms per step
    candidates: list[Candidate]
    thresholds: Thresholds  # the ones this report was made with
    warnings: list[str]
    notes: list[str] = field(default_factory=list)
    communication_ms_per_step: float = 0.0
    exposed_communication_ms_per_step: float = 0.0  # not overlapped by any compute kernel
    rank: int | None = None
    # torch.compile: compiled regions, graph breaks, recompiles, launch-bound graphs (None: none)
    compiled: dict[str, Any] | None = None
    idle: Idle | None = None  # idle time by cause class (None: a report made before it)
    step_spread_ms: float | None = None  # interquartile range of the step times (None: one step)
    # The step time's 95% interval (analysis/timeline/steady.py: the plain steps' steady median, or the
    # recorded steps' mean), and the idle share's that follows from it (None: one step).
    step_interval_ms: tuple[float, float] | None = None
    idle_interval_pct: tuple[float, float] | None = None
    # Plain steps cut as a warm-up transient, and whether the rest settled (None: not timed plain,
    # or timing processes gave the step time and settled their own steps).
    step_transient: int | None = None
    step_settled: bool | None = None
    # The script's step time over verify's baseline processes (runs, median_ms, low_ms, high_ms,
    # run_medians_ms): processes of one script can differ by more than one process's interval.
    step_processes: dict[str, Any] | None = None
    # Of ``unattributed_ms_per_step``: GPU work launched before the profiled window that runs
    # inside the steps (no op of the trace launched it).
    unattributed_before_window_ms: float = 0.0
    schema: str = SCHEMA

    @property
    def idle_bound(self) -> bool:
        """The report leads with the idle GPU: idle (and exposed communication) is at least
        ``idle_warn`` of the step, and still so at the low end of the step's interval where
        profile timed the script (else ``idle_noise`` times the steps' spread)."""
        if self.idle is not None:
            return self.idle.above_noise
        return self.idle_pct / 100.0 >= self.thresholds.idle_warn

    def candidate(self, ident: str) -> Candidate | None:
        for c in self.candidates:
            if c.id.lower() == ident.lower():
                return c
        return None

    def to_frame(self) -> pd.DataFrame:
        """The candidates as a pandas DataFrame: one row per candidate, in the report's order,
        flat columns named as in the JSON (``analysis.frames.CANDIDATE_COLUMNS``)."""
        from kerneltriage.analysis.frames import candidates_frame

        return candidates_frame(self.candidates)

    def gaps_frame(self) -> pd.DataFrame:
        """The GPU's idle gaps by cause (``cause, ms_per_step, count_per_step, example_ms``)."""
        from kerneltriage.analysis.frames import gaps_frame

        return gaps_frame(self.gaps)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        for c, entry in zip(self.candidates, data["candidates"]):
            for name in (*ATTRS_FIELDS, "attrs_order"):
                del entry[name]
            entry["attrs"] = c.json_attrs()
        # The documented keys, not the dataclass's fields; null when no GPU spec was found.
        data["gpu"] = self.gpu.to_json() if self.gpu is not None else None
        data = {"schema": data.pop("schema"), **data}
        return json_safe(data)


def json_safe(value: Any) -> Any:
    """JSON-safe: NaN/inf → null, floats rounded to what the measurement supports."""
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if isinstance(value, float):
        if not math.isfinite(value):
            return None
        return float(f"{value:.6g}")
    if hasattr(value, "item"):  # numpy scalars
        return json_safe(value.item())
    return value
