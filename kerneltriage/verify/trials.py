"""``kerneltriage verify``: run the run's recorded command in fresh processes, the baseline and
each fix interleaved (A B C A B C …, so machine drift hits every side), and write
``verify.json``.

Each process runs the script through ``harness.py`` (no profiler in it): the baseline with
nothing applied, a fix with its recipe's ``apply`` mapping, or (``--by-hand``) the user's own
fixed command. The manifest gives the command, its working directory and its environment.
``verify.json`` is rewritten after every run, so Ctrl-C keeps what finished.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
import math
import os
import statistics
import subprocess
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import kerneltriage
from kerneltriage import rundir
from kerneltriage import verify_record as record
from kerneltriage.errors import InputError, RunDirError, Terminated, ToolError
from kerneltriage.profile.command import Command, parse_command
from kerneltriage.profile.processes import terminate_as_interrupt
from kerneltriage.verify import outcome, together, torchrun
from kerneltriage.verify.harness import CONFIG_ENV, MODULE
from kerneltriage.verify.plan import Plan, Planned, Settings, make_plan, step_candidates

BASELINE = "baseline"


class VerifyReporter:
    """What ``verify`` tells the user while it runs; the CLI renders it. ``remaining`` is the
    estimate of the seconds left (None: unknown)."""

    def run_started(self, label: str, index: int, total: int, remaining: float | None = None) -> None: ...

    def run_done(self, label: str, result: dict[str, Any], seconds: float) -> None: ...


#: The first process after a cold start (page cache, Inductor's cache, clocks): run, never counted.
WARMUP = "warm-up"


@dataclass
class Trials:
    """Results so far: label -> the harness results of its runs, in order."""

    results: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    warmup: dict[str, Any] | None = None
    started: float = field(default_factory=time.perf_counter)
    durations: dict[str, list[float]] = field(default_factory=dict)

    def elapsed(self) -> float:
        return time.perf_counter() - self.started

    def run_seconds(self, label: str, plan: Plan) -> float:
        """What the next run of ``label`` is expected to take: its own runs' mean, else the
        plan's estimate, else the baseline's."""
        seen = self.durations.get(label) or []
        if seen:
            return sum(seen) / len(seen)
        estimate = plan.run_estimate(None if label == BASELINE else label)
        if estimate is not None:
            return estimate
        base = self.durations.get(BASELINE) or self.durations.get(WARMUP) or [0.0]
        return sum(base) / len(base)


def load_plan(
    run: str | Path,
    settings: Settings,
    *,
    ids: list[str] | None = None,
    by_hand: tuple[str, list[str]] | None = None,
    progress=None,
) -> tuple[Plan, rundir.Manifest]:
    """Read the run directory and its report, and plan (no process is started)."""
    from kerneltriage import api

    opened = rundir.open_run(run)  # one clear line for a bad run directory
    report = api.report(opened.path)
    if progress:
        progress("planning")
    plan = make_plan(
        str(run),
        opened.manifest,
        [*report.candidates, *step_candidates(report)],
        settings,
        step_ms=report.step_time_ms,
        ids=ids,
        by_hand=by_hand,
    )
    return plan, opened.manifest


def run_verify(
    plan: Plan, manifest: rundir.Manifest, reporter: VerifyReporter | None = None
) -> record.VerifyFile:
    """Run the plan; write and return ``verify.json``'s content.

    A warm-up process of the baseline first (not counted); then rounds of the baseline and every
    fix still to judge, interleaved. After ``repeats`` rounds, only the fixes whose status is
    inconclusive go on, round by round, until conclusive, ``max_repeats`` or the budget. A run
    past its time limit is stopped; its fix is not measured within the budget and leaves the
    rounds, while the others go on."""
    say = reporter or VerifyReporter()
    run = Path(plan.run)
    base_cmd, cwd = _recorded_command(manifest, run)
    todo = plan.to_run
    commands: dict[str, tuple[Command, Path]] = {BASELINE: (base_cmd, cwd)}
    for c in todo:
        if c.command is not None:
            commands[c.id] = (_parse_in(c.command, Path.cwd()), Path.cwd())
        else:
            commands[c.id] = (base_cmd, cwd)
    logs = run / rundir.LOGS / "verify"
    logs.mkdir(parents=True, exist_ok=True)
    trials = Trials({label: [] for label in commands})
    s = plan.settings
    data = _file(plan, manifest, trials, complete=not todo)
    index = 0

    def prefix(label: str) -> Path:
        return logs / f"{label}.{len(trials.results.get(label, [])) if label != WARMUP else 0}"

    # --start-together: decided once, for the largest round (the baseline and every fix).
    apart = together.why_apart(run, manifest, base_cmd, 1 + len(todo)) if s.together and todo else None

    def start_round(labels: list[str]) -> together.Round | None:
        """The round's runs started together, held at their gates (None: one at a time)."""
        if not s.together or apart is not None:
            return None
        launches = []
        for label in labels:
            command, where = commands[label]
            apply = next((c.apply for c in todo if c.id == label and c.command is None), None)
            gate = together.gate_of(prefix(label))
            cmd, env, config = _launch(command, manifest.env, s, apply, prefix(label), gate)
            launches.append(together.Launch(cmd, env, where, config, prefix(label)))
        return together.Round(launches, s.budget_s)

    def one(label: str, total: int, batch: together.Round | None = None) -> dict[str, Any]:
        nonlocal index
        index += 1
        command, where = commands[BASELINE if label == WARMUP else label]
        apply = next((c.apply for c in todo if c.id == label and c.command is None), None)
        remaining = _remaining(plan, trials, total - index + 1)
        say.run_started(label, index, total, remaining)
        start = trials.elapsed()
        limit, at_budget_end = _timeout(plan, trials, label)
        if batch is not None:
            code, tail = batch.next(limit)
            timed_out = together.timed_out(code)
            result = _timed_out(limit) if timed_out else _result(command, prefix(label), code, tail)
        else:
            result = _run_one(command, where, manifest.env, s, apply, prefix(label), timeout=limit)
        if result.get("status") == "timed-out" and at_budget_end:  # no sign that the fix misbehaved
            result.update(budget_end=True, error=f"was stopped at the budget's end ({limit:.0f} s were left)")
        seconds = trials.elapsed() - start
        result["seconds"] = round(seconds, 2)
        say.run_done(label, result, seconds)
        trials.durations.setdefault(label, []).append(seconds)
        return result

    # SIGTERM (timeout, a scheduler) ends it as Ctrl-C does: verify.json keeps what finished.
    with terminate_as_interrupt():
        try:
            if todo:
                active = [c.id for c in todo]
                total = 1 + (1 + len(active)) * s.repeats
                result = one(WARMUP, total)
                _check_baseline(result, s)
                trials.warmup = result
                rounds = 0
                while active:
                    # The baseline, then the fixes by their expected time: a long compile runs last
                    # in its round, so it cannot hold up the others.
                    labels = [BASELINE, *sorted(active, key=lambda label: trials.run_seconds(label, plan))]
                    margin = plan.start_margin()
                    need = margin * sum(trials.run_seconds(label, plan) for label in labels)
                    if rounds >= s.repeats and trials.elapsed() + need > s.budget_s:
                        break  # past the first rounds, a round that would end past the budget is not started
                    batch = start_round(labels)
                    try:
                        for label in labels:
                            if (
                                rounds >= 1
                                and trials.elapsed() + margin * trials.run_seconds(label, plan) > s.budget_s
                            ) or _budget_spent(trials, s):
                                # A run the budget would cut off is "not run", never "timed out".
                                if batch is not None:
                                    batch.skip()
                                continue
                            result = one(label, total, batch)
                            trials.results[label].append(result)
                            if label == BASELINE and len(trials.results[label]) == 1:
                                _check_baseline(result, s)
                            data = _file(plan, manifest, trials, complete=False)
                            record.write(run, data)
                    finally:
                        if batch is not None:
                            batch.close()
                    rounds += 1
                    if trials.elapsed() >= s.budget_s:
                        break
                    active = _still_open(data, active, trials, rounds, s)
                    if rounds >= s.repeats:
                        total = index + (1 + len(active)) if active else index
            data = _file(plan, manifest, trials, complete=True)
            short = _budget_note(data, trials, plan)
            if short:
                data.notes.append(short)
            if apart is not None:
                data.notes.append(f"--start-together: the runs went one at a time, as {apart}")
            elif s.together and todo:
                data.notes.append("each round's runs started together and took the GPU in turn")
            record.write(run, data)
        except KeyboardInterrupt as exc:
            data = _file(plan, manifest, trials, complete=False)
            how = "stopped by SIGTERM" if isinstance(exc, Terminated) else "interrupted (Ctrl-C)"
            data.notes.append(f"{how}: the runs that finished are kept; partial entries are marked")
            record.write(run, data)
            raise
    return data


