"""Plausibility checks that warn rather than refuse."""

from __future__ import annotations

import pandas as pd

from kerneltriage.analysis.timeline.plausibility import check_kernel_in_step


def kernels(durations_ns: list[float], steps: list[int]) -> pd.DataFrame:
    return pd.DataFrame(
        {"name": [f"k{i}" for i in range(len(steps))], "kind": "kernel", "step": steps, "dur": durations_ns}
    )


def test_a_kernel_longer_than_the_longest_step_is_named():
    (warning,) = check_kernel_in_step(kernels([2e6, 30e6, 1e6], [0, 1, -1]), [20e6, 22e6])
    assert "'k1' lasts 30 ms, longer than the longest step (22 ms)" in warning


def test_kernels_within_their_steps_and_kernels_outside_the_steps_pass():
    assert check_kernel_in_step(kernels([2e6, 21e6], [0, 1]), [20e6, 22e6]) == []
    assert check_kernel_in_step(kernels([2e6, 90e6], [0, -1]), [20e6, 22e6]) == []
