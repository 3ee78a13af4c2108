"""The command line through click's CliRunner: the shipped example and user mistakes."""

from __future__ import annotations

import gzip
import json

import pytest
from click.testing import CliRunner

from kerneltriage.cli import main
from tests.helpers import EXAMPLE_RUN, NCU_ALL, TRACE


def run(*args):
    return CliRunner().invoke(main, list(map(str, args)))


def test_report_on_the_shipped_example():
    result = run("report", EXAMPLE_RUN)
    assert result.exit_code == 0, result.output
    assert "attention (naive, causal)" in result.output
    assert "use-builtin" in result.output
    # profile's acceptance: the kernels phase 2 targeted are (nearly) all joined to counters.
    assert "hot kernels: 15/15 with counters" in result.output
    data = json.loads(run("report", EXAMPLE_RUN, "--format", "json").output)
    assert data["join"]["hot_time_joined_share"] >= 0.95


def test_the_counters_line_says_which_tensor_precisions_phase_two_counted(tmp_path):
    # A run whose phase 2 counted bf16 tensor-core FLOPs only (3 replay passes, not 6) says so
    # beside the coverage; a run that counted every precision (the shipped one) says nothing.
    import shutil

    run_dir = tmp_path / "run"
    shutil.copytree(EXAMPLE_RUN, run_dir)
    manifest = json.loads((run_dir / "manifest.json").read_text())
    manifest["phases"]["ncu"]["tensor_precisions"] = ["bf16"]
    (run_dir / "manifest.json").write_text(json.dumps(manifest))
    result = run("report", run_dir)
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())  # the terminal wraps the line
    assert "with counters" in text and "tensor-core FLOPs counted for bf16" in text
    assert json.loads(run("report", run_dir, "--format", "json").output)["join"]["tensor_precisions"] == [
        "bf16"
    ]
    assert "tensor-core FLOPs" not in " ".join(run("report", EXAMPLE_RUN).output.split())


def test_report_on_a_trace_with_counters_as_json(tmp_path):
    out = tmp_path / "r.json"
    result = run("report", TRACE, "--ncu", NCU_ALL, "--format", "json", "-o", out, "--top", "4")
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    assert len(data["candidates"]) == 4
    assert data["join"]["rows_joined"] == 348


def test_thresholds_from_flags():
    result = run("report", EXAMPLE_RUN, "--format", "json", "--min-headroom", "1000")
    assert result.exit_code == 0
    assert all(c["verdict"] == "skip" for c in json.loads(result.output)["candidates"])


def test_help_teaches():
    result = run("report", "--help")
    assert result.exit_code == 0
    assert "--ncu" in result.output and "Examples:" in result.output
    top = run("--help")
    assert "HEADROOM" in top.output and "HOTNESS" in top.output
    # The ladder in order: profile, report, verify, profile --apply, diff, scaffold.
    session = [line.split()[1] for line in top.output.splitlines() if line.startswith("    kerneltriage ")]
    assert session == ["profile", "report", "verify", "profile", "diff", "scaffold"]
    assert "kerneltriage profile --apply runs/exp1" in top.output


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda p: p / "missing", "no such file or directory"),
        (
            lambda p: (p / "t.json.gz").write_bytes(TRACE.read_bytes()[:9000]) and p / "t.json.gz",
            "truncated or corrupt",
        ),
        (lambda p: (p / "t.json").write_text('{"a": 1}') and p / "t.json", "not a PyTorch profiler"),
        (lambda p: (p / "t.txt").write_text("x") and p / "t.txt", "unrecognised file type"),
        (
            lambda p: (p / "empty").mkdir() or p / "empty",
            "neither a run directory (no manifest.json) nor a folder of traces",
        ),
    ],
)
def test_bad_input_is_one_line_exit_2(tmp_path, make, message):
    path = make(tmp_path)
    result = run("report", path)
    assert result.exit_code == 2
    assert message in result.output
    assert "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) == 1


