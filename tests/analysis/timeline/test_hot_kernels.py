"""Hot-kernel selection for phase 2 on the real H200 capture."""

from __future__ import annotations

import csv
import gzip
import io
from pathlib import Path

import pytest

from kerneltriage.analysis.rules import load_rules
from kerneltriage.analysis.timeline.hot_kernels import select_hot_kernels, without_counter_rows
from kerneltriage.ingest.ncu_csv import read_counters
from kerneltriage.ingest.source import read_timeline
from tests.helpers import EXAMPLE_RUN, EXTERNAL, corpus, timeline


def test_hot_kernels_cover_the_step():
    hot = select_hot_kernels(timeline(), load_rules(), coverage=0.95, max_kernels=64)
    assert hot.coverage >= 0.95
    assert "softmax_warp_forward" in hot.names and any(n.startswith("nvjet") for n in hot.names)
    assert hot.names == sorted(hot.names, key=hot.names.index)  # hottest first, no repeats
    assert len(set(hot.names)) == len(hot.names)
    capped = select_hot_kernels(timeline(), load_rules(), coverage=1.0, max_kernels=3)
    assert len(capped.names) == 3 and capped.names == hot.names[:3]
    assert 0 < hot.configs <= 510


def test_a_templates_cold_instantiations_are_left_out():
    # One template runs many ops (vectorized_elementwise_kernel of a multiply, a copy, a fill):
    # the coverage counts instantiations, so the cold ones get no launch of ncu's.
    from kerneltriage.analysis.timeline.attribution import attribute
    from kerneltriage.ingest.kernel_names import base_name

    tl = timeline()
    hot = select_hot_kernels(tl, load_rules(), coverage=0.95, max_kernels=64)
    k = attribute(tl).kernels
    k = k[(k["step"] >= 0) & (k["kind"] == "kernel")]
    k = k.assign(base=k["name"].map(base_name))
    assert hot.instances and set(hot.instances) <= set(hot.names)
    per_name = k.groupby("name")["dur"].sum()
    for base, names in hot.instances.items():
        others = set(k.loc[k["base"] == base, "name"]) - set(names)
        assert names and others  # in part: some, not all
        assert max(per_name[list(others)]) <= min(per_name[names])  # the colder ones left out
    # The configurations expected are those of the chosen launches only, fewer than the base
    # names' (the selection before: 510 at most, every instantiation of each hot base name).
    one = k[k["step"] == k["step"].min()]
    key = ["name", "grid_x", "grid_y", "grid_z", "block_x", "block_y", "block_z"]
    assert hot.configs == len(one[hot.chosen(one)].drop_duplicates(key))
    assert hot.configs < len(one[one["base"].isin(hot.names)].drop_duplicates(key))
    assert hot.coverage >= 0.95
    # Every-launch kernels are profiled whole (their pass takes every launch of the base name).
    assert not set(hot.variable) & set(hot.instances)


def test_the_rules_say_which_kernels_are_communication(tmp_path):
    # The user's rules decide what counts as communication (left out: ncu would serialize it).
    user = tmp_path / "rules.yaml"
    user.write_text(
        "schema: kerneltriage.rules/1\n"
        "op_classes:\n"
        "  - {kind: communication, kernels: ['softmax_warp_forward']}\n"
        "  - {kind: other, ops: ['.'], kernels: ['.']}\n"
    )
    default = select_hot_kernels(timeline(), load_rules(), coverage=0.95, max_kernels=64)
    mine = select_hot_kernels(timeline(), load_rules(user), coverage=0.95, max_kernels=64)
    assert "softmax_warp_forward" in default.names and not default.left_out
    assert mine.left_out == ["softmax_warp_forward"]
    assert "softmax_warp_forward" not in mine.names


def test_variable_size_kernels_fit_a_launch_budget_or_are_named():
    # The two persistent GEMMs of the capture run several sizes under one launch configuration
    # (21 and 20 launches a step): the default budget profiles every launch of both.
    hot = select_hot_kernels(timeline(), load_rules(), coverage=0.95, max_kernels=64)
    assert sorted(hot.variable) == [
        "nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT",
        "nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_TNT",
    ]
    assert hot.variable_launches == 41 and hot.over_budget == {}
    # A budget too small for one of them: the hotter one first, the other named, not dropped.
    tight = select_hot_kernels(
        timeline(), load_rules(), coverage=0.95, max_kernels=64, max_variable_launches=30
    )
    assert tight.variable == ["nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT"]
    assert tight.over_budget == {"nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_TNT": 20}
    assert tight.variable_launches == 21 and set(tight.names) == set(hot.names)


