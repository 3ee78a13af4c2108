"""Phase 2 pieces: hot-kernel selection, the ncu command line, progress from ncu's output,
and the whole phase against a stand-in `ncu` executable (no GPU here)."""

from __future__ import annotations

import gzip
import json
import os
import re
import shutil
import stat
import sys
from pathlib import Path

import pytest

from kerneltriage import rundir
from kerneltriage.api import build_report
from kerneltriage.profile import nsight_compute as ncu_tools
from kerneltriage.profile.command import parse_command
from kerneltriage.profile.context import Options, ProfileSession, Reporter
from kerneltriage.profile.phase_ncu import run_ncu
from tests.helpers import DATA, GPT, NCU_PER_CONFIG, TRACE

FAKE_NCU = r'''#!{python}
"""Stand-in for Nsight Compute: records its argv, prints ncu-like output, exports a CSV.

Each call's log line starts with the CUDA_VISIBLE_DEVICES and TMPDIR it ran with. With
FAKE_NCU_FILTER set, the report keeps the -k filter and the export holds only the rows of the
CSV (FAKE_NCU_LAUNCHES_CSV for an every-launch pass, when set) whose kernels it matches, as a
real capture would. FAKE_NCU_FAIL_GPU / FAKE_NCU_HANG_GPU: that GPU's process fails / hangs.
With FAKE_NCU_FILTER, an export of a call that asked for no instruction counters has none.
FAKE_NCU_IMPORT_SECONDS: an export takes that long (its end noted as "exported").
FAKE_NCU_IMPORT_FAIL: the export of the report with that file stem fails.
FAKE_NCU_LAUNCH_SECONDS: each profiled launch's line is followed by that long a wait.
FAKE_NCU_STATUS: the runner's status is written before FAKE_NCU_SECONDS pass and ncu ends.
FAKE_NCU_WARMUP_SECONDS: a process with a measure gate warms up that long after its gate opens,
then waits at its measure gate ("measure"; "profile" once it opens)."""
import gzip, json, os, sys
args = sys.argv[1:]
gpu = os.environ.get("CUDA_VISIBLE_DEVICES", "-")
with open(os.environ["FAKE_NCU_LOG"], "a") as f:
    f.write(f"[{gpu} {os.environ.get('TMPDIR', '-')}] " + " ".join(args) + "\n")
mode = os.environ.get("FAKE_NCU_MODE")
def note(what):  # when a profiling call started, got the GPU, ended (FAKE_NCU_TIMES)
    if os.environ.get("FAKE_NCU_TIMES"):
        import time
        with open(os.environ["FAKE_NCU_TIMES"], "a") as f:
            report = args[args.index('-o') + 1] if "-o" in args else args[1][: -len(".ncu-rep")]
            f.write(f"{what} {time.time()} {report}\n")
if "-o" in args:
    note("start")
    # The runner holds a script started with others at its first CUDA use (gate.py).
    conf = json.load(open(os.environ["KERNELTRIAGE_PROFILE"])) if os.environ.get("KERNELTRIAGE_PROFILE") else {}
    if conf.get("gate"):
        from kerneltriage.profile.gate import wait_for_gate
        wait_for_gate(conf["gate"], conf["parent_pid"])
    note("open")
    if conf.get("measure_gate"):  # the runner holds it again before its profiled step
        import time
        time.sleep(float(os.environ.get("FAKE_NCU_WARMUP_SECONDS", "0")))
        note("measure")
        wait_for_gate(conf["measure_gate"], conf["parent_pid"])
        note("profile")
if args[:1] != ["--import"] and gpu == os.environ.get("FAKE_NCU_HANG_GPU"):
    mode = "hang"
if args[:1] == ["--version"]:
    print("NVIDIA (R) Nsight Compute Command Line Profiler\nVersion 2025.3.1.0 (build 1)")
elif args[:1] == ["--query-metrics"]:
    print(open(os.environ["FAKE_NCU_METRICS"]).read())
elif args[:1] == ["--import"] and os.path.basename(args[1]) == os.environ.get("FAKE_NCU_IMPORT_FAIL", "") + ".ncu-rep":
    print("==ERROR== the report could not be read", file=sys.stderr)
    sys.exit(1)
elif args[:1] == ["--import"]:
    text = gzip.open(os.environ["FAKE_NCU_CSV"], "rt").read()
    if os.environ.get("FAKE_NCU_FILTER"):
        import csv, io, re
        from kerneltriage.ingest.kernel_names import base_name
        asked = json.load(open(args[1]))
        if asked["every"] and os.environ.get("FAKE_NCU_LAUNCHES_CSV"):
            text = gzip.open(os.environ["FAKE_NCU_LAUNCHES_CSV"], "rt").read()
        pattern = re.compile(asked["k"][len("regex:"):])
        table = list(csv.reader(io.StringIO(text)))
        name = table[0].index("Kernel Name")
        from tests.helpers import mangled_spelling
        keep = [r for r in table[2:] if pattern.search(mangled_spelling(r[name]))]
        # A call that asked for no instruction or tensor counters exports none.
        counters = ("smsp__sass_", "sm__ops_path_tensor")
        light = asked["metrics"] is not None and not any(m.startswith(counters) for m in asked["metrics"])
        columns = [i for i, c in enumerate(table[0]) if not (light and c.startswith(counters))]
        out = io.StringIO()
        csv.writer(out, quoting=csv.QUOTE_ALL, lineterminator="\n").writerows([[r[i] for i in columns] for r in table[:2] + keep])
        text = out.getvalue()
    if os.environ.get("FAKE_NCU_IMPORT_SECONDS"):
        import time
        time.sleep(float(os.environ["FAKE_NCU_IMPORT_SECONDS"]))
        note("exported")
    sys.stdout.write(text)
elif mode == "hang":
    import time
    if os.environ.get("FAKE_NCU_PIDS"):
        open(os.path.join(os.environ["FAKE_NCU_PIDS"], str(os.getpid())), "w").close()
    print('==PROF== Profiling "elementwise_kernel": 0%....50%....100% - 15 passes', flush=True)
    time.sleep(600)
elif mode == "report-then-hang":
    import time
    print('==PROF== Profiling "elementwise_kernel": 0%....50%....100% - 15 passes', flush=True)
    report = args[args.index("-o") + 1] + ".ncu-rep"
    open(report, "wb").write(b"fake report")
    print("==PROF== Report: " + report, flush=True)
    time.sleep(600)  # the application never exits
elif mode == "perm":
    print("==ERROR== ERR_NVGPUCTRPERM - The user does not have permission to access NVIDIA GPU Performance Counters")
    sys.exit(1)
elif gpu == os.environ.get("FAKE_NCU_FAIL_GPU"):
    print("==ERROR== The application returned an error code (1)", file=sys.stderr)
    sys.exit(1)
else:
    for line in open(os.environ["FAKE_NCU_PROGRESS"]):
        if line.startswith("==PROF== Profiling"):
            print(line.rstrip(), flush=True)
            if os.environ.get("FAKE_NCU_LAUNCH_SECONDS"):  # what each profiled launch takes
                import time
                time.sleep(float(os.environ["FAKE_NCU_LAUNCH_SECONDS"]))
    report = args[args.index("-o") + 1] + ".ncu-rep"
    asked = {"k": args[args.index("-k") + 1] if "-k" in args else "regex:.", "every": "--filter-mode" not in args,
             "metrics": args[args.index("--metrics") + 1].split(",") if "--metrics" in args else None}
    open(report, "w").write(json.dumps(asked))
    if os.environ.get("FAKE_NCU_STATUS") and conf.get("status_name"):
        # The runner's status, written after its profiled step: ncu then writes its report.
        status = os.path.join(conf["out"], "logs", f"status.{conf['status_name']}.rank0.json")
        open(status, "w").write(json.dumps({"status": "ok", "mode": "ncu"}))
    if os.environ.get("FAKE_NCU_SECONDS"):
        import time
        time.sleep(float(os.environ["FAKE_NCU_SECONDS"]))
    note("end")
'''


