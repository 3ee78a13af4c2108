"""The trace's spelling of each kernel in Nsight Compute's CSV export.

The PyTorch profiler names a kernel by CUPTI's demangled name, but CUPTI leaves a symbol it
cannot demangle as it is: CUTLASS's grouped GEMMs (``_ZN7cutlass13device_kernelI…``, over a
thousand characters) reach the trace mangled, while ncu's export prints its own demangling.
The two spellings never join. ncu can print either; exported both ways, the mangled spelling
replaces the demangled one on the rows whose symbol the trace holds mangled, so the report's
join finds them by name.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Collection

KERNEL_NAME = "Kernel Name"


def mangled_in_trace(names: Collection[str]) -> set[str]:
    """The kernel names of a trace that are Itanium symbols, left mangled by the profiler."""
    return {n for n in names if n.startswith("_Z")}


def with_trace_spelling(demangled_csv: str, mangled_csv: str, trace_symbols: Collection[str]) -> str:
    """``demangled_csv`` with each row's kernel name replaced by its mangled symbol where the
    trace spells it so. Both texts are ``ncu --csv --page raw`` exports of one report (the same
    rows in the same order; a header row, a units row, then one row per launch). Returns the
    text unchanged where nothing is replaced or the two exports do not line up."""
    symbols = set(trace_symbols)
    if not symbols:
        return demangled_csv
    rows = list(csv.reader(io.StringIO(demangled_csv)))
    mangled = list(csv.reader(io.StringIO(mangled_csv)))
    if len(rows) != len(mangled) or not rows or KERNEL_NAME not in rows[0] or KERNEL_NAME not in mangled[0]:
        return demangled_csv
    col, mcol = rows[0].index(KERNEL_NAME), mangled[0].index(KERNEL_NAME)
    replaced = 0
    for row, other in zip(rows[2:], mangled[2:], strict=True):
        if len(row) > col and len(other) > mcol and other[mcol] in symbols:
            row[col] = other[mcol]
            replaced += 1
    if not replaced:
        return demangled_csv
    out = io.StringIO()
    csv.writer(out, quoting=csv.QUOTE_ALL, lineterminator="\n").writerows(rows)  # as ncu quotes
    return out.getvalue()
