"""``kerneltriage verify``: measure each fix's saving before the report claims it.

- ``plan.py`` (pure): which candidates of a run can be verified, how, and how long it takes;
- ``trials.py``: runs the run's recorded command in fresh processes, baseline and fixed runs
  interleaved, and writes ``verify.json`` (``record.py``);
- ``harness.py``: in the script's process, apply a recipe's ``apply`` mapping
  (``kerneltriage.recipes``), time the steps (no profiler) and capture the first steps' losses.
"""