def test_cpu_only_trace(tmp_path):
    data = json.loads(gzip.decompress(TRACE.read_bytes()))
    data["traceEvents"] = [
        e for e in data["traceEvents"] if e.get("cat") not in ("kernel", "gpu_memcpy", "gpu_memset")
    ]
    f = tmp_path / "cpu.json.gz"
    f.write_bytes(gzip.compress(json.dumps(data).encode()))
    result = run("report", f)
    assert result.exit_code == 2 and "CPU-only" in result.output


def test_foreign_counters_and_unknown_gpu(tmp_path):
    csv = tmp_path / "c.csv"
    csv.write_text("name,value\nfoo,1\n")
    result = run("report", TRACE, "--ncu", csv)
    assert result.exit_code == 2 and "not an Nsight Compute raw CSV" in result.output
    result = run("report", TRACE, "--gpu", "Voodoo5")
    assert result.exit_code == 2 and "not in the GPU table" in result.output and "H100-SXM" in result.output


def test_bad_run_directory_manifest(tmp_path):
    (tmp_path / "manifest.json").write_text('{"schema": "kerneltriage.run/99"}')
    result = run("report", tmp_path)
    assert result.exit_code == 2 and "not supported" in result.output
    (tmp_path / "manifest.json").write_text('{"schema": "kerneltriage.run/1"}')
    result = run("report", tmp_path)
    assert result.exit_code == 2 and "no trace.json.gz" in result.output


def test_help_shows_the_rules_files_defaults():
    import yaml

    from kerneltriage.analysis.rules import default_rules_path

    shipped = yaml.safe_load(default_rules_path().read_text())["thresholds"]
    text = " ".join(run("report", "--help").output.split())
    for flag, name in (("--min-headroom", "min_headroom"), ("--min-share", "min_share")):
        after = text[text.index(flag) :]
        assert f"Default: {shipped[name]} (from kerneltriage/data/rules/default.yaml)" in after


def test_a_bad_threshold_flag_is_one_line_exit_2():
    result = run("report", EXAMPLE_RUN, "--min-headroom", "0.5")
    assert result.exit_code == 2
    assert result.output.strip() == (
        "kerneltriage: error: --min-headroom: min_headroom is a ratio of times and must be at least 1"
    )


