"""A torch.compile'd MoE whose experts' torch._grouped_mm the compiled graphs keep as library
CUTLASS grouped GEMMs (the H100 Mixtral-class run of BENCHMARKS.md, "The ladder on a MoE"): the
kernels are candidates of their own, named by a readable label that tells the three apart and
matches them across runs, judged as library GEMMs, never told to compile a compiled model.

The trace is built here, in the shape PyTorch's profiler writes it: ``Torch-Compiled Region`` →
``CompiledFunction`` → ``aten::_grouped_mm`` launching the kernel (External id, correlation) in
the forward, ``CompiledFunctionBackward`` in the backward; the kernels carry the three real
symbols of tests/data/cutlass_grouped_gemm_symbols.txt, which the profiler leaves mangled.
"""

from __future__ import annotations

import copy
import gzip
import json
from pathlib import Path

import pytest

import kerneltriage
from kerneltriage.analysis.compare.diff import compare
from kerneltriage.analysis.judge.verdict import decide
from kerneltriage.analysis.rules import load_rules
from kerneltriage.analysis.vocabulary import Reason, Verdict
from kerneltriage.render import render

DATA = Path(__file__).resolve().parents[2] / "data"
SYMBOLS = (DATA / "cutlass_grouped_gemm_symbols.txt").read_text().split()
STEP_US = 2000
BF16 = "c10::BFloat16"
# (symbol, _grouped_mm's inputs: tokens [T, K], the experts' weights [E, K, N], the offsets), as
# a Mixtral-class layer runs them: gate/up and down projections forward, a weight gradient.
LAUNCHES = (
    (SYMBOLS[0], [[16384, 2048], [8, 2048, 1408], [8]]),
    (SYMBOLS[1], [[16384, 1408], [8, 1408, 2048], [8]]),
    (SYMBOLS[2], [[2048, 16384], [8, 16384, 1408], [8]]),
)
INDUCTOR = "triton_poi_fused_mul_silu_0"


def moe_trace(path: Path, durations_us: tuple[float, ...] = (300, 320, 330), compiled: bool = True) -> Path:
    """Three steps of the layer; ``compiled=False``: its eager twin (the same ops and kernels,
    no compiled regions, no Inductor kernel)."""
    events: list[dict] = []
    correlation = 0

    def event(name: str, cat: str, ts: float, dur: float, **args) -> None:
        gpu = cat == "kernel"
        events.append(
            {
                "ph": "X",
                "name": name,
                "cat": cat,
                "ts": ts,
                "dur": dur,
                "pid": 0 if gpu else 100,
                "tid": 7 if gpu else 1,
                "args": args,
            }
        )

    def launch(op: str, dims: list, at: float, start: float, dur: float, kernel: str) -> None:
        nonlocal correlation
        correlation += 1
        types = [BF16, BF16, "int"][: len(dims)]
        event(op, "cpu_op", at, 20, **{"External id": correlation, "Input Dims": dims, "Input type": types})
        event(
            "cudaLaunchKernel",
            "cuda_runtime",
            at + 5,
            5,
            correlation=correlation,
            **{"External id": correlation},
        )
        event(kernel, "kernel", start, dur, correlation=correlation, device=0, stream=7)

    for step in range(3):
        t0 = step * STEP_US
        event(f"ProfilerStep#{step}", "user_annotation", t0, STEP_US)
        if compiled:
            event("Torch-Compiled Region: 0/0", "cpu_op", t0 + 10, 900)
            event("CompiledFunction", "cpu_op", t0 + 20, 880)
            launch(INDUCTOR, [], t0 + 60, t0 + 70, 60, INDUCTOR)
            event("autograd::engine::evaluate_function: CompiledFunctionBackward", "cpu_op", t0 + 1000, 900)
            event("CompiledFunctionBackward", "cpu_op", t0 + 1010, 880)
        else:
            event("autograd::engine::evaluate_function: GroupedMmBackward0", "cpu_op", t0 + 1000, 900)
            event("GroupedMmBackward0", "cpu_op", t0 + 1010, 880)
        for (symbol, dims), dur, at in zip(LAUNCHES, durations_us, (150, 500, 1100)):
            launch("aten::_grouped_mm", dims, t0 + at, t0 + at + 40, dur, symbol)
    properties = {
        "id": 0,
        "name": "NVIDIA H100 80GB HBM3",
        "numSms": 132,
        "computeMajor": 9,
        "computeMinor": 0,
    }
    path.write_bytes(
        gzip.compress(json.dumps({"deviceProperties": [properties], "traceEvents": events}).encode())
    )
    return path


def _by_symbol(rep) -> dict[str, object]:
    found = {
        c.kernels[0].full_name: c for c in rep.candidates if c.kernels and c.kernels[0].full_name in SYMBOLS
    }
    assert set(found) == set(SYMBOLS), [c.name for c in rep.candidates]
    return found


