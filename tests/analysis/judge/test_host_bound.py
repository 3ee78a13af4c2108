"""The host's time to issue a step against the step time: a kernel-only fix saves at most
step − host (``analysis/judge/host_bound.py``), on shipped runs with the host's time set."""

from __future__ import annotations

import json
import shutil
import statistics
from pathlib import Path

import numpy as np
import pytest

from kerneltriage import api, rundir
from kerneltriage.analysis.judge.host_bound import blocking_ms, launches_removed, queue_depth, settings
from kerneltriage.analysis.timeline.attribution import attribute
from kerneltriage.ingest.source import load_profile
from kerneltriage.ingest.tables import (
    CPU_COLUMNS,
    GPU_ANNOTATION_COLUMNS,
    KERNEL_COLUMNS,
    RUNTIME_COLUMNS,
    Timeline,
    frame,
)
from kerneltriage.render.header import header_lines
from tests.helpers import EXTERNAL, corpus

RUNS = Path(__file__).resolve().parents[3] / "examples" / "runs"
EAGER = RUNS / "gpt2-eager-h100"  # no op of the script blocks the host inside its steps
CONVNEXT = RUNS / "convnext-t-h100"  # timm ConvNeXt-T on an H100: the host paces its step
LLAMA = RUNS / "hf-llama-h100"  # a stream synchronize in every step


def with_host(tmp_path: Path, run: Path, host_ms: list[float]) -> Path:
    out = tmp_path / run.name
    shutil.copytree(run, out)
    manifest = json.loads((out / rundir.MANIFEST).read_text())
    manifest["phases"]["timeline"]["step_time"]["host_issue_ms"] = host_ms
    (out / rundir.MANIFEST).write_text(json.dumps(manifest))
    return out


def savings(report) -> dict[str, float]:
    return {c.id: c.expected_saving_share for c in report.candidates if c.expected_saving_share}


def test_blocking_calls_are_the_scripts_own_not_the_profilers():
    def per_step(run: Path) -> float:
        timeline = load_profile(run).timeline
        return blocking_ms(timeline, attribute(timeline, None).windows)

    # HF Llama: a cudaStreamSynchronize under an op at the start of every step (35, 29, 23 ms).
    assert per_step(LLAMA) == pytest.approx(29.01, abs=0.01)
    # GPT-2 eager: only the profiler's own cudaDeviceSynchronize (made by no op): none.
    assert per_step(EAGER) == 0.0


def test_a_host_that_takes_the_step_caps_every_kernel_only_saving(tmp_path):
    before = api.report(EAGER)
    step = before.step_time_ms
    assert savings(before)  # the run has fixes with predicted savings to cap
    host = 0.97 * step
    report = api.report(with_host(tmp_path, EAGER, [host * 0.99, host, host * 1.01]))
    timing = report.source["timing"]["host"]
    per_launch = statistics.median([host * 0.99, host, host * 1.01]) / timing["launches_per_step"]
    fewer = set(settings()["fewer_launches"])

    def room(c) -> float:
        # A fix that fuses launches from one call also takes them off the host.
        kind = ((c.recipe or {}).get("apply") or {}).get("kind")
        freed = launches_removed(c) * per_launch if kind in fewer else 0.0
        return (step - host + freed) / step

    after = savings(report)
    assert after and all(
        c.expected_saving_share <= room(c) + 1e-9 for c in report.candidates if c.id in after
    )
    capped = [c for c in report.candidates if "saving_before_host" in c.attrs]
    assert capped and all("the step waits on the host" in c.note for c in capped)
    assert all(c.attrs["saving_basis"].startswith("at most step − host") for c in capped)
    # The norm swap replaces each LayerNorm's launches with one: its room counts them.
    swaps = [c for c in capped if ((c.recipe or {}).get("apply") or {}).get("kind") == "norm-swap"]
    assert swaps and all("launches it replaces" in c.attrs["saving_basis"] for c in swaps)
    assert all(room(c) > (step - host) / step for c in swaps)
    assert any(
        c.expected_saving_share == pytest.approx((step - host) / step) for c in capped if c not in swaps
    )
    said = [w for w in report.warnings if w.startswith("host: issuing a step from an idle GPU")]
    assert len(said) == 1 and "97%" in said[0] and "reduce-overhead" in said[0]
    # A host-paced step moves with the machine's load: the interval covers these processes only.
    assert "another run may fall outside the step's interval" in said[0]
    assert (
        timing["judged"]
        and timing["samples"] == 3
        and timing["share_of_step"] == pytest.approx(0.97, abs=1e-3)
    )
    assert any("host issues a step in" in line for line in header_lines(report))


