"""What ``verify`` would run for a run directory and its report (pure: no torch, no process).

For each candidate chosen (``--candidates``, else every actionable one): its recipe, the text
the report prints, how the runner applies it (the recipe's ``apply`` mapping) or why it
cannot; then the number of runs (baseline and fixed, each ``repeats`` times, interleaved) and
an estimate of the time they take (compilation included where the fix compiles).

The runs: one warm-up process of the baseline first (a cold start: never counted), then rounds
of baseline and fixes, interleaved, at least ``repeats`` rounds; a fix whose status is still
inconclusive gets more rounds, up to ``max_repeats``, while the ``budget`` allows.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kerneltriage.analysis.vocabulary import Verdict
from kerneltriage.errors import InputError
from kerneltriage.recipes.install import check

if TYPE_CHECKING:  # pragma: no cover
    from kerneltriage.rundir import Manifest


def _measurement() -> dict[str, Any]:
    from kerneltriage.resources import load_yaml

    return dict(load_yaml("measurement.yaml")["verify"])


@dataclass
class Settings:
    repeats: int = 3  # rounds before a status is judged (measurement.yaml: min_repeats)
    warmup: int = 3
    steps: int = 20
    loss_steps: int = 3
    loss_rtol: float = 0.005
    seed: int = 0
    max_repeats: int = 10  # rounds at most while a status is inconclusive
    budget_s: float = 1200.0  # wall time for all the runs
    run_timeout_s: float | None = None  # one run's limit; None: from the estimate
    together: bool = False  # a round's runs start at once, the GPU in turns (together.py)

    @classmethod
    def defaults(cls, **given: Any) -> Settings:
        """Settings with ``measurement.yaml``'s defaults for what is not given (None)."""
        conf = _measurement()
        base: dict[str, Any] = {
            "repeats": int(conf["min_repeats"]),
            "max_repeats": int(conf["max_repeats"]),
            "budget_s": float(conf["budget_seconds"]),
        }
        base.update({k: v for k, v in given.items() if v is not None})
        return cls(**base)


@dataclass
class Planned:
    """One candidate's fix and how it would be verified."""

    id: str
    name: str
    verdict: str
    predicted: float | None
    recipe_id: str | None
    text: str | None  # the fix as the report prints it
    apply: dict[str, Any] | None  # what the runner applies (None: it cannot)
    why_not: str | None  # why it is not verifiable here (None: it is)
    command: list[str] | None = None  # --by-hand: the user's fixed command
    notes: list[str] = field(default_factory=list)
    # One fix that several candidates share (patch(model) swaps the norms of two candidates):
    # it runs once, under the first one's id, and is judged against their combined saving.
    run_as: str | None = None
    shared_with: list[str] = field(default_factory=list)
    # The prediction is the whole of what the fix covers (a module-class compile: the
    # candidate and what it takes from the others inside those modules), not this row's slice.
    whole: bool = False
    # A step-level fix's prediction as the step it leaves (ms): judged against each verify's own
    # baseline, whose host-paced step differs from the profiled process's.
    predicted_step_ms: float | None = None

    @property
    def verifiable(self) -> bool:
        return self.why_not is None

    @property
    def how(self) -> str:
        if self.command is not None:
            return "by hand: " + " ".join(self.command)
        if self.apply is not None and self.why_not is None:
            return "runner: " + self.apply["kind"]
        return "not applied"


@dataclass
class Plan:
    run: str
    command: list[str]
    settings: Settings
    candidates: list[Planned]
    run_seconds: float | None  # one run of the script, estimated
    notes: list[str] = field(default_factory=list)

    @property
    def verifiable(self) -> list[Planned]:
        return [c for c in self.candidates if c.verifiable]

    @property
    def to_run(self) -> list[Planned]:
        """The verifiable fixes with a run of their own (a shared fix runs once)."""
        return [c for c in self.verifiable if c.run_as is None]

    @property
    def runs(self) -> int:
        """Processes started at least: the warm-up process, then a baseline and each verifiable
        fix, ``repeats`` times each (more while a status is inconclusive, within the budget)."""
        n = len(self.to_run)
        return (n + 1) * self.settings.repeats + 1 if n else 0

    def compile_seconds(self, c: Planned) -> float:
        """What compiling adds to one run of ``c``'s fix (measurement.yaml)."""
        apply = c.apply or {}
        if c.command is not None or not str(apply.get("kind", "")).startswith("compile"):
            return 0.0
        table = _measurement()["compile_seconds"]
        mode = apply.get("mode") or ("module-class" if apply.get("kind") == "compile-module" else "default")
        return float(table.get(mode, table["default"]))

    def run_estimate(self, label: str | None) -> float | None:
        """One run: the baseline's (``label`` None) or a fix's, compilation included."""
        if self.run_seconds is None:
            return None
        c = next((c for c in self.to_run if c.id == label), None)
        return self.run_seconds + (self.compile_seconds(c) if c is not None else 0.0)

    def start_margin(self) -> float:
        """How much longer than its expected time a run must still fit in the budget to start
        (``measurement.yaml``: ``start_margin``)."""
        return float(_measurement()["start_margin"])

    def run_timeout(self, label: str | None) -> float:
        """One run's time limit: ``--run-timeout``, else a multiple of its estimate."""
        if self.settings.run_timeout_s:
            return self.settings.run_timeout_s
        conf = _measurement()
        estimate = self.run_estimate(label) or 0.0
        return max(float(conf["run_timeout_min"]), float(conf["run_timeout_factor"]) * estimate)

    @property
    def seconds(self) -> float | None:
        """The time the warm-up run and ``repeats`` rounds take (the budget may cut it)."""
        if self.run_seconds is None or not self.to_run:
            return None if self.run_seconds is None else 0.0
        base = self.run_seconds * (self.settings.repeats + 1)
        fixes = sum(self.run_estimate(c.id) or 0.0 for c in self.to_run) * self.settings.repeats
        return base + fixes


