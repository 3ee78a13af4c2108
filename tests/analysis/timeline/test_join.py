"""Joining Nsight Compute rows to trace kernels (names differ between the two tools)."""

from __future__ import annotations

import numpy as np
import pytest

from kerneltriage.analysis.timeline.attribution import attribute
from kerneltriage.analysis.timeline.join import join_counters
from kerneltriage.ingest.kernel_names import base_name, canonical_name, name_similarity
from kerneltriage.ingest.ncu_csv import read_counters
from tests.helpers import NCU_ALL, NCU_PER_CONFIG, NCU_SECTIONS, timeline


@pytest.fixture(scope="module")
def kernels():
    return attribute(timeline()).kernels


def test_names_normalise_across_demanglers():
    kineto = "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<bool>, std::array<char*, 1ul> >(int, at::native::FillFunctor<bool>, std::array<char*, 1ul>)"
    ncu = (
        "void at::vectorized_elementwise_kernel<4, at::FillFunctor<bool>, std::array<char *, 1>>(int, T2, T3)"
    )
    assert base_name(kineto) == base_name(ncu) == "vectorized_elementwise_kernel"
    assert canonical_name(kineto) == canonical_name(ncu)
    assert (
        base_name("void (anonymous namespace)::softmax_warp_forward<float>(float*)") == "softmax_warp_forward"
    )
    assert base_name("void <unnamed>::softmax_warp_forward<float>(float*)") == "softmax_warp_forward"
    # ncu's export may cut a qualifier off with the "<" of "<unnamed>" (an H200, ncu 2025.3.1):
    # the "<" after an identifier is then its template's.
    cut = "void unnamed>::CatArrayBatchedCopy<unnamed>::OpaqueType<8>, unsigned int, 2, 64, 64>(T1 *, T2)"
    whole = "void at::native::(anonymous namespace)::CatArrayBatchedCopy<at::native::(anonymous namespace)::OpaqueType<8>, unsigned int, 2, 64, 64>(T1 *, T2)"
    assert base_name(cut) == base_name(whole) == "CatArrayBatchedCopy"
    assert base_name("void native::<unnamed>::multi_tensor_apply_kernel<native::<unnamed>::M<4>>()") == (
        "multi_tensor_apply_kernel"
    )
    tril_k = "void at::native::triu_tril_kernel<bool, int, false, 8, false>(at::cuda::detail::TensorInfo<bool, int>)"
    tril_n = "void at::triu_tril_kernel<bool, int, 0, 8, 0>(at::cuda::detail::TensorInfo<bool, int>, T2)"
    assert name_similarity(tril_k, tril_n) == 1.0
    assert name_similarity(kineto, tril_n) < 0.5


def test_consecutive_launches_join_by_position(kernels):
    c = read_counters(NCU_ALL)
    j = join_counters(kernels, c, 4.0)
    assert j.rows_total == j.rows_joined == 348
    assert j.time_joined_share > 0.95
    methods = j.method[j.row >= 0].value_counts()
    assert methods["position"] == 2 * 348  # each row stands at its position in both steps
    # Every joined kernel has the row's base name, grid and block, and a close duration.
    joined = kernels.loc[j.row[j.row >= 0].index]
    rows = c.rows.iloc[j.row[j.row >= 0].to_numpy()]
    assert (joined["name"].map(base_name).to_numpy() == rows["base_name"].to_numpy()).all()
    assert (joined["grid_x"].to_numpy() == rows["grid_x"].to_numpy()).all()
    ratio = joined["dur"].to_numpy() / rows["duration_ns"].to_numpy()
    assert np.median(ratio) == pytest.approx(1.0, abs=0.1)


def test_per_config_rows_join_by_configuration(kernels):
    c = read_counters(NCU_PER_CONFIG)
    j = join_counters(kernels, c, 4.0)
    assert set(j.method[j.row >= 0]) == {"config"}
    assert j.rows_joined == 30
    # One row stands for every launch of its configuration: more kernels than rows joined.
    assert (j.row >= 0).sum() > 300
    # The per-config capture was NVTX-filtered on the main thread: backward kernels (autograd
    # thread) were never profiled, so coverage stays well short of all kernel time.
    assert 0.4 < j.time_joined_share < 0.8


def test_filtered_sequence_joins_as_a_subsequence(kernels):
    c = read_counters(NCU_SECTIONS)
    j = join_counters(kernels, c, 4.0)
    assert "position" in set(j.method[j.row >= 0])
    assert j.rows_joined >= 120


def test_wrong_durations_are_rejected_not_joined(kernels):
    c = read_counters(NCU_ALL)
    c.rows["duration_ns"] = c.rows["duration_ns"] * 10  # as if the rows came from another program
    j = join_counters(kernels, c, 4.0)
    assert (j.row >= 0).sum() == 0
    assert any("rejected" in w for w in j.warnings)


def test_rows_from_another_program_do_not_join(kernels):
    c = read_counters(NCU_ALL)
    c.rows["kernel_name"] = "void other::kernel<1>(int)"
    c.rows["base_name"] = "kernel"
    j = join_counters(kernels, c, 4.0)
    assert j.rows_joined == 0 and j.time_joined_share == 0.0
    assert any("matched no kernel" in w for w in j.warnings)


