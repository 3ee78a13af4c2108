"""Ranks read and reduced in parallel (``kerneltriage.parallel``): worker processes, Dask
distributed, traces named by fsspec URLs; the same reports as one process makes."""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from kerneltriage import api
from kerneltriage.cli import main
from kerneltriage.errors import InputError
from kerneltriage.parallel import report_ranks
from tests.helpers import EXTERNAL, corpus

ROOT = Path(__file__).resolve().parents[1]
DDP = ROOT / "examples" / "runs" / "gpt-ddp-2gpu-h200"
N_RANKS = 16


def _json(reports: dict) -> dict:
    return {r: json.dumps(rep.to_json(), sort_keys=True) for r, rep in reports.items()}


def _verdicts(reports: dict) -> dict:
    """Per rank: each candidate's id, name, verdict and share."""
    return {
        r: [(c.id, c.name, c.verdict, round(c.time_share, 9)) for c in rep.candidates]
        for r, rep in reports.items()
    }


@pytest.fixture(scope="module")
def rules():
    return api.load_rules(None)


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """16 rank traces made from the DDP run's two: even ranks as ``rank-N.json`` with
    ``distributedInfo`` telling the rank (HTA's names), odd ranks as ``host_rankN.pt.trace.json``
    whose rank only their name tells. Rank 5 copies rank 1 with every GPU kernel 30% longer: a
    straggler."""
    out = tmp_path_factory.mktemp("ranks16")
    docs = [gzip.decompress((DDP / f"trace.rank{r}.json.gz").read_bytes()) for r in (0, 1)]
    for r in range(N_RANKS):
        doc = docs[r % 2]
        info = f'"distributedInfo": {{"backend": "nccl", "rank": {r % 2}, "world_size": 2'.encode()
        assert doc.count(info) == 1
        if r % 2 == 0:
            doc = doc.replace(
                info, info.replace(b'"rank": 0, "world_size": 2', f'"rank": {r}, "world_size": 16'.encode())
            )
            name = f"rank-{r}.json"
        else:
            doc = doc.replace(b'"distributedInfo"', b'"distributed_info_dropped"')
            name = f"host_rank{r}.pt.trace.json"
        if r == 5:
            events = json.loads(doc)
            for e in events["traceEvents"]:
                if e.get("cat") == "kernel":
                    e["dur"] = e["dur"] * 1.3
            doc = json.dumps(events).encode()  # one line: the any-layout reader
        (out / name).write_bytes(doc)
    return out


@pytest.fixture(scope="module")
def local(folder, rules) -> dict:
    """The folder's reports from two worker processes."""
    return report_ranks(folder, rules=rules, workers=2)


@pytest.fixture(scope="module")
def one_process(rules) -> dict:
    """The DDP run's reports, as ``report`` made them before: every rank read in this process."""
    return api.load(DDP).reports(rules=rules)


def test_workers_make_the_reports_one_process_makes(rules, one_process):
    messages: list[str] = []
    parallel = report_ranks(DDP, rules=rules, workers=2, progress=messages.append)
    assert list(parallel) == [0, 1]
    assert _json(parallel) == _json(one_process)
    # The counters join on the rank ncu profiled only, as in one process.
    assert parallel[0].join is not None and parallel[1].join is None
    assert "analysing 2 ranks in 2 processes" in messages
    assert any(m.startswith("2/2 ranks analysed") for m in messages)


@corpus
def test_an_hta_rank_folder(rules):
    """A real folder of rank traces as HTA ships them (sampled_rank-0.json.gz, …; DLRM on two
    A100s): the same reports from two worker processes as from one process."""
    folder = EXTERNAL / "hta-dlrm-2rank-a100"
    one_process = api.load(folder).reports(rules=rules)
    parallel = report_ranks(folder, workers=2)  # the shipped rules when none are given
    assert list(parallel) == [0, 1]
    assert parallel[1].source["traces"]["1"].endswith("sampled_rank-1.json.gz")
    assert _json(parallel) == _json(one_process)


@pytest.mark.slow  # 16 ranks read twice (about 20 s of CPU)
def test_folder_of_16_ranks(folder, local):
    assert list(local) == list(range(N_RANKS))
    # The files' ranks: distributedInfo for the even ones, the file name for the odd ones.
    assert local[4].source["traces"]["4"].endswith("rank-4.json")
    assert local[3].source["traces"]["3"].endswith("host_rank3.pt.trace.json")
    assert len(local[0].source["traces"]) == N_RANKS
    # Copies of one rank get one report; the straggler's kernels take longer.
    assert _verdicts({0: local[0]})[0] == _verdicts({2: local[2]})[2]
    attention = {r: next(c for c in rep.candidates if c.kind == "attention") for r, rep in local.items()}
    assert attention[5].time_ms_per_step > 1.25 * attention[3].time_ms_per_step
    from kerneltriage.analysis.compare.ranks import summarize

    stragglers = summarize(local).stragglers
    assert any(s.startswith("rank 5: attention (naive") for s in stragglers), stragglers
    assert not any(s.startswith("rank 3:") for s in stragglers)
    # The summary groups the ranks that share an id or a verdict: one line, not 16.
    from kerneltriage.render.ranks_render import render_ranks

    summary = summarize(local)
    row = next(line for line in render_ranks(summary, "markdown").splitlines() if "attention (naive" in line)
    assert "| 0–15: C1 | 0–15: use-builtin |" in row
    text = render_ranks(summary, "terminal", width=160)
    assert sum("│ 0–15: C1 " in line for line in text.splitlines()) == 1