@dataclass
class StepCandidate:
    """A report's step-level fix (``source.timing.host.fix``: CUDA graphs for a step the host
    paces) as verify plans it: a candidate of its own id (``S1``), judged like any other."""

    id: str
    name: str
    fix: str
    recipe: dict[str, Any]
    expected_saving_share: float
    predicted_step_ms: float | None = None  # the step the fix should leave, whatever the baseline's host
    verdict: Verdict = Verdict.COMPILE
    attrs: dict[str, Any] = field(default_factory=dict)


def step_candidates(report: Any) -> list[StepCandidate]:
    """The report's step-level fixes, for verify (none where the host leaves the GPU the step)."""
    fix = ((report.source.get("timing") or {}).get("host") or {}).get("fix")
    if not fix:
        return []
    return [
        StepCandidate(
            id=str(fix["id"]),
            name=str(fix["name"]),
            fix=str(fix["fix"]),
            recipe=dict(fix["recipe"]),
            expected_saving_share=float(fix["predicted_saving_share"]),
            predicted_step_ms=fix.get("predicted_step_ms"),
        )
    ]


def recipe_of(candidate: Any) -> dict[str, Any] | None:
    """The candidate's fix recipe (the contract's ``recipe`` mapping), None when it has none."""
    recipe = getattr(candidate, "recipe", None)
    return recipe if isinstance(recipe, dict) else None


def select(candidates: list[Any], ids: list[str] | None, by_hand: str | None = None) -> list[Any]:
    """The candidates asked for (``--candidates``, ``--by-hand``), else the actionable ones and
    the skips that carry a setting the runner applies (DDP's or FSDP's on exposed communication)."""
    wanted = [by_hand] if by_hand else ids
    if not wanted:
        return [c for c in candidates if c.verdict != Verdict.SKIP or _runner_setting(c)]
    by_id = {c.id.lower(): c for c in candidates}
    missing = [i for i in wanted if i.lower() not in by_id]
    if missing:
        known = ", ".join(c.id for c in candidates[:12])
        raise InputError(f"no candidate {', '.join(missing)} in this run's report (it has {known}, …)")
    return [by_id[i.lower()] for i in wanted]


def _runner_setting(candidate: Any) -> bool:
    recipe = recipe_of(candidate)
    return bool(recipe and isinstance(recipe.get("apply"), dict) and not recipe.get("blocked"))


def plan_candidate(
    candidate: Any, by_hand: list[str] | None = None, *, refused: str | None = None
) -> Planned:
    recipe = recipe_of(candidate)
    planned = Planned(
        id=candidate.id,
        name=candidate.name,
        verdict=candidate.verdict,
        predicted=candidate.attrs.get("fix_saving_share") or candidate.expected_saving_share or None,
        whole=bool(candidate.attrs.get("fix_saving_share")),
        predicted_step_ms=getattr(candidate, "predicted_step_ms", None),
        recipe_id=recipe.get("id") if recipe else None,
        text=candidate.fix,
        apply=recipe.get("apply") if recipe and isinstance(recipe.get("apply"), dict) else None,
        why_not=None,
        command=list(by_hand) if by_hand is not None else None,
    )
    if by_hand is not None:
        planned.apply = None  # the user's command carries the fix
    elif candidate.verdict == Verdict.SKIP and recipe is None:
        # A skip can still carry a setting to try (DDP's buckets, FSDP's prefetch on exposed
        # communication): that one is measured like any fix.
        planned.why_not = "its verdict is skip: there is no fix to verify"
    elif recipe is None:
        planned.why_not = "the report gives no fix recipe for it" + _by_hand_hint(candidate)
    elif recipe.get("blocked"):
        planned.why_not = f"no fix offered: {recipe['blocked']}"
    elif planned.apply is None:
        planned.why_not = (recipe.get("apply_why_not") or "the runner cannot apply this fix") + _by_hand_hint(
            candidate, short=bool(recipe.get("apply_why_not"))
        )
    else:
        problem = check(planned.apply)
        if problem:
            planned.why_not = f"{problem}: the runner cannot apply it" + _by_hand_hint(candidate)
            planned.apply = None
        elif planned.apply["kind"] == "liger":
            planned.notes.append(
                "needs liger_kernel importable in the script's Python (checked when it runs)"
            )
        elif planned.apply.get("mode") == "max-autotune":
            # Each fresh process autotunes again: one BERT-base run took over 8 minutes on an H100.
            planned.notes.append(
                "max-autotune benchmarks GEMM templates for every shape in each fresh run: minutes per "
                "run (counted in the estimate); a run past --run-timeout is reported as not measured "
                "within the budget while the other fixes still run"
            )
    if refused and not planned.why_not:  # a torchrun job this machine cannot run (``torchrun.refusal``)
        planned.why_not = refused
    return planned


