"""Phase 2 split over several GPUs, against the stand-in ncu of test_nsight_compute.py: which
process profiles which kernels on which GPU, the merged exports, a process that fails or hangs,
Ctrl-C, and the runs that stay on one GPU (--ncu-gpus 1, torchrun)."""

from __future__ import annotations

import csv
import gzip
import io
import json
import os
import re
import shutil
import signal
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from kerneltriage import rundir
from kerneltriage.ingest.kernel_names import base_name
from kerneltriage.profile import gate as gates
from kerneltriage.profile import nsight_compute as ncu_tools
from kerneltriage.profile.command import parse_command
from kerneltriage.profile.context import Options, ProfileSession, Reporter
from kerneltriage.profile.phase_ncu import plan_ncu, run_ncu
from tests.helpers import NCU_ALL, NCU_PER_CONFIG, TRACE, mangled_spelling
from tests.profile import test_nsight_compute as harness
from tests.profile.test_nsight_compute import _phase, _run_dir

fake_ncu = harness.fake_ncu  # the stand-in ncu, a fixture


def _profiling_calls(log: Path) -> list[tuple[str, str, list[str]]]:
    """(CUDA_VISIBLE_DEVICES, TMPDIR, argv) of each ncu call that ran the script."""
    calls = []
    for line in log.read_text().splitlines():
        match = re.match(r"\[(\S+) (\S+)\] (.*)", line)
        assert match, line
        args = match.group(3).split(" ")
        if "-o" in args:
            calls.append((match.group(1), match.group(2), args))
    return calls


def _covers(args: list[str], names: list[str], instances: dict[str, list[str]] | None = None) -> set[str]:
    """The kernels of ``names`` that a call's -k filter lets through: the base name, or for a
    kernel wanted in part, one of its ``instances`` (``tests.helpers.mangled_spelling``)."""
    pattern = re.compile(args[args.index("-k") + 1][len("regex:") :])
    instances = instances or {}
    return {
        n
        for n in names
        if pattern.search(f"{len(n)}{n}")
        or any(pattern.search(mangled_spelling(f)) for f in instances.get(n, []))
    }


def _rows(path: Path) -> tuple[list[str], list[list[str]]]:
    table = list(csv.reader(io.StringIO(gzip.decompress(path.read_bytes()).decode())))
    return table[0], table[2:]


def _split(tmp_path, monkeypatch, gpus: str, **options):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", gpus)
    monkeypatch.setenv("FAKE_NCU_FILTER", "1")
    monkeypatch.setenv("FAKE_NCU_LAUNCHES_CSV", str(NCU_ALL))
    out = _run_dir(tmp_path)
    manifest, warnings, events = _phase(out, tmp_path, monkeypatch, **options)
    return out, manifest.phases.ncu.to_json(), manifest, warnings, events