def test_a_host_far_ahead_of_the_gpu_changes_nothing(tmp_path):
    before = api.report(EAGER)
    quick = 0.3 * before.step_time_ms
    report = api.report(with_host(tmp_path, EAGER, [quick] * 3))
    assert savings(report) == pytest.approx(savings(before))
    assert not [w for w in report.warnings if w.startswith("host:")]
    assert report.source["timing"]["host"]["judged"]


def test_below_the_bound_share_nothing_is_capped(tmp_path):
    # 85% of the step: a GPU-bound step of more launches than the launch queue holds reads this
    # much (BERT-base 77%, a Qwen2-class LM 79%), so the 15% room is no bound on an 18% fix.
    before = api.report(EAGER)
    assert max(savings(before).values()) > 0.15
    report = api.report(with_host(tmp_path, EAGER, [0.85 * before.step_time_ms] * 3))
    assert savings(report) == pytest.approx(savings(before))
    assert report.source["timing"]["host"]["judged"] and "fix" not in report.source["timing"]["host"]
    assert not [w for w in report.warnings if w.startswith("host:")]


def test_too_few_host_steps_or_a_script_that_waits_on_the_gpu_is_not_judged(tmp_path):
    eager = api.report(EAGER)
    two = api.report(with_host(tmp_path / "two", EAGER, [eager.step_time_ms] * 2))
    assert "host" not in two.source["timing"] and savings(two) == pytest.approx(savings(eager))
    llama = api.report(LLAMA)
    synced = api.report(with_host(tmp_path / "llama", LLAMA, [llama.step_time_ms] * 3))
    host = synced.source["timing"]["host"]
    assert not host["judged"] and "synchronizing calls" in host["why_not"]
    assert savings(synced) == pytest.approx(savings(llama))
    assert any("host time not judged" in line for line in header_lines(synced))


def test_a_host_paced_step_gets_cuda_graphs_as_s1_which_verify_plans_and_reads_back(tmp_path):
    from kerneltriage.analysis.fixes.verification import attach
    from kerneltriage.verify.plan import Settings, make_plan, step_candidates
    from tests.verify.test_plan import _entry, _file

    run = with_host(tmp_path, EAGER, [api.report(EAGER).step_time_ms * 1.05] * 3)
    report = api.report(run)
    fix = report.source["timing"]["host"]["fix"]
    assert fix["id"] == "S1" and fix["recipe"]["id"] == "compile-cuda-graphs"
    assert fix["recipe"]["apply"] == {"kind": "compile-model", "mode": "reduce-overhead"}
    assert 'mode="reduce-overhead"' in fix["fix"]
    capped = [c for c in report.candidates if "saving_before_host" in c.attrs]
    assert capped and all(c.note.endswith("`profile --apply RUN:S1`") for c in capped)
    # The kernels' time less what fusing takes from the norms and elementwise chains.
    fused = sum(
        c.time_ms_per_step * (1 - 1 / c.headroom)
        for c in report.candidates
        if c.kind in ("elementwise", "reduction", "softmax", "norm", "cross-entropy")
        and (c.headroom or 0) > 1
    )
    kernels = min(sum(c.time_ms_per_step for c in report.candidates), report.gpu_busy_ms, report.step_time_ms)
    assert fix["predicted_saving_share"] == pytest.approx(
        1 - (kernels - fused) / report.step_time_ms, abs=1e-4
    )
    # ... and as the step it leaves, which verify judges against its own baseline's step.
    assert fix["predicted_step_ms"] == pytest.approx(
        (1 - fix["predicted_saving_share"]) * report.step_time_ms, rel=1e-3
    )
    assert any(line.startswith("Host-paced step → S1") for line in header_lines(report))
    from kerneltriage.render import render

    page = render(report, "html")
    assert "host issues a step in" in page and "Host-paced step → S1" in page
    # verify plans it with the runner's own apply, as one more candidate (and by name).
    manifest = rundir.read_manifest(run)
    rows = [*report.candidates, *step_candidates(report)]
    plan = make_plan(str(run), manifest, rows, Settings(), step_ms=report.step_time_ms)
    s1 = next(c for c in plan.candidates if c.id == "S1")
    assert s1.apply == {"kind": "compile-model", "mode": "reduce-overhead"} and s1.why_not is None
    assert s1.predicted == pytest.approx(fix["predicted_saving_share"])
    assert s1.predicted_step_ms == fix["predicted_step_ms"]
    only = make_plan(str(run), manifest, rows, Settings(), ids=["s1"])
    assert [c.id for c in only.candidates] == ["S1"]
    # What verify measured comes back onto the step's fix, not as a stray row.
    attach(
        report, _file([_entry("S1", fix["name"], "verified", fix["predicted_saving_share"], 0.37)]).to_json()
    )
    assert fix["verification"]["status"] == "verified"
    assert not [w for w in report.warnings if "verify.json has S1" in w]
    assert any("verify: verified, realized 37.0%" in line for line in header_lines(report))
    # `profile --apply RUN:S1` installs it as verify's runner does.
    from kerneltriage.ladder import fixes_of

    (applied,) = fixes_of(run, ["S1"])
    assert applied["recipe_id"] == "compile-cuda-graphs" and applied["apply"]["mode"] == "reduce-overhead"