def _by_hand_hint(candidate: Any, short: bool = False) -> str:
    if short:
        return ""
    return f"; apply it by hand, then `kerneltriage verify RUN --by-hand {candidate.id} -- <fixed command>`"


def make_plan(
    run: str,
    manifest: Any,
    candidates: list[Any],
    settings: Settings,
    *,
    step_ms: float | None = None,
    ids: list[str] | None = None,
    by_hand: tuple[str, list[str]] | None = None,
) -> Plan:
    """The plan for ``candidates`` (a report's) of the run whose ``manifest`` is given.
    ``step_ms``: the report's step time, for the estimate."""
    if settings.repeats < 1 or settings.steps < 1 or settings.warmup < 0:
        raise InputError("--repeats and --steps must be at least 1, --warmup at least 0")
    if settings.max_repeats < settings.repeats:
        raise InputError(
            f"--max-repeats ({settings.max_repeats}) must be at least --repeats ({settings.repeats})"
        )
    if settings.budget_s <= 0 or (settings.run_timeout_s is not None and settings.run_timeout_s <= 0):
        raise InputError("--budget and --run-timeout must be above 0")
    if settings.loss_rtol <= 0:
        raise InputError("--loss-rtol must be above 0")
    command = list(manifest.command)
    chosen = select(candidates, ids, by_hand[0] if by_hand else None)
    refused, group_note = _torchrun(manifest)
    planned = [plan_candidate(c, by_hand[1] if by_hand else None, refused=refused) for c in chosen]
    for c in planned:  # the hint names this run
        if c.why_not:
            c.why_not = c.why_not.replace("verify RUN ", f"verify {run} ")
    _share_identical_fixes(planned)
    notes = [group_note] if group_note else []
    if not chosen:
        notes.append("no candidate of this report is actionable: nothing to verify")
    return Plan(run, command, settings, planned, run_seconds(manifest, settings, step_ms), notes)


def _share_identical_fixes(planned: list[Planned]) -> None:
    """Candidates whose fixes the runner applies identically share one run, judged once against
    the fix's own prediction: their own savings added (their ops are distinct) where each
    prediction is the candidate's slice, and the whole counted once where a prediction already
    covers everything the fix changes (a module-class compile)."""
    first: dict[str, Planned] = {}
    for c in planned:
        if not c.verifiable or c.apply is None or c.command is not None:
            continue
        key = repr(sorted(c.apply.items()))
        lead = first.setdefault(key, c)
        if lead is not c:
            c.run_as = lead.id
            lead.shared_with.append(c.id)
    for lead in first.values():
        if not lead.shared_with:
            continue
        group = [lead, *(c for c in planned if c.run_as == lead.id)]
        slices = sum(c.predicted or 0.0 for c in group if not c.whole)
        wholes = [c.predicted or 0.0 for c in group if c.whole]
        combined = max([*wholes, slices]) or None
        ids = ", ".join(c.id for c in group)
        counted = "the fix's whole prediction, counted once" if wholes else "their combined saving"
        for c in group:
            c.predicted = combined
            c.whole = bool(wholes) or c.whole
            c.notes.append(f"one fix covers {ids}: run once, judged against {counted}")


def _torchrun(manifest: Any) -> tuple[str | None, str | None]:
    """A torchrun job's refusal here (one line) and its per-rank runs (``verify.torchrun``)."""
    if not _is_torchrun(list(manifest.command)):
        return None, None
    from kerneltriage.errors import KernelTriageError
    from kerneltriage.verify import torchrun

    try:
        command = torchrun.recorded(manifest)
    except KernelTriageError as exc:
        return f"the torchrun command cannot be re-run here: {exc}", None
    return torchrun.refusal(command, manifest.gpu), torchrun.plan_note(command)