def test_profile_refuses_a_bad_rules_file_before_running(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("open(__file__ + '.ran', 'w').close()\n")
    result = run(
        "profile", "--rules", tmp_path / "none.yaml", "--out", tmp_path / "run", "--", "python", script
    )
    assert result.exit_code == 2
    assert "no such rules file" in result.output
    assert not (tmp_path / "train.py.ran").exists() and not (tmp_path / "run").exists()


# --- exports, several ranks, scaffold --rank, diff, help (issue 19) --------------------------

RUNS = EXAMPLE_RUN.parent
DDP = RUNS / "gpt-ddp-2gpu-h200"


def read_csv(text: str) -> list[dict[str, str]]:
    import csv
    import io

    return list(csv.DictReader(io.StringIO(text)))


def test_report_as_csv_is_the_candidates_table():
    from kerneltriage.analysis.frames import CANDIDATE_COLUMNS

    result = run("report", EXAMPLE_RUN, "--format", "csv", "--top", "5")
    assert result.exit_code == 0, result.output
    header = result.output.splitlines()[0].split(",")
    assert header == list(CANDIDATE_COLUMNS)
    rows = read_csv(result.output)
    assert [r["rank"] for r in rows] == ["1", "2", "3", "4", "5"]  # the report's order
    c1 = rows[0]
    assert c1["verdict"] == "use-builtin" and c1["headroom_source"] == "fused estimate"
    assert c1["builtin"] == "torch.nn.functional.scaled_dot_product_attention"
    assert 0.6 < float(c1["time_share"]) < 0.7 and float(c1["headroom"]) > 10


def test_export_writes_every_table(tmp_path):
    import pandas as pd

    import kerneltriage

    out = tmp_path / "tables"
    result = run("report", EXAMPLE_RUN, "--export", out, "-o", tmp_path / "report.txt")
    assert result.exit_code == 0, result.output
    names = ["candidates", "kinds", "gaps", "ranks", "kernels", "ops"]
    assert sorted(p.name for p in out.iterdir()) == sorted(f"{n}.csv" for n in names)
    assert f"wrote {out}/: " + ", ".join(f"{n}.csv" for n in names) in result.output
    csv_out = run("report", EXAMPLE_RUN, "--format", "csv").output
    assert (out / "candidates.csv").read_text() == csv_out  # the same table as --format csv
    prof = kerneltriage.load(EXAMPLE_RUN)
    kernels = pd.read_csv(out / "kernels.csv")
    assert list(kernels.columns) == list(prof.kernels.columns) and len(kernels) == len(prof.kernels)
    assert kernels.dur_us.sum() == pytest.approx(prof.kernels.dur_us.sum())
    ops = pd.read_csv(out / "ops.csv")
    assert len(ops) == len(prof.ops) and ops.gpu_us.sum() == pytest.approx(prof.ops.gpu_us.sum())
    ranks = pd.read_csv(out / "ranks.csv")
    assert len(ranks) == 1 and ranks.step_time_ms[0] == pytest.approx(47.97, abs=0.01)
    kinds = pd.read_csv(out / "kinds.csv")
    assert kinds.set_index("kind").ms_per_step["attention"] == pytest.approx(31.86, abs=0.01)


def test_export_as_parquet(tmp_path):
    import pandas as pd

    result = run(
        "report", EXAMPLE_RUN, "--export", tmp_path, "--export-format", "parquet", "-o", tmp_path / "r"
    )
    assert result.exit_code == 0, result.output
    candidates = pd.read_parquet(tmp_path / "candidates.parquet")
    from kerneltriage.api import build_report

    ranked = [c.id for c in build_report(EXAMPLE_RUN).candidates]  # the report's order
    assert candidates.id.tolist() == ranked and candidates.headroom.dtype == "float64"
    assert len(pd.read_parquet(tmp_path / "kernels.parquet")) > 1000


def test_parquet_without_pyarrow_is_one_line_exit_3(tmp_path, monkeypatch):
    import importlib.util

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "pyarrow" else find_spec(name, *a)
    )
    result = run("report", EXAMPLE_RUN, "--export", tmp_path / "t", "--export-format", "parquet")
    assert result.exit_code == 3
    assert len(result.output.strip().splitlines()) == 1
    assert "needs the pyarrow package" in result.output and "pip install pyarrow" in result.output
    assert not (tmp_path / "t").exists()  # refused before any work


def test_several_ranks_as_one_html_document(tmp_path):
    out = tmp_path / "ddp.html"
    result = run("report", DDP, "--format", "html", "-o", out)
    assert result.exit_code == 0, result.output
    page = out.read_text()
    assert page.startswith("<!DOCTYPE html>") and page.count("<!DOCTYPE html>") == 1
    assert page.count("<html") == 1 and page.count("</html>") == 1
    assert "| rank |" not in page and "|---" not in page  # no raw Markdown
    assert '<table class="ranks numbers">' in page
    assert '<section class="rank" id="rank-0">' in page and '<section class="rank" id="rank-1">' in page
    assert f"kerneltriage scaffold {DDP} C1 --rank 1" in page


def test_scaffold_a_rank(tmp_path):
    from kerneltriage.api import build_reports

    # Ids are numbered per rank on this run (tests/render/test_ranks_render.py): found by name.
    reports = build_reports(DDP)
    norm = next(c.id for c in reports[1].candidates if c.name.startswith("residual add + RMSNorm"))
    result = run("scaffold", DDP, norm, "--rank", "1", "--out", tmp_path / "r1")
    assert result.exit_code == 0, result.output
    assert "rownorm template" in result.output and "note:" not in result.output
    readme = (tmp_path / "r1" / "README.md").read_text()
    assert f"kerneltriage scaffold {DDP} {norm} --rank 1 --out" in readme and "RMSNorm" in readme
    # no --rank with several ranks: the profiled rank, and a note that says which candidate
    nccl = next(c.id for c in reports[0].candidates if c.name.startswith("ncclDevKernel_AllReduce"))
    result = run("scaffold", DDP, nccl, "--out", tmp_path / "r0")
    assert result.exit_code == 0, result.output
    assert (
        f"note: {DDP} has ranks 0, 1: scaffolding {nccl} of rank 0 (ncclDevKernel_AllReduce" in result.output
    )
    assert "--rank N picks another" in result.output and "generic template" in result.output
    bad = run("scaffold", DDP, "C1", "--rank", "5", "--out", tmp_path / "r5")
    assert bad.exit_code == 2 and "rank(s) 5 not in the run directory (it has 0, 1)" in bad.output
    kind = run("scaffold", "--kind", "rmsnorm", "--shape", "8x64", "--rank", "1", "--out", tmp_path / "k")
    assert kind.exit_code == 2 and "--rank goes with RUN CANDIDATE" in kind.output