def test_a_gpu_bound_step_gets_no_step_fix(tmp_path):
    report = api.report(with_host(tmp_path, EAGER, [0.3 * api.report(EAGER).step_time_ms] * 3))
    assert "fix" not in report.source["timing"]["host"]
    assert not [line for line in header_lines(report) if line.startswith("Host-paced")]


def test_convnext_on_an_h100_waits_on_its_host_and_gets_cuda_graphs(tmp_path):
    """The shipped ConvNeXt-T run, as measured: its timing processes issued 6 steps from an
    idle GPU in a median of 30.11 ms against a 28.56 ms step."""
    from click.testing import CliRunner

    from kerneltriage.cli import main

    report = api.report(CONVNEXT)
    host = report.source["timing"]["host"]
    assert host["judged"] and host["samples"] == 6
    assert host["host_issue_ms"] == pytest.approx(30.106, abs=0.01) and host["share_of_step"] > 1.0
    # Every kernel-time prediction is capped to what the host leaves: nothing.
    capped = [c for c in report.candidates if "saving_before_host" in c.attrs]
    assert {c.id for c in capped} >= {"C2", "C3", "C6"}
    assert all(c.expected_saving_share == 0.0 for c in capped)
    assert any(w.startswith("host: issuing a step from an idle GPU takes 30.11 ms") for w in report.warnings)
    # The step's own fix: the kernels' 27.6 ms less 7.0 ms of fusing, over 28.56 ms.
    fix = host["fix"]
    assert fix["recipe"]["id"] == "compile-cuda-graphs"
    assert fix["predicted_saving_share"] == pytest.approx(0.2806, abs=0.001)
    planned = CliRunner().invoke(main, ["verify", str(CONVNEXT), "--candidates", "S1", "--plan"])
    assert planned.exit_code == 0, planned.output
    assert "S1  the whole step: 1072 launches" in planned.output
    assert "applied  by the runner: compile-model (mode='reduce-overhead')" in planned.output


@corpus
def test_data_loading_stays_on_the_host_and_bounds_what_cuda_graphs_save():
    """ResNet-50 on a V100 (PyTorch 1.9, Kineto's own example traces): a single-process
    DataLoader holds the host 70 ms of each 176 ms step, a multiprocessing one 1.4 ms."""
    from kerneltriage.analysis.fixes.fix_environment import Environment
    from kerneltriage.analysis.judge.host_bound import HostTime, loading_ms, step_fix
    from kerneltriage.analysis.rules import load_rules

    found = {}
    for trace in sorted((EXTERNAL / "kineto-resnet50-v100-pt19").glob("*.json.gz")):
        timeline = load_profile(trace).timeline
        found[trace.name] = loading_ms(timeline, attribute(timeline, None).windows)
    assert sorted(round(v, 1) for v in found.values()) == [1.4, 70.1]
    # A step the host paces, whose kernels would take 40 ms once replayed: with 70 ms of data
    # loading a step it cannot fall below 70 ms.
    report = api.report(EAGER)
    step = report.step_time_ms
    host = HostTime(step * 1.05, step, 3, 0.0, judged=True)
    rules = load_rules()
    free = step_fix(report.candidates, host, report.gpu_busy_ms, 1000, False, rules.recipes, Environment())
    fed = step_fix(
        report.candidates,
        host,
        report.gpu_busy_ms,
        1000,
        False,
        rules.recipes,
        Environment(),
        loading=0.9 * step,
    )
    assert free is not None and fed is not None
    assert fed["predicted_saving_share"] == pytest.approx(0.1, abs=1e-3)
    assert fed["predicted_saving_share"] < free["predicted_saving_share"]
    assert "of data loading a step" in fed["saving_basis"] and "data loading" not in free["saving_basis"]