def test_two_gpus_share_the_hot_kernels(tmp_path, monkeypatch, fake_ncu):
    out, phase, _, _, events = _split(tmp_path, monkeypatch, "0,1")
    hot = phase["kernels"]
    calls = _profiling_calls(fake_ncu)
    assert sorted(gpu for gpu, _, _ in calls) == ["0", "1"]  # one process per GPU, each pinned
    assert len({tmp for _, tmp, _ in calls}) == 2 and os.environ.get("TMPDIR", "-") not in {
        tmp for _, tmp, _ in calls
    }  # a lock of its own each
    covered = Counter(n for _, _, args in calls for n in _covers(args, hot, phase.get("kernel_instances")))
    assert set(covered) == set(hot) and set(covered.values()) == {1}  # the hot set, no kernel twice
    for _, _, args in calls:
        assert " ".join(args).endswith("-m kerneltriage.profile.runner train.py")
    # Every kernel keeps its policy: the variable-size GEMMs every launch, the rest per config.
    assert phase["gpus"] == ["0", "1"]
    records = {r["stem"]: r for r in phase["passes"]}
    assert set(records) == {"ncu.launches.gpu0", "ncu.gpu1"}
    assert records["ncu.launches.gpu0"]["kernels"] == phase["variable_size_kernels"]
    assert set(records["ncu.gpu1"]["kernels"]) == set(hot) - set(phase["variable_size_kernels"])
    every = next(args for gpu, _, args in calls if gpu == records["ncu.launches.gpu0"]["gpu"])
    assert "--filter-mode" not in every and every[every.index("--launch-count") + 1] == "41"
    assert all(r["seconds"] >= 0 and r["start_s"] >= 0 and r["exit_code"] == 0 for r in records.values())
    assert "ncu_seconds" not in phase and phase["seconds"] >= 0
    # The every-launch process takes the first launch of each of the GEMMs' 11 problem sizes
    # (the stand-in prints its recorded 30-launch log whatever it is asked).
    assert records["ncu.launches.gpu0"]["expected"] == 11
    # The configurations left to scaling (one_size.py) cost no launch: the split counts the
    # others only, as one GPU's per-configuration pass does.
    assert phase["scaled_configs"] >= 1
    one_gpu = _split(tmp_path / "one", monkeypatch, "0")[1]
    (alone,) = [r for r in one_gpu["passes"] if r["stem"] == "ncu"]
    assert records["ncu.gpu1"]["expected"] == alone["expected"]
    # That process, alone on its GPU, has a config of its own (the other GPU's reads
    # config.ncu.json), with no gate to wait at.
    own = json.loads((out / "logs" / "config.ncu.launches.gpu0.json").read_text())
    assert own["ncu_take"] == "first-of-size" and "gate" not in own
    assert "ncu_take" not in json.loads((out / "logs" / "config.ncu.json").read_text())
    assert phase["profiled_launches"] == 60 and events[0][1] == 11 + records["ncu.gpu1"]["expected"]
    assert re.search(r"GPU 0:\d+/11 1:\d+/\d+", events[0][2])
    assert all(re.search(r"GPU 0:\d+/\d+ 1:\d+/\d+", kernel) for _, _, kernel in events)
    # The merged files hold what each process exported.
    header, launches = _rows(out / rundir.NCU_LAUNCHES_CSV)
    name = header.index("Kernel Name")
    assert {base_name(r[name]) for r in launches} == set(phase["variable_size_kernels"])
    header, configs = _rows(out / rundir.NCU_CSV)
    name = header.index("Kernel Name")
    assert {base_name(r[name]) for r in configs} <= set(records["ncu.gpu1"]["kernels"])


def test_merged_exports_are_the_union_of_the_processes(tmp_path, monkeypatch, fake_ncu):
    # Four GPUs: the every-launch GEMMs stay in one process (the first launch of each of their
    # 11 sizes), the rest go to the three others.
    out, phase, _, _, _ = _split(tmp_path, monkeypatch, "0,1,2,3")
    records = {r["stem"]: r for r in phase["passes"]}
    assert sorted(records) == ["ncu.gpu1", "ncu.gpu2", "ncu.gpu3", "ncu.launches.gpu0"]
    # One process's every-launch export is the file, as that process wrote it.
    launches = out / rundir.NCU_LAUNCHES_CSV
    part = out / rundir.LOGS / "ncu.launches.gpu0.csv.gz"
    assert gzip.decompress(launches.read_bytes()) == gzip.decompress(part.read_bytes())
    # One launch per configuration: the union of both processes' rows, each process's rows in
    # its own order, the IDs numbered anew.
    merged_header, merged = _rows(out / rundir.NCU_CSV)
    header, whole = _rows(NCU_PER_CONFIG)
    name = header.index("Kernel Name")
    rest = [n for n in phase["kernels"] if n not in phase["variable_size_kernels"]]
    # Kernels wanted in part: the instantiations asked for (and those -k cannot tell apart).
    asked = re.compile(ncu_tools.kernel_regex(rest, phase.get("kernel_instances"))[len("regex:") :])
    wanted = [r for r in whole if asked.search(mangled_spelling(r[name]))]
    assert merged_header == header and [r[0] for r in merged] == [str(i) for i in range(len(wanted))]
    assert Counter(tuple(r[1:]) for r in merged) == Counter(tuple(r[1:]) for r in wanted)
    for stem in ("ncu.gpu1", "ncu.gpu2", "ncu.gpu3"):
        mine = set(records[stem]["kernels"])
        assert [r[1:] for r in merged if base_name(r[name]) in mine] == [
            r[1:] for r in wanted if base_name(r[name]) in mine
        ]
    assert not mine & set(records["ncu.gpu1"]["kernels"])


