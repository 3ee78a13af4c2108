"""Steady state, intervals and statuses on synthetic step-time series (analysis/timeline/steady.py)."""

from __future__ import annotations

import numpy as np
import pytest

from kerneltriage.analysis.timeline import steady


def noisy(mean: float, n: int, seed: int, sd: float = 0.3) -> list[float]:
    return list(mean + np.random.default_rng(seed).normal(0.0, sd, n))


@pytest.mark.parametrize("seed", range(5))
def test_a_ten_step_slow_transient_after_warm_up_is_cut(seed):
    series = noisy(110.0, 10, seed) + noisy(90.0, 15, seed + 100)
    s = steady.steady(series)
    assert 10 <= s.skipped <= 12 and s.settled  # every slow step cut, few steady ones
    assert s.median == pytest.approx(90.0, abs=0.4) and s.low <= float(np.median(series[10:])) <= s.high


@pytest.mark.parametrize("seed", range(5))
def test_stationary_steps_are_not_cut(seed):
    s = steady.steady(noisy(90.0, 25, seed))
    assert s.skipped == 0 and s.settled and s.low <= s.median <= s.high


def test_a_transient_before_noisy_steps_is_cut_where_the_variance_alone_misses_it():
    # FSDP2 on two H100s (the script alone, both ranks in lockstep): 18-22 steps at 210-315 ms,
    # then 148-270 ms. MSER cut rank 1's transient and kept rank 0's, whose later steps are as
    # noisy as the transient is slow.
    import json
    from pathlib import Path

    alone = (
        Path(__file__).parents[3] / "benchmarks" / "results" / "multi_gpu_2026-11-27" / "fsdp2_alone.jsonl"
    )
    ranks = {r["rank"]: r["step_ms"] for r in map(json.loads, alone.read_text().splitlines())}
    cut = {rank: steady.steady(series).skipped for rank, series in ranks.items()}
    assert cut[1] == 22 and 16 <= cut[0] <= 22
    assert all(max(ranks[r][cut[r] :]) < 320 and np.median(ranks[r][cut[r] :]) < 205 for r in ranks)


@pytest.mark.parametrize("seed", range(20))
def test_noisy_stationary_or_spiky_steps_show_no_level_shift(seed):
    rng = np.random.default_rng(seed)
    normal = rng.normal(100.0, 6.0, 60)  # 6% noise, no transient
    spiky = rng.normal(100.0, 2.0, 60)
    spiky[rng.random(60) < 0.05] += 40.0  # a few slow steps anywhere
    assert steady.steady(list(normal)).skipped == 0
    assert steady.level_shift(normal) == 0 and steady.level_shift(spiky) == 0


def test_a_drifting_series_never_settles():
    drift = list(np.linspace(80.0, 100.0, 30))
    s = steady.steady(drift)
    assert not s.settled


def test_scattered_slow_steps_move_the_median_little():
    # An HF Qwen2-class LM alone on an H100 (ms): slow steps 8, 9 and 11 after a steady start.
    q = [90.9, 89.4, 90.0, 90.1, 90.9, 88.7, 89.1, 123.6, 110.1, 89.0, 106.1]
    q += [88.5, 89.8, 89.0, 88.2, 89.3, 88.8, 89.5, 89.1, 88.9]
    s = steady.steady(q)
    assert s.settled and s.median == pytest.approx(89.08, rel=0.01) and s.low <= 89.08 <= s.high


def test_too_few_steps_are_not_settled_and_have_an_interval():
    s = steady.steady([10.0, 10.2, 10.1])
    assert not s.settled and s.skipped == 0 and s.low <= s.median <= s.high


def test_two_processes_six_percent_apart_are_inconclusive_and_more_decide():
    # Two baseline processes 6% apart (89.57 and 84.44 ms), each steady within 1%; the fix saves
    # about 8% against 10.1% predicted: half the prediction (5.05%) lies inside the interval.
    base = [noisy(89.57, 20, 1), noisy(84.44, 20, 2)]
    fixed = [noisy(80.5, 20, 3), noisy(81.0, 20, 4)]
    two = steady.saving(base, fixed)
    assert steady.judge(0.101, two) == "inconclusive"
    base += [noisy(m, 20, 10 + i) for i, m in enumerate((86.0, 85.0, 87.0, 84.9))]
    fixed += [noisy(m, 20, 20 + i) for i, m in enumerate((79.0, 78.5, 80.0, 79.7))]
    six = steady.saving(base, fixed)
    assert steady.judge(0.101, six) == "verified"
    assert (six.high - six.low) < (two.high - two.low)