@pytest.fixture(scope="module")
def cluster():
    import distributed  # the dask extra: scripts/test.sh installs it

    # Threads in this process: quick to start, and they see fsspec's memory:// filesystem.
    with distributed.LocalCluster(
        n_workers=2, threads_per_worker=1, processes=False, dashboard_address=None
    ) as cluster:
        yield cluster


@pytest.mark.slow
def test_dask_localcluster_gives_the_local_result(folder, local, rules, cluster):
    messages: list[str] = []
    on_dask = report_ranks(folder, rules=rules, scheduler=cluster.scheduler_address, progress=messages.append)
    assert list(on_dask) == list(range(N_RANKS))
    assert _verdicts(on_dask) == _verdicts(local)
    assert _json(on_dask) == _json(local)
    assert any("on Dask" in m for m in messages)
    # Both of the cluster's workers took ranks.
    assert len(cluster.scheduler.workers) == 2


@pytest.mark.slow
def test_urls_through_fsspec(folder, local, rules, cluster):
    import fsspec

    fs = fsspec.filesystem("memory")
    picked = ["rank-0.json", "host_rank1.pt.trace.json", "rank-2.json", "host_rank5.pt.trace.json"]
    for name in picked:
        fs.pipe(f"/ranks/{name}", (folder / name).read_bytes())
    try:
        on_dask = report_ranks("memory://ranks/", rules=rules, scheduler=cluster.scheduler_address)
        here = report_ranks("memory://ranks", rules=rules, workers=1, ranks=[5])
    finally:
        fs.rm("/ranks", recursive=True)
    assert list(on_dask) == [0, 1, 2, 5]
    assert _verdicts(on_dask) == _verdicts({r: local[r] for r in (0, 1, 2, 5)})
    assert _verdicts(here) == _verdicts({5: local[5]})
    assert on_dask[1].source["path"] == "memory://ranks/"
    assert on_dask[1].source["traces"]["1"] == "memory://ranks/host_rank1.pt.trace.json"
    # file:// URLs read the file in place.
    as_url = report_ranks(f"file://{folder}", rules=rules, workers=1, ranks=[3])
    assert _verdicts(as_url) == _verdicts({3: local[3]})


def test_cli_scheduler(one_process, cluster):
    from kerneltriage.analysis.compare.ranks import summarize
    from kerneltriage.render.ranks_render import render_rank_reports

    args = ["report", str(DDP), "--format", "json"]
    result = CliRunner().invoke(main, [*args, "--scheduler", cluster.scheduler_address])
    assert result.exit_code == 0, result.output
    expected = render_rank_reports(summarize(one_process), one_process, "json", run_ref=str(DDP))
    assert json.loads(result.stdout) == json.loads(expected)


def test_cli_without_the_dask_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "distributed", None)  # import distributed → ImportError
    monkeypatch.setitem(sys.modules, "fsspec", None)
    runner = CliRunner()
    result = runner.invoke(main, ["report", str(DDP), "--scheduler", "local"])
    assert result.exit_code == 3
    assert result.stderr.strip().splitlines() == [
        "kerneltriage: error: --scheduler needs the optional packages dask and distributed, "
        "which are not installed (pip install 'kerneltriage[dask]')"
    ]
    result = runner.invoke(main, ["report", "s3://bucket/traces/"])
    assert result.exit_code == 3
    assert "needs the optional package fsspec" in result.stderr
    # Without --scheduler or a URL, report needs neither; one worker reads in this process.
    result = runner.invoke(main, ["report", str(DDP), "--rank", "1", "--workers", "1", "--format", "json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["rank"] == 1


def test_bad_input():
    with pytest.raises(InputError, match="--workers must be at least 1"):
        report_ranks(DDP, rules=api.load_rules(None), workers=0)
    result = CliRunner().invoke(main, ["report", str(DDP), "--scheduler", "local", "--export", "/tmp/x"])
    assert result.exit_code == 2
    assert "--export reads the traces in this process" in result.stderr
    result = CliRunner().invoke(main, ["report", str(DDP), "--rank", "7", "--workers", "2"])
    assert result.exit_code == 2
    assert "rank(s) 7 not in the run directory (it has 0, 1)" in result.stderr


def test_profile_records_every_ranks_plain_steps(tmp_path):
    """``profile`` keeps each rank's own plain, clean and recorded steps in the manifest; the
    report of rank 1 takes them as rank 0's takes ``step_time``."""
    from kerneltriage import rundir
    from kerneltriage.profile.step_plan import StepPlan
    from kerneltriage.profile.step_time import other_ranks_step_time

    times = {
        "plain_ms": [94.6, 94.7, 94.65],
        "plain_median_ms": 94.66,
        "clean_ms": [95.0],
        "recorded_ms": [127.0],
    }
    statuses = [
        {"rank": 0, "trace": "trace.rank0.json.gz", "step_times": {**times, "plain_median_ms": 94.65}},
        {"rank": 1, "trace": "trace.rank1.json.gz", "step_times": {**times, "recorded_median_ms": 127.0}},
    ]
    phase = rundir.TimelinePhase()
    other_ranks_step_time(tmp_path, statuses, statuses[0], StepPlan(3, 3, 3), phase, [])
    entry = phase.to_json()["step_time_ranks"]["1"]
    assert entry["rank"] == 1 and entry["plain_median_ms"] == 94.66 and entry["recorded_median_ms"] == 127.0
    assert entry["attribution_overhead"] == pytest.approx(127.0 / 94.66 - 1, abs=1e-4)
    assert "0" not in phase.to_json()["step_time_ranks"]