def test_hot_kernels_without_counter_rows_are_those_no_export_names():
    # The shipped run's two exports: per configuration, and every launch of the variable-size GEMMs.
    per_config = read_counters(EXAMPLE_RUN / "ncu.csv.gz").rows
    every_launch = read_counters(EXAMPLE_RUN / "ncu.launches.csv.gz").rows
    named = list(dict.fromkeys(per_config["base_name"]))
    assert without_counter_rows([*named, "no_such_kernel"], [per_config]) == ["no_such_kernel"]
    gemms = sorted(set(every_launch["base_name"]) - set(per_config["base_name"]))
    assert gemms and all(g.startswith("nvjet") for g in gemms)
    assert without_counter_rows(gemms, [per_config]) == gemms  # in hot order, as asked
    assert without_counter_rows(gemms, [per_config, every_launch]) == []
    assert without_counter_rows(named, []) == named  # no export: nothing was profiled


def test_warnings_name_kernels_short_and_demangled():
    from kerneltriage.analysis.timeline.hot_kernels import SHORT_NAME_LIMIT, short_name

    # A CUTLASS grouped GEMM as ncu and Kineto leave it mangled: thousands of characters.
    grouped = (
        "_ZN7cutlass13device_kernelIN10flashinfer4gemm17GroupedGemmKernelINS_4gemm6kernel"
        + "I" * 2000
        + "EEEEvNT_6ParamsE"
    )
    shown = short_name(grouped)
    assert shown.startswith("cutlass::device_kernel<flashinfer::gemm::GroupedGemmKernel")
    assert len(shown) <= SHORT_NAME_LIMIT and "…" in shown
    aligned = "_ZN7cutlass7Kernel2I52cutlass_80_tensorop_s1688gemm_256x128_32x3_tn_align1EEvNT_6ParamsE"
    assert (
        short_name(aligned, limit=200)
        == "cutlass::Kernel2<cutlass_80_tensorop_s1688gemm_256x128_32x3_tn_align1…>"
    )
    assert short_name("flash_fwd_kernel") == "flash_fwd_kernel"


# --- Which tensor-core precisions phase 2 counts ---------------------------------------------

RUNS = Path(__file__).parents[3] / "examples" / "runs"
TENSOR_COLUMNS = {
    "bf16": "sm__ops_path_tensor_src_bf16_dst_fp32.sum",
    "fp16": "sm__ops_path_tensor_src_fp16.sum",
    "tf32": "sm__ops_path_tensor_src_tf32_dst_fp32.sum",
    "fp8": "sm__ops_path_tensor_src_fp8.sum",
    "fp64": "sm__ops_path_tensor_src_fp64.sum",
}


def _precisions_counted(run: Path) -> set[str]:
    """The precisions whose tensor-pipe counter is non-zero on some launch of the run's exports
    (which collected all five)."""
    seen: set[str] = set()
    for name in ("ncu.csv.gz", "ncu.launches.csv.gz"):
        if not (run / name).is_file():
            continue
        with gzip.open(run / name, "rt") as f:
            header, _units, *body = csv.reader(io.StringIO(f.read()))
        for precision, column in TENSOR_COLUMNS.items():
            i = header.index(column)
            if any(float(row[i].replace(",", "") or 0) > 0 for row in body):
                seen.add(precision)
    return seen


@pytest.mark.parametrize("run", ["convnext-t-h100", "gpt2-compile-h100", "hf-llama-h100", "gpt-sdpa-h200"])
def test_the_precisions_chosen_hold_every_tensor_flop_the_counters_saw(run):
    # These runs collected every precision's counter: what ran must lie in what phase 2 would
    # now ask for (bf16 autocast: bf16 alone, 2 replay passes a launch instead of 6).
    trace = RUNS / run / "trace.json.gz"
    hot = select_hot_kernels(read_timeline(trace), load_rules(), coverage=0.95, max_kernels=64)
    counted = _precisions_counted(RUNS / run)
    assert counted == {"bf16"}
    assert hot.tensor_precisions == ["bf16"]


