"""Step times and torch.compile counts of an example script, for measuring the profiler.

``KT_EXAMPLE_STATS=stats.jsonl python examples/train_gpt.py …`` appends one JSON line when the
process exits: its per-step times, and Dynamo's graph and graph-break counts. Under
``kerneltriage profile`` each phase's process appends its own line (``kerneltriage_mode``:
timeline, ncu…), so a plain run and a profiled one compare from inside both processes.

Step times come from a CUDA event recorded at each step's end (no synchronization is added,
so the program runs as it would without them), or from ``perf_counter`` on the CPU.
"""

from __future__ import annotations

import atexit
import json
import os
import sys
import time

ENV = "KT_EXAMPLE_STATS"


class StepStats:
    def __init__(self, device) -> None:
        import torch

        self.torch = torch
        self.cuda = torch.device(device).type == "cuda"
        self.marks: list = []
        self.wall: list[float] = []  # host clock at each mark, to line steps up with GPU clock samples
        self.path = os.environ.get(ENV)
        if self.path:
            atexit.register(self.write)

    def step_done(self) -> None:
        if not self.path:
            return
        self.wall.append(round(time.time(), 4))
        if self.cuda:
            event = self.torch.cuda.Event(enable_timing=True)
            event.record()
            self.marks.append(event)
        else:
            self.marks.append(time.perf_counter())

    def step_ms(self) -> list[float]:
        if len(self.marks) < 2:
            return []
        if self.cuda:
            self.marks[-1].synchronize()
            return [round(a.elapsed_time(b), 4) for a, b in zip(self.marks, self.marks[1:])]
        return [round(1000.0 * (b - a), 4) for a, b in zip(self.marks, self.marks[1:])]

    def write(self) -> None:
        from torch._dynamo.utils import counters

        config = os.environ.get("KERNELTRIAGE_PROFILE")
        mode = None
        if config and os.path.isfile(config):
            with open(config) as f:
                mode = json.load(f).get("mode")
        breaks = counters["graph_break"]
        line = {
            "pid": os.getpid(),
            "rank": int(os.environ.get("RANK", "0")),
            "argv": sys.argv,
            "kerneltriage_mode": mode,
            "step_ms": self.step_ms(),  # step k's time: from the end of step k-1 to its end
            "step_wall": self.wall[1:],  # host time.time() when step k's end was recorded
            "graph_breaks": int(sum(breaks.values())),
            "unique_graphs": int(counters["stats"]["unique_graphs"]),
            "graph_break_reasons": [r.splitlines()[0][:200] for r in list(breaks)[:5]],
        }
        with open(self.path, "a") as f:
            f.write(json.dumps(line) + "\n")
