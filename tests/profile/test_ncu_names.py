"""ncu's demangled CSV takes the trace's mangled spelling where the trace has one (CUTLASS's
grouped GEMMs), and the report's join then finds those rows."""

from __future__ import annotations

import csv
import gzip
import io

from kerneltriage.ingest.ncu_csv import read_counters
from kerneltriage.profile.ncu_names import mangled_in_trace, with_trace_spelling
from tests.helpers import NCU_PER_CONFIG

SYMBOL = (
    "_ZN7cutlass13device_kernelIN2at4cuda6detail25enable_3x_kernel_for_sm9xINS_4gemm6kernel13Gemm"
    "UniversalINS5_17GroupProblemShapeIN4cute5tupleIJiiiEEEEEEEEEEvNT_6ParamsE"
)


def _exports() -> tuple[str, str, str]:
    """A real demangled export, and the same rows as a mangled export would spell them: the
    first kernel's rows under a CUTLASS-like symbol, the others unchanged."""
    text = gzip.decompress(NCU_PER_CONFIG.read_bytes()).decode()
    rows = list(csv.reader(io.StringIO(text)))
    col = rows[0].index("Kernel Name")
    first = rows[2][col]
    mangled = [list(r) for r in rows]
    for r in mangled[2:]:
        if r[col] == first:
            r[col] = SYMBOL
    out = io.StringIO()
    csv.writer(out, quoting=csv.QUOTE_ALL, lineterminator="\n").writerows(mangled)
    return text, out.getvalue(), first


def test_rows_the_trace_spells_mangled_take_that_spelling(tmp_path):
    demangled, mangled, first = _exports()
    merged = with_trace_spelling(demangled, mangled, mangled_in_trace([SYMBOL, "void at::foo<1>(int)"]))
    path = tmp_path / "ncu.csv"
    path.write_text(merged)
    names = list(read_counters(path).rows.kernel_name)
    before = list(read_counters(_write(tmp_path / "before.csv", demangled)).rows.kernel_name)
    assert len(names) == len(before) and names.count(SYMBOL) == before.count(first) > 0
    assert [n for n in names if n != SYMBOL] == [n for n in before if n != first]


def test_nothing_changes_without_mangled_names_or_when_the_exports_differ():
    demangled, mangled, _ = _exports()
    assert with_trace_spelling(demangled, mangled, mangled_in_trace(["void at::foo<1>(int)"])) == demangled
    assert with_trace_spelling(demangled, mangled.rsplit("\n", 3)[0], {SYMBOL}) == demangled


def _write(path, text):
    path.write_text(text)
    return path
