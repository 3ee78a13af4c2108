"""What padding an unaligned GEMM measured (``kerneltriage/data/gemm_alignment.yaml``): the least
gain at a unit's precision is the prediction, fp16 takes bf16's cases, fp32 operands TF32's."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from kerneltriage.analysis.judge.gemm_alignment import (
    AlignmentFile,
    alignment_data,
    padding_gain,
    shape_pad_gains,
)


def test_the_least_measured_gain_stands_for_a_precision():
    tf32 = padding_gain("tf32")
    assert tf32 is not None and tf32.gain == pytest.approx(2.919 / 2.220) and tf32.case.startswith("K=2798")
    assert padding_gain("fp32") == tf32  # fp32 operands on the tensor cores run TF32
    bf16 = padding_gain("bf16")
    assert bf16 is not None and bf16.gain == pytest.approx(1.685 / 0.618) and bf16.case.startswith("N=30522")
    assert padding_gain("fp16_tensor") == bf16
    # every case gains, and the least of each precision is what is used
    for case in alignment_data().cases:
        gain = case.eager_ms / case.padded_ms
        assert gain >= padding_gain(case.precision).gain > 1.0
    assert padding_gain("fp8") is None and padding_gain(None) is None


def test_force_shape_pad_gains_are_a_range_around_one():
    low, high = shape_pad_gains("tf32")
    assert low == pytest.approx(2.936 / 3.228) and high == pytest.approx(2.445 / 2.317)
    assert shape_pad_gains("bf16")[1] == pytest.approx(1.456 / 1.022)
    assert shape_pad_gains("int8") is None


def test_a_case_without_its_times_is_refused():
    good = alignment_data().model_dump()
    broken = {**good, "cases": [{**good["cases"][0], "padded_ms": 0}]}
    with pytest.raises(ValidationError):
        AlignmentFile.model_validate(broken)
    with pytest.raises(ValidationError):
        AlignmentFile.model_validate({**good, "cases": []})
