"""``verify.json`` in the run directory (schema ``kerneltriage.verify/1``): what ``verify``
measured for each candidate's fix. A pydantic model, written atomically after every run so an
interrupted ``verify`` keeps what finished (``complete: false``, partial candidates marked).

Each candidate's entry is whole by itself: its own baseline (the runs interleaved with its
fixed runs), its fixed runs, the loss check and the status. A later ``verify`` of other
candidates keeps the entries it does not redo.

Statuses:

- ``verified``: the 95% interval of the realized saving lies at or above half the prediction;
- ``refuted``: the interval lies below half the prediction, or below zero (a slowdown);
- ``inconclusive``: the interval straddles half the prediction: more runs would tell; the fix
  stays worth acting on;
- ``not verified``: it could not be measured here (``why`` says why: no recipe, the runner
  cannot apply it, the fixed run failed, …);
- ``changes-results``: the first steps' losses moved beyond the tolerance: never recommended
  as pasted, whatever its time.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from kerneltriage.errors import RunDirError

SCHEMA: Final = "kerneltriage.verify/1"
FILE = "verify.json"
Status = Literal["verified", "refuted", "inconclusive", "not verified", "changes-results"]
STATUSES = ("verified", "refuted", "inconclusive", "not verified", "changes-results")
#: The loss tolerance's default: relative difference of any of the first steps' losses. A
#: like-for-like kernel swap moves them by 1e-5 to 1e-3 (bf16 rounding); a dropped mask,
#: softcap or a wrong eps by far more.
DEFAULT_LOSS_RTOL = 0.005


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class Timing(_Model):
    """Step times of one side (baseline or fixed): each run cut to its steady state; the side's
    time is the mean of the runs' steady medians, with its 95% interval."""

    median_ms: float | None
    low_ms: float | None = None
    high_ms: float | None = None
    spread_ms: float | None = Field(description="interquartile range of the steady steps")
    run_medians_ms: list[float] = []
    steps: int = 0
    runs: int = 0
    transient_steps: int = Field(default=0, description="leading steps cut as warm-up transients")
    unsettled_runs: int = Field(default=0, description="runs whose steps never settled")
    outlier_runs_ms: list[float] = Field(
        default=[], description="medians of runs left out as outliers (far from the others')"
    )


class LossCheck(_Model):
    status: Literal["same", "differs", "inconclusive", "not measured"]
    rtol: float
    max_rel_diff: float | None = None
    baseline_noise: float | None = Field(
        default=None, description="largest relative difference between baseline runs"
    )
    steps_compared: int = 0
    baseline: list[float] = []
    fixed: list[float] = []
    detail: str = ""


class CandidateResult(_Model):
    id: str
    name: str = ""
    recipe_id: str | None = None
    how: str = Field(description="'runner: <kind>', 'by hand: <command>' or 'not applied'")
    apply: dict[str, Any] | None = None
    command: list[str] | None = None
    predicted_saving_share: float | None = None
    baseline: Timing | None = None
    fixed: Timing | None = None
    realized_saving_share: float | None = None
    realized_low: float | None = Field(default=None, description="the realized saving's 95% interval")
    realized_high: float | None = None
    loss_check: LossCheck | None = None
    status: Status
    why: str = ""
    partial: bool = False
    applied: dict[str, Any] | None = None
    # One fix several candidates share: it ran once, under ``run_as``'s id (None: this one's),
    # and is judged once against the fix's own prediction; ``shared_with``: the others.
    run_as: str | None = None
    shared_with: list[str] = []


class RecordedSettings(_Model):
    repeats: int
    warmup: int
    steps: int
    loss_steps: int
    loss_rtol: float
    seed: int
    max_repeats: int | None = None
    budget_s: float | None = None
    run_timeout_s: float | None = None


class VerifyFile(_Model):
    schema_: Literal["kerneltriage.verify/1"] = Field(default=SCHEMA, alias="schema")
    kerneltriage_version: str = ""
    created: str = ""
    run: str = ""
    command: list[str] = []
    device: str | None = None
    settings: RecordedSettings
    complete: bool = True
    seconds: float | None = Field(default=None, description="wall time verify spent")
    warmup_run: dict[str, Any] | None = Field(
        default=None, description="the first process after a cold start: run, never counted"
    )
    notes: list[str] = []
    candidates: list[CandidateResult] = []

    def to_json(self) -> dict[str, Any]:
        return self.model_dump(mode="json", by_alias=True)


def read(run: str | Path) -> VerifyFile | None:
    """The run's ``verify.json``, or None when it has none. A file that does not follow the
    schema is a ``RunDirError`` naming the field."""
    path = Path(run) / FILE
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise RunDirError(f"{FILE} cannot be read ({exc})", path=str(Path(run))) from None
    if isinstance(data, dict) and data.get("schema") != SCHEMA:
        raise RunDirError(
            f"{FILE} has schema {data.get('schema')!r}, expected {SCHEMA!r}", path=str(Path(run))
        )
    try:
        return VerifyFile.model_validate(data)
    except ValidationError as exc:
        from kerneltriage.validation import describe

        raise RunDirError(f"{FILE}: {describe(exc)}", path=str(Path(run))) from None


def write(run: str | Path, data: VerifyFile) -> Path:
    from kerneltriage.outputs import write_atomic

    path = Path(run) / FILE
    write_atomic(path, json.dumps(data.to_json(), indent=2) + "\n")
    return path