def _is_torchrun(command: list[str]) -> bool:
    if not command:
        return False
    return command[0].rsplit("/", 1)[-1].startswith("torchrun") or "torch.distributed.run" in command


def run_seconds(manifest: Manifest | None, settings: Settings, step_ms: float | None) -> float | None:
    """One run: the script's start-up (phase 1's time less its steps) plus warm-up and timed
    steps at the report's step time. None when the manifest does not say."""
    timeline = manifest.phases.timeline if manifest is not None else None
    if timeline is None:
        return None
    seconds, seen = timeline.seconds, timeline.steps_seen
    step_time = (timeline.step_time.plain_median_ms if timeline.step_time else None) or step_ms
    if not seconds or not step_time:
        return None
    # The phase's seconds cover phase 1 and every timing process after it (each its warm-up
    # and plain steps): the start-up is what is left, shared among the processes.
    steps = float(seen or 0)
    extra = [p for p in (timeline.step_time.processes_plain_ms if timeline.step_time else None) or [] if p][
        1:
    ]
    warmup = (
        manifest.schedule.warmup if manifest is not None and manifest.schedule.warmup else settings.warmup
    )
    steps += sum(len(p) + warmup for p in extra)
    startup = max(0.0, float(seconds) - steps * step_time / 1000.0) / (1 + len(extra))
    return startup + (settings.warmup + settings.steps) * step_time / 1000.0


def describe(plan: Plan) -> list[str]:
    """``verify --plan``: each candidate's fix, how it is applied or why not, runs and time."""
    lines = [f"verify plan for {plan.run}", f"  command: {' '.join(plan.command) or '(none recorded)'}"]
    s = plan.settings
    lines.append(
        f"  each run: {s.warmup} warm-up + {s.steps} timed steps (cut to their steady state), losses of "
        f"the first {s.loss_steps} compared within {s.loss_rtol:g} (relative), seed {s.seed}"
    )
    for c in plan.candidates:
        predicted = f"predicted saving {c.predicted:.1%}" if c.predicted else "no predicted saving"
        lines.append("")
        lines.append(f"{c.id}  {c.name}  ({c.verdict}; {predicted})")
        lines.append(f"  recipe   {c.recipe_id or '—'}")
        if c.text:
            lines.append("  fix      " + c.text.replace("\n", "\n           "))
        if c.command is not None:
            lines.append("  applied  by hand: " + " ".join(c.command))
        elif c.run_as is not None:
            lines.append(f"  applied  by the runner, in {c.run_as}'s run (the same fix)")
        elif c.apply is not None and c.verifiable:
            # Fields the trace could not give (None) are read from the model itself when it runs.
            fields = ", ".join(f"{k}={v!r}" for k, v in c.apply.items() if k != "kind" and v is not None)
            lines.append(f"  applied  by the runner: {c.apply['kind']}" + (f" ({fields})" if fields else ""))
        if c.why_not:
            lines.append(f"  not verifiable: {c.why_not}")
        lines += [f"  note     {n}" for n in c.notes]
    lines.append("")
    for n in plan.notes:
        lines.append(n)
    if plan.runs:
        estimate = f", about {_duration(plan.seconds)}" if plan.seconds is not None else ""
        fixes = len(plan.to_run)
        compiling = sum(plan.compile_seconds(c) for c in plan.to_run) * s.repeats
        if compiling and plan.seconds is not None:
            estimate += f" ({_duration(compiling)} of it compiling)"
        if plan.seconds is not None and plan.seconds > s.budget_s:
            estimate += f": more than the budget of {_duration(s.budget_s)}, which stops it"
        lines.append(
            f"{plan.runs} runs (1 warm-up + {s.repeats} × baseline + {s.repeats} × {fixes} "
            f"fix{'es' if fixes > 1 else ''}, interleaved){estimate}"
        )
        lines.append(
            f"an inconclusive fix gets more rounds, up to {s.max_repeats}, within a budget of "
            f"{_duration(s.budget_s)}; each run stops at "
            + (f"{_duration(s.run_timeout_s)}" if s.run_timeout_s else _default_timeout())
        )
    else:
        lines.append("nothing to run: no candidate can be verified here")
    return lines


def _default_timeout() -> str:
    conf = _measurement()
    return (
        f"{conf['run_timeout_factor']:g}× its estimate ({_duration(float(conf['run_timeout_min']))} at least)"
    )


def _duration(seconds: float) -> str:
    """Seconds under 90, else minutes: whole, or to a tenth under ten (a budget of 3.5 min)."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    minutes = seconds / 60
    if minutes < 10 and abs(minutes - round(minutes)) >= 0.05:
        return f"{minutes:.1f} min"
    return f"{minutes:.0f} min"