def test_a_failed_process_loses_only_its_own_kernels(tmp_path, monkeypatch, fake_ncu):
    monkeypatch.setenv("FAKE_NCU_FAIL_GPU", "1")
    out, phase, manifest, warnings, _ = _split(tmp_path, monkeypatch, "0,1")
    records = {r["gpu"]: r for r in phase["passes"]}
    assert records["1"]["exit_code"] == 1 and records["0"]["exit_code"] == 0
    lost = set(records["1"]["kernels"])
    missing = phase["hot_without_counters"]
    assert lost <= set(missing)
    assert all(missing[n] == f"its ncu pass ({records['1']['stem']}) failed" for n in lost)
    # GPU 0's counters are kept, and the report hears of the kernels only this side knows of.
    header, rows = _rows(out / rundir.NCU_LAUNCHES_CSV)
    assert {base_name(r[header.index("Kernel Name")]) for r in rows} == set(records["0"]["kernels"])
    assert not (out / rundir.NCU_CSV).exists()
    assert not set(records["0"]["kernels"]) & set(missing)
    assert any(f"ncu ({records['1']['stem']}) wrote no report" in w for w in warnings)
    (line,) = manifest.warnings
    assert "failed" in line


def test_a_hung_process_is_stopped_and_the_others_kept(tmp_path, monkeypatch, fake_ncu):
    monkeypatch.setenv("FAKE_NCU_HANG_GPU", "0")
    start = time.perf_counter()
    out, phase, _, warnings, _ = _split(tmp_path, monkeypatch, "0,1", ncu_timeout=3.0)
    assert time.perf_counter() - start < 60
    records = {r["gpu"]: r for r in phase["passes"]}
    assert records["0"]["exit_code"] == "timeout" and records["1"]["exit_code"] == 0
    assert (out / rundir.NCU_CSV).is_file() and not (out / rundir.NCU_LAUNCHES_CSV).exists()
    assert all("failed" in phase["hot_without_counters"][n] for n in records["0"]["kernels"])
    assert any(f"ncu ({records['0']['stem']}) was stopped after 3 s" in w for w in warnings)


def test_ctrl_c_stops_every_process(tmp_path, monkeypatch, fake_ncu):
    pids = tmp_path / "pids"
    pids.mkdir()
    monkeypatch.setenv("FAKE_NCU_MODE", "hang")
    monkeypatch.setenv("FAKE_NCU_PIDS", str(pids))
    main = threading.main_thread().ident

    def interrupt_when_both_run() -> None:
        deadline = time.monotonic() + 60
        while len(list(pids.iterdir())) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        signal.pthread_kill(main, signal.SIGINT)  # what a terminal's Ctrl-C does to the parent

    threading.Thread(target=interrupt_when_both_run, daemon=True).start()
    with pytest.raises(KeyboardInterrupt):
        _split(tmp_path, monkeypatch, "0,1")
    started = [int(p.name) for p in pids.iterdir()]
    assert len(started) == 2
    for pid in started:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_one_gpu_asked_runs_one_process_at_a_time(tmp_path, monkeypatch, fake_ncu):
    out, phase, _, _, events = _split(tmp_path, monkeypatch, "0,1", ncu_gpus=1)
    calls = _profiling_calls(fake_ncu)
    # Today's chain: the every-launch pass, then the per-configuration pass, on the GPUs the
    # script was given, with ncu's own lock.
    assert [(gpu, tmp) for gpu, tmp, _ in calls] == [("0,1", os.environ.get("TMPDIR", "-"))] * 2
    # Both processes start at once, held at their gates, so the stand-in logs them in either
    # order: each is told apart by its report path, and the passes' record gives the order.
    by_report = {Path(args[args.index("-o") + 1]).name: args for _, _, args in calls}
    assert "--filter-mode" not in by_report["ncu.launches"] and "per-launch-config" in by_report["ncu"]
    assert all(args[0] != "env" for _, _, args in calls) and (
        out / "logs" / "ncu.launches_command.txt"
    ).read_text().startswith(str(Path(ncu_tools.find_ncu())))
    assert "gpus" not in phase and "single_gpu_reason" not in phase
    assert [(r["stem"], r["gpu"]) for r in phase["passes"]] == [("ncu.launches", None), ("ncu", None)]
    assert phase["ncu.launches_exit_code"] == 0 and phase["ncu_seconds"] >= 0
    assert events[-1][1] == phase["passes"][1]["expected"]  # the bar follows each pass, as before
    assert (out / rundir.NCU_CSV).is_file() and (out / rundir.NCU_LAUNCHES_CSV).is_file()


