#!/usr/bin/env python3
"""Regenerate every sample of kerneltriage's output in README.md and docs/*.md.

A sample is the fenced block between two markers, the first naming the command that prints it:

    <!-- sample: kerneltriage report examples/runs/gpt-naive-h200 | rows=4 details=C1 -->
    ```
    …what the command prints today…
    ```
    <!-- /sample -->

The command runs in this process from the repository's root, on this checkout's package,
as the CLI runs with its output going to a file (no colour, its default width). Besides
``kerneltriage …``, ``verify-results RUN`` is the table ``kerneltriage verify`` prints when its
runs end, read back from ``RUN/verify.json`` (verify itself needs a GPU).

After ``|``, options abridge the output (shell quoting; each may repeat):

    rows=N              keep each table's first N rows, then a line "…"
    details=C1,C3       keep these candidates' detail blocks only ("none": no block)
    drop=roofline,time  leave out these lines of the detail blocks (by their label)
    short=GPU           a header line with this prefix cut to its first printed line, then "…"
    drop-table=TITLE    leave out the table whose title starts with TITLE
    warnings=drop       leave out the warnings
    from=TEXT           start at the first line that starts with TEXT

Every left-out part becomes one line "…" where it was.

The images in IMAGES are rewritten too, by the command beside each (not checked: a PNG's bytes
depend on the fonts and the matplotlib of the machine). ``docs/report.png``, a screenshot of
the HTML report in Chromium, is not among them.

    python scripts/docs_samples.py           # rewrite the samples that changed, and the images
    python scripts/docs_samples.py --check   # list them, exit 1 if any (tests/test_docs.py)
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGES = ("README.md", "docs/*.md")
SAMPLE = re.compile(r"^<!-- sample: (?P<spec>.+?) -->\n(?P<body>.*?)^<!-- /sample -->$", re.M | re.S)
ELLIPSIS = "…"
IMAGES = {  # image → the command that draws it
    "docs/roofline.png": "kerneltriage report examples/runs/gpt-naive-h200 --plot docs/roofline.png",
}
# A line that starts something of its own; any other line continues the one before it (the
# terminal wraps long lines at its width).
_START = re.compile(r"^(?:$|[A-Z][^:]{0,60}:(?: |$)|kerneltriage |warning: |C\d+  |  \S|[┏┃┡│├└])")
_LABEL = re.compile(r"^  (?:[✓✗!·]\s+)?(\S+)")


@dataclass(frozen=True)
class Sample:
    page: Path
    spec: str  # the marker's text: the command, then "| options"
    body: str  # the block between the markers as it stands

    @property
    def command(self) -> list[str]:
        return shlex.split(self.spec.partition("|")[0])

    @property
    def options(self) -> list[tuple[str, str]]:
        out = []
        for token in shlex.split(self.spec.partition("|")[2]):
            key, sep, value = token.partition("=")
            if not sep or key not in _OPTIONS:
                raise ValueError(f"{self.page.name}: unknown sample option {token!r} in {self.spec!r}")
            out.append((key, value))
        return out


_OPTIONS = {"rows", "details", "drop", "short", "drop-table", "warnings", "from"}


def samples(root: Path = ROOT) -> list[Sample]:
    """Every marked sample of README.md and docs/, in page order."""
    pages = sorted({p for pattern in PAGES for p in root.glob(pattern)})
    return [
        Sample(page, m["spec"].strip(), m["body"])
        for page in pages
        for m in SAMPLE.finditer(page.read_text())
    ]


def output(command: list[str]) -> str:
    """What ``command`` prints on stdout, run from the repository's root."""
    if command[:1] == ["verify-results"] and len(command) == 2:
        from kerneltriage import verify_record as record
        from kerneltriage.render.verify_text import result_lines

        data = record.read(ROOT / command[1])
        if data is None:
            raise ValueError(f"{command[1]} has no verify.json")
        return "\n".join(result_lines(data)) + "\n"
    if command[:1] != ["kerneltriage"]:
        raise ValueError(f"a sample's command is `kerneltriage …` or `verify-results RUN`, not {command!r}")
    from click.testing import CliRunner

    from kerneltriage.cli import main

    here = Path.cwd()
    os.chdir(ROOT)
    try:
        result = CliRunner().invoke(main, command[1:], catch_exceptions=False, color=False)
    finally:
        os.chdir(here)
    if result.exit_code != 0:
        raise RuntimeError(f"{shlex.join(command)}: exit {result.exit_code}: {result.output[-600:]}")
    return result.stdout


def _logical(lines: list[str]) -> Iterator[list[str]]:
    """Printed lines grouped into the lines the tool wrote (a line and its wrapped rest)."""
    group: list[str] = []
    for k, line in enumerate(lines):
        title = k + 1 < len(lines) and lines[k + 1].startswith("┏")  # a table's title
        if group and not _START.match(line) and not title:
            group.append(line)
            continue
        if group:
            yield group
        group = [line]
    if group:
        yield group


