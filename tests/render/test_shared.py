"""Names in terminal tables wrap between words or at their joints (. _ , : / ( and camelCase
humps), never in the middle of a word: checked on the wrapper and on rendered tables of the
shipped runs at several terminal widths."""

from __future__ import annotations

import re

import pytest

from kerneltriage.render import render
from kerneltriage.render.shared import wrap_name
from kerneltriage.render.text import verdict_text

# Where a break without a space may fall: after a joint character, or at a camelCase hump.
JOINT_BEFORE = re.compile(r"[._,:/(\-→]$")


def joint(left: str, right: str) -> bool:
    return bool(JOINT_BEFORE.search(left)) or (
        (left[-1:].islower() or left[-1:].isdigit()) and right[:1].isupper()
    )


def check_wrapped(text: str, lines: list[str], width: int | None) -> None:
    """``lines`` rebuild ``text``: each break is a space, or a joint inside a word; a line longer
    than ``width`` never; an ellipsis only at a word's cut end."""
    rebuilt = lines[0]
    for line in lines[1:]:
        rest = text[len(rebuilt) :]
        if rest.startswith(" "):
            rebuilt += " " + line
        else:
            assert joint(rebuilt, line), (text, lines)
            rebuilt += line
    assert rebuilt == text, (text, lines)
    if width is not None:
        assert all(len(line) <= width for line in lines)


@pytest.mark.parametrize(
    ("text", "width", "lines"),
    [
        (
            "use-builtin: LigerFusedLinearCrossEntropyLoss",
            30,
            ["use-builtin:", "LigerFusedLinearCrossEntropy", "Loss"],
        ),
        ("use-builtin: fused_add_rms_norm", 17, ["use-builtin:", "fused_add_rms_", "norm"]),
        (
            "aten::_fused_adamw_(32000x1024, 1024, 1024)",
            28,
            ["aten::_fused_adamw_(", "32000x1024, 1024, 1024)"],
        ),
        ("module.blocks.*.attn (Attention)", 14, ["module.blocks.", "*.attn", "(Attention)"]),
    ],
)
def test_wrap_name_breaks_at_joints(text, width, lines):
    assert wrap_name(text, width).split("\n") == lines


def test_a_word_without_joints_is_cut_with_an_ellipsis():
    assert wrap_name("4x16x2048x64 in", 8) == "4x16x20…\nin"


@pytest.fixture(scope="module")
def reports(example_report, ddp_reports):
    return [example_report, ddp_reports[0]]


def test_every_real_name_wraps_at_joints(reports):
    texts = {c.name for r in reports for c in r.candidates} | {
        verdict_text(c, short=True) for r in reports for c in r.candidates
    }
    for text in texts:
        for width in (12, 20, 28, 44, 60):
            lines = wrap_name(text, width).split("\n")
            cut = [line for line in lines if "…" in line]
            if (cut and cut != [lines[-1]]) or (cut and not text.endswith("…")):
                # a word with no joint within reach (a name shortened at a joint ends in "…")
                assert width < max(len(w) for w in text.split())
                continue
            check_wrapped(text, lines, width)


def table_cells(text: str, column: int) -> list[list[str]]:
    """The lines of one column's cells in the candidates table, one list per row."""
    body = text[text.index("┡") :]
    body = body[: body.index("└")]
    rows: list[list[str]] = []
    for line in body.splitlines()[1:]:
        cells = [cell.strip() for cell in line.split("│")[1:-1]]
        if cells[0]:  # the "#" column opens a row
            rows.append([])
        if cells[column]:
            rows[-1].append(cells[column])
    return rows


@pytest.mark.parametrize("width", [120, 140, 200])
def test_terminal_table_never_breaks_a_word(reports, width):
    for rep in reports:
        text = render(rep, "terminal", color=False, width=width)
        names = table_cells(text, 2)
        verdicts = table_cells(text, 8)
        assert len(names) == len(rep.candidates)
        for c, name, verdict in zip(rep.candidates, names, verdicts):
            check_wrapped(c.name, name, None)
            check_wrapped(verdict_text(c, short=True), verdict, None)
