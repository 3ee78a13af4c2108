"""Kernels memory-bound by what they compute (``kernel_classes.yaml``, ``memory_bound``) need no
instruction counters: profile's phase 2 measures them without (``ncu.light``), and every
shipped run with counters reports the same verdicts, savings, bounds and ceilings when its
export is read as that pass leaves it (their rows' instruction and tensor cells empty)."""

from __future__ import annotations

import csv
import gzip
import io
import shutil
from pathlib import Path

import pytest

import kerneltriage
from kerneltriage.analysis.kernel_classes import memory_bound
from kerneltriage.api import load_rules
from kerneltriage.ingest.kernel_names import base_name

RUNS = Path(__file__).resolve().parents[2] / "examples" / "runs"
WITH_COUNTERS = sorted(p.name for p in RUNS.iterdir() if (p / "ncu.csv.gz").is_file())
COUNTERS = ("smsp__sass_", "sm__ops_path_tensor")


def as_the_light_pass_leaves_it(run: Path, to: Path) -> int:
    """``run`` copied to ``to`` with its memory-bound kernels' instruction and tensor cells of
    ``ncu.csv.gz`` emptied (a kernel is light when all its rows are, as phase 2 decides it by
    base name); the number of rows emptied."""
    shutil.copytree(run, to)
    table = list(csv.reader(io.StringIO(gzip.decompress((run / "ncu.csv.gz").read_bytes()).decode())))
    header, body = table[0], table[2:]
    name = header.index("Kernel Name")
    light: dict[str, bool] = {}
    for r in body:
        light[base_name(r[name])] = light.get(base_name(r[name]), True) and memory_bound(r[name])
    emptied = [i for i, c in enumerate(header) if c.startswith(COUNTERS)]
    rows = [r for r in body if light[base_name(r[name])]]
    for r in rows:
        for i in emptied:
            r[i] = ""
    out = io.StringIO()
    csv.writer(out, quoting=csv.QUOTE_ALL, lineterminator="\n").writerows(table)
    (to / "ncu.csv.gz").write_bytes(gzip.compress(out.getvalue().encode()))
    return len(rows)


def _verdicts(run: Path) -> dict:
    reports = kerneltriage.reports(run, rules=load_rules(), workers=1)
    return {
        rank: [
            (
                c.id,
                str(c.verdict),
                round(c.expected_saving_share, 9),
                c.roofline.bound,
                c.roofline.ceiling_ms,
                c.roofline.source,
            )
            for c in rep.candidates
        ]
        for rank, rep in reports.items()
    }


@pytest.mark.parametrize("name", WITH_COUNTERS)
def test_a_shipped_run_reads_the_same_without_the_memory_bound_kernels_flops(tmp_path, name):
    emptied = as_the_light_pass_leaves_it(RUNS / name, tmp_path / name)
    assert emptied > 0  # every shipped run has memory-bound kernels among its profiled ones
    assert _verdicts(tmp_path / name) == _verdicts(RUNS / name)


def test_the_shipped_runs_with_counters_are_many():
    assert len(WITH_COUNTERS) >= 10
