"""The step ends stamped in the profiled process, and the step times read from them.

Each step end that bounds a plain, clean or recorded step is stamped with a CUDA event on the
current stream (no synchronization added), or with ``perf_counter`` without a GPU. The plain
phase goes on while its times have not settled, read from the steps the GPU has finished only;
all times are read once, when the process writes its status.

Runs inside the user's process (``hooks.py``): numpy at most (``analysis/timeline/steady.py``'s
settle test), no scipy.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

from kerneltriage.profile.step_plan import StepPlan


class StepClock:
    """The stamped step ends of one process (step number -> CUDA event or ``perf_counter``)."""

    def __init__(self, cuda: Any = None) -> None:
        self.cuda = cuda  # torch.cuda when the GPU's clock is used; None: perf_counter
        self.marks: dict[int, Any] = {}

    def stamp(self, step: int) -> None:
        """The end of ``step``, now."""
        if self.cuda is not None:
            event = self.cuda.Event(enable_timing=True)
            event.record()  # on the current stream, no synchronization
            self.marks[step] = event
        else:
            self.marks[step] = time.perf_counter()

    def finished(self, steps: range) -> list[float]:
        """The times of ``steps`` the GPU has finished, in order (ms). Only steps whose end the
        GPU has reached are read (an event's ``query``): nothing waits for the GPU here."""
        times: list[float] = []
        for step in steps:
            a, b = self.marks.get(step - 1), self.marks.get(step)
            if a is None or b is None:
                break
            if self.cuda is not None:
                if not b.query():
                    break
                times.append(float(a.elapsed_time(b)))
            else:
                times.append(1000.0 * (b - a))
        return times

    def times(self, plan: StepPlan, clean_profiler: str | None) -> dict[str, Any]:
        """Milliseconds per step: recorded (attribution profiler and module ranges), clean
        (``clean_profiler``, or nothing without a GPU) and plain (nothing installed)."""
        if not self.marks:
            return {}
        cuda = self.cuda is not None
        if cuda:
            last = self.marks[max(self.marks)]
            last.synchronize()

        def between(a: int, b: int) -> float | None:
            if a not in self.marks or b not in self.marks:
                return None
            if cuda:
                return float(self.marks[a].elapsed_time(self.marks[b]))
            return 1000.0 * (self.marks[b] - self.marks[a])

        windows = {
            "recorded": range(plan.first_recorded, plan.last_recorded + 1),
            "clean": plan.clean_steps,
            "plain": plan.plain_steps,
        }
        out: dict[str, Any] = {
            "clock": "cuda events" if cuda else "perf_counter",
            # What ran during the clean steps: a CUDA-only profiler, or (no GPU) nothing.
            "clean_profiler": clean_profiler,
        }
        for key, steps in windows.items():
            measured = [between(s - 1, s) for s in steps]
            times = [round(t, 4) for t in measured if t is not None]
            out[f"{key}_ms"] = times
            if times:
                out[f"{key}_median_ms"] = round(statistics.median(times), 4)
        return out


def plain_settled(times: list[float], planned: int) -> bool:
    """Whether the plain steps' times so far have settled (``analysis/timeline/steady.py``), judged
    once all but the last two or so of the ``planned`` plain steps are finished (the rest are
    still in flight on the GPU)."""
    # numpy only (torch loaded it): no interval here, so no scipy in the user's process.
    from kerneltriage.analysis.timeline import steady

    conf = steady.settings()["steady"]
    tail = times[steady.truncation(times) :]
    return len(times) >= planned - 2 and steady.settled(
        tail, min_steps=int(conf["min_steps"]), tolerance=float(conf["tolerance"])
    )
