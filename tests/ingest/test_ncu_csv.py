"""Nsight Compute raw-CSV reader: the fixture's three metric sets, units, and bad files."""

from __future__ import annotations

import csv
import gzip
import io
import math

import pytest

from kerneltriage.errors import CountersFormatError
from kerneltriage.ingest.ncu_csv import parse_counters, read_counters
from tests.helpers import NCU_ALL, NCU_PER_CONFIG, NCU_SECTIONS


def _table(path):
    return list(csv.reader(io.TextIOWrapper(gzip.open(path), encoding="utf-8")))


def _cell(table, row, column):
    return table[row][table[0].index(column)]


def test_per_config_set_scales_units_to_bytes_and_ns():
    c = read_counters(NCU_PER_CONFIG)
    table = _table(NCU_PER_CONFIG)
    assert len(c.rows) == len(table) - 2 == 30
    assert _cell(table, 1, "dram__bytes_read.sum") == "Gbyte"
    read = float(_cell(table, 2, "dram__bytes_read.sum")) * 1e9
    write = float(_cell(table, 2, "dram__bytes_write.sum")) * 1e9
    assert c.rows.at[0, "dram_bytes"] == pytest.approx(read + write)
    assert _cell(table, 1, "gpu__time_duration.sum") == "us"
    assert c.rows.at[0, "duration_ns"] == pytest.approx(
        float(_cell(table, 2, "gpu__time_duration.sum")) * 1e3
    )
    assert c.rows.at[0, "nvtx"] == "step"
    # No op counters in this set: tensor FLOPs are unknown, not zero.
    assert not c.has_tensor_flops and c.rows["flops_tensor"].isna().all()


def test_all_launches_set_has_tensor_flops_with_thousands_separators():
    c = read_counters(NCU_ALL)
    table = _table(NCU_ALL)
    assert len(c.rows) == 348
    assert _cell(table, 1, "gpu__time_duration.sum") == "ms"  # another scale than the per-config set
    assert c.rows.at[0, "duration_ns"] == pytest.approx(
        float(_cell(table, 2, "gpu__time_duration.sum")) * 1e6
    )
    i = next(
        i
        for i, r in enumerate(table[2:])
        if "," in _cell(table, i + 2, "sm__ops_path_tensor_op_hgmma_src_bf16_dst_fp32.sum")
    )
    printed = _cell(table, i + 2, "sm__ops_path_tensor_op_hgmma_src_bf16_dst_fp32.sum")
    assert c.rows.at[i, "flops_tensor"] == float(printed.replace(",", ""))
    # The 1024×1024 projection GEMM over 8192 tokens: 2·8192·1024·1024 FLOPs.
    gemm = c.rows[(c.rows["flops_tensor"] > 0) & (c.rows["base_name"].str.startswith("nvjet"))]
    assert (gemm["flops_tensor"] == 2 * 8192 * 1024 * 1024).any()
    assert c.has_tensor_flops


def test_sections_set_derives_bytes_and_flops_from_rates():
    c = read_counters(NCU_SECTIONS)
    table = _table(NCU_SECTIONS)
    assert len(c.rows) == 150
    rate = float(_cell(table, 2, "dram__bytes.sum.per_second")) * 1e12  # Tbyte/s
    duration = float(_cell(table, 2, "gpu__time_duration.sum")) * 1e-6  # us
    assert c.rows.at[0, "dram_bytes"] == pytest.approx(rate * duration)
    assert c.rows["flops_fp32"].notna().all()
    assert c.rows["dram_pct"].notna().all()


def _mini(units: dict[str, str], values: list[dict[str, str]]) -> str:
    header = ["ID", "Kernel Name", "Grid Size", "Block Size", *units]
    rows = [header, ["", "", "", "", *units.values()]]
    for i, v in enumerate(values):
        rows.append([str(i), "void k<1>(int)", "(1, 1, 1)", "(32, 1, 1)", *(v[k] for k in units)])
    out = io.StringIO()
    csv.writer(out).writerows(rows)
    return out.getvalue()


def test_the_same_quantity_in_other_units_reads_the_same():
    a = parse_counters(
        _mini(
            {"gpu__time_duration.sum": "usecond", "dram__bytes_read.sum": "Mbyte"},
            [{"gpu__time_duration.sum": "1,500", "dram__bytes_read.sum": "2,048"}],
        )
    )
    b = parse_counters(
        _mini(
            {"gpu__time_duration.sum": "msecond", "dram__bytes_read.sum": "Gbyte"},
            [{"gpu__time_duration.sum": "1.5", "dram__bytes_read.sum": "2.048"}],
        )
    )
    assert a.rows.at[0, "duration_ns"] == pytest.approx(b.rows.at[0, "duration_ns"]) == pytest.approx(1.5e6)
    assert a.rows.at[0, "dram_bytes"] == pytest.approx(b.rows.at[0, "dram_bytes"]) == pytest.approx(2.048e9)


def test_na_and_empty_cells_are_missing_not_zero():
    c = parse_counters(
        _mini(
            {"gpu__time_duration.sum": "ns", "dram__bytes_read.sum": "byte"},
            [
                {"gpu__time_duration.sum": "100", "dram__bytes_read.sum": "n/a"},
                {"gpu__time_duration.sum": "200", "dram__bytes_read.sum": ""},
            ],
        )
    )
    assert math.isnan(c.rows.at[0, "dram_bytes"]) and math.isnan(c.rows.at[1, "dram_bytes"])
    assert list(c.rows["duration_ns"]) == [100.0, 200.0]


def test_prof_lines_before_the_csv_are_skipped():
    text = "==PROF== Connected to process 1\n" + _mini(
        {"gpu__time_duration.sum": "ns"}, [{"gpu__time_duration.sum": "5"}]
    )
    assert parse_counters(text).rows.at[0, "duration_ns"] == 5.0


def test_missing_byte_counters_warn_but_read():
    c = parse_counters(
        _mini({"gpu__time_duration.sum": "ns"}, [{"gpu__time_duration.sum": "5"}]), source="x.csv"
    )
    assert any("no DRAM byte counters" in w for w in c.warnings)


def test_missing_duration_is_an_error():
    with pytest.raises(CountersFormatError, match="gpu__time_duration"):
        parse_counters(_mini({"dram__bytes_read.sum": "byte"}, [{"dram__bytes_read.sum": "5"}]))


def test_details_page_is_refused_with_the_fix():
    text = '"ID","Kernel Name","Section Name","Metric Name","Metric Unit","Metric Value"\n"0","k","SOL","Duration","ns","5"\n'
    with pytest.raises(CountersFormatError, match="--page raw"):
        parse_counters(text)


def test_csv_from_another_program_is_refused():
    with pytest.raises(CountersFormatError, match="not an Nsight Compute raw CSV"):
        parse_counters("name,value\nfoo,1\n")
    with pytest.raises(CountersFormatError, match="units row"):
        parse_counters('"ID","Kernel Name","gpu__time_duration.sum"\n"0","k","5"\n')


def test_bad_files(tmp_path):
    with pytest.raises(CountersFormatError, match="no such Nsight Compute file"):
        read_counters(tmp_path / "none.csv")
    binary = tmp_path / "b.csv"
    binary.write_bytes(b"\xff\xfe\x00\x81binary")
    with pytest.raises(CountersFormatError):
        read_counters(binary)
    cut = tmp_path / "cut.csv.gz"
    cut.write_bytes(NCU_ALL.read_bytes()[:5000])
    with pytest.raises(CountersFormatError, match="truncated or corrupt"):
        read_counters(cut)