def test_one_rank_picked_names_its_rank_in_scaffold_commands():
    result = run("report", DDP, "--rank", "1", "--format", "markdown", "--top", "3")
    assert result.exit_code == 0, result.output
    assert f"- start: `kerneltriage scaffold {DDP} C1 --rank 1`" in result.output
    assert "## Ranks" not in result.output  # one rank: its report alone


def test_cli_and_api_pick_the_counters_rank(tmp_path):
    # A two-rank run whose counters were measured on rank 1: the CLI and the Python API make
    # the same reports and the same diff, of rank 1 (the rank with counters), not rank 0.
    import shutil
    from unittest.mock import ANY

    import kerneltriage
    from kerneltriage.render import render

    copy = tmp_path / "ddp"
    shutil.copytree(DDP, copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["schedule"]["ncu_rank"] = 1
    (copy / "manifest.json").write_text(json.dumps(manifest))

    one = kerneltriage.report(copy)
    assert one.rank == 1 and one.join is not None
    rank0 = kerneltriage.report(copy, rank=0)
    assert rank0.rank == 0 and rank0.join is None
    assert one.step_time_ms != pytest.approx(rank0.step_time_ms)

    reports = run("report", copy, "--format", "json")
    assert reports.exit_code == 0, reports.output
    by_rank = json.loads(reports.output)["ranks"]
    assert by_rank["1"]["join"] is not None and by_rank["0"]["join"] is None
    alone = json.loads(render(one, "json"))
    assert by_rank["1"]["source"].pop("traces") == {"0": ANY, "1": alone["source"].pop("traces")["1"]}
    # Reading both ranks matches their collectives: wait and transfer, which one rank alone lacks.
    matched = by_rank["1"]["source"].pop("communication")
    assert matched["matched_collectives"] > 0 and "communication" not in alone["source"]
    # ... and, with the wait known, what the collectives' notes add (DDP's exposed last bucket).
    for both, single in zip(by_rank["1"]["candidates"], alone["candidates"]):
        if both["kind"] == "communication" and both["note"] != single["note"]:
            assert both["note"].startswith(single["note"]) and "last bucket" in both["note"]
            both["note"] = single["note"]
    assert by_rank["1"] == alone  # the same report, but for the traces read beside it

    cli = run("diff", copy, copy, "--format", "json")
    assert cli.exit_code == 0, cli.output
    data = json.loads(cli.output)
    assert data["step_time_ms"]["before"] == pytest.approx(one.step_time_ms)
    assert data == json.loads(json.dumps(kerneltriage.diff(copy, copy).to_json()))
    # --rank picks the other rank on both paths.
    rank0_cli = json.loads(run("diff", copy, copy, "--format", "json", "--rank", "0").output)
    assert rank0_cli["step_time_ms"]["before"] == pytest.approx(rank0.step_time_ms)
    assert rank0_cli == json.loads(json.dumps(kerneltriage.diff(copy, copy, rank=0).to_json()))


def test_a_slowdown_reads_as_a_slowdown():
    result = run("diff", RUNS / "gpt-sdpa-h200", EXAMPLE_RUN, "--top", "3")
    assert result.exit_code == 0, result.output
    assert "step time: 17.25 ms → 47.97 ms (+178.1% slower)" in result.output
    assert "% saved" not in result.output and " -" not in result.output.replace(" - ", "")


def test_calibrate_help_has_examples():
    text = run("calibrate", "--help").output
    assert "Examples:" in text and "kerneltriage calibrate --quick" in text
    assert "kerneltriage profile --calibrate -- python train.py" in text