def test_a_step_of_more_launches_than_the_queue_holds_is_judged_where_the_queue_stays_shallow(tmp_path):
    # Gemma-2 makes 1,727 launches a step: issued over 95% of its step, its recorded launches
    # leave the GPU (running them one after another) up to 561 behind, over half the launch
    # queue's 1,024: the host may have waited for the GPU to drain it, and its clock may time
    # the GPU's work, so it is not judged. (T5-base, 4,365 launches, read 91% of its step on an
    # H100 while verify realized 36% on its kernels' side.)
    gemma = RUNS / "gemma2-h100"
    before = api.report(gemma)
    assert savings(before)
    report = api.report(with_host(tmp_path, gemma, [0.95 * before.step_time_ms] * 3))
    host = report.source["timing"]["host"]
    assert not host["judged"] and "1,727 kernel launches" in host["why_not"] and "1,024" in host["why_not"]
    assert (
        host["launch_queue_depth"] >= 512
        and f"{host['launch_queue_depth']:,} of them behind" in host["why_not"]
    )
    assert savings(report) == pytest.approx(savings(before))
    assert not [c for c in report.candidates if "saving_before_host" in c.attrs]
    # BERT-base MLM's 1,124 launches over 97% of its step leave the GPU at most a few hundred
    # behind: the queue never fills, the host's clock is its own work, and the host paces the step.
    bert = RUNS / "bert-mlm-h100"
    paced = api.report(with_host(tmp_path, bert, [0.97 * api.report(bert).step_time_ms] * 3))
    host = paced.source["timing"]["host"]
    assert host["judged"] and 0 < host["launch_queue_depth"] < 512
    assert [c for c in paced.candidates if "saving_before_host" in c.attrs]
    # GPT-2 eager (978 launches) at the same share is judged and capped.
    eager = api.report(with_host(tmp_path, EAGER, [0.97 * api.report(EAGER).step_time_ms] * 3))
    assert eager.source["timing"]["host"]["judged"]


def _launches(n: int, every_ns: int, kernel_ns: int) -> Timeline:
    """A step of ``n`` launches ``every_ns`` apart on the host, each kernel ``kernel_ns`` long."""
    idx = np.arange(n, dtype=np.int64)
    runtime = frame(
        {
            "name": ["cudaLaunchKernel"] * n,
            "start": idx * every_ns,
            "dur": np.full(n, 2_000),
            "correlation": idx,
        },
        RUNTIME_COLUMNS,
    )
    kernels = frame(
        {
            "name": ["k"] * n,
            "start": idx * every_ns + 5_000,
            "dur": np.full(n, kernel_ns),
            "correlation": idx,
        },
        KERNEL_COLUMNS,
    )
    empty = frame({}, CPU_COLUMNS)
    return Timeline("synthetic", "kineto", kernels, runtime, empty, frame({}, GPU_ANNOTATION_COLUMNS))


def test_the_queue_depth_follows_whichever_side_is_slower():
    # 200 launches over 2 ms of host: 5 µs kernels never leave more than one queued; 50 µs
    # kernels leave the GPU 160 behind when the host is done (it has run 40 of them).
    window = [(0, 10_000_000)]
    assert queue_depth(_launches(200, 10_000, 5_000), window, 2.0) <= 1
    deep = queue_depth(_launches(200, 10_000, 50_000), window, 2.0)
    assert deep == pytest.approx(160, abs=2)
    # A slower host (its measured issue time) lets the same GPU keep up.
    assert queue_depth(_launches(200, 10_000, 50_000), window, 12.0) <= 1
    # Launches whose kernels are missing: cannot tell.
    lost = _launches(200, 10_000, 5_000)
    lost.kernels = lost.kernels.iloc[:50]
    assert queue_depth(lost, window, 2.0) is None


def test_cuda_graphs_take_from_a_batch_norm_what_fusing_its_neighbours_removes():
    """A region around a batch norm whose ops alone move 1.5× the fused kernel's bytes: the
    step after CUDA graphs keeps the norm's own passes (EfficientNet-B0 on an H200: 18.5 ms
    predicted so, 18.6 ms measured; 13.8 ms at the roofline's headroom)."""
    from dataclasses import replace

    from kerneltriage.analysis.fixes.fix_environment import Environment
    from kerneltriage.analysis.judge.host_bound import HostTime, step_fix
    from kerneltriage.analysis.rules import load_rules

    report = api.report(EAGER)
    step = report.step_time_ms
    host = HostTime(step * 1.05, step, 3, 0.0, judged=True)
    recipes = load_rules().recipes
    norm = next(c for c in report.candidates if c.kind == "norm" and (c.headroom or 0) > 2.0)
    others = [c for c in report.candidates if c is not norm]
    as_is = step_fix([norm, *others], host, report.gpu_busy_ms, 1000, False, recipes, Environment())
    batch = replace(norm, attrs={**norm.attrs, "fusion_headroom": 1.5})
    held = step_fix([batch, *others], host, report.gpu_busy_ms, 1000, False, recipes, Environment())
    assert as_is is not None and held is not None
    lost = norm.time_ms_per_step * ((1 - 1 / norm.headroom) - (1 - 1 / 1.5))
    assert held["predicted_step_ms"] == pytest.approx(as_is["predicted_step_ms"] + lost, rel=1e-3)
