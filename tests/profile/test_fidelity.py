"""Phase 1 runs the program the user runs: torch.compile sees the same graphs, the module hooks
cost little, the timed steps carry no shapes collection (shapes come from a warm-up step and
are copied in), and the profiler's overhead is measured against plain steps of the same
process and reported."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from kerneltriage import rundir
from kerneltriage.analysis.timeline.attribution import attribute
from kerneltriage.cli import main
from kerneltriage.ingest.kineto import read_trace
from kerneltriage.profile.context import Options, asked_plan
from kerneltriage.profile.hooks import ProfiledProcess
from kerneltriage.profile.phase_timeline import fitted_timing
from kerneltriage.profile.step_plan import StepPlan
from kerneltriage.profile.step_time import record_step_time
from kerneltriage.profile.trace_fixup import align, copy_shapes, summarize_clean
from kerneltriage.render.text import compiled_lines

ROOT = Path(__file__).resolve().parents[2]
GPT = ROOT / "examples" / "train_gpt.py"
LLAMA = ROOT / "examples" / "train_hf_llama.py"


@pytest.fixture
def stats_env(tmp_path, monkeypatch):
    """The examples append their step times and Dynamo counts here (examples/stepstats.py)."""
    path = tmp_path / "stats.jsonl"
    monkeypatch.setenv("KT_EXAMPLE_STATS", str(path))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # 2 shared cores: OpenMP spinning swamps the timing
    return path


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def profile(*args):
    return CliRunner().invoke(main, ["profile", "-q", "--cpu", *map(str, args)], catch_exceptions=False)


def test_the_plan_times_plain_steps_before_any_profiler():
    plan = StepPlan(warmup=3, steps=3, timing=5)
    # Plain steps straight after the warm-up, then the clean profiler (its warm-up step 9),
    # then the shapes step (hooks from there on), the recorded profiler's warm-up, the steps.
    assert list(plan.plain_steps) == [4, 5, 6, 7, 8]
    assert list(plan.clean_steps) == [10, 11, 12, 13, 14]
    assert plan.shapes_step == 15 and plan.hooks_from == 15
    assert (plan.first_recorded, plan.last_recorded) == (17, 19) and plan.stop_after == 19
    phases = [plan.phase_of(s) for s in range(1, 20)]
    assert phases == ["warmup"] * 3 + ["plain"] * 5 + ["clean-warmup"] + ["clean"] * 5 + [
        "shapes",
        "recorded-warmup",
        "recorded",
        "recorded",
        "recorded",
    ]
    # No timing steps: the shapes step follows the warm-up; the recorded steps are timed.
    bare = StepPlan(warmup=3, steps=3, timing=0)
    assert (bare.shapes_step, bare.first_recorded, bare.stop_after) == (4, 6, 8)
    assert list(bare.plain_steps) == [] and list(bare.clean_steps) == []
    # The first step (torch.compile traces there) never has hooks, even with no warm-up.
    assert StepPlan(warmup=0, steps=2, timing=6).hooks_from > 1
    whole = StepPlan(warmup=5, steps=2, timing=0, whole_run=True)
    assert whole.shapes_step is None and whole.phase_of(3) == "recorded"


def test_a_torchrun_job_times_enough_plain_steps_to_cut_a_transient():
    # A torchrun job's ranks time a fixed count. FSDP2 on two H100s: the script's first 18-22
    # steps were a slow transient, and 20 plain steps from step 4 all fell inside it. 40 leave
    # the steady steps after it to the report's cut.
    from kerneltriage.analysis.timeline import steady
    from kerneltriage.profile.context import plain_bounds

    assert plain_bounds(Options(), distributed=True) == (40, 40)
    assert plain_bounds(Options(), distributed=False, phase1=False) == (20, 60)
    assert plain_bounds(Options(plain_max=30), distributed=True) == (30, 30)
    # Steps 4-43 of a job whose first 22 steps ran 15% slow (ms): the cut finds the level.
    transient = [230.0 + 5 * (i % 3) for i in range(19)]
    level = [200.0 + (i % 4) for i in range(21)]
    found = steady.steady(transient + level)
    assert found.median == pytest.approx(statistics.median(level), abs=1.0)
    # With 20 plain steps (the count before) all of them are the transient.
    assert steady.steady(transient + level[:1]).median > 225
    # A torchrun script too short for 40: profiled again with what fits (3 + 36 + 1 + 5 + 1 + 1 +
    # 3 = 50), a fixed count again.
    options = Options(warmup=3, steps=3, timing_steps=5)
    assert fitted_timing(options, 50, distributed=True) == (5, 36)
    assert plain_bounds(Options(warmup=3, steps=3, timing_steps=5, plain_min=36, plain_max=36), True) == (
        36,
        36,
    )


def test_phase_1_settles_its_plain_steps_only_where_it_is_the_one_process_timed():
    # Its profiler steps follow the plain ones, so plain steps that go on until settled can
    # outlast the script (T5-base's 40 steps on an H100: profiled twice, 35 s more). Where
    # timing processes follow, they settle (they stop after their plain steps) and phase 1
    # times the fewest.
    from kerneltriage.profile.context import plain_bounds

    assert plain_bounds(Options()) == (20, 20)
    assert plain_bounds(Options(), phase1=False) == (20, 60)
    assert plain_bounds(Options(timing_processes=1)) == (20, 60)
    assert plain_bounds(Options(cpu=True)) == (20, 60)  # a dry run times one process
    assert plain_bounds(Options(plain_max=30)) == (20, 30)  # asked for: as asked
    assert asked_plan(Options(warmup=3, steps=3, timing_steps=5)).stop_after == 34


def test_a_short_script_is_profiled_again_with_the_timing_steps_it_has_room_for():
    # On a GPU the plan asks for 20 plain steps at least (measurement.yaml): 3 + 20 + 1 + 5 +
    # 1 + 1 + 3 = 34 steps. A shorter script gets fewer plain steps first, then fewer of both.
    options = Options(warmup=3, steps=3, timing_steps=5)
    assert fitted_timing(options, 34) == (5, 20)
    # Phase 1 timed alone, long enough for the fewest plain steps, yet no trace: the plain
    # steps went on, unsettled, past the script's end. Again with those that fit, fixed.
    alone = Options(warmup=3, steps=3, timing_steps=5, timing_processes=1)
    assert fitted_timing(alone, 40) == (5, 26)
    assert fitted_timing(alone, 400) == (5, 60)  # never more than plain_max
    assert fitted_timing(options, 25) == (5, 11)  # 3 + 11 + 1 + 5 + 1 + 1 + 3 = 25
    assert fitted_timing(options, 19) == (5, 5)  # the plain steps asked, no more
    assert fitted_timing(options, 15) == (3, 3)  # 3 + 2·3 + 3 + 3 = 15
    assert fitted_timing(options, 10) == (0, 0)  # room for warm-up, shapes and recorded only
    assert fitted_timing(options, 7) is None  # not even that: the whole run is recorded


@pytest.mark.parametrize("warmup", [3, 0])
def test_torch_compile_sees_the_same_program_under_profile(tmp_path, stats_env, warmup):
    # The profiling issue: a 4-block model compiled with 0 graph breaks and 1 graph plainly,
    # and with 56 breaks and 31 graphs under `profile --cpu --run-to-end` (Dynamo traced the
    # module hooks, then hit its recompile limit in them).
    args = [GPT, "--tiny", "--layers", "4", "--device", "cpu", "--compile", "--steps", "20"]
    subprocess.run([sys.executable, *map(str, args)], check=True, env=os.environ, capture_output=True)
    out = tmp_path / "run"
    result = profile(
        "--out", out, "--warmup", warmup, "--steps", "2", "--run-to-end", "--", sys.executable, *args
    )
    assert result.exit_code == 0, result.output
    plain, profiled = _lines(stats_env)
    assert plain["kerneltriage_mode"] is None and profiled["kerneltriage_mode"] == "timeline"
    assert (plain["graph_breaks"], plain["unique_graphs"]) == (0, 1)
    assert (profiled["graph_breaks"], profiled["unique_graphs"]) == (0, 1), profiled["graph_break_reasons"]
    assert len(profiled["step_ms"]) == 19  # the script ran its 20 steps
    # The compiled model still has its range (torch.compile's wrapper, named as the model).
    names = set(read_trace(out / rundir.TRACE).cpu["name"])
    assert "kerneltriage.module:GPT:GPT" in names
    status = json.loads((out / "logs" / "status.timeline.rank0.json").read_text())
    # Even with --warmup 0 the hooks come after the plain and clean steps, long after Dynamo
    # compiled the first step: nothing guards on them, so they go at the end.
    assert status["module_hooks_kept"] is False


def test_an_eager_model_gets_module_ranges_and_shapes_in_its_timed_steps(tmp_path, stats_env):
    out = tmp_path / "run"
    args = [GPT, "--tiny", "--device", "cpu", "--steps", "30"]
    result = profile("--out", out, "--warmup", "3", "--steps", "2", "--", sys.executable, *args)
    assert result.exit_code == 0, result.output
    m = json.loads((out / rundir.MANIFEST).read_text())
    phase = m["phases"]["timeline"]
    # Steps 1-3 warm-up, 4-8 plain, 9 the clean profiler's warm-up (none runs without a GPU),
    # 10-14 clean, 15 shapes, 16 the recorded profiler's warm-up, 17-18 recorded; then stop.
    assert phase["steps_seen"] == 18
    # The plain steps ran before any profiler existed in the process, without module hooks;
    # the runner logged each step's phase as it ended.
    status = json.loads((out / "logs" / "status.timeline.rank0.json").read_text())
    log = {p["step"]: p for p in status["phases"]}
    plain = [p for p in status["phases"] if p["phase"] == "plain"]
    assert [p["step"] for p in plain] == [4, 5, 6, 7, 8]
    assert all(
        p["profilers_created"] == 0 and not p["profiler_enabled"] and not p["module_hooks"] for p in plain
    )
    assert log[15]["phase"] == "shapes" and log[15]["profiler_enabled"] and log[15]["module_hooks"]
    assert log[17]["phase"] == "recorded" and log[17]["profilers_created"] == 2
    assert (out / "logs" / "shapes.rank0.json.gz").is_file()
    # The timed steps were recorded without shapes; every op got them from the shapes step.
    raw = json.loads(gzip.decompress((out / "logs" / "shapes.rank0.json.gz").read_bytes()))
    assert any("Input Dims" in e.get("args", {}) for e in raw["traceEvents"])
    fixup = phase["trace_fixup"]["trace.json.gz"]
    assert fixup["steps"] == 2 and fixup["ops"] > 1000 and fixup["ops_with_shapes"] == fixup["ops"]
    # The parent's time on phase 1's output (on the path to the later processes), and its part.
    assert 0 < fixup["seconds"] <= phase["finish_seconds"] < 60
    tl = read_trace(out / rundir.TRACE)
    mm = tl.cpu[tl.cpu["name"] == "aten::mm"]
    assert len(mm) > 20 and (mm["dims"] >= 0).all()
    # Module ranges are annotations (they were entered as fast C++ ranges, filed as ops).
    modules = tl.cpu[tl.cpu["name"].str.startswith("kerneltriage.module:")]
    assert set(modules["cat"]) == {"user_annotation"}
    assert "kerneltriage.module:blocks.1.attn:Attention" in set(modules["name"])
    # 2 blocks × (block, 2 norms, attention + qkv + proj, up, down) + embedding, norm, head, model.
    assert phase["module_calls_per_step"] == 20.0
    times = phase["step_time"]
    assert len(times["recorded_ms"]) == 2 and len(times["clean_ms"]) == 5 and len(times["plain_ms"]) == 5
    assert times["attribution_overhead"] == pytest.approx(
        times["recorded_median_ms"] / times["plain_median_ms"] - 1, abs=1e-3
    )
    # Without a GPU no clean profiler runs (the clean steps run bare): no overhead to state.
    assert times["clean_profiler"] is None and times["overhead"] is None
    # The regions of the module signatures come from one hooked step, each signature once.
    regions = [json.loads(line) for line in (out / rundir.REGIONS).read_text().splitlines()]
    attn = next(r for r in regions if r["path"] == "blocks.0.attn")
    assert attn["calls"] == 1 and attn["inputs"][0]["shape"] == [2, 64, 64]


def test_the_hf_llama_example_is_profiled_with_module_paths(tmp_path, stats_env):
    # transformers comes with the dev extra (pyproject.toml).
    out = tmp_path / "run"
    args = [LLAMA, "--tiny", "--device", "cpu", "--steps", "20"]
    result = profile("--out", out, "--warmup", "3", "--steps", "2", "--", sys.executable, *args)
    assert result.exit_code == 0, result.output
    names = set(read_trace(out / rundir.TRACE).cpu["name"])
    assert "kerneltriage.module:model.layers.1.self_attn:LlamaAttention" in names
    assert "kerneltriage.module:model.layers.0.mlp.down_proj:Linear" in names
    (line,) = _lines(stats_env)
    assert line["kerneltriage_mode"] == "timeline" and line["unique_graphs"] == 0


def test_a_module_call_costs_little_with_the_profiler_off(tmp_path):
    """The hook path's own cost, profiler off, on 200 small modules.

    Measured on this project's 2-core CI machine (thread CPU time, busy with other jobs): the
    global hooks make every module call take torch's slow path, 6.3 µs with two no-op hooks;
    ours cost 8-12 µs in all. The hooks before this change (record_function, shapes and a JSON
    key on every call) cost 83-122 µs. The budget, 30 µs, leaves about 3× margin for a slower
    machine and still fails a return to per-call shape work."""
    import torch
    import torch.nn as nn

    torch.set_num_threads(1)
    model = nn.Sequential(*(m for _ in range(100) for m in (nn.Linear(4, 4), nn.ReLU())))
    calls = sum(1 for _ in model.modules())
    assert calls == 201
    x = torch.zeros(2, 4)

    def per_call(n: int = 30) -> float:
        start = time.thread_time_ns()
        for _ in range(n):
            model(x)
        return (time.thread_time_ns() - start) / n / calls / 1000.0

    s = ProfiledProcess({"mode": "timeline", "out": str(tmp_path), "warmup": 3, "steps": 1, "cpu": True})
    s.prepare(torch)
    extra = []
    for _ in range(7):
        plain = per_call()
        s.modules.install(describe=False)
        hooked = per_call()
        s.modules.remove()
        extra.append(hooked - plain)
    assert s.modules.calls == 7 * 30 * calls and not s.modules.handles  # the hooks ran, then went
    assert statistics.median(extra) < 30.0, extra


def test_alignment_resumes_after_ops_that_differ():
    a = ["aten::linear", "aten::t", "aten::addmm", "aten::relu", "aten::linear", "aten::addmm"]
    b = ["aten::linear", "aten::t", "aten::addmm", "aten::empty", "aten::relu", "aten::linear", "aten::addmm"]
    assert align(a, b) == [(0, 0), (1, 1), (2, 2), (3, 4), (4, 5), (5, 6)]
    assert align(a, a) == [(i, i) for i in range(6)]
    assert align(["x"], ["y"]) == []


def test_shapes_are_copied_onto_every_recorded_step():
    def op(name, ts, dims, tid=1):
        return {"ph": "X", "cat": "cpu_op", "name": name, "ts": ts, "dur": 1.0, "tid": tid, "args": dims}

    source = [
        op("aten::mm", 5.0, {"Input Dims": [[2, 4], [4, 4]]}),
        op("aten::relu", 7.0, {"Input Dims": [[2, 4]]}),
    ]
    timed = [
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#4", "ts": 100.0, "dur": 50.0, "tid": 1},
        op("aten::mm", 101.0, {}),
        op("aten::relu", 103.0, {}),
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#5", "ts": 150.0, "dur": 50.0, "tid": 1},
        op("aten::mm", 151.0, {}),
        op("aten::relu", 153.0, {}),
        op("aten::mm", 300.0, {}),  # after the steps: not a recorded step's op
    ]
    stats = copy_shapes(timed, source)
    assert stats == {"steps": 2, "ops": 4, "ops_with_shapes": 4, "ops_without_shape_args": 0, "missing": {}}
    assert timed[1]["args"]["Input Dims"] == [[2, 4], [4, 4]] and timed[5]["args"]["Input Dims"] == [[2, 4]]
    assert "Input Dims" not in timed[6]["args"]


def test_the_step_time_is_the_plain_steps_and_the_clean_overhead_is_warned_above_five_percent():
    plan = StepPlan(warmup=3, steps=3, timing=5)
    times = {
        "clock": "cuda events",
        "clean_profiler": "cuda activity",
        "recorded_ms": [55.4, 49.1, 55.5],
        "clean_ms": [36.2] * 5,
        "plain_ms": [35.0] * 5,
        "recorded_median_ms": 55.4,
        "plain_median_ms": 35.0,
    }
    clean = {"gpu_busy_share": 0.8, "window_ms": 181.0, "kernels_per_step": 1510.0}
    quiet = rundir.Manifest(phases={"timeline": {}})
    record_step_time({**times, "clean_median_ms": 36.2}, plan, quiet, [], clean)
    step = quiet.phases.timeline.step_time.to_json()
    # The recorded steps' cost is stated, not warned about: the report does not time them.
    assert quiet.warnings == [] and step["attribution_overhead"] == pytest.approx(55.4 / 35.0 - 1, abs=1e-4)
    assert step["overhead"] == pytest.approx(36.2 / 35.0 - 1, abs=1e-4)
    assert (
        step["gpu_busy_ms"] == pytest.approx(0.8 * 36.2, abs=1e-3)
        and step["clean_kernels_per_step"] == 1510.0
    )
    slow = rundir.Manifest(phases={"timeline": {}})
    warnings: list[str] = []
    record_step_time({**times, "clean_median_ms": 40.0}, plan, slow, warnings, clean)
    (message,) = slow.warnings
    assert "14%" in message and "40.00 ms against 35.00 ms" in message and message in warnings
    assert "step time is the plain steps'" in message
    unmeasured = rundir.Manifest(phases={"timeline": {}})
    notes: list[str] = []
    record_step_time({"recorded_median_ms": 24.1, "recorded_ms": [24.1]}, plan, unmeasured, notes)
    assert unmeasured.phases.timeline.step_time.overhead is None
    assert any("not measured" in n for n in notes)
    asked = rundir.Manifest(phases={"timeline": {}})
    notes = []
    record_step_time({"recorded_median_ms": 24.1}, StepPlan(3, 3, 0), asked, notes)
    assert notes == []  # --timing-steps 0: nothing missing


def test_the_clean_trace_gives_the_gpu_busy_share_of_its_window():
    # The clean steps of GPT-2 124M eager on an H100: a CUDA-only profiler's trace.
    run = ROOT / "examples" / "runs" / "gpt2-eager-h100"
    path = run / "logs" / "clean.rank0.json.gz"
    summary = summarize_clean(path, 5)
    raw = json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]
    assert not any(e.get("cat") == "cpu_op" for e in raw)  # no CPU ops were recorded
    gpu = sorted(
        (e["ts"], e["ts"] + e["dur"]) for e in raw if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")
    )
    busy, reach = 0.0, gpu[0][0]
    for s, e in gpu:  # the union of the GPU's busy intervals
        busy += max(0.0, e - max(s, reach))
        reach = max(reach, e)
    window = max(e for _, e in gpu) - gpu[0][0]
    assert summary["gpu_busy_share"] == pytest.approx(busy / window, abs=2e-4)
    assert summary["window_ms"] == pytest.approx(window / 1000, rel=1e-4)
    step = json.loads((run / rundir.MANIFEST).read_text())["phases"]["timeline"]["step_time"]
    assert step["clean_gpu_busy_share"] == summary["gpu_busy_share"]
    # The clean steps ran the recorded steps' kernels (978 a step): as many per step.
    attr = attribute(read_trace(run / rundir.TRACE))
    k = attr.kernels[(attr.kernels["step"] >= 0) & (attr.kernels["kind"] == "kernel")]
    assert len(attr.steps) == 3
    assert summary["kernels_per_step"] == pytest.approx(len(k) / 3, rel=0.01)


def test_the_report_times_the_plain_steps_and_says_how(tmp_path):
    from kerneltriage.api import build_report
    from kerneltriage.render import render

    # GPT-2 124M eager on an H100 (benchmarks/gpu_fidelity.sh): the recorded steps ran at
    # 71.5 ms under the CPU-op profiler, the plain ones at 34.7 ms, as the script alone.
    src = ROOT / "examples" / "runs" / "gpt2-eager-h100"
    step = json.loads((src / rundir.MANIFEST).read_text())["phases"]["timeline"]["step_time"]
    after = build_report(src)
    # The same run read as an older one, timed on its recorded steps.
    run = tmp_path / "run"
    shutil.copytree(src, run)
    m = json.loads((run / rundir.MANIFEST).read_text())
    del m["phases"]["timeline"]["step_time"]["clean_ms"]
    (run / rundir.MANIFEST).write_text(json.dumps(m))
    before = build_report(run)
    assert "timing" not in before.source and before.step_time_ms > 1.5 * after.step_time_ms
    plain, busy = step["plain_median_ms"], step["gpu_busy_ms"]
    assert after.step_time_ms == pytest.approx(plain) and after.gpu_busy_ms == pytest.approx(busy)
    assert after.idle_pct == pytest.approx(100 * (1 - busy / plain), abs=1e-6) and after.idle_pct < 5
    # The idle causes found in the recorded steps keep their order, scaled to the idle time as run.
    scale = (plain - busy) / (before.step_time_ms - before.gpu_busy_ms)
    assert [g.cause for g in after.gaps] == [g.cause for g in before.gaps]
    for a, b in zip(after.gaps, before.gaps):
        assert a.ms_per_step == pytest.approx(b.ms_per_step * scale)
    # Candidates' shares of the step use the plain step.
    top = max(after.candidates, key=lambda c: c.time_ms_per_step)
    assert top.time_share == pytest.approx(top.time_ms_per_step / plain, rel=1e-6)
    timing = after.source["timing"]
    assert timing["gpu_busy_from"] == "clean steps" and timing["idle_scale"] == pytest.approx(scale)
    assert timing["steps"] == {"plain": 5, "clean": 5, "recorded": 3}
    text = render(after, "terminal", width=300)
    assert "Timing: step time from 5 plain steps (nothing installed)" in text
    clean, recorded = step["overhead"], step["attribution_overhead"]
    assert f"GPU busy from 5 clean steps (GPU-only profiler, {clean:+.0%} against plain)" in text
    assert (
        f"ops and modules from 3 recorded steps ({step['recorded_median_ms']:.2f} ms, {recorded:+.0%}" in text
    )
    # An older run keeps its own timing.
    assert "timing" not in build_report(ROOT / "examples" / "runs" / "gpt-naive-h200").source


DYNAMO_TOY = """
import json, sys, torch, torch._dynamo.utils as du

