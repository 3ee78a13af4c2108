"""Readers that turn profiler output into typed tables (``tables.Timeline``, ``ncu_csv.Counters``).

One analysis path, several readers: Kineto chrome traces (``kineto.py``), Nsight Systems SQLite
exports (``nsys.py``) and Nsight Compute raw CSV exports (``ncu_csv.py``).
"""