@corpus
def test_precisions_of_traces_nobody_here_made():
    moe = EXTERNAL / "tracelens-moe-8rank-b200"
    trace = next(p for p in sorted(moe.iterdir()) if p.name.endswith((".json", ".json.gz")))
    hot = select_hot_kernels(read_timeline(trace), load_rules(), coverage=0.95, max_kernels=64)
    assert hot.tensor_precisions == ["bf16", "fp8"]  # an FP8 MoE: both GEMM precisions
    # A trace recorded without shapes says no types: no precision can be left out.
    cnn = EXTERNAL / "hta-cnn-v100"
    trace = next(p for p in sorted(cnn.rglob("*")) if p.name.endswith((".json", ".json.gz")))
    assert (
        select_hot_kernels(
            read_timeline(trace), load_rules(), coverage=0.95, max_kernels=64
        ).tensor_precisions
        is None
    )


# T5-base's attention GEMMs when its fp32 position bias keeps SDPA on the math path (an H200):
# cuBLAS's xmma kernels on FFMA, off the tensor cores, with TF32 off.
FFMA_GEMM = "sm80_xmma_gemm_f32f32_f32f32_f32_nn_n_tilesize64x64x8_stage3_warpsize1x4x1_ffma_aligna4_alignc4_execute_kernel__5x_cublas"
TF32_GEMM = "sm80_xmma_gemm_tf32f32_tf32f32_f32_nn_n_tilesize128x128x16_stage3_warpsize2x2x1_tensor16x8x8_execute_kernel__5x_cublas"
BF16_GEMM = "nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT"


def _gemm_trace(tmp_path: Path, kernels: list[tuple[str, str]]) -> Path:
    """Three 1 ms ProfilerSteps, each launching one GEMM per (kernel name, input type) from an
    ``aten::mm`` whose inputs have that type."""
    from tests.helpers import write_trace

    def event(name, cat, ts, dur, **args):
        gpu = cat == "kernel"
        return {"ph": "X", "name": name, "cat": cat, "ts": ts, "dur": dur, "pid": 0 if gpu else 100,
                "tid": 7 if gpu else 1, "args": args}  # fmt: skip

    events, c = [], 0
    for step in range(3):
        base = step * 1000
        events.append(event(f"ProfilerStep#{step}", "user_annotation", base, 1000))
        for i, (name, dtype) in enumerate(kernels):
            c += 1
            at = base + 10 + 200 * i
            events.append(event("aten::mm", "cpu_op", at, 20, **{"External id": c, "Input Dims": [[512, 512], [512, 512]],
                                                                  "Input type": [dtype, dtype]}))  # fmt: skip
            events.append(
                event("cudaLaunchKernel", "cuda_runtime", at + 5, 5, correlation=c, **{"External id": c})
            )
            events.append(event(name, "kernel", at + 30, 150, correlation=c, device=0, stream=7))
    return write_trace(tmp_path / "t.json.gz", {"traceEvents": events})


@pytest.mark.parametrize(
    ("kernels", "expected"),
    [
        ([(FFMA_GEMM, "float"), (BF16_GEMM, "c10::BFloat16")], ["bf16"]),  # FFMA: no TF32 counter
        ([(TF32_GEMM, "float"), (BF16_GEMM, "c10::BFloat16")], ["bf16", "tf32"]),
        (
            [("ampere_gemm_unnamed_precision", "float")],
            ["tf32"],
        ),  # an fp32 op, its kernel silent: may be TF32
    ],
)
def test_an_fp32_op_on_an_ffma_kernel_costs_no_tf32_replay_pass(tmp_path, kernels, expected):
    hot = select_hot_kernels(
        read_timeline(_gemm_trace(tmp_path, kernels)), load_rules(), coverage=1.0, max_kernels=8
    )
    assert sorted(hot.names) == sorted(name for name, _ in kernels)
    assert hot.tensor_precisions == expected