def test_a_torchrun_job_is_not_split(tmp_path, monkeypatch, fake_ncu):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("")
    out = tmp_path / "run"
    (out / rundir.LOGS).mkdir(parents=True)
    shutil.copy(TRACE, out / "trace.rank0.json.gz")
    manifest = rundir.Manifest(command=["torchrun", "train.py"])
    command = parse_command(["torchrun", "--nproc-per-node", "2", "train.py"])
    run_ncu(
        ProfileSession(command, Options(ncu_every_counter=True), out, manifest, Reporter(), []),
        ncu_tools.find_ncu(),
    )
    phase = manifest.phases.ncu.to_json()
    assert {gpu for gpu, _, _ in _profiling_calls(fake_ncu)} == {"0,1"}
    assert "torchrun" in phase["single_gpu_reason"] and "gpus" not in phase
    assert [r["gpu"] for r in phase["passes"]] == [None, None]


def test_the_option_reaches_the_session(tmp_path, monkeypatch):
    from click.testing import CliRunner

    from kerneltriage.cli import main
    from kerneltriage.profile import session

    seen: list[Options] = []

    def run_profile(argv, options, reporter=None):
        seen.append(options)
        return session.Result(tmp_path / "run", rundir.Manifest(), [])

    monkeypatch.setattr(session, "run_profile", run_profile)
    runner = CliRunner()
    assert runner.invoke(main, ["profile", "--ncu-gpus", "2", "--", "python", "t.py"]).exit_code == 0
    assert runner.invoke(main, ["profile", "--", "python", "t.py"]).exit_code == 0
    assert [o.ncu_gpus for o in seen] == [2, None]  # None: every visible GPU
    refused = runner.invoke(main, ["profile", "--ncu-gpus", "0", "--", "python", "t.py"])
    assert refused.exit_code == 2 and "--ncu-gpus" in refused.output
    text = " ".join(runner.invoke(main, ["profile", "--help"], terminal_width=200).output.split())
    assert "--ncu-gpus N" in text and "CUDA_VISIBLE_DEVICES" in text and "1: one process at a time" in text


def test_manifests_with_and_without_the_processes_load(tmp_path, monkeypatch, fake_ncu):
    from tests.helpers import EXAMPLE_RUN

    older = rundir.read_manifest(EXAMPLE_RUN)  # written before phase 2 recorded its processes
    assert older.phases.ncu is not None and older.phases.ncu.passes is None and older.phases.ncu.gpus is None
    _, phase, manifest, _, _ = _split(tmp_path, monkeypatch, "0,1")
    rundir.write_manifest(tmp_path / "again", manifest)
    again = rundir.read_manifest(tmp_path / "again").phases.ncu
    assert again.to_json() == phase and [p.gpu for p in again.passes] == ["0", "1"]


def _one_gpu_with_times(tmp_path, monkeypatch, **env: str) -> tuple[Path, dict, dict[tuple[str, str], float]]:
    """Phase 2 on one GPU with the stand-in's ``env``: the run, its phase, and when each ncu call
    started, got the GPU, ended, was exported ((what, report stem) -> time)."""
    times = tmp_path / "times.txt"
    monkeypatch.setenv("FAKE_NCU_TIMES", str(times))
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    out, phase, _, _, _ = _split(tmp_path, monkeypatch, "0")
    events = {
        (what, Path(report).name): float(t)
        for what, t, report in (r.split() for r in times.read_text().splitlines())
    }
    return out, phase, events


