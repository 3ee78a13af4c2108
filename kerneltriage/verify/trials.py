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
import os
import subprocess
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import kerneltriage
from kerneltriage import rundir
from kerneltriage.errors import InputError, RunDirError, ToolError
from kerneltriage.profile.command import Command, parse_command
from kerneltriage.verify import outcome, record
from kerneltriage.verify.harness import CONFIG_ENV, MODULE
from kerneltriage.verify.plan import Plan, Planned, Settings, make_plan

BASELINE = "baseline"


class Reporter:
    """What ``verify`` tells the user while it runs; the CLI renders it."""

    def run_started(self, label: str, index: int, total: int) -> None: ...

    def run_done(self, label: str, result: dict[str, Any], seconds: float) -> None: ...


@dataclass
class Trials:
    """Results so far: label -> the harness results of its runs, in order."""

    results: dict[str, list[dict[str, Any]]] = field(default_factory=dict)


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
        report.candidates,
        settings,
        step_ms=report.step_time_ms,
        ids=ids,
        by_hand=by_hand,
    )
    return plan, opened.manifest


def run_verify(plan: Plan, manifest: rundir.Manifest, reporter: Reporter | None = None) -> record.VerifyFile:
    """Run the plan; write and return ``verify.json``'s content."""
    say = reporter or Reporter()
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
    order = [BASELINE, *(c.id for c in todo)] * plan.settings.repeats if todo else []
    data = _file(plan, manifest, trials, complete=not order)
    try:
        for index, label in enumerate(order, 1):
            repeat = trials.results[label]
            command, where = commands[label]
            apply = next((c.apply for c in todo if c.id == label and c.command is None), None)
            say.run_started(label, index, len(order))
            start = time.perf_counter()
            result = _run_one(
                command, where, manifest.env, plan.settings, apply, logs / f"{label}.{len(repeat)}"
            )
            say.run_done(label, result, time.perf_counter() - start)
            repeat.append(result)
            if label == BASELINE and len(repeat) == 1:
                _check_baseline(result, plan.settings)
            data = _file(plan, manifest, trials, complete=index == len(order))
            record.write(run, data)
    except KeyboardInterrupt:
        data = _file(plan, manifest, trials, complete=False)
        data.notes.append("interrupted (Ctrl-C): the runs that finished are kept; partial entries are marked")
        record.write(run, data)
        raise
    if not order:
        record.write(run, data)
    return data


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


def _run_one(
    command: Command,
    cwd: Path,
    env_extra: dict[str, str],
    settings: Settings,
    apply: dict[str, Any] | None,
    prefix: Path,
) -> dict[str, Any]:
    """One process of the script under the harness; its result (``status`` failed when it
    wrote none)."""
    result_path = Path(f"{prefix}.result.json")
    config_path = Path(f"{prefix}.config.json")
    with contextlib.suppress(FileNotFoundError):
        result_path.unlink()
    config = {
        "result": str(result_path.resolve()),
        "warmup": settings.warmup,
        "steps": settings.steps,
        "loss_steps": settings.loss_steps,
        "seed": settings.seed,
        "apply": apply,
    }
    config_path.write_text(json.dumps(config, indent=2) + "\n")
    env = {**os.environ, **env_extra, CONFIG_ENV: str(config_path.resolve()), "PYTHONUNBUFFERED": "1"}
    package_root = str(Path(kerneltriage.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH", "")) if p)
    cmd = [*command.prefix, "-m", MODULE, *command.target]
    tail: deque[str] = deque(maxlen=20)
    try:
        with open(f"{prefix}.stdout", "w") as out, open(f"{prefix}.stderr", "w+") as err:
            proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=out, stderr=err, text=True)
            try:
                code = proc.wait()
            except KeyboardInterrupt:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=10)  # the terminal's Ctrl-C reached it too
                if proc.poll() is None:
                    proc.kill()
                raise
            err.seek(0)
            tail.extend(line.rstrip("\n") for line in err)
    except FileNotFoundError:
        raise ToolError(f"cannot start {cmd[0]!r}: not found") from None
    try:
        result = json.loads(result_path.read_text())
    except (OSError, ValueError):
        last = next((line for line in reversed(tail) if line.strip()), "")
        result = {
            "status": "failed",
            "error": f"exit code {code}" + (f": {last}" if last else ""),
            "step_ms": [],
        }
    result["exit_code"] = code
    if result["status"] == "failed" and tail and result.get("error", "").startswith("the script exited"):
        last = next((line for line in reversed(tail) if line.strip()), "")
        result["error"] += f": {last}" if last else ""
    return result


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
        settings=record.Settings(
            repeats=s.repeats,
            warmup=s.warmup,
            steps=s.steps,
            loss_steps=s.loss_steps,
            loss_rtol=s.loss_rtol,
            seed=s.seed,
        ),
        complete=complete,
        candidates=entries + kept,
    )


def _previous(run: Path) -> list[record.CandidateResult]:
    try:
        old = record.read(run)
    except InputError:
        return []  # an unreadable earlier file is replaced
    return list(old.candidates) if old else []


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
    )
    if not c.verifiable:
        return entry
    ok = [r for r in fixed if r.get("status") == "ok" and r.get("step_ms")]
    failed = [r for r in fixed if r not in ok]
    entry.partial = len(fixed) < s.repeats
    if not fixed:
        entry.why = "not run (interrupted before its first run)" if not complete else "not run"
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
    entry.realized_saving_share = outcome.realized(entry.baseline, entry.fixed)
    entry.loss_check = outcome.compare_losses(
        [outcome.loss_values(r) for r in base_ok], [outcome.loss_values(r) for r in ok], s.loss_rtol
    )
    entry.status, entry.why = outcome.judge(c.predicted, entry.realized_saving_share, entry.loss_check)
    if failed:
        entry.why += f"; {len(failed)} of its {len(fixed)} runs failed ({failed[0].get('error')})"
    if entry.partial:
        entry.why += f" (partial: {len(fixed)} of {s.repeats} runs)"
    return entry