def _budget_note(data: record.VerifyFile, trials: Trials, plan: Plan) -> str | None:
    """Where the budget left fixes with fewer runs than a status needs: the budget that gives
    every fix ``outcome.MIN_RUNS`` runs a side at the pace its runs went (None: none short)."""
    short = [
        c.id
        for c in data.candidates
        if c.status == "inconclusive" and c.fixed is not None and c.fixed.runs < outcome.MIN_RUNS
    ]
    short += [
        c.id for c in data.candidates if c.status == "not verified" and "within the budget" in (c.why or "")
    ]
    if not short:
        return None
    labels = [BASELINE, *(c.id for c in plan.to_run)]
    need = sum(trials.durations.get(WARMUP) or [0.0])
    # A fix not run yet takes at least a baseline run (its estimate may count no start-up).
    base = trials.durations.get(BASELINE) or [0.0]
    pace = sum(base) / len(base)
    need += outcome.MIN_RUNS * sum(max(trials.run_seconds(label, plan), pace) for label in labels)
    minutes = math.ceil(max(need * 1.1 / 60.0, plan.settings.budget_s / 60.0 + 0.5))
    return (
        f"the budget of {plan.settings.budget_s / 60:.1f} min left {', '.join(short)} with fewer than the "
        f"{outcome.MIN_RUNS} runs a side a status needs; at the pace these runs went, every fix gets them "
        f"in about {minutes} min: --budget {minutes}"
    )