def test_the_next_pass_starts_up_while_the_one_before_profiles(tmp_path, monkeypatch, fake_ncu):
    out, phase, events = _one_gpu_with_times(tmp_path, monkeypatch, FAKE_NCU_SECONDS="1")
    # The per-configuration pass was started with the every-launch pass, and given the GPU
    # (its script's first CUDA use let through) only once that one had ended.
    assert events[("start", "ncu")] < events[("end", "ncu.launches")] <= events[("open", "ncu")]
    assert [(r["stem"], r["exit_code"]) for r in phase["passes"]] == [("ncu.launches", 0), ("ncu", 0)]
    assert (out / rundir.NCU_CSV).is_file() and (out / rundir.NCU_LAUNCHES_CSV).is_file()


def test_the_next_pass_opens_at_the_status_where_two_processes_fit(tmp_path, monkeypatch, fake_ncu):
    # The every-launch pass's process writes its status after its profiled step; ncu then
    # writes the report and the process exits (1.1-2.0 s on an H100). Where two processes of the
    # script fit on the GPU (two_processes_fit, tested above), the next pass opens meanwhile,
    # also where it has no gate before its profiled step (a script with no warm-up steps).
    monkeypatch.setattr("kerneltriage.profile.pairs.two_processes_fit", lambda session: True)
    monkeypatch.setattr("kerneltriage.profile.pairs.measure_gates", lambda session, processes: False)
    out, phase, events = _one_gpu_with_times(tmp_path, monkeypatch, FAKE_NCU_SECONDS="1", FAKE_NCU_STATUS="1")
    assert not any(what == "measure" for what, _ in events)
    assert events[("end", "ncu.launches")] - 1.0 <= events[("open", "ncu")] < events[("end", "ncu.launches")]
    assert [(r["stem"], r["exit_code"]) for r in phase["passes"]] == [("ncu.launches", 0), ("ncu", 0)]
    assert (out / rundir.NCU_CSV).is_file() and (out / rundir.NCU_LAUNCHES_CSV).is_file()


def test_both_passes_warm_up_at_once_and_profile_in_turn_where_two_fit(tmp_path, monkeypatch, fake_ncu):
    # Where two processes of the script fit on the GPU, the per-configuration pass starts with
    # the every-launch pass; each waits at its measure gate after its warm-up. The first
    # profiles only once the second waits there, the second once the first's status is written.
    monkeypatch.setattr("kerneltriage.profile.pairs.two_processes_fit", lambda session: True)
    out, phase, events = _one_gpu_with_times(
        tmp_path, monkeypatch, FAKE_NCU_SECONDS="1", FAKE_NCU_STATUS="1", FAKE_NCU_WARMUP_SECONDS="0.5"
    )
    first, second = "ncu.launches", "ncu"
    assert events[("open", second)] < events[("profile", first)]  # warmed up together
    assert events[("profile", first)] >= events[("measure", second)]
    assert events[("measure", second)] < events[("end", first)] <= events[("profile", second)] + 1.0
    assert events[("profile", second)] < events[("end", first)]  # at the status, not the exit
    configs = [json.loads((out / "logs" / f"config.{s}.json").read_text()) for s in (first, second)]
    assert all(c["measure_gate"].endswith(f"measure.{s}") for c, s in zip(configs, (first, second)))
    assert [(r["stem"], r["exit_code"]) for r in phase["passes"]] == [(first, 0), (second, 0)]
    assert (out / rundir.NCU_CSV).is_file() and (out / rundir.NCU_LAUNCHES_CSV).is_file()
    # Without room for two, neither waits twice and the second starts after the first's exit.
    monkeypatch.setattr("kerneltriage.profile.pairs.two_processes_fit", lambda session: False)
    out, _, events = _one_gpu_with_times(tmp_path / "apart", monkeypatch)
    assert not any(what in ("measure", "profile") for what, _ in events)
    assert events[("open", second)] >= events[("end", first)]
    assert "measure_gate" not in json.loads((out / "logs" / f"config.{second}.json").read_text())


