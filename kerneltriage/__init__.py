"""kerneltriage: is a custom GPU kernel worth writing?

Importing the package is cheap and needs no torch: the report path (ingest → analysis →
render) is pure Python + pandas, imported on first use. ``step()`` and ``region()`` annotate
a training script for ``kerneltriage profile``; they import torch only when called.

The Python API (README "Python API", docs/notebook.md)::

    import kerneltriage
    rep = kerneltriage.report("runs/exp1")        # a Report; rep.to_frame(): its candidates
    reps = kerneltriage.reports("runs/ddp")       # {rank: Report}
    prof = kerneltriage.load("runs/exp1")         # prof.kernels, prof.ops: DataFrames
    d = kerneltriage.diff("runs/before", "runs/after")   # d.to_frame()
    kerneltriage.apply(run="runs/exp1")           # the verified fixes, before the model is built
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.4.0"

from kerneltriage.annotate import region, step

# Names served by kerneltriage.api, imported on first use (pandas and the analysis stay unloaded
# until then).
_API = ("report", "reports", "load", "diff", "Report", "Profile", "Diff", "export_tables")

__all__ = ["__version__", "apply", "region", "step", *_API]


def __getattr__(name: str) -> Any:
    if name == "apply":  # kerneltriage.ladder.apply; torch is imported when it is called
        return importlib.import_module("kerneltriage.ladder").apply
    if name in _API:
        return getattr(importlib.import_module("kerneltriage.api"), name)
    raise AttributeError(f"module 'kerneltriage' has no attribute {name!r}")
