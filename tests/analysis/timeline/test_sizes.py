"""Problem sizes of launches, and counters of the first launch of each size standing for the
rest, checked against real every-launch captures: an eager Hugging Face Llama on an H100 and
GPT-2 in eager mode."""

from __future__ import annotations

from functools import cache

import numpy as np
import pandas as pd
import pytest

from kerneltriage.analysis.rules import load_rules
from kerneltriage.analysis.timeline.attribution import attribute
from kerneltriage.analysis.timeline.hot_kernels import select_hot_kernels
from kerneltriage.analysis.timeline.join import join_counters
from kerneltriage.analysis.timeline.sizes import first_of_size, launch_sizes
from kerneltriage.ingest.kernel_names import base_name
from kerneltriage.ingest.ncu_csv import Counters, read_counters
from kerneltriage.ingest.source import read_timeline
from tests.helpers import EXAMPLE_RUN

RUNS = EXAMPLE_RUN.parent


@cache
def _loaded(run: str):
    timeline = read_timeline(RUNS / run / "trace.json.gz")
    return timeline, attribute(timeline).kernels


def _in_step(kernels: pd.DataFrame) -> pd.DataFrame:
    return kernels[(kernels["step"] >= 0) & (kernels["kind"] == "kernel")]


@pytest.mark.parametrize("run", ["hf-llama-h100", "gpt2-eager-h100"])
def test_a_persistent_gemm_runs_few_sizes_at_many_launches(run):
    timeline, kernels = _loaded(run)
    hot = select_hot_kernels(timeline, load_rules(), coverage=0.95, max_kernels=64)
    sizes = launch_sizes(timeline, kernels)
    in_step = _in_step(kernels)
    own = sizes[kernels.index.get_indexer(in_step.index)]
    variable = in_step["name"].map(base_name).isin(hot.variable).to_numpy()
    assert variable.sum() >= 60 and (own[variable] >= 0).all()  # the shapes step recorded them all
    first = first_of_size(in_step, own)
    steps = in_step["step"].nunique()
    # hf-llama: 113 launches of two nvjet GEMMs a step, 9 sizes among them.
    assert (first & variable).sum() * 5 < variable.sum() / steps * steps
    # Every launch has a first launch of its kernel, configuration and size in its own step.
    frame = in_step.assign(size=own, first=first, key=list(zip(in_step["name"], in_step["grid_x"])))
    seen = set(frame.loc[frame["first"], ["step", "size"]].itertuples(index=False, name=None))
    assert all((s, z) in seen for s, z in frame[["step", "size"]].itertuples(index=False, name=None))


@pytest.mark.parametrize("run", ["hf-llama-h100", "gpt2-eager-h100"])
def test_the_first_launch_of_a_size_has_the_counters_of_the_others(run):
    # The every-launch capture, cut down to the rows a first-of-size pass profiles, joined by
    # size: every launch the full capture joined gets a row of its own size, and its measured
    # DRAM bytes and duration are those of the launch ncu measured.
    timeline, kernels = _loaded(run)
    full = read_counters(RUNS / run / "ncu.launches.csv.gz")
    whole = join_counters(kernels, full, 4.0)
    sizes = launch_sizes(timeline, kernels)
    in_step = _in_step(kernels)
    first = first_of_size(in_step, sizes[kernels.index.get_indexer(in_step.index)])
    reference = in_step[first & (in_step["step"] == in_step["step"].min()).to_numpy()]
    taken = reference.sort_values("correlation").index
    taken = taken[whole.row[taken].to_numpy() >= 0]
    rows = full.rows.iloc[whole.row[taken].to_numpy()].reset_index(drop=True)
    assert 0 < len(rows) * 5 < len(full.rows)

    def by_size(rows: pd.DataFrame):
        part = Counters(full.source, rows.reset_index(drop=True), full.metrics, first_of_size=frozenset({0}))
        return part, join_counters(kernels, part, 4.0, sizes=sizes)

    part, joined = by_size(rows)
    both = whole.row.index[(whole.row >= 0).to_numpy() & (joined.row >= 0).to_numpy()]
    assert len(both) >= 0.98 * int((whole.row >= 0).sum())
    assert set(joined.method[joined.row >= 0]) == {"size"}
    measured = full.rows.iloc[whole.row[both].to_numpy()]
    stood_in = part.rows.iloc[joined.row[both].to_numpy()]
    for column in ("dram_bytes", "duration_ns"):
        ratio = stood_in[column].to_numpy(dtype=float) / measured[column].to_numpy(dtype=float)
        assert np.median(np.abs(ratio - 1)) < 0.05, column
        assert np.quantile(np.abs(ratio - 1), 0.9) < 0.3, column
    # A row the process took that the trace does not count as first costs that row only ...
    middle = len(rows) // 2
    _, extra = by_size(pd.concat([rows.iloc[:middle], rows.iloc[[middle]], rows.iloc[middle:]]))
    assert (extra.row >= 0).sum() == (joined.row >= 0).sum()
    # ... and a size the process did not take leaves its launches, and only those, without.
    _, missed = by_size(rows.drop(index=middle))
    lost = joined.row.index[(joined.row >= 0).to_numpy() & (missed.row < 0).to_numpy()]
    assert len(lost) and set(sizes[kernels.index.get_indexer(lost)]) == {
        sizes[kernels.index.get_loc(taken[middle])]
    }


def test_rows_of_another_size_are_not_stood_in():
    # Rows whose durations disagree with every launch of their kernel and grid (another
    # program) join nothing.
    timeline, kernels = _loaded("hf-llama-h100")
    full = read_counters(RUNS / "hf-llama-h100" / "ncu.launches.csv.gz")
    rows = full.rows.assign(duration_ns=full.rows["duration_ns"] * 1000)
    part = Counters(full.source, rows, full.metrics, first_of_size=frozenset({0}))
    joined = join_counters(kernels, part, 4.0, sizes=launch_sizes(timeline, kernels))
    assert (joined.row >= 0).sum() == 0


def test_the_launch_budget_counts_the_first_launch_of_each_size():
    timeline, _ = _loaded("hf-llama-h100")
    every = select_hot_kernels(timeline, load_rules(), coverage=0.95, max_kernels=64)
    sized = select_hot_kernels(timeline, load_rules(), coverage=0.95, max_kernels=64, first_of_size=True)
    assert not every.variable_first_of_size and sized.variable_first_of_size
    assert sized.variable == every.variable
    assert sized.variable_every == every.variable_launches == every.variable_every == 113
    assert 0 < sized.variable_launches <= 12
    # A budget too small for every launch holds the first of each size.
    tight = select_hot_kernels(
        timeline, load_rules(), coverage=0.95, max_kernels=64, max_variable_launches=20, first_of_size=True
    )
    assert tight.variable == every.variable and not tight.over_budget
