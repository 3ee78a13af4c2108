"""Does a stopped PyTorch profiler slow the steps after it? ``python benchmarks/profiler_residue.py
SCRIPT ARGS…`` runs a training script (runpy, as ``kerneltriage profile`` does) and times its
steps (optimizer post-hook, CUDA events): 8 steps before any profiler, a CPU+CUDA profiler over
3 steps, 8 steps while the stopped profiler object (and its parsed events) is still referenced,
then 8 steps after it is dropped and ``gc.collect()`` ran. Prints one JSON line of medians (ms).

    python benchmarks/profiler_residue.py examples/train_gpt.py --d 768 --layers 12 --heads 12 \
        --seq 1024 --batch 8 --vocab 50304 --attn sdpa --steps 40

Needs a CUDA GPU and torch with CUDA; the script must step a ``torch.optim`` optimizer.

Written for issue 16: in phase 1, GPT-2 eager's plain steps after the recorded ones ran at
39.3 ms against 34.8 ms for the script alone, drifting up step by step.
"""

from __future__ import annotations

import contextlib
import gc
import json
import runpy
import statistics
import sys

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook

WINDOWS = {"before": (3, 11), "kept": (15, 23), "released": (24, 32)}
PROFILE = (11, 14)  # the profiler starts after step 11 ends and stops after step 14
marks: dict[int, torch.cuda.Event] = {}
state: dict[str, object] = {"n": 0, "prof": None}


class Stop(BaseException):
    pass


def on_step(*_args) -> None:
    n = state["n"] = int(state["n"]) + 1
    event = torch.cuda.Event(enable_timing=True)
    event.record()
    marks[n] = event
    if n == PROFILE[0]:
        prof = torch.profiler.profile(
            activities=[torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
        )
        prof.start()
        state["prof"] = prof
    elif n == PROFILE[1]:
        state["prof"].stop()  # parses the events into Python objects; the object stays referenced
    elif n == WINDOWS["kept"][1]:
        state["prof"] = None
        gc.collect()
    elif n == WINDOWS["released"][1]:
        marks[n].synchronize()
        out = {}
        for name, (a, b) in WINDOWS.items():
            out[name] = round(
                statistics.median(marks[s - 1].elapsed_time(marks[s]) for s in range(a + 1, b + 1)), 3
            )
            out[name + "_all"] = [round(marks[s - 1].elapsed_time(marks[s]), 2) for s in range(a + 1, b + 1)]
        print("RESIDUE " + json.dumps(out), flush=True)
        raise Stop


def main() -> None:
    register_optimizer_step_post_hook(on_step)
    script, *args = sys.argv[1:]
    sys.argv = [script, *args]
    with contextlib.suppress(Stop):
        runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
