"""The README and the manual in docs/: every relative link and image points at a file of the
repository (and a heading of it, for #anchors), every page is in mkdocs.yml's nav, the README
stays a short tour. (`scripts/test.sh --lint`, as CI runs it, also builds the site with
`mkdocs build --strict`.)"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
PAGES = [
    ROOT / "README.md",
    ROOT / "BENCHMARKS.md",
    ROOT / "CHANGELOG.md",
    *sorted((ROOT / "docs").glob("*.md")),
]
LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)
CODE_SPAN = re.compile(r"`[^`\n]*`")


def _prose(text: str) -> str:
    """The text without fenced blocks and code spans (links there are examples, not links)."""
    return CODE_SPAN.sub("", FENCE.sub("", text))


def _slug(heading: str) -> str:
    """A heading's anchor as GitHub (and mkdocs, for ASCII headings) writes it."""
    s = heading.strip().lower().replace("`", "")
    s = re.sub(r"[^\w\- ]", "", s)
    return s.replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    headings = re.findall(r"^#{1,6}\s+(.+?)\s*#*\s*$", FENCE.sub("", page.read_text()), re.M)
    return {_slug(h) for h in headings}


def _links(page: Path) -> list[str]:
    return [m.group(1) for m in LINK.finditer(_prose(page.read_text()))]


def test_the_pages_have_links_to_check():
    # Guards the checks below: a regex that stopped matching would pass them vacuously.
    assert len(_links(ROOT / "README.md")) >= 5
    assert len(_links(ROOT / "docs" / "README.md")) >= 10


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page: Path):
    broken = []
    for target in _links(page):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif not dest.is_relative_to(ROOT):
            broken.append(f"{target}: outside the repository")
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            broken.append(f"{target}: no heading #{anchor} in {dest.relative_to(ROOT)}")
    assert not broken, broken


def test_every_docs_page_is_in_the_nav():
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    nav = {next(iter(item.values())) for item in config["nav"]}
    pages = {p.name for p in (ROOT / "docs").glob("*.md")}
    assert pages == nav


def test_the_readme_is_a_short_tour():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 250, len(lines)
    # The two commands a newcomer runs first, exactly as scripts/test.sh and CI expect them.
    text = "\n".join(lines)
    assert "pip install . && kerneltriage report examples/runs/gpt-naive-h200" in text
    assert "scripts/test.sh" in text