class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(16, 16), torch.nn.Linear(16, 1)

    def forward(self, x):
        h = self.a(x).relu()
        torch._dynamo.graph_break()  # one deliberate graph break
        return self.b(h).mean()

torch.manual_seed(0)
model = torch.compile(Net())
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x = torch.randn(8, 16)
for step in range(int(sys.argv[2])):
    if step == 1:
        with torch.no_grad():  # an evaluation pass: grad mode changed, one recompile per frame
            model(x)
    model(x).backward()
    opt.step()
    opt.zero_grad()
breaks = du.counters["graph_break"]
with open(sys.argv[1], "w") as f:
    json.dump({"graph_breaks": sum(breaks.values()), "unique_graphs": du.counters["stats"]["unique_graphs"],
               "recompiles": sum(len(v) for v in du.guard_failures.values())}, f)
"""


def test_the_report_counts_graph_breaks_and_recompiles_as_dynamo_does(tmp_path):
    from kerneltriage.api import report as build

    script = tmp_path / "toy.py"
    script.write_text(DYNAMO_TOY)
    alone = tmp_path / "alone.json"
    subprocess.run([sys.executable, str(script), str(alone), "24"], check=True, capture_output=True)
    expected = json.loads(alone.read_text())
    assert expected["graph_breaks"] >= 1 and expected["recompiles"] >= 1
    out = tmp_path / "run"
    result = profile(
        "--out", out, "--warmup", "3", "--steps", "2", "--", sys.executable, script, tmp_path / "p.json", "24"
    )
    assert result.exit_code == 0, result.output
    dynamo = json.loads((out / rundir.MANIFEST).read_text())["phases"]["timeline"]["dynamo"]["plain"]
    assert {k: dynamo[k] for k in expected} == expected
    assert any("grad_mode" in r["reason"] for r in dynamo["recompile_reasons"])
    # A CPU run has no kernels to report on: the counts go into a GPU run's manifest (the
    # compiled GPT-2 example), whose report must show them instead of the trace's.
    run = tmp_path / "gpu-run"
    shutil.copytree(ROOT / "examples" / "runs" / "gpt2-compile-h100", run)
    m = json.loads((run / rundir.MANIFEST).read_text())
    m["phases"]["timeline"]["dynamo"] = {"plain": dynamo, "end": dynamo}
    (run / rundir.MANIFEST).write_text(json.dumps(m))
    rep = build(run)
    assert {k: rep.compiled["dynamo"][k] for k in expected} == expected
    text = "\n".join(compiled_lines(rep))
    assert (
        f"graph breaks: {expected['graph_breaks']}" in text
        and f"recompiles: {expected['recompiles']}" in text
    )
    assert "grad_mode" in text and "(from the trace)" not in text