def test_a_slowdown_is_refuted_and_a_null_effect_is_not_verified():
    base = [noisy(50.0, 20, i) for i in range(3)]
    slower = [noisy(53.0, 20, 10 + i) for i in range(3)]
    assert steady.judge(0.05, steady.saving(base, slower)) == "refuted"
    assert steady.judge(None, steady.saving(base, slower)) == "refuted"
    same = [noisy(50.0, 20, 20 + i) for i in range(3)]
    assert steady.judge(0.063, steady.saving(base, same)) != "verified"


def test_intervals_are_reproducible():
    base = [noisy(50.0, 20, i) for i in range(3)]
    fixed = [noisy(45.0, 20, 10 + i) for i in range(3)]
    assert steady.saving(base, fixed) == steady.saving(base, fixed)
    assert steady.steady(base[0]) == steady.steady(base[0])


def test_side_time_covers_each_process_spread():
    side = steady.side_time([noisy(89.57, 20, 1), noisy(84.44, 20, 2)])
    assert side.value == pytest.approx(87.0, abs=0.3)
    assert side.low < 85.5 and side.high > 88.5


def test_a_process_far_from_the_others_is_an_outlier():
    # ConvNeXt-T on an H100: one baseline process ran through a slow stretch of the machine.
    assert steady.outlier_runs([38.97, 28.56, 28.74]) == [0]
    # T5-base: processes 196.0, 180.05, 175.66 ms differ, but none stands apart from the rest.
    assert steady.outlier_runs([196.0, 180.05, 175.66]) == []
    assert steady.outlier_runs([50.0, 60.0]) == []  # two cannot say which one is off


# ConvNeXt-T plain steps on an H100 (ms), SM clock at 1980 MHz throughout: a floor that repeats
# to within 0.1%, and stretches above it while the machine's other load delays the launches.
CONVNEXT_DISTURBED = [28.8226, 28.7739, 29.0994, 31.6012, 29.9281, 30.0137, 32.0422, 31.2086, 30.1096]
CONVNEXT_DISTURBED += [28.6879, 28.6782, 28.8811, 30.6495, 28.6656, 28.6585, 28.6858, 32.206, 32.8322]
CONVNEXT_DISTURBED += [32.2535, 34.2234, 114.1921]
# A Mixtral-class MoE alone on an H100: steps spread by routing, no floor (windows of 10 steps
# had medians 57.9-65.1 ms).
MOE_SPREAD = [62.4, 61.1, 60.3, 59.6, 64.8, 63.1, 59.7, 58.8, 58.0, 64.3, 63.4, 65.1, 63.0, 59.5, 57.9]


def test_a_floor_with_slower_stretches_is_measured_by_its_floor():
    s = steady.steady(CONVNEXT_DISTURBED)
    assert float(np.median(s.values)) > 30.0  # the median sits inside the stretches
    assert s.median == pytest.approx(28.69, abs=0.05)
    assert s.disturbed >= 10 and s.low <= s.median <= s.high
    assert steady.level(CONVNEXT_DISTURBED) == s.median


@pytest.mark.parametrize("seed", range(3))
def test_a_broad_spread_keeps_its_median(seed):
    series = list(np.random.default_rng(seed).permutation(MOE_SPREAD * 3))
    s = steady.steady(series)
    assert s.disturbed == 0 and s.median == pytest.approx(float(np.median(s.values)))
    # A level that is simply higher, steady within 1%, is not a floor either.
    assert steady.steady(noisy(92.8, 30, seed)).disturbed == 0
    # Nor a T5-base-class process on an H100 whose steps spread 165-181 ms.
    t5 = [180.46, 167.35, 166.35, 174.33, 174.95, 175.05, 166.27, 177.09, 172.7, 174.18]
    t5 += [175.69, 167.54, 166.96, 164.76, 165.67, 179.35, 181.0, 178.57, 177.68, 176.96]
    assert steady.steady(t5).disturbed == 0 and steady.level(t5) == float(np.median(t5))