@pytest.fixture(scope="module")
def compiled_report(tmp_path_factory):
    return kerneltriage.report(moe_trace(tmp_path_factory.mktemp("moe") / "compiled.json.gz"))


# --- the label ----------------------------------------------------------------------------------


def test_each_grouped_gemm_is_a_candidate_named_readably_and_apart(compiled_report):
    gemms = _by_symbol(compiled_report)
    for symbol, c in gemms.items():
        assert c.level == "kernel" and c.compiled and not c.inductor
        assert c.name.startswith("cutlass::device_kernel<at::cuda::detail::enable_3x_kernel_for_sm9x")
        assert c.full_name == symbol  # the symbol stays in the JSON and the HTML tooltip
    assert len({c.name for c in gemms.values()}) == 3
    text = render(compiled_report, "terminal", width=200)
    for c in gemms.values():
        assert f"{c.id}  {c.name}" in text  # the detail line names it as the table does


def test_diff_matches_each_grouped_gemm_with_itself(tmp_path, compiled_report):
    # The run after, the three kernels in another order of time: each is still matched with
    # the same kernel, by name (when they shared a name, they were paired by time).
    after = kerneltriage.report(moe_trace(tmp_path / "after.json.gz", durations_us=(340, 290, 310)))
    before_ids = {c.id: s for s, c in _by_symbol(compiled_report).items()}
    after_ids = {c.id: s for s, c in _by_symbol(after).items()}
    matched = [
        m for m in compare(compiled_report, after).candidates if set(m.ids["before"]) & set(before_ids)
    ]
    assert len(matched) == 3
    for m in matched:
        assert m.how == "same name"
        assert [before_ids[i] for i in m.ids["before"]] == [after_ids[i] for i in m.ids["after"]]


# --- kind and verdict ---------------------------------------------------------------------------


def test_grouped_gemms_a_compiled_graph_kept_get_a_library_gemms_verdict(tmp_path, compiled_report):
    eager = _by_symbol(kerneltriage.report(moe_trace(tmp_path / "eager.json.gz", compiled=False)))
    for symbol, c in _by_symbol(compiled_report).items():
        assert c.kind == "gemm" and c.attrs["kernel_library"] == "CUTLASS"
        # compiling the model again is not its advice
        assert c.builtin != "torch.compile"
        assert (c.recipe or {}).get("id") not in ("compile-model", "compile-module-class")
        if c.fwd_ms_per_step:
            # the same op run eagerly: a library GEMM, at the same headroom, the same verdict
            e = eager[symbol]
            assert e.level == "op" and e.ops == ["aten::_grouped_mm"] and e.kind == "gemm"
            assert c.headroom == pytest.approx(e.headroom, rel=1e-6)
            assert c.conditions["headroom"].passed and c.conditions["hotness"].passed
            assert (c.verdict, c.reason, c.builtin) == (e.verdict, e.reason, e.builtin)
            assert (c.recipe or {}).get("id") == (e.recipe or {}).get("id")
            assert c.expected_saving_share == pytest.approx(e.expected_saving_share, rel=1e-6)


def test_a_library_kernel_a_compiled_graph_kept_is_never_told_to_compile(compiled_report):
    # The kernel table read these kernels as copies (their cute::Copy_Atom template argument)
    # before it knew CUTLASS 3 GEMMs: elementwise, whose advice is torch.compile (the MoE run's
    # report said "compile: torch.compile" at 2.3x headroom). Judged again as elementwise:
    def judged(compiled: bool) -> list:
        candidates = copy.deepcopy(compiled_report.candidates)
        for c in candidates:
            c.fix = c.recipe = None  # as measured, before any verdict
            if c.kernels[0].full_name in SYMBOLS:
                c.kind, c.compiled = "elementwise", compiled
        decide(candidates, load_rules(), compiled_report.gpu)
        return [
            c for c in candidates if c.kernels[0].full_name in SYMBOLS and c.conditions["headroom"].passed
        ]

    kept = judged(compiled=True)
    assert kept  # conditions that would have earned a verdict
    for c in kept:
        # a library kernel the compiled graph kept: compiling again leaves it as it is
        assert (c.verdict, c.reason, c.builtin, c.fix) == (Verdict.SKIP, Reason.LIBRARY_KERNEL, None, None)
        assert c.expected_saving_share == 0.0
        assert (
            c.note.startswith("a CUTLASS kernel that the compiled graph kept") and "(torch.compile)" in c.note
        )
    # The same kernels outside a compiled graph: compiling is advice that can fuse them.
    for c in judged(compiled=False):
        assert c.verdict == Verdict.COMPILE and c.builtin == "torch.compile"