def _timeout(plan: Plan, trials: Trials, label: str) -> tuple[float, bool]:
    """One run's limit: its own (``--run-timeout`` or from its estimate), never more than half the
    budget (one slow fix leaves the others time) nor past the budget's end; and whether that end set it."""
    own = min(plan.run_timeout(None if label in (BASELINE, WARMUP) else label), plan.settings.budget_s / 2)
    left = plan.settings.budget_s - trials.elapsed()
    return max(1.0, min(own, left)), left < own


def _budget_spent(trials: Trials, s: Settings) -> bool:
    """Less of the budget is left than the quickest run so far took: no run could finish."""
    done = [t for ts in trials.durations.values() for t in ts]
    return bool(done) and s.budget_s - trials.elapsed() < min(done)


def _still_open(
    data: record.VerifyFile, active: list[str], trials: Trials, rounds: int, s: Settings
) -> list[str]:
    """The fixes that get another round: every one until ``repeats`` rounds ran, then those
    still inconclusive, up to ``max_repeats``; never one whose run timed out or failed."""
    by_id = {e.id: e for e in data.candidates}
    keep = []
    for label in active:
        runs = trials.results.get(label, [])
        if any(r.get("status") in ("timed-out", "failed", "not-applied") for r in runs):
            continue
        entry = by_id.get(label)
        open_ = entry is not None and entry.status == "inconclusive" and rounds < s.max_repeats
        if rounds < s.repeats or open_:
            keep.append(label)
    return keep


def _remaining(plan: Plan, trials: Trials, runs_left: int) -> float | None:
    """Seconds left: the runs left at the mean run's pace, within the budget."""
    done = [t for ts in trials.durations.values() for t in ts]
    pace = sum(done) / len(done) if done else plan.run_estimate(None)
    if pace is None:
        return None
    return min(runs_left * pace, max(0.0, plan.settings.budget_s - trials.elapsed()))


