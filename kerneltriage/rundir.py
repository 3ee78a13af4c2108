"""The run directory: what ``profile`` writes and ``report`` reads. Versioned, in one place.

Layout of schema ``kerneltriage.run/1``::

    RUN/
      manifest.json        this module's Manifest: command, GPU, versions, schedule, phases, status,
                           warnings for the report
      trace.json.gz        PyTorch profiler (Kineto) chrome trace of the recorded steps
      trace.rank{N}.json.gz  one per rank instead, for multi-process (torchrun) runs
      timeline.sqlite      instead of a trace: an Nsight Systems export (profile --timeline nsys)
      ncu.csv.gz           optional: ``ncu --import ncu.ncu-rep --csv --page raw`` (one launch per
                           unique kernel/grid/block of the profiled step)
      ncu.launches.csv.gz  optional: every launch of the kernels whose one configuration runs
                           several problem sizes (persistent GEMMs), from a second ncu pass
      ncu.ncu-rep          optional: the Nsight Compute report (open it in the GUI)
      regions.jsonl        optional: one JSON object per module signature (path, class, shapes)
      logs/                stdout/stderr of each phase, per-process status, the shapes step's trace

Only ``manifest.json`` and a trace are required. Every other file is optional and the report
says what it used.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictInt,
    StrictStr,
    ValidationError,
    model_validator,
)

from kerneltriage.errors import RunDirError

SCHEMA = "kerneltriage.run/1"
MANIFEST = "manifest.json"
TRACE = "trace.json.gz"
TRACE_RANK_GLOB = "trace.rank*.json.gz"
TRACE_NSYS = "timeline.sqlite"
NCU_CSV = "ncu.csv.gz"
NCU_LAUNCHES_CSV = "ncu.launches.csv.gz"
NCU_REP = "ncu.ncu-rep"
REGIONS = "regions.jsonl"
LOGS = "logs"

_RANK_RE = re.compile(r"trace\.rank(\d+)\.json\.gz$")


_Open = ConfigDict(extra="allow", validate_assignment=True, populate_by_name=True)


def _number(value: Any) -> Any:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError("expected a number")
    return value


#: A time in milliseconds: a finite number above zero (a step of -5 ms or NaN ms is no step).
Milliseconds = Annotated[float, BeforeValidator(_number), Field(gt=0, allow_inf_nan=False)]
Seconds = Annotated[float, BeforeValidator(_number), Field(ge=0, allow_inf_nan=False)]


class _Part(BaseModel):
    """A mapping of the manifest. Only what was set is written: the manifest says what ran."""

    model_config = _Open

    def to_json(self) -> dict[str, Any]:
        return self.model_dump(mode="json", by_alias=True, exclude_unset=True)


class Schedule(_Part):
    warmup: StrictInt | None = None
    steps: StrictInt | None = None
    step_marker: StrictStr | None = None
    run_to_end: bool | None = None
    ncu_rank: StrictInt | None = Field(default=None, ge=0)
    timing_steps: StrictInt | None = None  # fewer than asked: the script was too short
    whole_run: bool | None = None  # the whole run was recorded as one step


class StepTime(_Part):
    """``phases.timeline.step_time``: the steps ``profile`` timed, which the report then uses."""

    rank: StrictInt = Field(default=0, ge=0)
    plain_median_ms: Milliseconds | None = None
    clean_median_ms: Milliseconds | None = None
    recorded_median_ms: Milliseconds | None = None
    gpu_busy_ms: Seconds | None = None
    plain_ms: list[Milliseconds] = []
    clean_ms: list[Milliseconds] = []
    recorded_ms: list[Milliseconds] = []
    # The clean steps against the plain ones (None: no clean profiler ran).
    overhead: float | None = None
    # The plain steps of every timing process, phase 1's first: processes of one script differ
    # by more than the steps of one do, so the step time's interval spans them (--timing-processes).
    processes_plain_ms: list[list[Milliseconds]] = []
    # The timing processes' steps issued from an idle GPU, timed on the host's clock: the host's
    # own time to issue a step (``hooks.HOST_STEPS`` a process; empty: not measured).
    host_issue_ms: list[Milliseconds] = []


class TimelinePhase(_Part):
    seconds: Seconds | None = None
    exit_code: StrictInt | StrictStr | None = None
    tool: StrictStr | None = None  # "nsys" for an Nsight Systems timeline
    steps_seen: StrictInt | None = None
    step_source: StrictStr | None = None
    module_calls_per_step: float | None = None  # module ranges per recorded step
    traces: list[StrictStr] | None = None
    dynamo: dict[StrictStr, Any] | None = None  # Dynamo's counts after the plain steps, at the end
    trace_fixup: dict[StrictStr, Any] | None = None  # per trace: its counts and seconds
    # The parent's own time on phase 1's output, before any later process starts: the traces
    # finished (``trace_fixup``) and the step time recorded.
    finish_seconds: Seconds | None = None
    step_time: StepTime | None = None
    plain_extended: StrictInt | None = None  # plain steps added until the step times settled


class NcuPassRecord(_Part):
    """One ncu process of phase 2 (``phases.ncu.passes``): its file stem, the GPU it was given
    (``CUDA_VISIBLE_DEVICES``; None: the parent's), its kernels, the launches expected and
    profiled, when it started (seconds into the phase), how long it ran and its exit code;
    ``profiling_s``: from its first profiled launch to its last, as ncu printed them (over
    ``launches - 1``: a launch's cost, the process's start-up and warm-up steps apart)."""

    stem: StrictStr
    gpu: StrictStr | None = None
    kernels: list[StrictStr] = []
    expected: StrictInt | None = None
    launches: StrictInt | None = None
    start_s: Seconds | None = None
    seconds: Seconds | None = None
    exit_code: StrictInt | StrictStr | None = None  # "timeout" when it was stopped
    profiling_s: Seconds | None = None


class NcuPhase(_Part):
    """``phases.ncu``: the hot kernels asked for and each pass's time and exit code (a pass's
    keys are named after its file stem: ``ncu_…`` and ``ncu.launches_…``; ``passes`` lists
    every ncu process, also when the kernels were split over several GPUs at once)."""

    kernels: list[StrictStr] | None = None
    expected_configs: StrictInt | None = None
    coverage_of_gpu_time: float | None = None
    metrics: list[StrictStr] | None = None
    # The tensor-core precisions whose counters were collected (None: every one).
    tensor_precisions: list[StrictStr] | None = None
    excluded_communication: list[StrictStr] | None = None
    variable_size_kernels: list[StrictStr] | None = None
    variable_launches_per_step: StrictInt | None = None
    variable_over_budget: dict[StrictStr, StrictInt] | None = None
    # "first-of-size": the every-launch pass profiled the first launch of each problem size
    # (the join maps its rows onto the launches of the same size); None: every launch.
    variable_selection: StrictStr | None = None
    # Hot kernels of which only some instantiations were profiled -> those (full names, as the
    # trace spells them); the others lie outside the coverage (hot_kernels.py).
    kernel_instances: dict[StrictStr, list[StrictStr]] | None = None
    # Elementwise instantiations (as the trace spells them) profiled at one configuration per
    # L2 regime, whose other configurations (``scaled_configs`` of them) the join scales by
    # threads (``analysis/timeline/one_size.py``); None: every configuration profiled.
    scaled_kernels: list[StrictStr] | None = None
    scaled_configs: StrictInt | None = None
    # Kernels memory-bound by what they compute, profiled in a pass of their own (``ncu.light``)
    # without the instruction counters: time and bytes only, their rows in ``ncu.csv.gz`` with
    # empty FLOP columns (``profile/ncu_passes.py``); None: no such pass.
    light_kernels: list[StrictStr] | None = None
    seconds: Seconds | None = None
    # The plan's own time after phase 1: the trace read, the hot kernels chosen, ncu asked for
    # its metrics (on the path to phase 2's processes, which start once it is known).
    plan_seconds: Seconds | None = None
    profiled_launches: StrictInt | None = None
    hot_without_counters: dict[StrictStr, StrictStr] | None = None
    ncu_seconds: Seconds | None = None
    ncu_exit_code: StrictInt | StrictStr | None = None  # "timeout" when it was stopped
    launches_seconds: Seconds | None = Field(default=None, alias="ncu.launches_seconds")
    launches_exit_code: StrictInt | StrictStr | None = Field(default=None, alias="ncu.launches_exit_code")
    light_seconds: Seconds | None = Field(default=None, alias="ncu.light_seconds")
    light_exit_code: StrictInt | StrictStr | None = Field(default=None, alias="ncu.light_exit_code")
    passes: list[NcuPassRecord] | None = None
    gpus: list[StrictStr] | None = None  # the GPUs the kernels were split over, when they were
    single_gpu_reason: StrictStr | None = None  # why several visible GPUs were not used

    def record_pass(
        self, stem: str, *, seconds: float | None = None, exit_code: int | str | None = None
    ) -> None:
        """The time or exit code of the pass that wrote ``stem`` (``ncu``, ``ncu.launches`` or
        ``ncu.light``)."""
        prefix = {"ncu": "ncu", "ncu.launches": "launches", "ncu.light": "light"}[stem]
        if seconds is not None:
            setattr(self, f"{prefix}_seconds", seconds)
        if exit_code is not None:
            setattr(self, f"{prefix}_exit_code", exit_code)


class CalibratePhase(_Part):
    seconds: Seconds | None = None


class Phases(_Part):
    """Phase name -> what it recorded, in the order the phases run."""

    calibrate: CalibratePhase | None = None
    timeline: TimelinePhase | None = None
    ncu: NcuPhase | None = None

    @model_validator(mode="after")
    def _unknown_phases_are_mappings(self) -> Phases:
        # Checked here, not typed with `__pydantic_extra__: … = Field(init=False)`: under
        # validate_assignment that annotation became an extra phase named __pydantic_extra__.
        for name, value in (self.__pydantic_extra__ or {}).items():
            if not isinstance(value, dict):
                raise ValueError(f"phase {name!r}: expected a mapping, got {type(value).__name__}")
        return self

    def seconds(self) -> dict[str, float]:
        """Phase -> how long it took, for the phases that ran."""
        out = {}
        for name, value in self.to_json().items():
            out[name] = float(value.get("seconds") or 0.0) if isinstance(value, dict) else 0.0
        return out


class AppliedFix(_Part):
    """One fix a run was profiled with (``profile --apply``): the candidate of the run before it
    came from, its recipe and ``apply`` mapping, and what the report and ``verify`` said of it."""

    id: StrictStr
    recipe_id: StrictStr | None = None
    apply: dict[StrictStr, Any] = {}
    predicted_saving_share: float | None = None
    realized_saving_share: float | None = None
    status: StrictStr | None = None  # verify's status of the fix on the run before


class Calibration(BaseModel):
    model_config = ConfigDict(extra="allow", allow_inf_nan=False)
    gpu: StrictStr | None = None
    peak_tflops: dict[StrictStr, float] | None = None
    hbm_gbs: float | None = None


def _calibration(value: dict[str, Any]) -> dict[str, Any]:
    Calibration.model_validate(value)  # its numbers checked; kept as the mapping gpus.py reads
    return value


class Manifest(BaseModel):
    """Everything about how a run was made (``manifest.json``, schema ``kerneltriage.run/1``),
    typed. Unknown keys are kept and written back: a newer kerneltriage may add keys."""

    model_config = _Open
    schema_: StrictStr = Field(default=SCHEMA, alias="schema")
    kerneltriage_version: StrictStr = ""
    created: StrictStr = ""
    command: list[StrictStr] = []
    cwd: StrictStr = ""
    env: dict[StrictStr, StrictStr] = {}
    gpu: dict[StrictStr, Any] = {}
    versions: dict[StrictStr, Any] = {}
    schedule: Schedule = Field(default_factory=Schedule)
    phases: Phases = Field(default_factory=Phases)
    calibration: Annotated[dict[StrictStr, Any], AfterValidator(_calibration)] = {}
    status: StrictStr = "ok"
    exit_code: StrictInt | None = None
    ranks: list[StrictInt] = []
    notes: list[StrictStr] = []
    #: What the report must repeat about how the run was measured (the profiler's overhead on
    #: the step time, hot kernels left without counters and why); a subset of ``notes``.
    warnings: list[StrictStr] = []
    #: ``profile --apply``: the fixes this run was profiled with, and the run they came from
    #: (written only when set).
    applied_fixes: list[AppliedFix] = []
    parent_run: StrictStr | None = None

    def to_json(self) -> dict[str, Any]:
        """Every field (a part, with what was set in it), then the unknown keys read."""
        data: dict[str, Any] = {}
        for name, info in type(self).model_fields.items():
            value = getattr(self, name)
            if name in _WHEN_SET and not value:
                continue
            if name == "applied_fixes":
                value = [fix.to_json() for fix in value]
            data[info.alias or name] = value.to_json() if isinstance(value, _Part) else value
        data.update(self.model_extra or {})
        return json.loads(json.dumps(data))  # a copy: what is written is not the model's own

    @classmethod
    def from_json(cls, data: dict[str, Any], where: str = MANIFEST) -> Manifest:
        """``data`` read; ``RunDirError`` (one line: the field and the type expected) unless it
        follows the schema."""
        from kerneltriage.validation import describe

        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            raise RunDirError(describe(exc, "manifest.json"), path=where) from None


_WHEN_SET = ("applied_fixes", "parent_run")


@dataclass
class RunDir:
    """A run directory on disk and the files it holds."""

    path: Path
    manifest: Manifest
    traces: dict[int, Path]  # rank -> trace file; rank 0 for a single-process run
    ncu_csv: Path | None
    ncu_launches_csv: Path | None
    ncu_rep: Path | None
    regions: Path | None

    @property
    def trace(self) -> Path:
        return self.traces[min(self.traces)]


def is_run_dir(path: Path) -> bool:
    # exists(), not is_file(): a manifest.json that cannot be read is an error, not a trace folder.
    return path.is_dir() and (path / MANIFEST).exists()


def read_manifest(path: Path) -> Manifest:
    from kerneltriage.inputs import read_text

    file = path / MANIFEST
    if not os.path.lexists(file):
        raise RunDirError("no manifest.json: not a kerneltriage run directory", path=str(path))
    text = read_text(file, "manifest", RunDirError)  # a directory, a pipe, not UTF-8: refused
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise RunDirError(f"manifest.json is not valid JSON ({exc})", path=str(path)) from None
    except RecursionError:
        raise RunDirError("manifest.json is nested too deeply to be a manifest", path=str(path)) from None
    if not isinstance(data, dict):
        raise RunDirError("manifest.json is not a JSON object", path=str(path))
    schema = data.get("schema", "")
    if not str(schema).startswith("kerneltriage.run/"):
        raise RunDirError(f"manifest.json has schema {schema!r}, expected {SCHEMA!r}", path=str(path))
    if schema != SCHEMA:
        raise RunDirError(
            f"run directory schema {schema!r} is not supported by this kerneltriage ({SCHEMA})",
            path=str(path),
        )
    return Manifest.from_json(data, str(path))


def open_run(path: str | os.PathLike[str]) -> RunDir:
    """Read a run directory's manifest and locate its files."""
    root = Path(path)
    if not root.exists():
        raise RunDirError("no such file or directory", path=str(root))
    if not root.is_dir():
        raise RunDirError(
            "not a directory: a run is the folder `kerneltriage profile --out` wrote", path=str(root)
        )
    manifest = read_manifest(root)
    traces: dict[int, Path] = {}
    for file in sorted(root.glob(TRACE_RANK_GLOB)):
        match = _RANK_RE.search(file.name)
        if match:
            traces[int(match.group(1))] = file
    if (root / TRACE).is_file():
        traces.setdefault(0, root / TRACE)
    elif not traces and (root / TRACE_NSYS).is_file():
        traces[0] = root / TRACE_NSYS
    if not traces:
        hint = f"the run's status is {manifest.status!r}" if manifest.status != "ok" else None
        raise RunDirError(f"no {TRACE} in the run directory", path=str(root), hint=hint)
    return RunDir(
        path=root,
        manifest=manifest,
        traces=traces,
        ncu_csv=_optional(root / NCU_CSV),
        ncu_launches_csv=_optional(root / NCU_LAUNCHES_CSV),
        ncu_rep=_optional(root / NCU_REP),
        regions=_optional(root / REGIONS),
    )


def write_manifest(path: Path, manifest: Manifest) -> None:
    """Write atomically: a run interrupted mid-write keeps its previous manifest."""
    path.mkdir(parents=True, exist_ok=True)
    tmp = path / (MANIFEST + ".tmp")
    tmp.write_text(json.dumps(manifest.to_json(), indent=2, sort_keys=False) + "\n")
    os.replace(tmp, path / MANIFEST)


def _optional(file: Path) -> Path | None:
    return file if file.is_file() else None