def test_a_pass_is_exported_while_the_next_one_profiles(tmp_path, monkeypatch, fake_ncu):
    # ncu reads a report on the CPU: the every-launch pass's export runs while the
    # per-configuration pass has the GPU, not between the two.
    out, phase, events = _one_gpu_with_times(tmp_path, monkeypatch, FAKE_NCU_IMPORT_SECONDS="1.5")
    assert events[("end", "ncu.launches")] <= events[("open", "ncu")] < events[("exported", "ncu.launches")]
    assert [(r["stem"], r["exit_code"]) for r in phase["passes"]] == [("ncu.launches", 0), ("ncu", 0)]
    assert (out / rundir.NCU_CSV).is_file() and (out / rundir.NCU_LAUNCHES_CSV).is_file()


def test_a_pass_whose_export_fails_loses_its_own_kernels_only(tmp_path, monkeypatch, fake_ncu):
    # The every-launch pass profiled, but its report could not be exported; the pass after it
    # ran meanwhile, and keeps its counters.
    monkeypatch.setenv("FAKE_NCU_IMPORT_FAIL", "ncu.launches")
    out, phase, _, warnings, _ = _split(tmp_path, monkeypatch, "0")
    first, second = phase["passes"]
    assert (first["stem"], second["stem"], second["exit_code"]) == ("ncu.launches", "ncu", 0)
    assert (out / rundir.NCU_CSV).is_file() and not (out / rundir.NCU_LAUNCHES_CSV).exists()
    assert any("could not export its report to CSV" in w and "could not be read" in w for w in warnings)
    missing = phase["hot_without_counters"]
    assert {n for n, why in missing.items() if why == "its ncu pass (ncu.launches) failed"} == set(
        first["kernels"]
    )
    # The second pass's kernels keep its counters (those the stand-in's capture lacks aside).
    assert not any("ncu pass" in missing.get(n, "") for n in second["kernels"])
    assert set(second["kernels"]) - set(missing)


def test_after_a_pass_whose_process_fails_the_next_does_not_run(tmp_path, monkeypatch, fake_ncu):
    monkeypatch.setenv("FAKE_NCU_FAIL_GPU", "0")
    _, phase, _, warnings, _ = _split(tmp_path, monkeypatch, "0")
    (first,) = phase["passes"]  # the per-configuration pass never started its turn
    assert (first["stem"], first["exit_code"]) == ("ncu.launches", 1)
    assert any("wrote no report (exit code 1)" in w for w in warnings)
    missing = phase["hot_without_counters"]
    assert all(missing[n] == "its ncu pass (ncu.launches) failed" for n in first["kernels"])
    later = set(phase["kernels"]) - set(first["kernels"])
    assert later and all(
        missing[n] == "its ncu pass (ncu) did not run (the ncu.launches pass failed)" for n in later
    )


def _early_session(tmp_path: Path, monkeypatch) -> tuple[ProfileSession, Path, rundir.Manifest]:
    """A session whose phase 1 went well, for phase 2 started early (the stand-in ncu)."""
    monkeypatch.setenv("FAKE_NCU_FILTER", "1")
    monkeypatch.setenv("FAKE_NCU_LAUNCHES_CSV", str(NCU_ALL))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("")
    out = _run_dir(tmp_path)
    manifest = rundir.Manifest(command=["python", "train.py"], gpu={"name": "NVIDIA H200"})
    session = ProfileSession(
        parse_command(["python", "train.py"]), Options(ncu_every_counter=True), out, manifest, Reporter(), []
    )
    return session, out, manifest


def _hold_at_gates(waiting: list, seconds: float) -> None:
    """Wait until every process is at its gate, then ``seconds`` more (the timing turns)."""
    deadline = time.monotonic() + 60
    while not all(gates.at_gate(t.gate) for t in waiting) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert all(gates.at_gate(t.gate) for t in waiting)
    time.sleep(seconds)