def _recorded_command(manifest: rundir.Manifest, run: Path) -> tuple[Command, Path]:
    if not manifest.command:
        raise RunDirError("the manifest records no command to re-run", path=str(run))
    cwd = Path(manifest.cwd or ".")
    if not cwd.is_dir():
        raise RunDirError(
            f"the run's working directory {manifest.cwd} does not exist here",
            path=str(run),
            hint="verify re-runs the recorded command where it was profiled",
        )
    return _parse_in(manifest.command, cwd), cwd


def _parse_in(argv: list[str], cwd: Path) -> Command:
    with contextlib.chdir(cwd):  # the script's path is relative to where it ran
        return parse_command(list(argv))


def _check_baseline(result: dict[str, Any], settings: Settings) -> None:
    if result["status"] != "ok":
        raise ToolError(f"the script failed in the baseline run: {result.get('error') or 'no result'}")
    if len(result.get("step_ms") or []) < 1:
        seen = result.get("steps_seen", 0)
        raise ToolError(
            f"the baseline run timed no step: {seen} step(s) seen, and the first {settings.warmup} are warm-up"
            + ("" if seen else " (no torch.optim step and no kerneltriage.step() in the script)")
        )


def _launch(
    command: Command,
    env_extra: dict[str, str],
    settings: Settings,
    apply: dict[str, Any] | None,
    prefix: Path,
    gate: Path | None = None,
) -> tuple[list[str], dict[str, str], Path]:
    """One run's command line and environment, its config written beside ``prefix`` (with
    ``gate``: it waits at its first CUDA use until the parent opens it); and its config's path."""
    result_path = Path(f"{prefix}.result.json")
    config_path = Path(f"{prefix}.config.json")
    with contextlib.suppress(FileNotFoundError):
        result_path.unlink()
    group = torchrun.world_size(command)  # a torchrun job: every rank writes its own result
    if group:
        torchrun.clear(prefix, group)
    config: dict[str, Any] = {
        "result": torchrun.result_pattern(prefix) if group else str(result_path.resolve()),
        "warmup": settings.warmup,
        "steps": settings.steps,
        "loss_steps": settings.loss_steps,
        "seed": settings.seed,
        "apply": apply,
    }
    if gate is not None:
        config.update(gate=str(gate.resolve()), parent_pid=os.getpid())
    config_path.write_text(json.dumps(config, indent=2) + "\n")
    env = {**os.environ, **env_extra, CONFIG_ENV: str(config_path.resolve()), "PYTHONUNBUFFERED": "1"}
    package_root = str(Path(kerneltriage.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH", "")) if p)
    return [*command.prefix, "-m", MODULE, *command.target], env, config_path


def _result(command: Command, prefix: Path, code: int, tail: list[str]) -> dict[str, Any]:
    """What a finished run wrote (``status`` failed where it wrote nothing)."""
    group = torchrun.world_size(command)
    last = next((line for line in reversed(tail) if line.strip()), "")
    try:
        if group:
            result = torchrun.read_group(prefix, group, code, last)
        else:
            result = json.loads(Path(f"{prefix}.result.json").read_text())
    except (OSError, ValueError):
        result = {
            "status": "failed",
            "error": f"exit code {code}" + (f": {last}" if last else ""),
            "step_ms": [],
        }
    result["exit_code"] = code
    if result["status"] == "failed" and last and result.get("error", "").startswith("the script exited"):
        result["error"] += f": {last}"
    return result


def _run_one(
    command: Command,
    cwd: Path,
    env_extra: dict[str, str],
    settings: Settings,
    apply: dict[str, Any] | None,
    prefix: Path,
    timeout: float | None = None,
) -> dict[str, Any]:
    """One process of the script under the harness; its result (``status`` failed when it
    wrote none, ``timed-out`` when it ran past ``timeout`` seconds and was stopped)."""
    cmd, env, _ = _launch(command, env_extra, settings, apply, prefix)
    tail: deque[str] = deque(maxlen=20)
    try:
        with open(f"{prefix}.stdout", "w") as out, open(f"{prefix}.stderr", "w+") as err:
            # A session of its own: a run past its limit is stopped with its compile workers.
            proc = subprocess.Popen(
                cmd, cwd=cwd, env=env, stdout=out, stderr=err, text=True, start_new_session=True
            )
            try:
                code = proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                _stop_group(proc)
                return _timed_out(timeout)
            except KeyboardInterrupt:
                # Its own session: the terminal's Ctrl-C does not reach it; pass it on.
                import signal

                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGINT)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=10)
                if proc.poll() is None:
                    _stop_group(proc)
                raise
            err.seek(0)
            tail.extend(line.rstrip("\n") for line in err)
    except FileNotFoundError:
        raise ToolError(f"cannot start {cmd[0]!r}: not found") from None
    return _result(command, prefix, code, list(tail))