def test_side_time_of_disturbed_processes_leaves_the_stretches_out():
    quiet = noisy(28.72, 20, 5, sd=0.01)
    side = steady.side_time([CONVNEXT_DISTURBED, quiet])
    assert side.value == pytest.approx(28.7, abs=0.05) and side.low < 28.69 < 28.71 < side.high
    # Each process by its own rule in every resample: a series with no floor keeps its median's
    # interval (resamples of five steps would often show a floor that the series does not have).
    five = [68.73, 70.18, 70.18, 85.97, 79.35]  # an HF Llama run's plain steps (ms)
    assert steady.steady(five).disturbed == 0 and steady.steady(five).high == pytest.approx(85.97)
    # The same processes by their medians would have put the step 2% higher.
    assert float(np.mean([np.median(CONVNEXT_DISTURBED), np.median(quiet)])) > 29.3


# Timing processes of a Qwen2-class LM in two profiles on an H100 shared with other load
# (2026-11-27), and the script alone minutes later: 93.92 ms.
QWEN2_PROFILES = [(88.98, 89.17, 92.21), (85.95, 87.44, 92.74)]


def test_a_run_of_the_script_falls_in_the_run_interval_where_the_mean_interval_misses_it():
    for medians in QWEN2_PROFILES:
        steps = [list(m + np.random.default_rng(1).normal(0, 2.0, 20)) for m in medians]
        mean = steady.side_time(steps)
        run = steady.run_interval(steps)
        assert mean is not None and run is not None
        assert run.value == pytest.approx(mean.value)
        assert not mean.covers(93.92) and run.covers(93.92)
        assert run.low <= mean.low and run.high >= mean.high


def test_the_run_interval_covers_further_processes_at_its_confidence():
    # Processes whose own levels differ (sd 3%) and whose steps are noisy (sd 2%): a further
    # process's step time falls in the interval of three at about 95%, in the mean's far less.
    rng = np.random.default_rng(7)
    hits_run = hits_mean = 0
    trials = 300
    for _ in range(trials):
        levels = 100.0 * (1 + rng.normal(0, 0.03, 4))
        procs = [list(m * (1 + rng.normal(0, 0.02, 20))) for m in levels]
        new = steady.level(procs[3])
        hits_run += steady.run_interval(procs[:3]).covers(new)
        hits_mean += steady.side_time(procs[:3]).covers(new)
    assert hits_run / trials >= 0.9
    assert hits_mean / trials <= 0.7


def test_processes_that_agree_keep_a_narrow_run_interval():
    # BERT-base on an H100: three processes within 0.4% of each other.
    rng = np.random.default_rng(3)
    procs = [list(m + rng.normal(0, 0.05, 20)) for m in (56.50, 56.50, 56.30)]
    run = steady.run_interval(procs)
    assert run is not None and (run.high - run.low) / 2 < 0.03 * run.value
    assert run.covers(56.32)
    # One process: the interval of its own median, as before.
    one = steady.run_interval(procs[:1])
    assert one == steady.side_time(procs[:1])


def test_a_left_out_process_raises_the_top_of_the_run_interval():
    # ConvNeXt-T on a shared H100: two processes at their 28.91 ms floor, one at 35.54 ms (left
    # out of the step time), and the script alone minutes later at 37.93 ms.
    rng = np.random.default_rng(5)
    floor = [list(28.91 + rng.normal(0, 0.01, 20)) for _ in range(2)]
    slow = [list(35.54 + rng.normal(0, 1.0, 20))]
    assert steady.outlier_runs([steady.level(p) for p in floor + slow]) == [2]
    without = steady.run_interval(floor)
    run = steady.run_interval(floor, slow)
    assert run.value == pytest.approx(28.91, abs=0.01) and run.low == without.low
    assert not without.covers(37.93) and run.covers(37.93)


def test_processes_that_agree_exactly_still_give_half_a_percent_either_way():
    # BERT-base: three processes at 56.65 ms, the script alone at 56.70 ms on the same machine.
    run = steady.run_interval([[56.65] * 20, [56.65] * 20, [56.65] * 20])
    assert run.low == pytest.approx(56.65 * 0.995) and run.high == pytest.approx(56.65 * 1.005)
    assert run.covers(56.70)
