"""Phase 2's passes for the kernels memory-bound by what they compute (``ncu.light``): which
kernels, when they get a pass of their own, its metrics, and the run it leaves, against the
stand-in ncu of test_nsight_compute.py on the H200 GPT fixture (trace and per-configuration
counters)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from kerneltriage import rundir
from kerneltriage.analysis.kernel_classes import memory_bound
from kerneltriage.analysis.rules import load_rules
from kerneltriage.analysis.timeline.hot_kernels import select_hot_kernels
from kerneltriage.ingest.kernel_names import base_name
from kerneltriage.profile import ncu_gpus, ncu_passes
from kerneltriage.profile import nsight_compute as ncu_tools
from kerneltriage.profile.pairs import processes_fit
from tests.helpers import timeline
from tests.profile import test_nsight_compute as harness
from tests.profile.test_phase_ncu import _profiling_calls, _rows, _split

fake_ncu = harness.fake_ncu  # the stand-in ncu, a fixture

INSTRUCTION_COUNTERS = ("smsp__sass_", "sm__ops_path_tensor")


def _hot(**options):
    return select_hot_kernels(
        timeline(), load_rules(), coverage=0.97, max_kernels=64, first_of_size=True, **options
    )


def test_memory_bound_is_kind_and_library():
    # PyTorch's own elementwise, reduction and softmax kernels: one op's arithmetic.
    assert memory_bound(
        "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, "
        "std::array<char*, 3ul> >(int, at::native::CUDAFunctor_add<float>, std::array<char*, 3ul>)"
    )
    assert memory_bound("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float> >()")
    # GEMMs, attention, a compiler's fused kernel (ConvNeXt-T's Inductor reduction with a
    # convolution's epilogue ran at 18.8 FLOP/byte) and other libraries' kernels keep their FLOPs.
    assert not memory_bound("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT")
    assert not memory_bound("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_7")
    assert not memory_bound("triton_red_fused__to_copy_convolution_native_layer_norm_permute_29")
    assert not memory_bound("cudnn::bn_fw_tr_1C11_kernel_NCHW<float, float, 512, true, 1>")


def test_the_light_kernels_of_the_fixture():
    hot = _hot()
    assert hot.light and set(hot.light) <= set(hot.names)
    assert not set(hot.light) & set(hot.variable)  # every-launch kernels keep their pass
    assert all(not n.startswith("nvjet") for n in hot.light)
    assert "vectorized_elementwise_kernel" in hot.light
    assert 0 < hot.light_configs <= hot.configs - hot.variable_configs


def test_a_light_pass_of_its_own_from_enough_configurations():
    hot = _hot()
    passes = ncu_passes.single(hot, False, 256)
    assert [p.stem for p in passes] == ["ncu.launches", "ncu", "ncu.light"]
    launches, full, light = passes
    assert light.light and not full.light and not launches.light
    # The light pass takes every per-configuration kernel, so that its rows keep one process's
    # launch order; the full pass counts the FLOPs of those that are not memory-bound.
    assert not set(full.kernels) & set(hot.light)
    assert set(light.kernels) == set(hot.light) | set(full.kernels)
    assert light.expected == hot.light_configs + full.expected
    assert launches.expected + light.expected == hot.variable_launches + hot.configs - hot.variable_configs
    # Both per-configuration exports go to logs/ and merge into ncu.csv.gz.
    assert full.csv_name == f"{rundir.LOGS}/{rundir.NCU_CSV}" and light.csv_name.startswith(rundir.LOGS)
    # Under LIGHT_MIN_CONFIGS configurations, the process start would cost more than it saves.
    few = _hot()
    few.light_configs = ncu_passes.LIGHT_MIN_CONFIGS - 1
    assert [p.stem for p in ncu_passes.single(few, False, 256)] == ["ncu.launches", "ncu"]
    assert ncu_passes.single(few, False, 256)[1].csv_name == rundir.NCU_CSV


def test_light_metrics_are_bytes_and_time():
    full = ncu_tools.metric_list(None, ["bf16"])
    light = ncu_tools.light_metrics(full)
    assert (
        "gpu__time_duration.sum" in light and "dram__bytes_read.sum" in light and "lts__t_bytes.sum" in light
    )
    assert not any(m.startswith(INSTRUCTION_COUNTERS) for m in light)
    assert set(light) < set(full)


@pytest.mark.parametrize(("peak_mb", "most", "fit"), [(28_544.0, 3, 3), (40_000.0, 3, 2), (90_000.0, 3, 1)])
def test_how_many_processes_fit(peak_mb, most, fit):
    # T5-base's phase-1 peak on an H200 (28.5 GB): three in 80% of 141 GB.
    session = SimpleNamespace(
        statuses=lambda mode: [{"gpu_peak_mb": peak_mb}] if mode == "timeline" else [],
        manifest=SimpleNamespace(gpu={"memory_gb": 141.0}),
    )
    assert processes_fit(session, most) == fit


def _asked_metrics(args: list[str]) -> list[str]:
    return args[args.index("--metrics") + 1].split(",")


def test_one_gpu_profiles_the_memory_bound_kernels_without_instruction_counters(
    tmp_path, monkeypatch, fake_ncu
):
    out, phase, _, warnings, _ = _split(tmp_path, monkeypatch, "0", ncu_every_counter=False)
    assert [r["stem"] for r in phase["passes"]] == ["ncu.launches", "ncu", "ncu.light"]
    assert phase["light_kernels"] and phase["light_kernels"] == _hot().light
    calls = {Path(args[args.index("-o") + 1]).name: args for _, _, args in _profiling_calls(fake_ncu)}
    assert not any(m.startswith(INSTRUCTION_COUNTERS) for m in _asked_metrics(calls["ncu.light"]))
    assert any(m.startswith("smsp__sass_") for m in _asked_metrics(calls["ncu"]))
    assert json.loads((out / rundir.LOGS / "config.ncu.light.json").read_text())["status_name"] == "ncu.light"
    # One per-configuration export: the light rows among the others in launch order, their
    # instruction-counter cells empty; the IDs numbered anew.
    header, rows = _rows(out / rundir.NCU_CSV)
    name = header.index("Kernel Name")
    sass = [i for i, c in enumerate(header) if c.startswith("smsp__sass_")]
    assert sass and [r[0] for r in rows] == [str(i) for i in range(len(rows))]
    light = set(phase["light_kernels"])
    light_rows = [r for r in rows if base_name(r[name]) in light]
    assert light_rows and all(r[i] == "" for r in light_rows for i in sass)
    assert all(r[sass[0]] != "" for r in rows if base_name(r[name]) not in light)
    # The same rows as with every counter on every kernel, the same kernels without any.
    every, phase_every, _, warnings_every, _ = _split(
        tmp_path / "every", monkeypatch, "0", ncu_every_counter=True
    )
    _, rows_every = _rows(every / rundir.NCU_CSV)
    launch = [header.index(c) for c in ("Kernel Name", "Grid Size", "Block Size")]
    assert [[r[i] for i in launch] for r in rows] == [[r[i] for i in launch] for r in rows_every]  # in order
    assert phase["hot_without_counters"] == phase_every["hot_without_counters"]
    assert [w for w in warnings if "without counters" in w] == [
        w for w in warnings_every if "without counters" in w
    ]


def test_the_fixture_reads_the_same_verdicts_without_the_light_kernels_flops(tmp_path, monkeypatch, fake_ncu):
    from kerneltriage.analysis.gpus import resolve_gpu
    from kerneltriage.analysis.triage import triage
    from kerneltriage.ingest.ncu_csv import merge_counters, read_counters

    def verdicts(out: Path) -> list[tuple]:
        parts = [read_counters(out / rundir.NCU_LAUNCHES_CSV), read_counters(out / rundir.NCU_CSV)]
        parts[0].first_of_size = frozenset({0})
        tl = timeline()
        rep = triage(tl, resolve_gpu(tl.gpu_name), load_rules(), merge_counters(parts))
        return [
            (c.id, str(c.verdict), round(c.expected_saving_share, 6), c.roofline.bound, c.roofline.ceiling_ms)
            for c in rep.candidates
        ]

    every, _, _, _, _ = _split(tmp_path / "every", monkeypatch, "0", ncu_every_counter=True)
    light, phase, _, _, _ = _split(tmp_path / "light", monkeypatch, "0", ncu_every_counter=False)
    assert phase["light_kernels"]
    assert verdicts(light) == verdicts(every)


def test_two_gpus_give_the_light_pass_to_one_of_them(tmp_path, monkeypatch, fake_ncu):
    out, phase, _, _, _ = _split(tmp_path, monkeypatch, "0,1", ncu_every_counter=False)
    stems = [r["stem"] for r in phase["passes"]]
    assert sum(s.startswith("ncu.light.gpu") for s in stems) == 1
    light = next(r for r in phase["passes"] if r["stem"].startswith("ncu.light"))
    configs = {k for r in phase["passes"] if not r["stem"].startswith("ncu.launches") for k in r["kernels"]}
    assert set(light["kernels"]) == configs  # every per-configuration kernel: its rows give the order
    header, rows = _rows(out / rundir.NCU_CSV)
    every, _, _, _, _ = _split(tmp_path / "every", monkeypatch, "0,1", ncu_every_counter=True)
    _, rows_every = _rows(every / rundir.NCU_CSV)
    name = header.index("Kernel Name")
    assert [r[name] for r in rows] == [r[name] for r in rows_every]  # in one process's order
    assert any(base_name(r[name]) in set(phase["light_kernels"]) for r in rows)
    # Its launches cost a fifth of one with the instruction counters in the split's balance.
    hot = _hot()
    step = ncu_gpus.step_launches(timeline(), hot)
    gpus = [ncu_gpus.Gpu("0"), ncu_gpus.Gpu("1")]
    shares = ncu_gpus.plan_shares(hot, step, gpus, False, 15, 3, light=ncu_passes.light_split(hot))
    assert sum(bool(s.light) for s in shares) == 1
    assert not {n for s in shares for n in s.configs} & set(hot.light)
    light_share = next(s for s in shares if s.light)
    assert light_share.light_count == ncu_passes.light_split(hot)[1] + sum(s.config_count for s in shares)


@pytest.mark.parametrize("options", [{"ncu_every_counter": True}, {"ncu_set": "full"}])
def test_every_counter_on_every_kernel_where_asked(tmp_path, monkeypatch, fake_ncu, options):
    _, phase, _, _, _ = _split(tmp_path, monkeypatch, "0", **options)
    assert [r["stem"] for r in phase["passes"]] == ["ncu.launches", "ncu"]
    assert not phase.get("light_kernels")
    calls = _profiling_calls(fake_ncu)
    assert all(not re.search(r"ncu\.light", " ".join(args)) for _, _, args in calls)