def _timed_out(timeout: float | None) -> dict[str, Any]:
    return {
        "status": "timed-out",
        "error": f"ran past its {timeout or 0:.0f} s limit and was stopped",
        "step_ms": [],
        "exit_code": TIMED_OUT_CODE,
    }


TIMED_OUT_CODE = -9


def _stop_group(proc: subprocess.Popen) -> None:
    """Stop a run and every process it started (its own session)."""
    import signal

    for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 10)):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=wait)
            return


# --- verify.json ----------------------------------------------------------------------------


def _file(plan: Plan, manifest: rundir.Manifest, trials: Trials, *, complete: bool) -> record.VerifyFile:
    s = plan.settings
    baseline = trials.results.get(BASELINE, [])
    previous = _previous(Path(plan.run))
    entries = [
        _entry(c, baseline, trials.results.get(c.run_as or c.id, []), s, complete) for c in plan.candidates
    ]
    # A candidate this run measured nothing for (not verifiable here, not run) keeps what an
    # earlier run measured: a plain `verify` after a `--by-hand` one loses nothing.
    measured = {e.id: e for e in previous if e.realized_saving_share is not None}
    entries = [measured.get(e.id, e) if e.realized_saving_share is None else e for e in entries]
    done = {e.id for e in entries}
    kept = [e for e in previous if e.id not in done]
    return record.VerifyFile(
        kerneltriage_version=kerneltriage.__version__,
        created=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        run=str(plan.run),
        command=list(manifest.command),
        device=next((r.get("device") for r in baseline if r.get("device")), None),
        settings=record.RecordedSettings(
            repeats=s.repeats,
            warmup=s.warmup,
            steps=s.steps,
            loss_steps=s.loss_steps,
            loss_rtol=s.loss_rtol,
            seed=s.seed,
            max_repeats=s.max_repeats,
            budget_s=s.budget_s,
            run_timeout_s=s.run_timeout_s,
        ),
        complete=complete,
        seconds=round(trials.elapsed(), 1) if trials.durations else None,
        warmup_run=_warmup_summary(trials.warmup),
        candidates=entries + kept,
    )


def _warmup_summary(result: dict[str, Any] | None) -> dict[str, Any] | None:
    """The warm-up process's steps, kept to show whether it would have been an outlier."""
    if not result:
        return None
    times = result.get("step_ms") or []
    return {
        "status": result.get("status"),
        "seconds": result.get("seconds"),
        "median_ms": round(statistics.median(times), 4) if times else None,
        "steps": len(times),
    }


def _previous(run: Path) -> list[record.CandidateResult]:
    try:
        old = record.read(run)
    except InputError:
        return []  # an unreadable earlier file is replaced
    return list(old.candidates) if old else []