def test_hot_kernels_are_measured_apart(kernels):
    # The fixture's per-config capture was filtered on the main thread: the backward-only
    # kernels among the hot ones never got counters, and the join says so.
    hot = ["softmax_warp_forward", "cunn_SoftMaxForward", "cunn_SoftMaxBackwardSmem", "cunn_SoftMaxBackward"]
    j = join_counters(kernels, read_counters(NCU_PER_CONFIG), 4.0, hot)
    assert (j.hot_kernels, j.hot_kernels_joined) == (4, 2)
    names = kernels["name"].map(base_name)
    in_step = kernels[(kernels["step"] >= 0) & (kernels["kind"] == "kernel")]
    fwd = in_step[names[in_step.index].isin(hot[:2])]["dur"].sum()
    assert j.hot_time_joined_share == pytest.approx(
        fwd / in_step[names[in_step.index].isin(hot)]["dur"].sum()
    )
    assert j.to_json()["hot_kernels_joined"] == 2
    assert "hot_kernels" not in join_counters(kernels, read_counters(NCU_PER_CONFIG), 4.0).to_json()


def test_a_kernel_wanted_in_part_is_measured_on_its_instances(kernels):
    # profile took some instantiations of a template only (hot_kernels.py): the hot kernels'
    # coverage counts those, not the cold ones ncu was never asked for.
    names = kernels["name"].map(base_name)
    in_step = kernels[(kernels["step"] >= 0) & (kernels["kind"] == "kernel")]
    counters = read_counters(NCU_PER_CONFIG)
    base = "vectorized_elementwise_kernel"
    mine = in_step[names[in_step.index] == base]
    per_name = mine.groupby("name")["dur"].sum().sort_values(ascending=False)
    assert len(per_name) >= 2
    whole = join_counters(kernels, counters, 4.0, [base])
    counters.hot_instances = {base: [str(per_name.index[0])]}
    part = join_counters(kernels, counters, 4.0, [base])
    hottest = mine[mine["name"] == per_name.index[0]]
    joined = part.row[hottest.index] >= 0
    assert part.hot_time_joined_share == pytest.approx(
        hottest.loc[joined, "dur"].sum() / hottest["dur"].sum()
    )
    assert part.hot_time_joined_share != pytest.approx(whole.hot_time_joined_share)


def test_hot_kernels_without_counters_are_named_with_the_reason(kernels):
    hot = ["softmax_warp_forward", "cunn_SoftMaxForward", "cunn_SoftMaxBackwardSmem", "cunn_SoftMaxBackward"]
    j = join_counters(kernels, read_counters(NCU_PER_CONFIG), 4.0, hot)
    # The capture never profiled the backward kernels: no row of theirs at all.
    assert set(j.hot_without_counters) == {"cunn_SoftMaxBackwardSmem", "cunn_SoftMaxBackward"}
    assert all(why.startswith("no counter row") for why in j.hot_without_counters.values())
    assert j.to_json()["hot_kernels_without_counters"] == j.hot_without_counters
    (line,) = [w for w in j.warnings if w.startswith("hot kernels without counters: ")]
    assert "cunn_SoftMaxBackward (no counter row" in line
    # Rows from another program: every join rejected by duration, and the reason says so.
    c = read_counters(NCU_ALL)
    c.rows["duration_ns"] = c.rows["duration_ns"] * 10
    j = join_counters(kernels, c, 4.0, hot)
    assert set(j.hot_without_counters) == set(hot)
    assert "had counters of another duration, rejected" in j.hot_without_counters["softmax_warp_forward"]
    # All joined: nothing to name.
    assert join_counters(kernels, read_counters(NCU_ALL), 4.0, hot).hot_without_counters == {}


def test_a_scaled_instantiation_lends_its_counters_to_its_other_sizes(kernels):
    # The per-configuration capture holds three sizes of one bf16 copy; keep the largest only.
    from kerneltriage.ingest.ncu_csv import Counters

    c = read_counters(NCU_PER_CONFIG)
    full = join_counters(kernels, c, 4.0)
    copies = c.rows[c.rows["kernel_name"].str.contains("bfloat16_copy_kernel_cuda")]
    threads = copies["grid_x"] * copies["block_x"]
    keep = int(threads.idxmax())
    dropped = [i for i in copies.index if i != keep]
    names = frozenset(kernels.loc[full.row[full.row.isin(copies.index)].index, "name"])
    rows = c.rows.drop(index=dropped).reset_index(drop=True)
    fewer = Counters(c.source, rows, c.metrics)
    plain = join_counters(kernels, fewer, 4.0)
    scaled = join_counters(kernels, fewer, 4.0, scaled_kernels=names)
    kept_row = int(
        np.flatnonzero(
            rows["kernel_name"].eq(c.rows.loc[keep, "kernel_name"])
            & rows["grid_x"].eq(c.rows.loc[keep, "grid_x"])
        )[0]
    )
    for d in dropped:
        launches = full.row[full.row == d].index
        assert (plain.row[launches] == -1).all()  # without the manifest's word: unjoined
        assert set(scaled.method[launches]) == {"scaled"} and set(scaled.row[launches]) == {kept_row}
        factor = float(threads[d] / threads[keep])
        assert np.allclose(scaled.scale[launches], factor)
        # Same regime (all below L2): the scaled bytes are within 1% of those measured.
        assert rows.loc[kept_row, "dram_bytes"] * factor == pytest.approx(
            c.rows.loc[d, "dram_bytes"], rel=0.01
        )
    # (and the launches of its configurations the capture missed: its backward ones)
    assert scaled.time_scaled_share > 0 and scaled.to_json()["methods"]["scaled"] >= 16
    assert (scaled.measured_row[scaled.method == "scaled"] == -1).all()
