"""From the runs' results to each candidate's verdict (pure).

- step times: each process's steps are cut to their steady state (``analysis/timeline/steady.py``); a
  side's time is the mean of its processes' steady medians (a disturbed process's floor), with a two-stage bootstrap
  interval (processes, then steps);
- realized saving: ``1 − fixed / baseline``, a share of the step as the report's predicted
  saving is, with the interval of the same bootstrap over both sides;
- loss check: the first steps' losses of every fixed run against the first baseline run's,
  relative difference; when the baseline runs already differ among themselves by more than
  the tolerance, the script is not deterministic and the check is inconclusive;
- status: ``changes-results`` when the losses differ; else ``verified`` when the realized
  saving's interval lies at or above half the prediction, ``refuted`` when it lies below half
  the prediction (or below zero: a slowdown), ``inconclusive`` when it straddles that line.
"""

from __future__ import annotations

import statistics
from typing import Any

from kerneltriage.analysis.timeline import steady
from kerneltriage.verify_record import LossCheck, Status, Timing

#: A fix is refuted when it realizes less than this share of its predicted saving.
REFUTED_BELOW = 0.5


def steady_runs(runs: list[list[float]]) -> tuple[list[list[float]], int, int, list[float]]:
    """Each process's steady steps; the steps cut as warm-up transients; processes unsettled;
    the medians of outlier processes left out (``steady.outlier_runs``)."""
    kept: list[list[float]] = []
    skipped = unsettled = 0
    for run in runs:
        s = steady.steady(run)
        if s is None:
            continue
        kept.append(list(s.values))
        skipped += s.skipped
        unsettled += not s.settled
    out = set(steady.outlier_runs([steady.level(r) for r in kept]))
    dropped = [round(steady.level(r), 4) for i, r in enumerate(kept) if i in out]
    return [r for i, r in enumerate(kept) if i not in out], skipped, unsettled, dropped


def timing(runs: list[list[float]]) -> Timing | None:
    kept, skipped, unsettled, dropped = steady_runs(runs)
    if not kept:
        return None
    side = steady.side_time(kept)
    assert side is not None
    steps = [t for run in kept for t in run]
    q = statistics.quantiles(steps, n=4) if len(steps) >= 2 else [steps[0]] * 3
    return Timing(
        median_ms=round(side.value, 4),
        low_ms=round(side.low, 4),
        high_ms=round(side.high, 4),
        spread_ms=round(q[2] - q[0], 4),
        run_medians_ms=[round(steady.level(run), 4) for run in kept],
        steps=len(steps),
        runs=len(kept),
        transient_steps=skipped,
        unsettled_runs=unsettled,
        outlier_runs_ms=dropped,
    )


def realized(baseline: list[list[float]], fixed: list[list[float]]) -> steady.Interval | None:
    """The realized saving with its interval, over both sides' steady steps (outlier processes
    left out)."""
    base = steady_runs(baseline)[0]
    fix = steady_runs(fixed)[0]
    return steady.saving(base, fix)


#: Runs a side needs before a status is conclusive: one process cannot tell a fix from a slow
#: (or fast) process.
MIN_RUNS = 2


def loss_values(result: dict[str, Any]) -> list[float]:
    return [float(x["value"]) for x in result.get("losses") or [] if x.get("value") is not None]


def _rel(a: list[float], b: list[float]) -> float | None:
    n = min(len(a), len(b))
    if not n:
        return None
    return max(abs(x - y) / max(abs(y), 1e-12) for x, y in zip(a[:n], b[:n]))


def compare_losses(baseline: list[list[float]], fixed: list[list[float]], rtol: float) -> LossCheck:
    """The first steps' losses of the fixed runs against the baseline's."""
    reference = next((run for run in baseline if run), [])
    measured = [run for run in fixed if run]
    if not reference or not measured:
        side = "baseline" if not reference else "fixed"
        return LossCheck(
            status="not measured",
            rtol=rtol,
            baseline=reference,
            fixed=measured[0] if measured else [],
            detail=f"no scalar loss reached backward in the {side} runs' first steps",
        )
    noise = max((_rel(run, reference) or 0.0 for run in baseline[1:] if run), default=0.0)
    diff = max(_rel(run, reference) or 0.0 for run in measured)
    steps = min(len(reference), *(len(run) for run in measured))
    worst = max(measured, key=lambda run: _rel(run, reference) or 0.0)
    check = LossCheck(
        status="same",
        rtol=rtol,
        max_rel_diff=round(diff, 8),
        baseline_noise=round(noise, 8),
        steps_compared=steps,
        baseline=reference[:steps],
        fixed=worst[:steps],
    )
    if noise > rtol:
        check.status = "inconclusive"
        check.detail = (
            f"the baseline runs' losses differ by {noise:.2g} among themselves (above {rtol:g}): the script's "
            "data or initialisation is not deterministic, so the fix's effect on them cannot be told"
        )
    elif diff > rtol:
        check.status = "differs"
        check.detail = f"losses differ by up to {diff:.2g} (relative), above the tolerance {rtol:g}"
    else:
        check.detail = f"losses within {diff:.2g} of the baseline's (tolerance {rtol:g})"
    return check


#: A realized saving above this multiple of its prediction is verified with a note: the
#: prediction covered less than the fix changed.
BEYOND = 1.5


def judge(
    predicted: float | None,
    realized_share: steady.Interval | None,
    loss: LossCheck | None,
    runs: int = MIN_RUNS,
) -> tuple[Status, str]:
    """(status, why) of a fix whose runs finished; ``runs``: the fewest processes of either
    side (below ``MIN_RUNS``, a measured saving is inconclusive whatever its interval)."""
    if realized_share is None:
        return "not verified", "no step was timed in its runs"
    if loss is not None and loss.status == "differs":
        return "changes-results", f"changes the model's results: {loss.detail}"
    r = realized_share
    said = f"realized {r.value:.1%} (95% interval {r.low:.1%} to {r.high:.1%})"
    if predicted:
        said += f" against {predicted:.1%} predicted"
    status = steady.judge(predicted, r, REFUTED_BELOW)
    line = f"{REFUTED_BELOW:g}× the prediction" if predicted else "zero"
    if runs < MIN_RUNS:
        return "inconclusive", (
            f"{said}: one run of a side cannot tell the fix from a slow or fast process; more runs would "
            "tell (the fix stays worth acting on)"
        )
    if status == "refuted":
        if r.high < 0:
            return "refuted", f"{said}: the step got slower"
        return "refuted", f"{said}: the whole interval lies below {line}"
    if status == "inconclusive":
        return "inconclusive", (
            f"{said}: the interval straddles {line}; more runs would tell (the fix stays worth acting on)"
        )
    if predicted and r.value > BEYOND * predicted:
        # Verified, but the prediction was not: the fix changed more than the candidate (a
        # compiled module fuses its other ops too), so its saving is not this candidate's alone.
        return "verified", (
            f"{said}: {r.value / predicted:.1f}× the prediction, so the fix changes more than "
            "this candidate (its other ops, or other candidates' ops) and the prediction undercounts it"
        )
    return "verified", said