def _predicted_here(c: Planned, baseline: record.Timing | None) -> tuple[float | None, str]:
    """The prediction the realized saving is judged against, and how it was made. A step-level
    fix predicts the step it leaves: against this verify's baseline, whose host-paced step moves
    with the host's load from process to process, its saving is 1 − that step / the baseline's
    (ConvNeXt-T on an H200: 32.2% at the profiled 26.7 ms, 46.3% at verify's 33.7 ms baseline)."""
    if not c.predicted_step_ms or baseline is None or not baseline.median_ms:
        return c.predicted, ""
    here = round(max(0.0, 1.0 - c.predicted_step_ms / baseline.median_ms), 4)
    was = f"{c.predicted:.1%} at the profiled step" if c.predicted else "none at the profiled step"
    return here, (
        f"predicted: the step to {c.predicted_step_ms:.2f} ms, {here:.1%} of this baseline's "
        f"{baseline.median_ms:.2f} ms ({was})"
    )


def _entry(
    c: Planned,
    baseline: list[dict[str, Any]],
    fixed: list[dict[str, Any]],
    s: Settings,
    complete: bool,
) -> record.CandidateResult:
    entry = record.CandidateResult(
        id=c.id,
        name=c.name,
        recipe_id=c.recipe_id,
        how=c.how,
        apply=c.apply,
        command=c.command,
        predicted_saving_share=c.predicted,
        status="not verified",
        why=c.why_not or "",
        run_as=c.run_as,
        shared_with=list(c.shared_with),
    )
    if not c.verifiable:
        return entry
    ok = [r for r in fixed if r.get("status") == "ok" and r.get("step_ms")]
    stopped = [r for r in fixed if r.get("budget_end")]  # by the budget's end: not the fix's fault
    failed = [r for r in fixed if r not in ok and r not in stopped]
    timed_out = [r for r in failed if r.get("status") == "timed-out"]
    entry.partial = len(ok) < s.repeats and not timed_out
    if not fixed:
        entry.why = (
            "not run (interrupted before its first run)" if not complete else "not run within the budget"
        )
        return entry
    if not ok and (timed_out or (stopped and not failed)):
        said = f"{timed_out[0].get('error')} (compiling?)" if timed_out else stopped[0].get("error")
        entry.why = f"not measured within the budget: its run {said}"
        return entry
    entry.applied = next((r.get("applied") for r in ok if r.get("applied")), None)
    if failed and not ok:
        first = failed[0]
        what = (
            "the fix could not be applied" if first.get("status") == "not-applied" else "the fixed run failed"
        )
        entry.why = f"{what}: {first.get('error') or 'no result'}"
        return entry
    base_ok = [r for r in baseline if r.get("status") == "ok" and r.get("step_ms")]
    entry.baseline = outcome.timing([r["step_ms"] for r in base_ok])
    entry.fixed = outcome.timing([r["step_ms"] for r in ok])
    interval = outcome.realized([r["step_ms"] for r in base_ok], [r["step_ms"] for r in ok])
    if interval is not None:
        entry.realized_saving_share = round(interval.value, 4)
        entry.realized_low, entry.realized_high = round(interval.low, 4), round(interval.high, 4)
    entry.loss_check = outcome.compare_losses(
        [outcome.loss_values(r) for r in base_ok], [outcome.loss_values(r) for r in ok], s.loss_rtol
    )
    runs = min(entry.baseline.runs if entry.baseline else 0, entry.fixed.runs if entry.fixed else 0)
    predicted, basis = _predicted_here(c, entry.baseline)
    entry.predicted_saving_share = predicted
    entry.status, entry.why = outcome.judge(predicted, interval, entry.loss_check, runs)
    if basis:
        entry.why += f"; {basis}"
    for side, t in (("baseline", entry.baseline), ("fixed", entry.fixed)):
        if t is not None and t.outlier_runs_ms:
            said = ", ".join(f"{m:.2f} ms" for m in t.outlier_runs_ms)
            entry.why += f"; {len(t.outlier_runs_ms)} {side} run(s) left out as outliers ({said})"
    if failed:
        entry.why += f"; {len(failed)} of its {len(fixed)} runs failed ({failed[0].get('error')})"
    if stopped:
        entry.why += f"; its last run {stopped[0].get('error')} and is not counted"
    if entry.partial:
        entry.why += f" (partial: {len(ok)} of {s.repeats} runs)"
    return entry