def _cells(row: str) -> list[str]:
    return [c.strip() for c in row.strip("│").split("│")]


def abridge(text: str, options: list[tuple[str, str]]) -> str:
    """The output with what ``options`` leave out replaced by "…" lines (see the module's doc)."""
    if not options:
        return text
    start = next((v for k, v in options if k == "from"), None)
    if start is not None:
        lines = text.split("\n")
        first = next((k for k, line in enumerate(lines) if line.startswith(start)), 0)
        text = "\n".join(([ELLIPSIS] if first else []) + lines[first:])
    rows = next((int(v) for k, v in options if k == "rows"), None)
    details = {i for k, v in options if k == "details" for i in v.split(",") if i}
    drop = {label for k, v in options if k == "drop" for label in v.split(",") if label}
    short = tuple(v for k, v in options if k == "short")
    drop_tables = tuple(v for k, v in options if k == "drop-table")
    no_warnings = ("warnings", "drop") in options

    out: list[str] = []

    def left_out() -> None:
        k = len(out)
        while k and out[k - 1] == "":
            k -= 1
        if k and out[k - 1] == ELLIPSIS:  # "…", blank lines, "…": one "…"
            del out[k:]
        if not out or out[-1] != ELLIPSIS:
            out.append(ELLIPSIS)

    groups = list(_logical(text.rstrip("\n").split("\n")))
    i = 0
    in_detail = False
    while i < len(groups):
        group = groups[i]
        first = group[0]
        title_of_table = i + 1 < len(groups) and groups[i + 1][0].startswith("┏")
        if title_of_table or first.startswith("┏"):  # a table, with its title when it has one
            end = i + (1 if title_of_table else 0)
            while end < len(groups) and not groups[end][0].startswith("└"):
                end += 1
            table = [line for g in groups[i : end + 1] for line in g]
            title = first.strip() if title_of_table else ""
            i = end + 1
            in_detail = False
            if title and any(title.startswith(t) for t in drop_tables):
                left_out()
                continue
            if rows is None:
                out.extend(table)
                continue
            kept, seen = [], 0
            for line in table:
                if line.startswith("│") and len(_cells(line)) > 1 and _cells(line)[1]:
                    seen += 1
                if line.startswith("│") and seen > rows:
                    continue
                if line.startswith("└") and seen > rows:
                    break
                kept.append(line)
            out.extend(kept)
            if seen > rows:
                out.append(ELLIPSIS)
            continue
        i += 1
        candidate = re.match(r"^(C\d+)  ", first)
        if candidate:
            in_detail = True
            if details and (candidate.group(1) not in details or "none" in details):
                in_detail = False
                while i < len(groups) and groups[i][0] != "":  # the block, up to its blank line
                    i += 1
                if i < len(groups):
                    i += 1
                left_out()
                continue
        elif first == "":
            in_detail = False
        elif in_detail and drop:
            label = _LABEL.match(first)
            if label and label.group(1) in drop:
                left_out()
                continue
        if no_warnings and first.startswith("warning: "):
            left_out()
            continue
        if any(first.startswith(p) for p in short) and len(group) > 1:
            out.append(first.rstrip() + " " + ELLIPSIS)
            continue
        out.extend(group)
    while out and out[-1] == "":
        out.pop()
    return "\n".join(line.rstrip() for line in out) + "\n"


def render(sample: Sample) -> str:
    """The block a sample's marker asks for, fenced."""
    text = abridge(output(sample.command), sample.options)
    return f"```\n{text}```\n"


def stale(root: Path = ROOT) -> list[tuple[Sample, str]]:
    """The samples whose block differs from what the tool prints today, with the new block."""
    return [(s, new) for s in samples(root) if (new := render(s)) != s.body]


def rewrite(root: Path = ROOT) -> list[Sample]:
    """Rewrite every stale sample in place; the samples rewritten."""
    changed = stale(root)
    for page in {s.page for s, _ in changed}:
        text = page.read_text()
        for sample, new in changed:
            if sample.page == page:
                old = f"<!-- sample: {sample.spec} -->\n{sample.body}<!-- /sample -->"
                text = text.replace(old, f"<!-- sample: {sample.spec} -->\n{new}<!-- /sample -->", 1)
        page.write_text(text)
    return [s for s, _ in changed]


def write_images() -> list[str]:
    """Draw every image of IMAGES with its command; the images written."""
    for command in IMAGES.values():
        output(shlex.split(command))
    return list(IMAGES)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if a sample is stale")
    args = parser.parse_args(argv)
    changed = [s for s, _ in stale()] if args.check else rewrite()
    for s in changed:
        print(f"{s.page.relative_to(ROOT)}: {s.spec}{' is stale' if args.check else ' rewritten'}")
    if not changed:
        print(f"{len(samples())} sample(s), all as the tool prints them")
    if not args.check:
        print("drew", ", ".join(write_images()))
    return 1 if args.check and changed else 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))  # this checkout's package, whatever is installed
    sys.exit(main())
