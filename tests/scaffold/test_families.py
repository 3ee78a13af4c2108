"""The scaffold families' registry (``scaffold.families.FAMILIES``) is the one list of
families: every family scaffolds from ``--kind``, and what the CLI lists and accepts is the
registry's, nothing else."""

from __future__ import annotations

import dataclasses

import pytest
from click.testing import CliRunner

from kerneltriage.cli import main
from kerneltriage.scaffold import FAMILIES, FILES, kinds_text, scaffold_kind
from kerneltriage.scaffold.families import for_kind
from kerneltriage.scaffold.writer import templates_dir

# A --shape each family takes; chain families also a chain of their own.
SHAPES = {
    "rownorm": "64x1000",
    "softmax": "64x1000",
    "attention": "2x4x96x64",
    "gemm_epilogue": "64x96x80",
    "elementwise": "64x1000",
    "depthwise_conv": "2x40x13x13",
    "generic": "64x1000",
}
CHAINS = {
    "gemm_epilogue": "linear+bias+silu",
    "elementwise": "mul+silu",
    "depthwise_conv": "depthwise_conv3x3_stride2",
}


def _words(text: str) -> str:
    return " ".join(text.split())


def test_every_family_has_a_shape_here():
    assert list(SHAPES) == list(FAMILIES)  # a new family needs its case below
    assert set(CHAINS) == {name for name, f in FAMILIES.items() if f.kind_chain is not None}


@pytest.mark.parametrize("name", list(FAMILIES))
def test_every_family_scaffolds_from_each_of_its_kinds(name, tmp_path):
    family = FAMILIES[name]
    kinds = [*family.kinds, *([CHAINS[name]] if name in CHAINS else [])]
    assert kinds, name
    for source in family.templates.values():
        assert (templates_dir() / source).is_file(), source
    assert list(family.templates) == list(FILES)
    for i, kind in enumerate(kinds):
        assert for_kind(kind) is family, kind
        result = scaffold_kind(kind, [SHAPES[name]], "fp32", tmp_path / str(i))
        assert result.template == name, kind
        assert [p.name for p in result.files] == list(FILES)
        kernel = (result.out / "kernel.py").read_text()
        compile(kernel, "kernel.py", "exec")
        assert f"def {result.name}(" in kernel
        assert f"--kind {kind} " in (result.out / "README.md").read_text()


def test_unknown_kind_names_exactly_the_registered_families(tmp_path):
    res = CliRunner().invoke(
        main, ["scaffold", "--kind", "nosuchop", "--shape", "8x8", "--out", str(tmp_path / "x")]
    )
    assert res.exit_code == 2, res.output
    listed = res.output.strip().partition("expected one of ")[2]
    assert [part.partition(":")[0] for part in listed.split("; ")] == list(FAMILIES)
    for family in FAMILIES.values():
        assert f"{family.name}: {family.kinds_text}" in listed


def test_help_lists_the_registry(monkeypatch, tmp_path):
    help_text = _words(CliRunner().invoke(main, ["scaffold", "--help"]).output)
    assert _words(kinds_text()) in help_text
    # A kind added to a family's entry is listed, accepted and scaffolded with no other change.
    rownorm = FAMILIES["rownorm"]
    monkeypatch.setitem(FAMILIES, "rownorm", dataclasses.replace(rownorm, kinds=(*rownorm.kinds, "my_norm")))
    assert "my_norm" in _words(CliRunner().invoke(main, ["scaffold", "--help"]).output)
    out = tmp_path / "mine"
    res = CliRunner().invoke(main, ["scaffold", "--kind", "my_norm", "--shape", "8x64", "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert "rownorm template" in res.output and (out / "kernel.py").is_file()
    monkeypatch.undo()
    res = CliRunner().invoke(
        main, ["scaffold", "--kind", "my_norm", "--shape", "8x64", "--out", str(tmp_path / "no")]
    )
    assert res.exit_code == 2 and "unknown --kind 'my_norm'" in res.output, res.output
