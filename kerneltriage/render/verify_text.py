"""Text for ``verify``'s results: the summary ``verify`` prints, and the predicted-beside-realized
cells and lines the report shows once the run has a ``verify.json``."""

from __future__ import annotations

from typing import Any

from kerneltriage.render.text import pct

MARKS = {"verified": "✓", "refuted": "✗", "inconclusive": "~", "changes-results": "✗", "not verified": "?"}
LABELS = {
    "verified": "verified",
    "refuted": "refuted",
    "inconclusive": "inconclusive",
    "changes-results": "changes the model's results",
    "not verified": "not verified",
}


def _get(obj: Any, key: str) -> Any:
    return obj.get(key) if isinstance(obj, dict) else getattr(obj, key, None)


def _ms(t: Any) -> str:
    """``84.44 ms (84.1–84.8)``: a side's time with its 95% interval (``±`` half the
    interquartile range for a file written before intervals)."""
    if t is None or _get(t, "median_ms") is None:
        return "—"
    low, high = _get(t, "low_ms"), _get(t, "high_ms")
    if low is not None and high is not None:
        return f"{_get(t, 'median_ms'):.2f} ms ({low:.2f}–{high:.2f})"
    spread = _get(t, "spread_ms")
    return f"{_get(t, 'median_ms'):.2f} ms" + (f" ±{spread / 2:.2f}" if spread else "")


def _interval(v: Any) -> str:
    """`` (5.1–9.8%)``: the realized saving's 95% interval, when measured."""
    low, high = _get(v, "realized_low"), _get(v, "realized_high")
    if low is None or high is None:
        return ""
    return f" ({pct(low).rstrip('%')} to {pct(high)})".replace("-", "−")


def realized_cell(v: dict[str, Any] | None) -> str:
    """``18.2% ✓``, ``−62.0% ✗``, ``? not verified`` for a table."""
    if not v:
        return ""
    status = v.get("status", "not verified")
    share = v.get("realized_saving_share")
    if v.get("run_as"):  # one fix shared: its numbers are on the row it ran under
        return f"{MARKS.get(status, '?')} in {v['run_as']}'s fix"
    if share is None or status == "not verified":
        return f"{MARKS.get(status, '?')} {LABELS.get(status, status)}"
    text = pct(share).replace("-", "−")
    return (
        f"{text}{_interval(v)} {MARKS.get(status, '?')}"
        + (" results differ" if status == "changes-results" else "")
        + (" inconclusive" if status == "inconclusive" else "")
    )


def verification_line(v: dict[str, Any] | None) -> str:
    """One line for a candidate's details: predicted, realized (median, spread), loss check."""
    if not v:
        return ""
    status = v.get("status", "not verified")
    parts = [f"{MARKS.get(status, '?')} {LABELS.get(status, status)}"]
    if v.get("run_as"):
        parts.append(f"one fix with {v['run_as']}, measured and judged once there")
    elif v.get("shared_with"):
        parts.append(f"one fix for this and {', '.join(v['shared_with'])}, judged once")
    if v.get("predicted_saving_share") is not None:
        parts.append(f"predicted {pct(v['predicted_saving_share'])}")
    if v.get("realized_saving_share") is not None:
        parts.append(
            f"realized {pct(v['realized_saving_share'])}{_interval(v)} "
            f"({_ms(v.get('baseline'))} → {_ms(v.get('fixed'))})"
        )
    loss = v.get("loss_check")
    if loss:
        parts.append(f"losses {loss.get('status')}")
    line = " · ".join(parts)
    if v.get("why") and status != "verified":
        line += f" — {v['why']}"
    if v.get("partial"):
        line += " [partial]"
    return line


def result_lines(data: Any) -> list[str]:
    """What ``verify`` prints when its runs end (``data``: a ``VerifyFile``)."""
    settings = data.settings
    took = f" in {data.seconds / 60:.1f} min" if data.seconds else ""
    lines = [
        f"verify {data.run}: {settings.repeats}–{settings.max_repeats or settings.repeats} run(s) per side "
        f"after a warm-up run, {settings.steps} timed steps after {settings.warmup} warm-up, "
        f"losses within {settings.loss_rtol:g}{took}" + (f" · {data.device}" if data.device else ""),
        "realized savings with their 95% interval over runs and steps: verified at or above half the "
        "prediction, refuted below it, inconclusive across it",
    ]
    if data.warmup_run and data.warmup_run.get("median_ms"):
        lines.append(f"warm-up run (not counted): {data.warmup_run['median_ms']:.2f} ms a step")
    if not data.complete:
        lines.append("partial: interrupted before every run finished")
    header = (
        f"{'id':<5} {'status':<16} {'predicted':>9} {'realized (95% interval)':>24}  {'baseline':>26}  "
        f"{'fixed':>26}  runs  losses"
    )
    lines += ["", header]
    for c in data.candidates:
        realized = pct(c.realized_saving_share) + _interval(c)
        runs = f"{c.fixed.runs}" if c.fixed else "—"
        if c.run_as:
            lines.append(f"{c.id:<5} {c.status:<16} {'':>9} {'in ' + c.run_as + chr(39) + 's fix':>24}")
            continue
        lines.append(
            f"{c.id:<5} {c.status:<16} {pct(c.predicted_saving_share):>9} {realized:>24}  "
            f"{_ms(c.baseline):>26}  {_ms(c.fixed):>26}  {runs:>4}  "
            f"{c.loss_check.status if c.loss_check else '—'}"
        )
    notes = [c for c in data.candidates if c.status != "verified" and c.why]
    if notes:
        lines.append("")
        lines += [f"{c.id}: {c.why}" for c in notes]
    lines += data.notes
    return lines