def test_phase_two_starts_during_the_timing_processes_and_waits_at_its_gates(tmp_path, monkeypatch, fake_ncu):
    # profile plans phase 2 and starts its processes while the timing processes start up
    # (session._EarlyNcu); they wait at their gates until phase 2 runs, and a pass's seconds
    # count from then, not from its start.
    times = tmp_path / "times.txt"
    monkeypatch.setenv("FAKE_NCU_TIMES", str(times))
    session, out, manifest = _early_session(tmp_path, monkeypatch)
    plan = plan_ncu(session, ncu_tools.find_ncu())
    assert plan is not None
    waiting = plan.start()
    try:
        assert [t.gate.name for t in waiting] == ["gate.ncu.launches", "gate.ncu"]
        _hold_at_gates(waiting, 2.0)  # the timing processes' turns
        started = [line.split() for line in times.read_text().splitlines()]
        assert {(w, Path(r).name) for w, _, r in started} == {("start", "ncu.launches"), ("start", "ncu")}
        run_ncu(session, plan.ncu, plan)
    finally:
        plan.close()
    phase = manifest.phases.ncu.to_json()
    assert [(r["stem"], r["exit_code"]) for r in phase["passes"]] == [("ncu.launches", 0), ("ncu", 0)]
    assert all(r["seconds"] < 2.0 for r in phase["passes"])
    assert (out / rundir.NCU_CSV).is_file() and (out / rundir.NCU_LAUNCHES_CSV).is_file()


def test_on_two_gpus_phase_two_starts_early_too(tmp_path, monkeypatch, fake_ncu):
    # Each GPU's chain of passes is started during the timing processes as well: every process
    # waits at its gate, and each GPU's turns count from when phase 2 runs.
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    session, out, manifest = _early_session(tmp_path, monkeypatch)
    late = plan_ncu(session, ncu_tools.find_ncu())
    plan = plan_ncu(session, ncu_tools.find_ncu(), early=True)
    assert late is not None and plan is not None and len(plan.shares) == 2
    # Started early, a process costs only its warm-up steps: the every-launch GPU now takes
    # configurations too, where a whole process start kept them off it.
    assert [bool(s.configs) for s in late.shares] == [False, True]
    assert [bool(s.configs) for s in plan.shares] == [True, True]
    waiting = plan.start()
    try:
        assert {t.gate.name for t in waiting} == {"gate.ncu.launches.gpu0", "gate.ncu.gpu0", "gate.ncu.gpu1"}
        _hold_at_gates(waiting, 2.0)  # the timing processes' turns
        run_ncu(session, plan.ncu, plan)
    finally:
        plan.close()
    phase = manifest.phases.ncu.to_json()
    assert phase["gpus"] == ["0", "1"] and len(phase["passes"]) == 3
    assert all(r["exit_code"] == 0 and r["seconds"] < 2.0 for r in phase["passes"])
    assert (out / rundir.NCU_CSV).is_file() and (out / rundir.NCU_LAUNCHES_CSV).is_file()
    assert not plan.lock_dirs  # removed with the plan
    calls = _profiling_calls(fake_ncu)
    assert sorted(gpu for gpu, _, _ in calls) == ["0", "0", "1"]  # each pinned to its GPU


