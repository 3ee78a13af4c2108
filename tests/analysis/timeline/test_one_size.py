"""One launch configuration per elementwise instantiation (one_size.py), on the shipped
ConvNeXt-T run (H100), whose Nsight Compute export holds every hot configuration: what phase 2
would leave out, and how close the counters scaled from the kept ones come to those measured."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from kerneltriage.analysis.rules import load_rules
from kerneltriage.analysis.timeline.attribution import attribute
from kerneltriage.analysis.timeline.hot_kernels import select_hot_kernels
from kerneltriage.analysis.timeline.join import join_counters
from kerneltriage.analysis.timeline.one_size import ELEMENTWISE_BASES, one_size_per_instantiation, op_key
from kerneltriage.ingest.kernel_names import base_name
from kerneltriage.ingest.ncu_csv import Counters, read_counters
from kerneltriage.ingest.source import read_timeline

RUN = Path(__file__).resolve().parents[3] / "examples" / "runs" / "convnext-t-h100"
CONFIG = ["grid_x", "grid_y", "grid_z", "block_x", "block_y", "block_z"]


@pytest.fixture(scope="module")
def convnext():
    tl = read_timeline(RUN / "trace.json.gz")
    hot = select_hot_kernels(tl, load_rules(), coverage=0.97, max_kernels=64, first_of_size=True)
    one = one_size_per_instantiation(tl, hot, large_ns=15_000.0)
    attr = attribute(tl)
    k, cpu, skip = attr.kernels, tl.cpu, set(one.skip)

    def skipped(op: int) -> bool:
        # The launching op or one of its aten ancestors (what the process may see) is skipped.
        while op >= 0 and cpu["cat"].iat[op] == "cpu_op" and str(cpu["name"].iat[op]).startswith("aten::"):
            if (
                cpu["dims"].iat[op] >= 0
                and op_key(str(cpu["name"].iat[op]), tl.arg(int(cpu["dims"].iat[op]))) in skip
            ):
                return True
            op = int(attr.cpu_parent[op])
        return False

    under = np.array([skipped(int(op)) for op in k["op"].to_numpy()])
    return tl, hot, one, k, under


def test_op_keys_are_names_and_tensor_shapes():
    assert op_key("aten::add", [[64, 96, 56, 56], [64, 96, 56, 56], []]) == (
        "aten::add",
        ((64, 96, 56, 56), (64, 96, 56, 56)),
    )
    # A list of tensors counts each; a scalar or a 0-d tensor ([]) counts nothing.
    assert op_key("aten::cat", [[[2, 3], [4, 3]], []]) == ("aten::cat", ((2, 3), (4, 3)))
    assert op_key("aten::mul", [[8, 1024, 1], []]) == op_key("aten::mul", [[8, 1024, 1]])


def test_only_elementwise_launches_of_configurations_not_kept_are_left_out(convnext):
    _, hot, one, k, under = convnext
    assert one.skip and one.scaled
    in_step = (k["step"] >= 0) & (k["kind"] == "kernel")
    left_out = k[under & in_step]
    bases = left_out["name"].map(base_name)
    chosen = hot.chosen(left_out.assign(base=bases))
    # Every hot launch under a skipped call is elementwise; the rest are cold (not profiled).
    assert bases[chosen].isin(ELEMENTWISE_BASES).all()
    # Each scaled instantiation keeps at least one configuration outside the skipped calls.
    kept = k[~under & in_step]
    assert set(one.scaled) <= set(kept["name"])
    # 58 of the 150 hot configurations are left to scaling (11 instantiations), most of them
    # copies whose calls the process sees as aten::_to_copy or aten::clone.
    assert one.skipped == 58 and len(one.scaled) == 11 and hot.configs == 150
    assert {"aten::_to_copy", "aten::clone", "aten::copy_"} <= {name for name, _ in one.skip}


def test_scaled_counters_come_close_to_the_measured_ones(convnext):
    # Drop the counter rows a run with the skip would not have (those joined only to launches
    # under skipped calls), join with the scaled join, and compare with what ncu measured.
    _, _, one, k, under = convnext
    c = read_counters(RUN / "ncu.csv.gz")
    full = join_counters(k, c, 4.0)
    joined = full.row >= 0
    needed = set(full.row[joined & ~under].tolist())
    dropped = sorted(set(full.row[joined & under].tolist()) - needed)
    assert len(dropped) >= 50
    rows = c.rows.drop(index=dropped).reset_index(drop=True)
    fewer = join_counters(k, Counters(c.source, rows, c.metrics), 4.0, scaled_kernels=frozenset(one.scaled))
    scaled = fewer.method == "scaled"
    assert scaled.sum() > 500 and fewer.time_scaled_share > 0.1
    assert fewer.time_joined_share >= full.time_joined_share  # no launch lost its counters
    estimate = rows["dram_bytes"].to_numpy()[fewer.row[scaled].to_numpy()] * fewer.scale[scaled].to_numpy()
    measured = c.rows["dram_bytes"].to_numpy()[full.row[scaled].to_numpy()]
    # In all, the bytes scaled by threads are within 5% of those measured (1.011 here); the
    # one-block copies (128 threads, 2 us) are far off, and ride on the launch floor anyway.
    assert estimate.sum() / measured.sum() == pytest.approx(1.0, abs=0.05)
    ratio = estimate / measured
    assert np.median(ratio) == pytest.approx(1.0, abs=0.1)
    # A scaled row is not a measurement: no roof moves on it.
    assert (fewer.measured_row[scaled] == -1).all() and (fewer.row[scaled] >= 0).all()


def test_a_run_profiled_one_size_per_instantiation_reports_the_same_verdicts(convnext, tmp_path):
    # The shipped run as a run with the skip would have left it: the counter rows of the
    # configurations left out removed from its export, the manifest naming the scaled kernels.
    # The report joins their launches by scaling, says so, and ranks the same verdicts.
    import gzip
    import json
    import shutil

    from click.testing import CliRunner

    from kerneltriage.cli import main

    _, _, one, k, under = convnext
    c = read_counters(RUN / "ncu.csv.gz")
    full = join_counters(k, c, 4.0)
    joined = full.row >= 0
    dropped = set(full.row[joined & under].tolist()) - set(full.row[joined & ~under].tolist())
    run = tmp_path / "run"
    shutil.copytree(RUN, run)
    lines = gzip.decompress((RUN / "ncu.csv.gz").read_bytes()).decode().splitlines(keepends=True)
    # Header and units rows, then one line per row in order.
    kept = lines[:2] + [line for i, line in enumerate(lines[2:]) if i not in dropped]
    (run / "ncu.csv.gz").write_bytes(gzip.compress("".join(kept).encode()))
    manifest = json.loads((run / "manifest.json").read_text())
    manifest["phases"]["ncu"]["scaled_kernels"] = one.scaled
    manifest["phases"]["ncu"]["scaled_configs"] = one.skipped
    (run / "manifest.json").write_text(json.dumps(manifest))

    def report(path):
        result = CliRunner().invoke(main, ["report", str(path), "--format", "json"])
        assert result.exit_code == 0, result.output[-2000:]
        return json.loads(result.output)

    before, after = report(RUN), report(run)
    assert after["join"]["rows"] == before["join"]["rows"] - len(dropped)
    assert (
        after["join"]["kernel_time_scaled_share"] > 0.1 and "kernel_time_scaled_share" not in before["join"]
    )
    assert after["join"]["methods"]["scaled"] > 500
    assert after["join"]["hot_time_joined_share"] >= before["join"]["hot_time_joined_share"] - 0.01

    def top(rep):
        return [(c["name"], c["verdict"]) for c in rep["candidates"][:10]]

    assert top(after) == top(before)
