"""``kerneltriage profile``: run a training script under the PyTorch profiler, then under
Nsight Compute on its hot kernels only, and write one run directory (``kerneltriage.rundir``).

In the parent:

- ``session.py``: ``run_profile``, the phases in order, the manifest, failures and Ctrl-C;
- ``context.py``: the options and the ``ProfileSession`` the phases share (config files, child
  processes, status files);
- ``phase_timeline.py``: phase 1 (PyTorch profiler or Nsight Systems, the timing processes);
  ``step_time.py``: the step time it records;
- ``phase_ncu.py``: phase 2, Nsight Compute on the hot kernels; ``ncu_pass.py``: one ncu pass's
  progress and export; ``nsight_compute.py``: the ncu command line, its metrics, its progress
  output;
- ``processes.py``: a child process run, logged, stopped on a timeout or Ctrl-C;
  ``turns.py`` with ``gate.py``: processes started together, each held at its first CUDA use
  until its turn on the GPU;
- ``command.py``: the user's command and its rewrite with the runner in front;
- ``trace_fixup.py``: phase 1's trace finished (shapes copied in, module ranges);
- ``calibrate.py``: measured ceilings of this GPU.

In the user's process (import-light: no scipy, no pandas):

- ``runner.py``: runs the script as ``python`` would, with ``hooks.py``'s ``ProfiledProcess``
  installed first (steps, profilers, NVTX ranges, the status file);
- ``step_plan.py``: which step does what (``StepPlan``), shared with the parent;
- ``step_clock.py``: the step ends stamped and the step times; ``module_ranges.py``: module
  ranges and shapes; ``process_facts.py``: versions, GPU, Dynamo's counts;
- ``fix_install.py``: ``profile --apply``'s fixes installed before the script runs.
"""
