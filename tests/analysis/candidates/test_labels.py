"""Candidate labels of kernels: a symbol the profiler left mangled reads demangled, and kernels
that share a demangled head stay apart (on the three CUTLASS grouped GEMMs of torch._grouped_mm
an H100 MoE trace recorded, tests/data/cutlass_grouped_gemm_symbols.txt)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from kerneltriage.analysis.candidates.labels import kernel_label
from kerneltriage.analysis.candidates.measure import NAME_LIMIT
from kerneltriage.analysis.timeline.hot_kernels import short_name

DATA = Path(__file__).resolve().parents[2] / "data"
SYMBOLS = (DATA / "cutlass_grouped_gemm_symbols.txt").read_text().split()


def test_mangled_grouped_gemms_read_demangled_and_apart():
    labels = [kernel_label(s) for s in SYMBOLS]
    assert len(SYMBOLS) == 3 and len(set(SYMBOLS)) == 3
    assert len(set(labels)) == 3  # the three kernels stay three
    heads = {label.rsplit(" #", 1)[0] for label in labels}
    # one demangled head for all three, as a warning prints the kernel
    assert heads == {short_name(SYMBOLS[0], 72)}
    (head,) = heads
    assert head.startswith("cutlass::device_kernel<at::cuda::detail::enable_3x_kernel_for_sm9x")
    for label in labels:
        assert "_ZN" not in label and len(label) <= NAME_LIMIT
        assert len(label.rsplit(" #", 1)[1]) == 6


def test_the_label_is_the_same_in_every_process():
    # Reports of two runs are matched by label: it must not depend on Python's hash seed.
    code = (
        "import sys; from kerneltriage.analysis.candidates.labels import kernel_label; "
        "print('\\n'.join(kernel_label(s) for s in sys.argv[1:]))"
    )
    outputs = [
        subprocess.run(
            [sys.executable, "-c", code, *SYMBOLS],
            capture_output=True,
            text=True,
            check=True,
            env={**os.environ, "PYTHONHASHSEED": seed},
        ).stdout.splitlines()
        for seed in ("1", "2")
    ]
    assert outputs[0] == outputs[1] == [kernel_label(s) for s in SYMBOLS]


def test_overloads_of_one_function_stay_apart():
    # add_kernel(float*, float*) and add_kernel(double*, double*): one name, two kernels
    single, double = kernel_label("_Z10add_kernelPfS_"), kernel_label("_Z10add_kernelPdS_")
    assert single.startswith("add_kernel #") and double.startswith("add_kernel #")
    assert single != double


def test_readable_names_are_as_before():
    assert kernel_label("triton_poi_fused_mul_silu_0") == "triton_poi_fused_mul_silu_0"
    name = "void at::native::vectorized_elementwise_kernel<4, at::native::AddFunctor<float>, std::array<char*, 3ul> >(int, at::native::AddFunctor<float>, std::array<char*, 3ul>)"
    assert kernel_label(name) == "vectorized_elementwise_kernel<AddFunctor>"
    assert (
        kernel_label("nvjet_sm90_tst_192x128_64x5_1x2_h_bz_coopB_NNT")
        == "nvjet_sm90_tst_192x128_64x5_1x2_h_bz_coopB_NNT"
    )
