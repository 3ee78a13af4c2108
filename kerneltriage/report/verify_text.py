"""Text for ``verify``'s results: the summary ``verify`` prints, and the predicted-beside-realized
cells and lines the report shows once the run has a ``verify.json``."""

from __future__ import annotations

from typing import Any

from kerneltriage.report.text import pct

MARKS = {"verified": "✓", "refuted": "✗", "changes-results": "✗", "not verified": "?"}
LABELS = {
    "verified": "verified",
    "refuted": "refuted",
    "changes-results": "changes the model's results",
    "not verified": "not verified",
}


def _get(obj: Any, key: str) -> Any:
    return obj.get(key) if isinstance(obj, dict) else getattr(obj, key, None)


def _ms(t: Any) -> str:
    if t is None or _get(t, "median_ms") is None:
        return "—"
    spread = _get(t, "spread_ms")
    return f"{_get(t, 'median_ms'):.2f} ms" + (f" ±{spread / 2:.2f}" if spread else "")


def realized_cell(v: dict[str, Any] | None) -> str:
    """``18.2% ✓``, ``−62.0% ✗``, ``? not verified`` for a table."""
    if not v:
        return ""
    status = v.get("status", "not verified")
    share = v.get("realized_saving_share")
    if share is None or status == "not verified":
        return f"{MARKS.get(status, '?')} {LABELS.get(status, status)}"
    text = pct(share).replace("-", "−")
    return f"{text} {MARKS.get(status, '?')}" + (" results differ" if status == "changes-results" else "")


def verification_line(v: dict[str, Any] | None) -> str:
    """One line for a candidate's details: predicted, realized (median, spread), loss check."""
    if not v:
        return ""
    status = v.get("status", "not verified")
    parts = [f"{MARKS.get(status, '?')} {LABELS.get(status, status)}"]
    if v.get("predicted_saving_share") is not None:
        parts.append(f"predicted {pct(v['predicted_saving_share'])}")
    if v.get("realized_saving_share") is not None:
        parts.append(
            f"realized {pct(v['realized_saving_share'])} ({_ms(v.get('baseline'))} → {_ms(v.get('fixed'))})"
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
    lines = [
        f"verify {data.run}: {settings.repeats} run(s) per side, {settings.steps} timed steps after "
        f"{settings.warmup} warm-up, losses within {settings.loss_rtol:g}"
        + (f" · {data.device}" if data.device else ""),
    ]
    if not data.complete:
        lines.append("partial: interrupted before every run finished")
    header = (
        f"{'id':<5} {'status':<16} {'predicted':>9} {'realized':>9}  {'baseline':>18}  {'fixed':>18}  losses"
    )
    lines += ["", header]
    for c in data.candidates:
        lines.append(
            f"{c.id:<5} {c.status:<16} {pct(c.predicted_saving_share):>9} {pct(c.realized_saving_share):>9}  "
            f"{_ms(c.baseline):>18}  {_ms(c.fixed):>18}  {c.loss_check.status if c.loss_check else '—'}"
        )
    notes = [c for c in data.candidates if c.status != "verified" and c.why]
    if notes:
        lines.append("")
        lines += [f"{c.id}: {c.why}" for c in notes]
    lines += data.notes
    return lines
