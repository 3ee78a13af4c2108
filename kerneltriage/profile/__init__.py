"""``kerneltriage profile``: run a training script under the PyTorch profiler, then under
Nsight Compute on its hot kernels only, and write one run directory (``kerneltriage.rundir``).

- ``command.py``: the user's command and its rewrite with the runner in front;
- ``runner.py`` + ``hooks.py``: run inside the user's process (steps, profiler, module ranges,
  plain step times);
- ``trace_fixup.py``: phase 1's trace finished in the parent (shapes copied in, module ranges);
- ``session.py``: the two phases, logs, manifest, failures and Ctrl-C;
- ``nsight_compute.py``: the ncu command line, its metrics, its progress output;
- ``calibrate.py``: measured ceilings of this GPU.
"""
