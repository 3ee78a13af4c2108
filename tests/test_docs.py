"""The README and the manual in docs/: every relative link and image points at a file of the
repository (and a heading of it, for #anchors), every page is in mkdocs.yml's nav, the README
stays a short tour. (`scripts/test.sh --lint`, as CI runs it, also builds the site with
`mkdocs build --strict`.)"""

from __future__ import annotations

import importlib.util
import os
import re
import sys
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


# --- samples of the tool's output: scripts/docs_samples.py -----------------------------------


def _docs_samples():
    spec = importlib.util.spec_from_file_location("docs_samples", ROOT / "scripts" / "docs_samples.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


SAMPLES = _docs_samples()


def test_the_pages_have_samples_of_every_command_they_show():
    found = SAMPLES.samples()
    commands = {" ".join(s.command[:2]) for s in found}
    assert {
        "kerneltriage report",
        "kerneltriage diff",
        "verify-results examples/runs/gemma2-h100",
    } <= commands
    assert {s.page.name for s in found} >= {"README.md", "examples.md"}
    # No fenced block of a page looks like the tool's output without being a marked sample.
    for page in PAGES:
        text = SAMPLES.SAMPLE.sub("", page.read_text())
        for block in re.findall(r"^```\n(.*?)^```", text, re.M | re.S):
            assert not re.search(r"^(Steps: |step time: |┏)", block, re.M), f"{page.name}: an unmarked sample"


@pytest.mark.parametrize(
    "sample", SAMPLES.samples(), ids=lambda s: f"{s.page.relative_to(ROOT)}: {' '.join(s.command[:4])}"
)
def test_every_sample_is_what_the_tool_prints_today(sample, monkeypatch):
    monkeypatch.chdir(ROOT)
    assert sample.body == SAMPLES.render(sample), (
        f"{sample.page.name}: the sample of `{sample.spec}` is stale: run python scripts/docs_samples.py"
    )


OUTPUT = """\
kerneltriage report run
GPU: X — ceilings 1 GB/s (measured: bandwidth,
bf16; raised)
Steps: 3 · step time 4 ms
Candidates
┏━━━━┳━━━━━┓
┃  # ┃ id  ┃
┡━━━━╇━━━━━┩
│  1 │ C1  │
│    │     │
│  2 │ C2  │
│  3 │ C3  │
└────┴─────┘
Time per kind
┏━━━━┳━━━━━┓
┃ k  ┃ ms  ┃
┡━━━━╇━━━━━┩
│ a  │ 1   │
└────┴─────┘

C1  one → use-builtin: x
  ✓  headroom   9× (needs ≥ 2×)
  roofline   1 MB and 2 GFLOP, ceiling 3 µs [fused
estimate]; today
  saving     up to 5%

C2  two → skip
  ✓  headroom   1×

warning: one
that wraps
"""


def test_abridging_leaves_out_what_the_options_name_and_marks_it():
    abridge = SAMPLES.abridge
    assert abridge(OUTPUT, []) == OUTPUT
    out = abridge(
        OUTPUT,
        [("short", "GPU"), ("rows", "1"), ("details", "C1"), ("drop", "roofline"), ("warnings", "drop")],
    ).splitlines()
    assert out[1] == "GPU: X — ceilings 1 GB/s (measured: bandwidth, …" and out[2].startswith("Steps: ")
    # one row (with its wrapped line) of each table, then "…" in place of the rest and the border
    assert out[out.index("│  1 │ C1  │") + 1 : out.index("│  1 │ C1  │") + 3] == ["│    │     │", "…"]
    assert "│  2 │ C2  │" not in out and out.count("└────┴─────┘") == 1  # the one-row table is whole
    # C1 without its roofline line (and that line's wrapped rest); C2 and the warning left out
    assert "  ✓  headroom   9× (needs ≥ 2×)" in out and not any(
        "roofline" in s or "estimate]" in s for s in out
    )
    assert "C2  two → skip" not in out and not any("warning" in s or "wraps" in s for s in out)
    assert out[-1] == "…" and out.count("…") == 3
    dropped = abridge(OUTPUT, [("drop-table", "Time per kind")]).splitlines()
    assert "Time per kind" not in dropped and "│ a  │ 1   │" not in dropped and "…" in dropped
    assert abridge(OUTPUT, [("from", "Steps:")]).splitlines()[:2] == ["…", "Steps: 3 · step time 4 ms"]
    with pytest.raises(ValueError, match="unknown sample option"):
        _ = SAMPLES.Sample(ROOT / "x.md", "kerneltriage report x | colour=red", "").options


# --- the vocabulary: every verdict and reason the report can print is documented --------------


def _documented(page: Path) -> set[str]:
    """The code spans of a page, a template's fields written without their format spec."""
    return {re.sub(r"\{(\w+)[^}]*\}", r"{\1}", span[1:-1]) for span in CODE_SPAN.findall(page.read_text())}


def test_every_verdict_and_reason_is_documented():
    from kerneltriage.analysis.vocabulary import Reason, Verdict

    documented = _documented(ROOT / "docs" / "how-it-decides.md")
    missing = [
        f"{m.__class__.__name__}.{m.name}: {m.value}"
        for m in (*Verdict, *Reason)
        if re.sub(r"\{(\w+)[^}]*\}", r"{\1}", m.value) not in documented
    ]
    assert not missing, f"not in docs/how-it-decides.md's tables: {missing}"


# --- docs/layout.md names every module, and only modules that exist -----------------------------


def test_the_layout_page_is_written_from_the_code():
    """The package tree in docs/layout.md is ``scripts/layout.py``'s output for today's tree."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("layout", ROOT / "scripts" / "layout.py")
    layout = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(layout)
    page = (ROOT / "docs" / "layout.md").read_text()
    assert layout.rendered(page) == page, "docs/layout.md is stale: run python scripts/layout.py"


def test_the_layout_page_follows_the_tree():
    text = (ROOT / "docs" / "layout.md").read_text()
    tree = FENCE.search(text).group(0)
    package = ROOT / "kerneltriage"
    # Every module of the package and of its subpackages (not of their subfolders, such as
    # kernels/norms/ or scaffold/families/, named as folders), and every subpackage.
    modules = [p for p in package.glob("*.py")] + [p for p in package.glob("*/*.py")]
    missing = [
        str(p.relative_to(ROOT))
        for p in modules
        if p.name != "__init__.py"
        and "/data/" not in str(p)
        and not re.search(rf"\b{re.escape(p.name)}\b", tree)
    ]
    folders = [p for p in package.glob("*/") if (p / "__init__.py").exists() or p.name == "data"]
    missing += [str(p.relative_to(ROOT)) for p in folders if f"{p.name}/" not in tree]
    assert not missing, f"docs/layout.md does not name: {missing}"
    # Every file it names exists somewhere in the repository.
    names = set(re.findall(r"\b([\w]+\.(?:py|yaml|sh))\b", tree))
    files = {
        name
        for top in ("kerneltriage", "examples", "benchmarks", "scripts", "tests", "docs")
        for _, dirs, names in os.walk(ROOT / top)
        if not dirs.__setitem__(slice(None), [d for d in dirs if not d.startswith(".")])
        for name in names
    } | {p.name for p in ROOT.iterdir()}
    assert not names - files, f"docs/layout.md names files that are gone: {sorted(names - files)}"


def test_the_shipped_data_cites_only_files_a_user_has():
    """The ceilings' sources are printed in reports: a file they cite must be in the repository
    (not in the corpus or other folders beside the checkout)."""
    data = ROOT / "kerneltriage" / "data"
    cited = []
    for path in [*data.glob("*.yaml"), *data.glob("rules/*.yaml")]:
        text = path.read_text()
        assert not re.search(r"\bshared/|ANCHORS", text), path.name
        cited += re.findall(r"(?<![\w/.])((?:benchmarks|docs|tests|examples|scripts)/[\w./-]+\.\w+)", text)
    assert cited, "the data cites the files its figures come from"
    assert not [c for c in cited if not (ROOT / c).exists()]


def test_every_column_of_the_python_api_tables_is_documented():
    from kerneltriage.analysis import frames

    spans = _documented(ROOT / "docs" / "python-api.md")  # `a`, `b` or `a, b, c`
    documented = spans | {part.strip() for span in spans for part in span.split(",")}
    tables = {
        "Report.to_frame()": frames.CANDIDATE_COLUMNS,
        "Profile.kernels": frames.KERNEL_COLUMNS,
        "Profile.ops": frames.OP_COLUMNS,
        "Report.gaps_frame()": frames.GAP_COLUMNS,
        "Diff.to_frame()": frames.DIFF_COLUMNS,
        "ranks": frames.RANK_COLUMNS,
        "rank_candidates": frames.RANK_CANDIDATE_COLUMNS,
    }
    missing = {table: [c for c in columns if c not in documented] for table, columns in tables.items()}
    assert not any(missing.values()), f"not in docs/python-api.md: {missing}"
