"""In the user's process: find the steps, drive the profiler, mark the ncu step.

Runs inside the training script's interpreter (started by ``runner.py``). torch is imported
here, never in the report path.

Steps come from ``kerneltriage.step()`` when the script uses it, else from a global optimizer
step post-hook (every ``torch.optim`` optimizer), else nothing fires and the whole run is
recorded.

Phase 1 ("timeline") must time the program as the user runs it. A profiler session leaves
the process slower after it has been stopped, exported and collected (more so the more
launches a step has), so the order is fixed (``step_plan.StepPlan`` says which step does what):

- after the user's warm-up, *plain* steps with nothing installed but a step counter: every
  step end is stamped with a CUDA event (no synchronization is added; ``step_clock.py``);
  their median and spread are the report's step time, and Dynamo's own counts (graph breaks,
  graphs, recompiles and their reasons) are read after them;
- then *clean* steps under a profiler that records CUDA activity only (CUPTI's activity
  buffers: no per-op work on the host), whose trace (``logs/clean.rank<r>.json.gz``) gives the
  GPU's busy time; kernel time barely moves with host time;
- then one step under a CPU-only profiler that records input shapes (collecting shapes costs
  host time per op), with module hooks installed from then on (``module_ranges.py``): module
  ranges (``kerneltriage.module:<path>:<Class>``) enter or leave one profiler range under a
  name resolved once per module, and module input shapes for ``regions.jsonl`` are taken in
  that step; ``profile/trace_fixup.py`` copies the shapes onto the recorded trace's ops;
- then the recorded steps: the structure (ops, kernels, modules), not the time.

Every hook returns at once while Dynamo traces it (``torch.compiler.is_compiling()``), so a
compiled program gets the same graphs, graph breaks and kernels as without kerneltriage. Hooks
added after compilation are not guarded on (``skip_nnmodule_hook_guards``), so they cause no
recompilation either. Each step's phase, and whether a profiler existed then, is written to the
status file (``phases``).

A *timing* process (``--timing-processes``: more processes of the script, for the step time's
interval) runs the warm-up and the plain steps only, then ``HOST_STEPS`` steps that each start
from an idle GPU (a synchronize before each), timed on the host's clock: the host's time to
issue a step (at most its own work: a step of more launches than the launch queue holds also
waits for the GPU to drain it). Where that is most of the step, the GPU waits on the host, and
a fix that only shortens kernels shortens the step by little.

Phase 2 ("ncu") records nothing itself and installs no module hooks: it opens an NVTX
*start/end* range around the first step phase 1 recorded (start/end ranges are process-wide,
so the autograd thread's backward kernels fall inside it, unlike push/pop ranges) for Nsight
Compute's ``--nvtx-include`` filter. Phase 1's hooks change nothing Dynamo or the GPU sees,
so both phases run the same kernels. The every-launch pass of an eager script also marks the
first call of each op signature inside that step (``first_of_size.py``), a range of its own
that the pass's filter names instead.
"""

from __future__ import annotations

import dataclasses
import gc
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kerneltriage import annotate, rundir
from kerneltriage.profile.module_ranges import ModuleRanges, is_compiling_function, not_compiling
from kerneltriage.profile.process_facts import (
    dynamo_facts,
    environment,
    gpu_peak_mb,
    max_rss_mb,
    profiler_enabled,
)
from kerneltriage.profile.step_clock import StepClock, plain_settled
from kerneltriage.profile.step_plan import (
    CAPTURE_RANGE,
    EXIT_NO_GPU,
    EXIT_NO_TORCH,
    NCU_RANGE,
    StepPlan,
    clean_file,
    shapes_file,
)

#: Steps a timing process issues from an idle GPU after its plain steps, each timed on the
#: host's clock (the host's time to issue a step: the report compares it with the step time).
HOST_STEPS = 3


class StepsDone(BaseException):
    """Raised once the process has written what it ran for, to end the script early.

    A BaseException, so that a script's ``except Exception`` does not swallow it.
    """


def rank() -> int:
    return int(os.environ.get("RANK", "0"))


