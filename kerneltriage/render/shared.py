"""Small pieces the renderers share: the scaffold command a candidate offers, and the layout
of terminal tables whose names wrap between words or at a name's own joints (``.``, ``_``,
``,``, a camelCase hump), never in the middle of a word."""

from __future__ import annotations

import itertools
import re
import shlex
from collections.abc import Sequence

from rich.cells import cell_len

from kerneltriage.analysis.compare.ranks import RankSummary
from kerneltriage.analysis.model import Candidate
from kerneltriage.analysis.vocabulary import Reason, Verdict
from kerneltriage.render.text import ms

RANK_HEAD = ("rank", "step time", "GPU busy", "communication", "exposed communication")

# Skips for things that are no kernel at all: nothing to scaffold.
NOT_A_KERNEL = (Reason.NOT_A_KERNEL, Reason.COMMUNICATION)


def offers_scaffold(c: Candidate) -> bool:
    """Whether the report offers ``kerneltriage scaffold`` for ``c``: not for copies, memsets
    or collectives (skipped as ``not-a-kernel`` or ``communication``)."""
    return not (c.verdict == Verdict.SKIP and c.reason in NOT_A_KERNEL)


def scaffold_command(run_ref: str, ident: str, rank: int | None = None, *, quote: bool = False) -> str:
    """``kerneltriage scaffold RUN C3`` (``--rank N`` for a rank of a multi-rank run: candidate
    ids are numbered per rank)."""
    ref = shlex.quote(run_ref) if quote else run_ref
    return f"kerneltriage scaffold {ref} {ident}" + (f" --rank {rank}" if rank is not None else "")


# Where a long identifier may break: after a separator, or before a capital that follows a
# lower-case letter (LigerFusedLinearCrossEntropy|Loss).
_AFTER = re.compile(r"[._,:/(\-]|→")
_HUMP = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")


def _atom(text: str) -> int:
    """The widest piece of ``text`` between spaces and joints, plus one: a joint is taken only
    a few cells into a line, so a piece needs that much room beside it."""
    widest = 0
    for word in text.split():
        cuts = sorted(
            {
                0,
                len(word),
                *(m.end() for m in _AFTER.finditer(word)),
                *(m.start() for m in _HUMP.finditer(word)),
            }
        )
        widest = max(widest, *(cell_len(word[a:b]) for a, b in itertools.pairwise(cuts)))
    return widest + 1


def _pieces(word: str, width: int) -> list[str]:
    """``word`` in pieces of at most ``width`` cells, cut at its joints; a piece with no joint
    within reach ends in an ellipsis instead of being cut in two."""
    out = []
    while cell_len(word) > width:
        head = word[:width]
        cuts = [m.end() for m in _AFTER.finditer(head)] + [m.start() for m in _HUMP.finditer(head)]
        cut = max((c for c in cuts if c >= max(2, width // 3)), default=0)
        if not cut:
            out.append(word[: width - 1] + "…")
            return out
        out.append(word[:cut])
        word = word[cut:]
    return [*out, word] if word else out


def wrap_name(text: str, width: int | None) -> str:
    """``text`` wrapped to ``width`` cells: between words, and a word longer than a line at
    its joints (see ``_pieces``). ``None``: as is."""
    if width is None:
        return text
    lines: list[str] = []
    for given in text.splitlines() or [""]:  # a line break in ``text`` stays one
        line = ""
        for word in given.split():
            for n, piece in enumerate(_pieces(word, width)):
                joined = f"{line} {piece}" if line and n == 0 else line + piece
                if cell_len(joined) <= width:
                    line = joined
                else:
                    lines.append(line)
                    line = piece
        lines.append(line)
    return "\n".join(lines)


def name_widths(
    width: int, headers: Sequence[str], rows: Sequence[Sequence[str]], caps: dict[int, int]
) -> dict[int, int]:
    """Widths for the name columns (index → cap) of a rich table of ``width`` cells: the other
    columns keep their natural width, the name columns share what is left in proportion to
    their own (each at most its cap, at least 10 cells)."""
    natural = [
        max([cell_len(h), *(max((cell_len(x) for x in str(r[i]).splitlines()), default=0) for r in rows)])
        for i, h in enumerate(headers)
    ]
    fixed = sum(natural[i] + 2 for i in range(len(headers)) if i not in caps) + len(headers) + 1
    want = {i: max(cell_len(headers[i]), min(natural[i], cap)) for i, cap in caps.items()}
    left = width - fixed - 2 * len(caps)
    if sum(want.values()) <= left:
        return want
    # Each name column first gets its longest word (so no word is cut), then the rest of the
    # room goes to the columns in the order of ``caps`` (the first: the one to read first).
    floor = {
        i: min(want[i], max(10, max((cell_len(w) for r in rows for w in str(r[i]).split()), default=0)))
        for i in caps
    }
    spare = left - sum(floor.values())
    if spare < 0:
        # Too narrow for every longest word: each column gets at least its longest piece
        # between joints (so ``_pieces`` cuts no word mid-piece), the rest in proportion.
        atoms = {i: min(floor[i], max(10, max((_atom(str(r[i])) for r in rows), default=0))) for i in caps}
        spare = left - sum(atoms.values())
        if spare < 0:
            total = sum(want.values())
            return {i: max(10, left * w // total) for i, w in want.items()}
        room = {i: floor[i] - atoms[i] for i in caps}
        total = sum(room.values()) or 1
        return {i: atoms[i] + spare * room[i] // total for i in caps}
    widths = dict(floor)
    for i in caps:
        more = min(spare, want[i] - floor[i])
        widths[i] += more
        spare -= more
    return widths


def rank_rows(summary: RankSummary) -> list[list[str]]:
    """One row per rank of the summary across ranks, formatted."""
    return [
        [
            str(r.rank),
            ms(r.step_time_ms),
            f"{r.gpu_busy_pct:.1f}%",
            ms(r.communication_ms),
            ms(r.exposed_communication_ms),
        ]
        for r in summary.ranks
    ]