def test_on_two_gpus_the_other_gpus_passes_warm_up_ahead(tmp_path, monkeypatch, fake_ncu):
    # Where two processes fit on a GPU (measure gates), the passes on the GPU the timing
    # processes do not use go through their first gate at once and wait, warmed up, at their
    # measure gate; phase 2 then finds them ready to profile. The script's GPU's passes wait at
    # their first gate as before. The plan counts the other GPU's start as almost free.
    times = tmp_path / "times.txt"
    monkeypatch.setenv("FAKE_NCU_TIMES", str(times))
    monkeypatch.setenv("FAKE_NCU_WARMUP_SECONDS", "0.5")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    monkeypatch.setattr("kerneltriage.profile.pairs.two_processes_fit", lambda session: True)
    session, out, manifest = _early_session(tmp_path, monkeypatch)
    plan = plan_ncu(session, ncu_tools.find_ncu(), early=True)
    assert plan is not None and [s.ahead for s in plan.shares] == [False, True]
    waiting = plan.start()
    try:
        deadline = time.monotonic() + 60
        ahead = [t for t in waiting if t.gate.name.endswith("gpu1")]
        while not all(gates.at_gate(t.measure) for t in ahead) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert ahead and all(gates.at_gate(t.measure) for t in ahead)
        assert not any(gates.is_open(t.gate) for t in waiting if t not in ahead)
        time.sleep(0.5)  # the timing processes' turns
        begun = time.time()
        run_ncu(session, plan.ncu, plan)
    finally:
        plan.close()
    events = {
        (what, Path(report).name): float(t)
        for what, t, report in (r.split() for r in times.read_text().splitlines())
    }
    assert events[("measure", "ncu.gpu1")] < begun <= events[("profile", "ncu.gpu1")]
    # No warm-up on its path:
    assert events[("profile", "ncu.gpu1")] < events[("open", "ncu.launches.gpu0")] + 0.5
    assert events[("open", "ncu.launches.gpu0")] >= begun  # the script's GPU: after the timing turns
    phase = manifest.phases.ncu.to_json()
    assert all(r["exit_code"] == 0 for r in phase["passes"])
    assert (out / rundir.NCU_CSV).is_file() and (out / rundir.NCU_LAUNCHES_CSV).is_file()


def test_phase_two_waits_for_the_timing_processes_where_the_host_memory_is_short(
    tmp_path, monkeypatch, fake_ncu
):
    # A model built on the host is held there while its process waits at its gate: where the
    # timing processes and phase 2's would not fit in the host's memory together, phase 2's
    # start after them, and the manifest says why.
    from kerneltriage.profile import context
    from kerneltriage.profile import session as session_module

    session, out, manifest = _early_session(tmp_path, monkeypatch)
    status = {"rank": 0, "status": "ok", "max_rss_mb": 30 * 1024.0}
    (out / "logs" / "status.timeline.rank0.json").write_text(json.dumps(status))
    early = session_module._EarlyNcu(session)
    monkeypatch.setattr(context, "available_mb", lambda: 100 * 1024.0)
    try:
        assert early() == []  # 2 timing + 2 ncu processes of 30 GiB: 120 GiB > 80 GiB
        assert early.planned and early.plan is not None and not early.plan.chains
        (note,) = [n for n in manifest.notes if "phase 2's processes started after" in n]
        assert "4 processes of 30.0 GiB" in note and "100.0 GiB available" in note
    finally:
        early.close()
    # Where they fit, phase 2's processes start at once and wait at their gates.
    manifest.notes.clear()
    monkeypatch.setattr(context, "available_mb", lambda: 200 * 1024.0)
    again = session_module._EarlyNcu(session)
    try:
        waiting = again()
        assert len(waiting) == 2 and not manifest.notes
    finally:
        again.close()


@pytest.mark.parametrize(
    ("peaks", "memory_gb", "fit"),
    [
        ([30_000.0], 85.0, True),  # T5-base-sized on an H100: 2 x 31 GB in 80% of 85 GB
        ([34_000.0], 85.0, False),  # 2 x 35.7 GB > 68 GB
        ([None], 85.0, False),  # phase 1 recorded no peak (an older runner, no CUDA)
        ([], 85.0, False),
        ([1_000.0], None, False),  # the GPU's memory unknown
    ],
)
def test_one_pass_exits_beside_the_next_ones_first_steps_only_where_two_fit(peaks, memory_gb, fit):
    from types import SimpleNamespace

    from kerneltriage.profile.pairs import two_processes_fit

    session = SimpleNamespace(
        statuses=lambda mode: [{"gpu_peak_mb": p} for p in peaks] if mode == "timeline" else [],
        manifest=SimpleNamespace(gpu={"memory_gb": memory_gb} if memory_gb else {}),
    )
    assert two_processes_fit(session) is fit