class ProfiledProcess:
    """One profiled process. ``config`` is the JSON written by the parent (``context.py``)."""

    def __init__(self, config: dict[str, Any]):
        self.config = config
        self.mode = config["mode"]  # "timeline", "timing", "ncu" or "nsys"
        self.out = Path(config["out"])
        self.warmup = int(config["warmup"])
        self.steps = int(config["steps"])
        self.whole_run = bool(config.get("whole_run"))
        self.plan = StepPlan(
            self.warmup,
            self.steps,
            int(config.get("timing_steps", 0)),
            self.whole_run,
            plain=int(config.get("plain_min") or 0) or None,
        )
        self.plain_extended = 0  # plain steps added because the times had not settled
        self.rank = rank()
        self.steps_seen = 0
        self.step_source: str | None = None
        self.done = False
        self._finished = False
        self.trace_path: Path | None = None
        self.shapes_path: Path | None = None
        # torch is imported in install(), never with this module: torch and its objects are
        # typed Any here.
        self.prof: Any = None
        self.shapes_prof: Any = None
        self.clean_prof: Any = None  # the clean steps' profiler (CUDA activity only)
        self.clean_path: Path | None = None
        self.ncu_range: Any = None
        self.first_of_size: Any = None  # FirstOfSize, for an every-launch ncu pass
        self.capture: Any = None  # Nsight Systems: the range over the recorded steps
        self.step_range: Any = None  # Nsight Systems: the range of the step running now
        self.modules = ModuleRanges()
        self.clock = StepClock()
        self.torch: Any = None
        # Resolved by prepare(), before any hook is installed.
        self._is_compiling: Callable[[], bool] = not_compiling
        self.profilers_created = 0
        # One entry per ended step: its phase and whether any profiler existed during it (the
        # plain steps must show none; tests read this from the status file).
        self.phase_log: list[dict[str, Any]] = []
        self.dynamo_plain: dict[str, Any] | None = None  # Dynamo's counts after the plain steps
        # A timing process's steps issued from an idle GPU: the host's time to issue each (ms).
        self.host_issue_ms: list[float] = []
        self._host_t0 = 0.0
        # Where the process's time went: seconds since the runner started at each milestone
        # (torch imported, first step, warm-up done, ncu range, finished); ``profile`` adds
        # them up by phase.
        self._t0 = float(config.get("_started") or time.time())
        self.wall: dict[str, float] = {}

    # --- set-up -------------------------------------------------------------------------

    def install(self) -> None:
        try:
            import torch
        except ModuleNotFoundError as exc:
            if exc.name != "torch":
                raise
            self.write_status("no-torch", error=f"no torch in the script's Python ({sys.executable})")
            raise SystemExit(EXIT_NO_TORCH) from None

        self.torch = torch
        self.milestone("torch")
        if not self.config.get("cpu") and not torch.cuda.is_available():
            self.write_status("no-gpu", error="torch.cuda.is_available() is False in the script's Python")
            raise SystemExit(EXIT_NO_GPU)
        if torch.cuda.is_available() and self.config.get("distributed"):
            local = int(os.environ.get("LOCAL_RANK", "0"))
            torch.cuda.set_device(local % torch.cuda.device_count())
        self.prepare(torch)
        if not self._cuda_clock:
            # A CPU dry run: no GPU steady state to wait for; the plain steps asked, no more.
            self.plan = dataclasses.replace(self.plan, plain=None)
            self.config["plain_max"] = 0
        from torch.optim.optimizer import register_optimizer_step_post_hook

        register_optimizer_step_post_hook(self._on_optimizer_step)
        annotate.step_listeners.append(self._on_user_step)
        if self.mode == "timeline":
            if self.warmup == 0 and not self.whole_run:
                self._mark(0)  # the first plain step's start
            self._advance_timeline()
        elif self.mode == "timing" and self.warmup == 0:
            self._mark(0)
        elif self.mode == "ncu" and self.warmup == 0 and not self.whole_run:
            self._open_ncu_range()
        elif self.mode == "nsys" and self.warmup == 0:
            self._open_capture()

    def prepare(self, torch) -> None:
        """What the hooks need, resolved once (``install`` calls it; tests call it alone)."""
        self.torch = torch
        self._is_compiling = is_compiling_function(torch)
        self.modules.prepare(torch)
        self.clock = StepClock(torch.cuda if self._cuda_clock else None)

    @property
    def _cuda_clock(self) -> bool:
        return bool(self.torch.cuda.is_available() and not self.config.get("cpu"))

    # --- phase 1: the profilers, in the plan's order -------------------------------------

    def _profiler(self, *, shapes: bool, cpu_only: bool, schedule, on_trace_ready):
        torch = self.torch
        activities = [torch.profiler.ProfilerActivity.CPU]
        if self._cuda_clock and not cpu_only:
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        # No with_flops: the report computes work from shapes and counters, never from the
        # profiler's FLOP estimates, and they cost host time per op.
        self.profilers_created += 1
        return torch.profiler.profile(
            activities=activities, schedule=schedule, on_trace_ready=on_trace_ready, record_shapes=shapes
        )

    def _advance_timeline(self) -> None:
        """Phase 1: start or stop what the step that begins now needs (``self.steps_seen``
        steps have ended)."""
        plan, seen = self.plan, self.steps_seen
        torch = self.torch
        if self.whole_run:
            if seen == 0:
                self.modules.install(describe=True)
                self.prof = self._profiler(shapes=True, cpu_only=False, schedule=None, on_trace_ready=None)
                self.prof.start()
            return
        if plan.timing and seen == plan.warmup + plan.plain_count and self._extend_plain():
            return  # not settled yet: one more plain step
        if plan.timing and seen == plan.warmup + plan.plain_count and self._cuda_clock:
            # The plain steps are timed; the first profiler of the process records the GPU's
            # activity only. Its first step is CUPTI's warm-up.
            self.dynamo_plain = dynamo_facts()
            schedule = torch.profiler.schedule(wait=0, warmup=1, active=plan.timing, repeat=1)
            self.clean_prof = torch.profiler.profile(
                activities=[torch.profiler.ProfilerActivity.CUDA],
                schedule=schedule,
                on_trace_ready=self._export_clean,
            )
            self.profilers_created += 1
            self.clean_prof.start()
        elif plan.timing and seen == plan.warmup + plan.plain_count:
            self.dynamo_plain = dynamo_facts()  # no GPU: the clean steps run bare
        shapes_step = plan.stepped_shapes_step
        if seen == shapes_step - 1:
            if not plan.timing:
                self.dynamo_plain = dynamo_facts()  # nothing was timed plain: the warm-up's
            self.modules.install(describe=True)
            self.shapes_prof = self._profiler(
                shapes=True, cpu_only=True, schedule=None, on_trace_ready=self._export_shapes
            )
            self.shapes_prof.start()
        elif seen == shapes_step:
            self.modules.describe = False  # one hooked step is enough for regions.jsonl
            self._stop_shapes_pass()
            # The timed profiler: its own warm-up step, then the recorded steps.
            schedule = torch.profiler.schedule(wait=0, warmup=1, active=plan.steps, repeat=1)
            self.prof = self._profiler(
                shapes=False, cpu_only=False, schedule=schedule, on_trace_ready=self._export
            )
            self.prof.start()

    def _extend_plain(self) -> bool:
        """At the end of the last planned plain step: whether the plain phase goes on for one
        more step, because the steps timed so far have not settled (``analysis/timeline/steady.py``) and
        fewer than ``plain_max`` ran."""
        plan = self.plan
        most = int(self.config.get("plain_max") or 0)
        if plan.plain_count >= most:
            return False
        if plain_settled(self.clock.finished(plan.plain_steps), plan.plain_count):
            return False
        self.plan = dataclasses.replace(plan, plain=plan.plain_count + 1)
        self.plain_extended += 1
        return True

    def _release_profilers(self) -> None:
        """Drop a profiler once its trace is written, and collect. Stopping a profiler parses
        every recorded event into Python objects, and the export makes more: without this, the
        plain steps of GPT-2 124M eager on an H100 ran at 39.3 ms (drifting from 36.6 to
        42.4 ms) against 34.7 ms for the script alone; with it, at 34.7 ms. The step that pays
        for the export pays for the collection too; it is never timed."""
        released = False
        if self.prof is not None and self.trace_path is not None:
            self.prof = None
            released = True
        if self.clean_prof is not None and self.clean_path is not None:
            self.clean_prof = None
            released = True
        if released:
            gc.collect()

    def _export_clean(self, prof) -> None:
        self.clean_path = _write_trace(prof, self._logs() / clean_file(self.rank))

    def _logs(self) -> Path:
        logs = self.out / rundir.LOGS
        logs.mkdir(parents=True, exist_ok=True)
        return logs

    def _stop_shapes_pass(self) -> None:
        prof, self.shapes_prof = self.shapes_prof, None
        if prof is not None:
            prof.stop()  # hands the trace to _export_shapes
            del prof
            gc.collect()  # its parsed events, before the timed profiler's warm-up step

    def _export_shapes(self, prof) -> None:
        self.shapes_path = _write_trace(prof, self._logs() / shapes_file(self.rank))

    # --- steps --------------------------------------------------------------------------

    def _on_user_step(self, event: str) -> None:
        if self.step_source != "kerneltriage.step":
            self.step_source = "kerneltriage.step"
        if event == "end":
            self._step_ended()
        elif event == "begin" and self.mode == "ncu" and self.steps_seen == self.warmup:
            self._open_ncu_range()

    def _on_optimizer_step(self, optimizer, args, kwargs) -> None:
        if self._is_compiling():
            return  # a compiled optimizer step: nothing for Dynamo to trace here
        if self.step_source == "kerneltriage.step":
            return  # the script marks its own steps
        self.step_source = "optimizer"
        self._step_ended()

    def _step_ended(self) -> None:
        if self.done:
            return
        self.steps_seen += 1
        if self.steps_seen == 1:
            self.milestone("step1")
        if self.steps_seen == self.warmup:
            self.milestone("warmup")
        if self.mode == "nsys":
            self._nsys_step()
            return
        if self.mode == "timing":
            self._timing_step()
            return
        if self.mode == "timeline":
            if self.whole_run:
                return
            self._mark(self.steps_seen)
            plan = self.plan
            self.phase_log.append(
                {
                    "step": self.steps_seen,
                    "phase": plan.phase_of(self.steps_seen),
                    "profilers_created": self.profilers_created,
                    "profiler_enabled": profiler_enabled(self.torch),
                    "module_hooks": bool(self.modules.handles),
                }
            )
            if self.steps_seen == plan.last_recorded:
                self.modules.remove()
            if self.prof is not None and self.trace_path is None:
                self.prof.step()  # may call _export
            if self.clean_prof is not None and self.clean_path is None:
                self.clean_prof.step()  # may call _export_clean
            self._release_profilers()
            self._advance_timeline()
            if self.steps_seen >= plan.stop_after and self.trace_path is not None:
                self.done = True
                self._finish_and_stop()
        else:
            if self.steps_seen == self.warmup and self.step_source == "optimizer":
                self._open_ncu_range()  # the next step starts now
            elif self.steps_seen == self.warmup + 1 and not self.whole_run:
                # Every rank stops here, not only the one ncu profiles (the one with the
                # range): a rank that trained on would wait forever in its next all-reduce.
                self._close_ncu_range()
                self.done = True
                self._finish_and_stop()

    def _timing_step(self) -> None:
        """A timing process (``profile``'s extra processes): the warm-up and the plain steps,
        each end stamped as phase 1 stamps them; then, on a GPU, ``HOST_STEPS`` steps that each
        start from an idle GPU, timed on the host's clock to the step's end: the host's time
        to issue a step (``host_issue_ms``). Then it stops. Nothing else is installed."""
        plan = self.plan
        last_plain = plan.warmup + plan.plain_count
        gate = self.config.get("measure_gate")
        if gate and self.steps_seen == max(1, plan.warmup - 1) and self._cuda_clock:
            # Started beside another timing process: wait for the GPU to be this one's before
            # the last warm-up step, so that a step after the wait is never timed.
            self._hold_at_measure_gate(Path(gate), release=False)
        if self.steps_seen <= last_plain:
            self._mark(self.steps_seen)
            if self.steps_seen < last_plain or self._extend_plain():
                return
            if self.torch is None or not self._cuda_clock:
                self.done = True
                self._finish_and_stop()
                return
        else:
            self.host_issue_ms.append(round(1000.0 * (time.perf_counter() - self._host_t0), 4))
        if len(self.host_issue_ms) >= HOST_STEPS:
            self.done = True
            self._finish_and_stop()
            return
        # The next step starts with nothing queued, so the GPU is never ahead of the host in it
        # (the plain steps are timed and read by now: this sync changes none of them).
        self.torch.cuda.synchronize()
        self._host_t0 = time.perf_counter()

    def _mark(self, step: int) -> None:
        """Time stamp the end of ``step`` if it bounds a recorded, clean or plain step."""
        plan = self.plan
        if plan.warmup <= step <= plan.stop_after:
            self.clock.stamp(step)

    def step_times(self) -> dict[str, Any]:
        """Milliseconds per step: recorded, clean and plain (``StepClock.times``)."""
        return self.clock.times(self.plan, "cuda activity" if self.clean_path is not None else None)

    # --- NVTX: Nsight Systems' capture range and step ranges, Nsight Compute's range -----

    def _open_capture(self) -> None:
        nvtx = self.torch.cuda.nvtx
        self.capture = nvtx.range_start(CAPTURE_RANGE)
        self.step_range = nvtx.range_start(annotate.STEP_RANGE)

    def _nsys_step(self) -> None:
        nvtx = self.torch.cuda.nvtx
        if self.step_range is not None:
            nvtx.range_end(self.step_range)
            self.step_range = None
        if self.steps_seen == self.warmup:
            self._open_capture()
        elif self.warmup < self.steps_seen < self.warmup + self.steps:
            self.step_range = nvtx.range_start(annotate.STEP_RANGE)
        elif self.steps_seen >= self.warmup + self.steps and self.capture is not None:
            nvtx.range_end(self.capture)
            self.capture = None
            self.done = True
            self._finish_and_stop()

    def _open_ncu_range(self) -> None:
        if self.ncu_range is None and self.rank == int(self.config.get("ncu_rank", 0)):
            if self.config.get("measure_gate"):
                self._hold_at_measure_gate(Path(self.config["measure_gate"]), release=True)
            self.milestone("ncu_start")
            self.ncu_range = self.torch.cuda.nvtx.range_start(NCU_RANGE)
            if self.config.get("profiler_api"):
                # ncu --profile-from-start off: nothing before this step is intercepted.
                self.torch.cuda.profiler.start()
            take = self.config.get("ncu_take") == "first-of-size"
            trim = bool(self.config.get("ncu_trim"))
            skip = {
                (str(name), tuple(tuple(int(d) for d in shape) for shape in shapes))
                for name, shapes in self.config.get("ncu_skip") or []
            }
            if take or trim or skip:
                from kerneltriage.profile.first_of_size import FirstOfSize

                self.first_of_size = FirstOfSize(self.torch, take=take, trim=trim, skip=skip)
                self.first_of_size.start()

    def _hold_at_measure_gate(self, gate: Path, *, release: bool) -> None:
        """Wait for the parent before the steps this process is there for: another process of
        the script may be timing or profiling its own (nothing else may run on the GPU then).
        What the warm-up queued is finished first. ``release`` (an ncu process): the blocks the
        warm-up left cached go back, so that it holds only its live tensors while the other's
        kernels are replayed; a timing process keeps them, as the script alone would."""
        from kerneltriage.profile.gate import wait_for_gate

        torch = self.torch
        if torch.cuda.is_initialized():
            torch.cuda.synchronize()
            if release:
                torch.cuda.empty_cache()
        self.milestone("at_measure")
        wait_for_gate(gate, int(self.config["parent_pid"]))
        self.milestone("measure_open")

    def _close_ncu_range(self) -> None:
        if self.ncu_range is None:
            return
        if self.first_of_size is not None:
            self.first_of_size.stop()
        if self.config.get("profiler_api"):
            self.torch.cuda.profiler.stop()
        self.torch.cuda.nvtx.range_end(self.ncu_range)
        self.ncu_range = None
        self.milestone("ncu_end")

    def milestone(self, name: str) -> None:
        """Note the seconds since the runner started at ``name`` (the first time only)."""
        self.wall.setdefault(name, round(time.time() - self._t0, 3))

    def _finish_and_stop(self) -> None:
        self.finish("ok")
        if not self.config.get("run_to_end"):
            raise StepsDone

    # --- output -------------------------------------------------------------------------

    def _trace_file(self) -> Path:
        name = rundir.TRACE if not self.config.get("distributed") else f"trace.rank{self.rank}.json.gz"
        return self.out / name

    def _export(self, prof) -> None:
        self.trace_path = _write_trace(prof, self._trace_file())

    def finish(self, status: str, error: str | None = None) -> None:
        """Write everything this process knows (idempotent)."""
        if self._finished:
            return
        self._finished = True
        self.modules.remove()
        if self.mode == "timeline":
            try:
                if self.shapes_prof is not None:
                    self._stop_shapes_pass()
                if self.clean_prof is not None and self.clean_path is None:
                    self.clean_prof.stop()  # a script that ended inside the clean steps
                if self.prof is not None and self.trace_path is None:
                    # Stopping while recording hands the trace to on_trace_ready (_export): a
                    # script that ends inside the recorded steps still leaves what it recorded.
                    self.prof.stop()
                    if self.whole_run and self.trace_path is None:
                        self._export(self.prof)
            except Exception as exc:  # a failing export must not hide the script's own error
                error = error or f"profiler export failed: {exc}"
        if self.mode == "timeline" and self.modules.signatures and self.rank == 0:
            self.modules.write_signatures(self.out / rundir.REGIONS)
        self._close_ncu_range()
        self.milestone("finished")
        self.write_status(status, error=error)

    def write_status(self, status: str, error: str | None = None) -> None:
        data = {
            "status": status,
            "error": error,
            "mode": self.mode,
            "rank": self.rank,
            "steps_seen": self.steps_seen,
            "step_source": self.step_source,
            "trace": self.trace_path.name if self.trace_path else None,
            "shapes_trace": self.shapes_path.name if self.shapes_path else None,
            "clean_trace": self.clean_path.name if self.clean_path else None,
            "module_calls": self.modules.calls,
            # Left installed (inert) because Dynamo compiled while they were in place.
            "module_hooks_kept": bool(self.modules.handles),
            "environment": environment(self.torch),
            "wall": self.wall,
            # How much host memory another process of the script will take (profile starts
            # several at once only where they fit).
            "max_rss_mb": max_rss_mb(),
        }
        if self.mode in ("timeline", "timing"):
            data["phases"] = self.phase_log
            data["plain_steps"] = self.plan.plain_count
            data["plain_extended"] = self.plain_extended
        if self.mode == "timing":
            data["host_issue_ms"] = self.host_issue_ms
        if self.first_of_size is not None:
            data["ncu_take"] = self.first_of_size.status()
        if self.mode == "timeline":
            data["dynamo"] = {"plain": self.dynamo_plain, "end": dynamo_facts()}
            # How much GPU memory a later process of the script takes (phase 2 overlaps one
            # pass's exit with the next one's first steps only where two fit).
            data["gpu_peak_mb"] = gpu_peak_mb(self.torch)
        if self.mode in ("timeline", "timing") and self.torch is not None:
            try:
                data["step_times"] = self.step_times()
            except Exception as exc:  # a failed CUDA context must not lose the status
                data["step_times"] = {"error": str(exc)}
        logs = self.out / rundir.LOGS
        logs.mkdir(parents=True, exist_ok=True)
        name = self.config.get("status_name") or self.mode  # processes of one mode at once
        path = logs / f"status.{name}.rank{self.rank}.json"
        path.write_text(json.dumps(data, indent=2) + "\n")


#: gzip level of the traces the process writes. The parent rewrites the timed trace anyway
#: (``trace_fixup.py``), and torch's own ``.gz`` export compresses at level 9 while the script's
#: process waits: 5.5 s for a 151 MB trace against 0.5 s at level 1, for 1.65× the bytes
#: (``benchmarks/bench_trace_write.py``, 2 cores).
TRACE_GZIP_LEVEL = 1


def _write_trace(prof, path: Path) -> Path:
    """The profiler's trace at ``path``, written atomically: a reader never sees half a trace.
    Kineto writes the JSON (C++), then it is gzipped at ``TRACE_GZIP_LEVEL``."""
    import gzip
    import shutil

    plain = path.with_name(path.name.replace(".json.gz", ".tmp.json"))
    packed = path.with_name(path.name.replace(".json.gz", ".tmp.json.gz"))
    try:
        prof.export_chrome_trace(str(plain))
        with open(plain, "rb") as fin, gzip.open(packed, "wb", compresslevel=TRACE_GZIP_LEVEL) as fout:
            shutil.copyfileobj(fin, fout, 1 << 20)
    finally:
        plain.unlink(missing_ok=True)
    os.replace(packed, path)
    return path
