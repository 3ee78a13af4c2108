"""kerneltriage: is a custom GPU kernel worth writing?

Importing the package is cheap and needs no torch: the report path (ingest → analysis →
report) is pure Python + pandas. ``step()`` and ``region()`` annotate a training script
for ``kerneltriage profile``; they import torch only when called.
"""

from __future__ import annotations

__version__ = "0.1.0"

from kerneltriage.annotate import region, step

__all__ = ["__version__", "region", "step"]
