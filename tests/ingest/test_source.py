"""What ``report`` opens: folders of per-rank traces nobody here made, and ``--rank`` checks.

The traces are the real third-party ones of ../shared/external-traces, read in place (links in
a temporary folder point at them; nothing is copied).
"""

from __future__ import annotations

import gzip
import json
from functools import cache
from pathlib import Path

import pytest
from click.testing import CliRunner

from kerneltriage.cli import main
from kerneltriage.errors import InputError
from kerneltriage.ingest.source import _peek_rank, load_profile
from tests.helpers import EXTERNAL, corpus

DLRM = EXTERNAL / "hta-dlrm-2rank-a100"
RESNET_PT19 = EXTERNAL / "kineto-resnet50-v100-pt19"
MINITOY = EXTERNAL / "hta-minitoy-mi250-rocm62" / "mi250_minitoy_train_ROCm6_2_kineto.json.gz"
COMPILE = EXTERNAL / "tracelens-compile-mi300x" / "trace.json.gz"
RECSYS = EXTERNAL / "hta-recsys-8rank-a100" / "control.json.gz"


def run(*args):
    return CliRunner().invoke(main, list(map(str, args)))


@cache
def _meta(path: Path) -> dict:
    """The trace's top-level keys other than its events, read with the json module."""
    data = json.loads(gzip.decompress(path.read_bytes()))
    return {k: v for k, v in data.items() if k != "traceEvents"}


def _link(folder: Path, name: str, target: Path) -> Path:
    folder.mkdir(exist_ok=True)
    (folder / name).symlink_to(target)
    return folder / name


@corpus
def test_the_traces_are_there():
    for path in (DLRM, RESNET_PT19, MINITOY, COMPILE, RECSYS):
        assert path.exists(), f"{path} missing"


@corpus
def test_a_folder_of_rank_traces_is_one_input():
    profile = load_profile(DLRM)
    files = sorted(DLRM.glob("*.json.gz"))
    expected = {_meta(f)["distributedInfo"]["rank"]: f for f in files}
    assert set(profile.timelines) == set(expected) == {0, 1}
    for rank, tl in profile.timelines.items():
        assert tl.rank == rank
        assert Path(tl.source).name == expected[rank].name
    assert profile.run_dir == DLRM and profile.manifest is None
    assert profile.source_info()["path"] == str(DLRM)
    assert not profile.warnings


@corpus
def test_rank_selection_in_a_folder_reads_only_that_rank():
    profile = load_profile(DLRM, ranks=[1])
    assert list(profile.timelines) == [1]
    assert Path(profile.timelines[1].source).name == "sampled_rank-1.json.gz"


@corpus
def test_a_rank_not_in_the_folder_is_one_line_exit_2():
    result = run("report", DLRM, "--rank", "5")
    assert result.exit_code == 2
    assert result.output.count("\n") == 1 and "Traceback" not in result.output
    assert "rank(s) 5 not in the folder" in result.output and "ranks 0, 1" in result.output


@corpus
def test_a_single_trace_checks_its_own_rank():
    rank1 = DLRM / "sampled_rank-1.json.gz"
    assert _meta(rank1)["distributedInfo"]["rank"] == 1
    result = run("report", rank1, "--rank", "0")
    assert result.exit_code == 2 and result.output.count("\n") == 1
    assert "rank(s) 0 not in the trace (it has rank 1)" in result.output
    assert list(load_profile(rank1, ranks=[1]).timelines) == [1]
    # A trace of rank 3 of an 8-rank job is rank 3, not 0.
    assert _meta(RECSYS)["distributedInfo"]["rank"] == 3
    with pytest.raises(InputError, match="it has rank 3"):
        load_profile(RECSYS, ranks=[0])


@pytest.mark.parametrize(
    "path", [DLRM / "sampled_rank-0.json.gz", DLRM / "sampled_rank-1.json.gz", RECSYS, MINITOY]
)
@corpus
def test_the_rank_is_peeked_from_the_head_of_the_file(path):
    """distributedInfo sits before traceEvents in Kineto's output: the first MiB says the rank
    without reading the events."""
    rank, looks_like_trace = _peek_rank(path)
    assert looks_like_trace
    assert rank == (_meta(path).get("distributedInfo") or {}).get("rank")


@corpus
def test_separate_captures_claiming_one_rank_are_refused_with_their_names():
    """Two single-process captures of different runs (TensorBoard's worker0, no distributedInfo)
    are not two ranks: the folder is refused in one line that names both files."""
    files = sorted(RESNET_PT19.glob("*.json.gz"))
    assert len(files) == 2 and all("distributedInfo" not in _meta(f) for f in files)
    result = run("report", RESNET_PT19)
    assert result.exit_code == 2 and result.output.count("\n") == 1
    assert all(f.name in result.output for f in files)
    assert "separate captures" in result.output and "report one file at a time" in result.output


@corpus
def test_ranks_from_file_names_when_the_traces_do_not_say(tmp_path):
    assert "distributedInfo" not in _meta(MINITOY) and "distributedInfo" not in _meta(COMPILE)
    folder = tmp_path / "job"
    _link(folder, "trace_rank_1.json.gz", MINITOY)
    _link(folder, "trace_rank_0.json.gz", COMPILE)
    (folder / "config.json").write_text('{"lr": 0.1}')  # not a trace: skipped, said so
    profile = load_profile(folder)
    assert {r: Path(t.source).name for r, t in profile.timelines.items()} == {
        0: "trace_rank_0.json.gz",
        1: "trace_rank_1.json.gz",
    }
    assert any("config.json" in w and "skipped" in w for w in profile.warnings)


@corpus
def test_traces_that_name_no_rank_are_numbered_in_name_order_with_a_warning(tmp_path):
    folder = tmp_path / "job"
    _link(folder, "b.json.gz", MINITOY)
    _link(folder, "a.pt.trace.json.gz", COMPILE)
    profile = load_profile(folder)
    assert {r: Path(t.source).name for r, t in profile.timelines.items()} == {
        0: "a.pt.trace.json.gz",
        1: "b.json.gz",
    }
    assert any("name no rank" in w and "a.pt.trace.json.gz → rank 0" in w for w in profile.warnings)


@corpus
def test_a_folder_with_one_trace_is_that_trace(tmp_path):
    folder = tmp_path / "one"
    _link(folder, "whatever.json.gz", MINITOY)
    profile = load_profile(folder)
    assert list(profile.timelines) == [0]


def test_a_folder_without_manifest_or_trace_is_one_line_exit_2(tmp_path):
    (tmp_path / "README.md").write_text("notes")
    result = run("report", tmp_path)
    assert result.exit_code == 2 and result.output.count("\n") == 1
    assert "no manifest.json" in result.output and "folder of traces" in result.output
