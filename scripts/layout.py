"""Write the package tree of docs/layout.md from the code: every package and module of
``kerneltriage/`` with the first sentence of its docstring (a file's one story), between the
``<!-- layout -->`` and ``<!-- /layout -->`` markers.

    python scripts/layout.py            # rewrite docs/layout.md
    python scripts/layout.py --check    # exit 1 if it is stale (tests/test_docs.py checks it)
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "kerneltriage"
PAGE = ROOT / "docs" / "layout.md"
BEGIN, END = "<!-- layout -->", "<!-- /layout -->"
WIDTH = 100
#: Folders listed as one line (their files are one story together: kernels and their launchers,
#: the scaffold's template families, shipped data).
FOLDED = {"kernels/norms", "kernels/attention", "kernels/csrc", "scaffold/families", "data"}


def story(path: Path) -> str:
    """The first sentence of a module's (or a package's ``__init__``) docstring."""
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    text = " ".join(doc.split())
    match = re.match(r"(.+?[.:;])(\s|$)", text)
    first = match.group(1) if match else text
    return first.rstrip(".:;")


def _wrap(prefix: str, text: str) -> list[str]:
    """``prefix`` then ``text``, wrapped at ``WIDTH`` under the text's first column."""
    lines, line, fresh = [], prefix, True
    for word in text.split():
        if not fresh and len(line) + 1 + len(word) > WIDTH:
            lines.append(line)
            line, fresh = " " * len(prefix), True
        line, fresh = (line + word if fresh else f"{line} {word}"), False
    lines.append(line.rstrip())
    return lines


def tree() -> list[str]:
    out = ["kerneltriage/"]

    def walk(folder: Path, depth: int) -> None:
        indent = "  " * depth
        for path in sorted(p for p in folder.iterdir() if p.suffix == ".py" and p.name != "__init__.py"):
            out.extend(_wrap(f"{indent}{path.name:<22} ", story(path)))
        for sub in sorted(p for p in folder.iterdir() if p.is_dir() and not p.name.startswith(("_", "."))):
            rel = str(sub.relative_to(PACKAGE))
            init = sub / "__init__.py"
            what = story(init) if init.is_file() else ""
            if rel in FOLDED:
                count = sum(1 for _ in sub.rglob("*") if _.is_file() and "__pycache__" not in _.parts)
                out.extend(_wrap(f"{indent}{sub.name + '/':<22} ", f"{what} ({count} files)".strip()))
                continue
            out.extend(_wrap(f"{indent}{sub.name + '/':<22} ", what))
            walk(sub, depth + 1)

    walk(PACKAGE, 1)
    return out


def rendered(page: str) -> str:
    block = "\n".join([BEGIN, "```", *tree(), "```", END])
    head, sep, rest = page.partition(BEGIN)
    if not sep:
        raise SystemExit(f"{PAGE} has no {BEGIN} marker")
    _, _, tail = rest.partition(END)
    return head + block + tail


def main() -> int:
    page = PAGE.read_text()
    new = rendered(page)
    if "--check" in sys.argv:
        if new != page:
            print(f"{PAGE.relative_to(ROOT)} is stale: run python scripts/layout.py", file=sys.stderr)
            return 1
        return 0
    PAGE.write_text(new)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