@pytest.fixture
def fake_ncu(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    exe = bin_dir / "ncu"
    exe.write_text(FAKE_NCU.replace("{python}", sys.executable))
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    metrics = tmp_path / "metrics.txt"
    metrics.write_text(
        Path("benchmarks/probes/h200_roofline_metrics.txt").read_text()
        + "\nsm__throughput\ngpu__compute_memory_throughput\ngpu__dram_throughput\n"
    )
    log = tmp_path / "ncu_calls.txt"
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_NCU_LOG", str(log))
    monkeypatch.setenv("FAKE_NCU_METRICS", str(metrics))
    monkeypatch.setenv("FAKE_NCU_CSV", str(NCU_PER_CONFIG))
    monkeypatch.setenv("FAKE_NCU_PROGRESS", str(GPT / "ncu_per_config_log.txt"))
    # One GPU whatever the machine: the split over several has tests of its own (test_phase_ncu.py).
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    return log


def _run_dir(tmp_path) -> Path:
    out = tmp_path / "run"
    (out / rundir.LOGS).mkdir(parents=True)
    shutil.copy(TRACE, out / rundir.TRACE)
    return out


def _phase(out: Path, tmp_path, monkeypatch, **options):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("")
    manifest = rundir.Manifest(command=["python", "train.py"], gpu={"name": "NVIDIA H200"})
    warnings: list[str] = []
    events = []

    class Recorder(Reporter):
        def ncu_progress(self, done, total, kernel):
            events.append((done, total, kernel))

        def warn(self, message):
            warnings.append(message)

    command = parse_command(["python", "train.py"])
    # The passes as they were before the memory-bound kernels got one of their own (ncu.light):
    # its tests say so (test_phase_ncu.py).
    options.setdefault("ncu_every_counter", True)
    run_ncu(
        ProfileSession(command, Options(**options), out, manifest, Recorder(), warnings), ncu_tools.find_ncu()
    )
    return manifest, warnings, events


def test_command_line():
    cmd = ncu_tools.ncu_command(
        "ncu", Path("run/ncu"), ["a.b", "nvjet_x"], ["gpu__time_duration.sum"], ["python", "t.py"]
    )
    assert cmd[:5] == ["ncu", "--target-processes", "all", "--clock-control", "none"]
    assert cmd[cmd.index("--nvtx-include") + 1] == "kerneltriage.ncu"  # start/end range: no slash
    assert cmd[cmd.index("--kernel-name-base") + 1] == "mangled"
    assert cmd[cmd.index("-k") + 1] == ncu_tools.kernel_regex(["a.b", "nvjet_x"])
    assert cmd[cmd.index("--filter-mode") + 1] == "per-launch-config"
    assert cmd[cmd.index("--launch-count") + 1] == "1"
    assert cmd[-2:] == ["python", "t.py"]
    full = ncu_tools.ncu_command("ncu", Path("r"), [], ["m"], ["python", "t.py"], nvtx=False, full_set=True)
    assert "--nvtx" not in full and full[full.index("--set") + 1] == "full"
    every = ncu_tools.ncu_command("ncu", Path("r"), ["k"], ["m"], ["python", "t.py"], every_launch=12)
    assert "--filter-mode" not in every and every[every.index("--launch-count") + 1] == "12"


def test_ncu_is_asked_its_version_and_metrics_in_the_background(tmp_path):
    # Each is an ncu process of its own (--query-metrics takes seconds on a GPU): asked while
    # phase 1 runs, they are waited for only when phase 2's plan needs them.
    import time

    slow = tmp_path / "ncu"
    slow.write_text(
        f"#!{sys.executable}\nimport sys, time\ntime.sleep(1.0)\n"
        "if sys.argv[1] == '--version': print('Version 2025.3.1.0 (build 1)')\n"
        "else: print('dram__bytes_read  Counter  # of bytes')\n"
    )
    slow.chmod(slow.stat().st_mode | stat.S_IEXEC)
    started = time.perf_counter()
    ncu_tools.prefetch(str(slow))
    assert time.perf_counter() - started < 0.5
    assert ncu_tools.ncu_version(str(slow)) == "2025.3.1.0"
    assert ncu_tools.available_metrics(str(slow)) == {"dram__bytes_read"}
    assert time.perf_counter() - started < 2.0  # both at once, not one after the other


def test_kernel_filter_tells_instantiations_and_names_apart():
    import re

    pattern = re.compile(
        ncu_tools.kernel_regex(["elementwise_kernel", "nvjet_sm90_tst_256x128"])[len("regex:") :]
    )
    assert pattern.search("_ZN2at6native18elementwise_kernelILi128ELi4EZNS0_22gpu_kernel_impl_nocast")
    assert not pattern.search("_ZN2at6native29vectorized_elementwise_kernelILi4ENS0_11FillFunctorIbEE")
    assert not pattern.search("_ZN2at6native27unrolled_elementwise_kernelINS0_15direct_copy")
    assert pattern.search("nvjet_sm90_tst_256x128")
    anon = re.compile(ncu_tools.kernel_regex(["softmax_warp_forward"])[len("regex:") :])
    assert anon.search(
        "_ZN2at6native12_GLOBAL__N_120softmax_warp_forwardIfffLi11ELb0ELb0EEEvPT0_PKT_iiiPKbib"
    )
    assert not pattern.search("nvjet_sm90_tst_256x128_64x4_other")


def test_an_instantiation_is_matched_by_its_mangled_name():
    # Demangled and mangled names of the same kernels (Nsight Systems exports of two H100s):
    # the filter built from the demangled name matches the mangled one ncu filters on.
    import sqlite3

    from kerneltriage.ingest.kernel_names import base_name

    pairs = set()
    for name in ("h100_2gpu_1s", "mfu_2gpu_after", "mfu_2gpu_before"):
        db = sqlite3.connect(DATA / "nsys" / f"{name}.sqlite")
        pairs |= set(
            db.execute(
                "SELECT d.value, m.value FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds d ON d.id = "
                "k.demangledName JOIN StringIds m ON m.id = k.mangledName GROUP BY k.mangledName"
            )
        )
    mangled = [(d, m) for d, m in pairs if m.startswith("_Z")]
    assert len(mangled) >= 40
    told_apart = 0
    for demangled, symbol in mangled:
        base = base_name(demangled)
        pattern = re.compile(ncu_tools.kernel_regex([base], {base: [demangled]})[len("regex:") :])
        assert pattern.search(symbol), demangled
        siblings = [m for d, m in mangled if base_name(d) == base and m != symbol]
        told_apart += bool(siblings) and not all(pattern.search(m) for m in siblings)
    assert told_apart >= 20  # most instantiations with siblings are told apart from some
    # The profiler's spelling: lambdas, integer suffixes and anonymous namespaces are no
    # identifiers of the mangled name; template placeholders (T1) are back-references.
    kineto = (
        "void at::native::vectorized_elementwise_kernel<4, at::native::(anonymous namespace)::"
        "pow_tensor_scalar_kernel_impl<float, float>(at::TensorIteratorBase&, float)::{lambda(float)#2}, "
        "std::array<char*, 2ul> >(int, T1, std::array<char*, 2ul>)"
    )
    regex = ncu_tools.kernel_regex(
        ["vectorized_elementwise_kernel"], {"vectorized_elementwise_kernel": [kineto]}
    )
    assert regex == (
        "regex:(?:29vectorized_elementwise_kernel.*29pow_tensor_scalar_kernel_impl.*18TensorIteratorBase)"
    )
    # Names the trace left mangled, and kernels with no C++ name, match whole.
    whole = ncu_tools.kernel_regex(["k", "nvjet_x"], {"k": ["_ZN1k1fE"], "nvjet_x": ["nvjet_x"]})
    assert whole == "regex:^(?:_ZN1k1fE|nvjet_x)$"


def test_metrics_follow_what_the_gpu_supports():
    available = set(Path("benchmarks/probes/h200_roofline_metrics.txt").read_text().split())
    chosen = ncu_tools.metric_list(available)
    assert "sm__ops_path_tensor_src_bf16_dst_fp32.sum" in chosen
    assert "dram__bytes_read.sum" in chosen
    assert "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed" not in chosen  # not in that list
    # The SM and compute-memory SOL % cost 9 replay passes per launch and are not measured.
    assert not any(
        m.startswith(("sm__throughput", "gpu__compute_memory")) for m in ncu_tools.ROOFLINE_METRICS
    )
    assert ncu_tools.metric_list(None) == ncu_tools.ROOFLINE_METRICS


def test_tensor_counters_only_for_the_precisions_that_run():
    # Each tensor-pipe counter costs a replay pass: a bf16 model collects the bf16 one only.
    available = set(Path("benchmarks/probes/h200_roofline_metrics.txt").read_text().split())
    bf16 = ncu_tools.metric_list(available, ["bf16"])
    tensor = [m for m in bf16 if m.startswith("sm__ops_path_tensor")]
    assert tensor == ["sm__ops_path_tensor_src_bf16_dst_fp32.sum"]
    assert set(ncu_tools.metric_list(available)) - set(bf16) == {
        f"{ncu_tools.TENSOR_METRICS[p]}.sum" for p in ("fp16", "tf32", "fp8", "fp64")
    }
    assert ncu_tools.metric_list(None, ["bf16", "fp8"]) == [
        m for m in ncu_tools.ROOFLINE_METRICS if "tensor" not in m or "bf16" in m or "fp8" in m
    ]
    assert not any("tensor" in m for m in ncu_tools.metric_list(None, []))
    assert ncu_tools.metric_list(None, None) == ncu_tools.ROOFLINE_METRICS


def test_progress_from_a_recorded_ncu_log():
    seen, names = 0, []
    for line in (GPT / "ncu_per_config_log.txt").read_text().splitlines():
        p = ncu_tools.parse_progress(line, seen)
        if p:
            seen = p.index
            names.append(p.kernel)
    assert seen == 30
    assert names[0] == "elementwise_kernel" and names[-1] == "multi_tensor_apply_kernel"
    assert ncu_tools.parse_progress("loss 10.39", 0) is None


def test_phase_two_end_to_end_with_a_stand_in_ncu(tmp_path, monkeypatch, fake_ncu):
    monkeypatch.setenv("FAKE_NCU_LAUNCH_SECONDS", "0.02")
    out = _run_dir(tmp_path)
    manifest, _, events = _phase(out, tmp_path, monkeypatch)
    assert (out / rundir.NCU_CSV).is_file()
    assert gzip.decompress((out / rundir.NCU_CSV).read_bytes()) == gzip.decompress(
        NCU_PER_CONFIG.read_bytes()
    )
    phase = manifest.phases.ncu.to_json()
    # The persistent cuBLAS GEMM runs several sizes under one launch configuration: a first
    # pass profiles its every launch, then one launch per configuration for the rest (the
    # stand-in prints the recorded 30-kernel log for each pass).
    assert phase["variable_size_kernels"] == [
        "nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT",
        "nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_TNT",
    ]
    assert (out / rundir.NCU_LAUNCHES_CSV).is_file()
    assert phase["profiled_launches"] == 60 and len(events) == 60
    assert events[-1][0] == 30 and events[0][2] == "elementwise_kernel"
    launches_cmd = (out / "logs" / "ncu.launches_command.txt").read_text().split()
    # 21 + 20 launches a step, of 11 problem sizes: the runner's range takes the first launch of
    # each size; the launch count caps every launch of the step.
    assert launches_cmd[launches_cmd.index("--launch-count") + 1] == "41"
    assert launches_cmd[launches_cmd.index("--nvtx-include") + 1] == "kerneltriage.ncu.take"
    assert "per-launch-config" not in launches_cmd
    config = json.loads((out / "logs" / "config.ncu.launches.json").read_text())
    assert config["ncu_take"] == "first-of-size"
    per_config = json.loads((out / "logs" / "config.ncu.json").read_text())
    assert "ncu_take" not in per_config
    # Both passes trim the profiled step's cached GPU memory (kernel replay saves all of it).
    assert config["ncu_trim"] is True and per_config["ncu_trim"] is True
    # ... and the per-configuration pass leaves those two out: they are profiled already.
    config_cmd = (out / "logs" / "ncu_command.txt").read_text()
    assert "coopA_NNT" not in config_cmd and "elementwise_kernel" in config_cmd
    assert "coopA_NNT" in " ".join(launches_cmd)
    # The elementwise sizes left to scaling (one_size.py): their calls are named in the
    # per-configuration pass's config, and ncu excludes the range the runner opens around them.
    skip = per_config["ncu_skip"]
    assert skip and all(name.startswith("aten::") for name, _ in skip)
    assert {"aten::_to_copy", "aten::clone"} <= {name for name, _ in skip}  # what the process sees
    assert "--nvtx-exclude kerneltriage.ncu.skip" in config_cmd
    assert "ncu_skip" not in config and "--nvtx-exclude" not in launches_cmd
    assert phase["scaled_configs"] >= 1 and phase["scaled_kernels"]
    assert all("elementwise_kernel" in name for name in phase["scaled_kernels"])
    assert phase["ncu.launches_seconds"] >= 0 and phase["ncu_seconds"] >= 0
    assert 0 <= phase["plan_seconds"] < 60  # the plan's own time, on the path to phase 2
    # Each process, in order: one at a time, on the script's own GPU.
    (first, second) = phase["passes"]
    assert (first["stem"], first["gpu"], first["expected"], first["launches"]) == (
        "ncu.launches",
        None,
        11,
        30,
    )
    assert (second["stem"], second["gpu"], second["exit_code"]) == ("ncu", None, 0)
    assert second["start_s"] >= first["start_s"] + first["seconds"] - 0.02  # each rounded to 0.01 s
    # A launch's cost: from the first profiled launch's line to the last's (29 waits of 0.02 s).
    assert 29 * 0.02 <= first["profiling_s"] < first["seconds"]
    assert manifest.versions["ncu"] == "2025.3.1.0"
    profile_call = next(line for line in fake_ncu.read_text().splitlines() if "per-launch-config" in line)
    assert "--nvtx-include kerneltriage.ncu" in profile_call
    assert "-m kerneltriage.profile.runner train.py" in profile_call
    assert (out / "logs" / "ncu_command.txt").read_text().split()[0].endswith("ncu")
    assert "--print-kernel-base demangled" in fake_ncu.read_text()
    # The stand-in's CSV is a per-configuration capture filtered on the main thread: the hot
    # backward kernels have no row, and the manifest says so, for the report to repeat.
    missing = phase["hot_without_counters"]
    assert "cunn_SoftMaxBackward" in missing and "softmax_warp_forward" not in missing
    assert "ncu profiled no launch of it" in missing["cunn_SoftMaxBackward"]
    # The report's join names kernels without rows itself; the manifest carries only what the
    # join cannot know (none here).
    assert manifest.warnings == []
    assert phase["variable_over_budget"] == {} and phase["variable_launches_per_step"] == 11
    # The stand-in ran no script, so no process said it took the first of each size: the
    # report reads the export as consecutive launches.
    assert phase.get("variable_selection") is None
    # The run directory now reports with counters joined.
    (out / rundir.MANIFEST).write_text(json.dumps(rundir.Manifest().to_json()))
    rep = build_report(out)
    assert rep.join is not None and rep.join["rows"] == 60 and rep.join["rows_joined"] >= 30


def test_counter_permission_error_is_explained(tmp_path, monkeypatch, fake_ncu):
    monkeypatch.setenv("FAKE_NCU_MODE", "perm")
    out = _run_dir(tmp_path)
    _, warnings, _ = _phase(out, tmp_path, monkeypatch)
    assert not (out / rundir.NCU_CSV).exists()
    assert any("NVreg_RestrictProfilingToAdminUsers" in w for w in warnings)
    assert any("ERR_NVGPUCTRPERM" in w for w in warnings)


def test_missing_ncu_means_timeline_only(tmp_path, monkeypatch):
    from kerneltriage.profile import session

    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("")
    monkeypatch.setenv("PATH", str(tmp_path))  # nothing there
    monkeypatch.setattr(ncu_tools, "find_ncu", lambda: None)
    monkeypatch.setattr(session, "run_timeline", lambda _, **kw: None)  # phase 1 went well
    said: list[str] = []

    class Recorder(Reporter):
        def warn(self, message):
            said.append(message)

    result = session.run_profile(["python", "train.py"], Options(out=tmp_path / "run"), Recorder())
    assert result.manifest.status == "ok" and result.manifest.phases.ncu is None
    assert any("ncu" in w and "not" in w for w in result.warnings) and any("not on PATH" in w for w in said)


def test_a_hung_ncu_is_stopped_and_the_timeline_kept(tmp_path, monkeypatch, fake_ncu):
    import time

    monkeypatch.setenv("FAKE_NCU_MODE", "hang")
    out = _run_dir(tmp_path)
    start = time.perf_counter()
    manifest, warnings, events = _phase(out, tmp_path, monkeypatch, ncu_timeout=3.0)
    assert time.perf_counter() - start < 60
    assert any("stopped after 3 s" in w for w in warnings)
    assert manifest.phases.ncu.to_json()["ncu.launches_exit_code"] == "timeout"
    assert not (out / rundir.NCU_CSV).exists() and (out / rundir.TRACE).is_file()
    assert len(events) == 1  # the progress line before the hang was seen


def test_a_report_written_before_a_hang_is_kept(tmp_path, monkeypatch, fake_ncu):
    monkeypatch.setenv("FAKE_NCU_MODE", "report-then-hang")
    out = _run_dir(tmp_path)
    manifest, warnings, _ = _phase(out, tmp_path, monkeypatch, ncu_timeout=3.0)
    assert manifest.phases.ncu.to_json()["ncu_exit_code"] == "timeout"
    assert (out / rundir.NCU_CSV).is_file() and (out / rundir.NCU_LAUNCHES_CSV).is_file()
    assert any("counters are kept" in w for w in warnings)


def test_phase_two_picks_kernels_with_the_users_rules(tmp_path, monkeypatch, fake_ncu):
    rules = tmp_path / "rules.yaml"
    rules.write_text(
        "schema: kerneltriage.rules/1\n"
        "op_classes:\n"
        "  - {kind: communication, kernels: ['softmax_warp_forward']}\n"
        "  - {kind: other, ops: ['.'], kernels: ['.']}\n"
    )
    out = _run_dir(tmp_path)
    manifest, _, _ = _phase(out, tmp_path, monkeypatch, rules_file=rules)
    phase = manifest.phases.ncu.to_json()
    assert phase["excluded_communication"] == ["softmax_warp_forward"]
    assert "softmax_warp_forward" not in phase["kernels"]


def test_variable_size_kernels_over_the_launch_budget_are_named(tmp_path, monkeypatch, fake_ncu):
    # The profiling issue: two persistent GEMMs of 56 and 57 launches a step exceeded the old
    # budget of 48, got one launch per configuration, and nothing said so. The budget counts
    # the launches the pass takes: the first of each problem size. A budget of 8 holds the
    # hotter GEMM (6 sizes among its 21 launches a step), not the other (5 more).
    out = _run_dir(tmp_path)
    manifest, warnings, _ = _phase(out, tmp_path, monkeypatch, max_variable_launches=8)
    phase = manifest.phases.ncu.to_json()
    assert phase["variable_size_kernels"] == ["nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT"]
    assert phase["variable_over_budget"] == {"nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_TNT": 5}
    why = phase["hot_without_counters"]["nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_TNT"]
    assert "5 problem sizes a step" in why and "budget (8 a step, 6 taken" in why
    launches_cmd = (out / "logs" / "ncu.launches_command.txt").read_text().split()
    assert launches_cmd[launches_cmd.index("--launch-count") + 1] == "8"  # every launch, within the budget
    assert "coopA_TNT" in (out / "logs" / "ncu_command.txt").read_text()  # per configuration, at least
    assert any("coopA_TNT" in w for w in warnings)
    (line,) = manifest.warnings  # for the report: the join cannot know the budget
    assert line.startswith("hot kernels left without (some) counters by phase 2: ") and "coopA_TNT" in line
