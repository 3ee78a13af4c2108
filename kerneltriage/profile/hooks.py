"""In the user's process: find the steps, drive the profiler, name modules, mark the ncu step.

Runs inside the training script's interpreter (started by ``runner.py``). torch is imported
here, never in the report path.

Steps come from ``kerneltriage.step()`` when the script uses it, else from a global optimizer
step post-hook (every ``torch.optim`` optimizer), else nothing fires and the whole run is
recorded.

Phase 1 ("timeline") must time the program as the user runs it. A profiler session leaves
the process slower after it has been stopped, exported and collected (more so the more
launches a step has), so the order is fixed (``Plan`` says which step does what):

- after the user's warm-up, *plain* steps with nothing installed but a step counter: every
  step end is stamped with a CUDA event (no synchronization is added); their median and spread
  are the report's step time, and Dynamo's own counts (graph breaks, graphs, recompiles and
  their reasons) are read after them;
- then *clean* steps under a profiler that records CUDA activity only (CUPTI's activity
  buffers: no per-op work on the host), whose trace (``logs/clean.rank<r>.json.gz``) gives the
  GPU's busy time; kernel time barely moves with host time;
- then one step under a CPU-only profiler that records input shapes (collecting shapes costs
  host time per op), with module hooks installed from then on: module ranges
  (``kerneltriage.module:<path>:<Class>``) enter or leave one profiler range under a name
  resolved once per module, and module input shapes for ``regions.jsonl`` are taken in that
  step; ``profile/trace_fixup.py`` copies the shapes onto the recorded trace's ops;
- then the recorded steps: the structure (ops, kernels, modules), not the time.

Every hook returns at once while Dynamo traces it (``torch.compiler.is_compiling()``), so a
compiled program gets the same graphs, graph breaks and kernels as without kerneltriage. Hooks
added after compilation are not guarded on (``skip_nnmodule_hook_guards``), so they cause no
recompilation either. Each step's phase, and whether a profiler existed then, is written to the
status file (``phases``).

Phase 2 ("ncu") records nothing itself and installs no module hooks: it opens an NVTX
*start/end* range around the first step phase 1 recorded (start/end ranges are process-wide,
so the autograd thread's backward kernels fall inside it, unlike push/pop ranges) for Nsight
Compute's ``--nvtx-include`` filter. Phase 1's hooks change nothing Dynamo or the GPU sees,
so both phases run the same kernels.
"""

from __future__ import annotations

import dataclasses
import gc
import json
import os
import statistics
import sys
import threading
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kerneltriage import annotate, rundir

EXIT_NO_GPU = 86
EXIT_NO_TORCH = 88  # the script's Python has no torch: one line, not its traceback
NCU_RANGE = "kerneltriage.ncu"
#: The recorded steps under Nsight Systems (``--capture-range=nvtx``).
CAPTURE_RANGE = "kerneltriage.capture"
#: torch.compile(module) warns when global module hooks exist; ours are kerneltriage's, not
#: the user's, and they do nothing inside compiled code.
_OPTIMIZED_MODULE_WARNING = r"Using `torch.compile\(module\)` when there are global hooks"


class Done(BaseException):
    """Raised once the recorded steps are written, to end the script early.

    A BaseException, so that a script's ``except Exception`` does not swallow it.
    """


def rank() -> int:
    return int(os.environ.get("RANK", "0"))


def shapes_file(rank_: int) -> str:
    """The shapes pass's trace, under ``logs/`` of the run directory."""
    return f"shapes.rank{rank_}.json.gz"


def clean_file(rank_: int) -> str:
    """The clean steps' trace (CUDA activity only), under ``logs/`` of the run directory."""
    return f"clean.rank{rank_}.json.gz"


@dataclass(frozen=True)
class Plan:
    """Which step of phase 1 does what. Steps are numbered from 1, in the order they end.

    ``warmup`` W and ``steps`` S as the user asked; ``timing`` T. Nothing of kerneltriage's
    but a step counter exists before the plain steps are timed: a profiler session leaves the
    process slower after it is stopped and collected (on a timm ViT-B/16, 29.1 ms per step
    before a CPU+CUDA session, 34.1 ms after it), so no profiler may have run before them.

    - steps 1..W: the user's warm-up (torch.compile compiles here), nothing installed;
    - steps W+1..W+T: *plain*, nothing installed, each step end stamped with a CUDA event;
    - step W+T+1: the clean profiler's warm-up (CUPTI start-up); steps W+T+2..W+2T+1:
      *clean*, under a profiler of CUDA activity only (no per-op host work): the GPU's busy
      time;
    - the next step: the *shapes* step, under a CPU-only profiler that records input shapes,
      with the module hooks installed from then on;
    - the next: the timed profiler's own warm-up; then S *recorded* steps (ops, kernels,
      module ranges), after which the process stops.

    With T = 0 there are no plain or clean steps and the shapes step follows the warm-up.
    """

    warmup: int
    steps: int
    timing: int
    whole_run: bool = False
    # Plain steps, when more than ``timing``: the plain phase goes on until the step times
    # settle (``Session._extend_plain``), so the later steps move with it.
    plain: int | None = None

    @property
    def plain_count(self) -> int:
        return max(self.plain or 0, self.timing) if self.timing else 0

    @property
    def plain_steps(self) -> range:
        """The steps timed with nothing installed."""
        return range(self.warmup + 1, self.warmup + self.plain_count + 1)

    @property
    def clean_steps(self) -> range:
        """The steps timed under the CUDA-only profiler."""
        if not self.timing:
            return range(0)
        first = self.warmup + self.plain_count + 2
        return range(first, first + self.timing)

    @property
    def shapes_step(self) -> int | None:
        if self.whole_run:
            return None
        return self._shapes_step

    @property
    def _shapes_step(self) -> int:
        """The shapes step of the stepped plan (a whole run has none)."""
        return self.warmup + (self.plain_count + self.timing + 2 if self.timing else 1)

    @property
    def first_recorded(self) -> int:
        return self.warmup + 1 if self.whole_run else self._shapes_step + 2

    @property
    def last_recorded(self) -> int:
        return self.first_recorded + self.steps - 1

    @property
    def hooks_from(self) -> int:
        """The first step during which module hooks exist (the shapes step): never a step that
        is timed plain or clean, nor the first step, where torch.compile traces."""
        return self.shapes_step or 1

    @property
    def stop_after(self) -> int:
        """The process stops once this many steps ended (unless --run-to-end)."""
        return self.last_recorded

    def phase_of(self, step: int) -> str:
        """What step ``step`` is for (``warmup``, ``plain``, ``clean-warmup``, ``clean``,
        ``shapes``, ``recorded-warmup``, ``recorded`` or ``after``)."""
        if self.whole_run:
            return "recorded"
        if step <= self.warmup:
            return "warmup"
        if step in self.plain_steps:
            return "plain"
        if self.timing and step == self.warmup + self.plain_count + 1:
            return "clean-warmup"
        if step in self.clean_steps:
            return "clean"
        if step == self.shapes_step:
            return "shapes"
        if step == self._shapes_step + 1:
            return "recorded-warmup"
        if self.first_recorded <= step <= self.last_recorded:
            return "recorded"
        return "after"


class Session:
    """One profiled process. ``config`` is the JSON written by the parent (``session.py``)."""

    def __init__(self, config: dict[str, Any]):
        self.config = config
        self.mode = config["mode"]  # "timeline", "ncu" or "nsys"
        self.out = Path(config["out"])
        self.warmup = int(config["warmup"])
        self.steps = int(config["steps"])
        self.whole_run = bool(config.get("whole_run"))
        self.plan = Plan(
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
        self.recording = False  # module ranges are wanted (hooks installed and a profiler on)
        self.describe = False  # module input/output shapes are taken for regions.jsonl
        self.done = False
        self.trace_path: Path | None = None
        self.shapes_path: Path | None = None
        # torch is imported in install(), never with this module: torch and its objects are
        # typed Any here.
        self.prof: Any = None
        self.shapes_prof: Any = None
        self.clean_prof: Any = None  # the clean steps' profiler (CUDA activity only)
        self.clean_path: Path | None = None
        self.ncu_range: Any = None
        self.hook_handles: list[Any] = []
        self.graphs_at_install = 0
        self.hook_calls = 0
        self.signatures: dict[tuple, dict[str, Any]] = {}
        self.names: dict[int, str] = {}
        self._local = threading.local()
        self.marks: dict[int, Any] = {}  # step number -> CUDA event or perf_counter at its end
        self.torch: Any = None
        # Both resolved by prepare(), before any hook is installed.
        self._range: Callable[[str], Any] = _no_range
        self._is_compiling: Callable[[], bool] = _not_compiling
        self.profilers_created = 0
        # One entry per ended step: its phase and whether any profiler existed during it (the
        # plain steps must show none; tests read this from the status file).
        self.phase_log: list[dict[str, Any]] = []
        self.dynamo_plain: dict[str, Any] | None = None  # Dynamo's counts after the plain steps

    # --- set-up -------------------------------------------------------------------------

    def install(self) -> None:
        try:
            import torch
        except ModuleNotFoundError as exc:
            if exc.name != "torch":
                raise
            self._write_status("no-torch", error=f"no torch in the script's Python ({sys.executable})")
            raise SystemExit(EXIT_NO_TORCH) from None

        self.torch = torch
        if not self.config.get("cpu") and not torch.cuda.is_available():
            self._write_status("no-gpu", error="torch.cuda.is_available() is False in the script's Python")
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
        self._is_compiling = _is_compiling_function(torch)
        self._range = _fast_range_type(torch)

    @property
    def _cuda_clock(self) -> bool:
        return bool(self.torch.cuda.is_available() and not self.config.get("cpu"))

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
                self._install_module_hooks(describe=True)
                self.prof = self._profiler(shapes=True, cpu_only=False, schedule=None, on_trace_ready=None)
                self.prof.start()
            return
        if plan.timing and seen == plan.warmup + plan.plain_count and self._extend_plain():
            return  # not settled yet: one more plain step
        if plan.timing and seen == plan.warmup + plan.plain_count and self._cuda_clock:
            # The plain steps are timed; the first profiler of the process records the GPU's
            # activity only. Its first step is CUPTI's warm-up.
            self.dynamo_plain = _dynamo_facts()
            schedule = torch.profiler.schedule(wait=0, warmup=1, active=plan.timing, repeat=1)
            self.clean_prof = torch.profiler.profile(
                activities=[torch.profiler.ProfilerActivity.CUDA],
                schedule=schedule,
                on_trace_ready=self._export_clean,
            )
            self.profilers_created += 1
            self.clean_prof.start()
        elif plan.timing and seen == plan.warmup + plan.plain_count:
            self.dynamo_plain = _dynamo_facts()  # no GPU: the clean steps run bare
        shapes_step = plan._shapes_step
        if seen == shapes_step - 1:
            if not plan.timing:
                self.dynamo_plain = _dynamo_facts()  # nothing was timed plain: the warm-up's
            self._install_module_hooks(describe=True)
            self.shapes_prof = self._profiler(
                shapes=True, cpu_only=True, schedule=None, on_trace_ready=self._export_shapes
            )
            self.shapes_prof.start()
        elif seen == shapes_step:
            self.describe = False  # one hooked step is enough for regions.jsonl
            self._stop_shapes_pass()
            # The timed profiler: its own warm-up step, then the recorded steps.
            schedule = torch.profiler.schedule(wait=0, warmup=1, active=plan.steps, repeat=1)
            self.prof = self._profiler(
                shapes=False, cpu_only=False, schedule=schedule, on_trace_ready=self._export
            )
            self.prof.start()

    def _extend_plain(self) -> bool:
        """At the end of the last planned plain step: whether the plain phase goes on for one
        more step, because the steps timed so far have not settled (``analysis/steady.py``) and
        fewer than ``plain_max`` ran. Only steps whose end the GPU has reached are read (an
        event's ``query``): nothing waits for the GPU here."""
        plan = self.plan
        most = int(self.config.get("plain_max") or 0)
        if plan.plain_count >= most:
            return False
        times = self._finished_plain_times()
        # numpy only (torch loaded it): no interval here, so no scipy in the user's process.
        from kerneltriage.analysis import steady

        conf = steady.settings()["steady"]
        tail = times[steady.truncation(times) :]
        # Settled on the steps the GPU has finished (all but the last two or so in flight).
        if len(times) >= plan.plain_count - 2 and steady.settled(
            tail, min_steps=int(conf["min_steps"]), tolerance=float(conf["tolerance"])
        ):
            return False
        self.plan = dataclasses.replace(plan, plain=plan.plain_count + 1)
        self.plain_extended += 1
        return True

    def _finished_plain_times(self) -> list[float]:
        """The plain steps' times the GPU has finished, in order (ms)."""
        times: list[float] = []
        for step in self.plan.plain_steps:
            a, b = self.marks.get(step - 1), self.marks.get(step)
            if a is None or b is None:
                break
            if self._cuda_clock:
                if not b.query():
                    break
                times.append(float(a.elapsed_time(b)))
            else:
                times.append(1000.0 * (b - a))
        return times

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
                    "profiler_enabled": _profiler_enabled(self.torch),
                    "module_hooks": bool(self.hook_handles),
                }
            )
            if self.steps_seen == plan.last_recorded:
                self._remove_module_hooks()
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
                if self.ncu_range is not None:
                    self.torch.cuda.nvtx.range_end(self.ncu_range)
                    self.ncu_range = None
                self.done = True
                self._finish_and_stop()

    def _timing_step(self) -> None:
        """A timing process (``profile``'s extra processes): the warm-up and the plain steps,
        each end stamped as phase 1 stamps them, then it stops. Nothing else is installed."""
        self._mark(self.steps_seen)
        plan = self.plan
        if self.steps_seen >= plan.warmup + plan.plain_count and not self._extend_plain():
            self.done = True
            self._finish_and_stop()

    def _mark(self, step: int) -> None:
        """Time stamp the end of ``step`` if it bounds a recorded, clean or plain step."""
        plan = self.plan
        if not plan.warmup <= step <= plan.stop_after:
            return
        if self._cuda_clock:
            event = self.torch.cuda.Event(enable_timing=True)
            event.record()  # on the current stream, no synchronization
            self.marks[step] = event
        else:
            self.marks[step] = time.perf_counter()

    def step_times(self) -> dict[str, Any]:
        """Milliseconds per step: recorded (attribution profiler and module ranges), clean
        (CUDA-only profiler) and plain (nothing installed)."""
        if not self.marks:
            return {}
        cuda = self._cuda_clock
        if cuda:
            last = self.marks[max(self.marks)]
            last.synchronize()

        def between(a: int, b: int) -> float | None:
            if a not in self.marks or b not in self.marks:
                return None
            if cuda:
                return float(self.marks[a].elapsed_time(self.marks[b]))
            return 1000.0 * (self.marks[b] - self.marks[a])

        plan = self.plan
        windows = {
            "recorded": range(plan.first_recorded, plan.last_recorded + 1),
            "clean": plan.clean_steps,
            "plain": plan.plain_steps,
        }
        out: dict[str, Any] = {
            "clock": "cuda events" if cuda else "perf_counter",
            # What ran during the clean steps: a CUDA-only profiler, or (no GPU) nothing.
            "clean_profiler": "cuda activity" if self.clean_path is not None else None,
        }
        for key, steps in windows.items():
            measured = [between(s - 1, s) for s in steps]
            times = [round(t, 4) for t in measured if t is not None]
            out[f"{key}_ms"] = times
            if times:
                out[f"{key}_median_ms"] = round(statistics.median(times), 4)
        return out

    # --- Nsight Systems: a capture range over the recorded steps, a range per step ------

    def _open_capture(self) -> None:
        nvtx = self.torch.cuda.nvtx
        self.capture = nvtx.range_start(CAPTURE_RANGE)
        self.step_range = nvtx.range_start(annotate.STEP_RANGE)

    def _nsys_step(self) -> None:
        nvtx = self.torch.cuda.nvtx
        if getattr(self, "step_range", None) is not None:
            nvtx.range_end(self.step_range)
            self.step_range = None
        if self.steps_seen == self.warmup:
            self._open_capture()
        elif self.warmup < self.steps_seen < self.warmup + self.steps:
            self.step_range = nvtx.range_start(annotate.STEP_RANGE)
        elif self.steps_seen >= self.warmup + self.steps and getattr(self, "capture", None) is not None:
            nvtx.range_end(self.capture)
            self.capture = None
            self.done = True
            self._finish_and_stop()

    def _open_ncu_range(self) -> None:
        if self.ncu_range is None and self.rank == int(self.config.get("ncu_rank", 0)):
            self.ncu_range = self.torch.cuda.nvtx.range_start(NCU_RANGE)

    def _finish_and_stop(self) -> None:
        self.finish("ok")
        if not self.config.get("run_to_end"):
            raise Done

    # --- module ranges ------------------------------------------------------------------

    def _install_module_hooks(self, *, describe: bool) -> None:
        if self.hook_handles:
            return
        from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook

        warnings.filterwarnings("ignore", message=_OPTIMIZED_MODULE_WARNING)
        self.graphs_at_install = _dynamo_graphs()
        self.hook_handles = [
            register_module_forward_pre_hook(self._module_pre),
            register_module_forward_hook(self._module_post),
        ]
        self.recording = True
        self.describe = describe

    def _remove_module_hooks(self) -> None:
        """Stop the module ranges. The hooks go too unless Dynamo compiled a graph while they
        were installed: it guards on the global hook dicts it read, and removing our hooks
        would recompile that graph. They then stay, returning at once."""
        self.recording = self.describe = False
        if self.hook_handles and _dynamo_graphs() == self.graphs_at_install:
            for handle in self.hook_handles:
                handle.remove()
            self.hook_handles = []

    def _name(self, module) -> str:
        """The range name of ``module``, resolved once: the first module seen without a name
        is a root, and its whole tree is named then."""
        root = module
        inner = getattr(module, "_orig_mod", None)  # torch.compile(model)'s OptimizedModule
        if inner is not None and type(module).__name__ == "OptimizedModule":
            root = inner
        root_name = type(root).__name__
        prefix = annotate.MODULE_PREFIX
        self.names.setdefault(id(module), f"{prefix}{root_name}:{root_name}")
        for name, sub in root.named_modules():
            self.names.setdefault(id(sub), f"{prefix}{name or root_name}:{type(sub).__name__}")
        return self.names[id(module)]

    def _module_pre(self, module, args) -> None:
        if self._is_compiling():
            return  # Dynamo inlines this hook: it must add nothing to the graph
        if not self.recording:
            return
        name = self.names.get(id(module)) or self._name(module)
        rf = self._range(name)
        rf.__enter__()
        stack = getattr(self._local, "stack", None)
        if stack is None:
            stack = self._local.stack = []
        stack.append((module, rf, _describe(args) if self.describe else None))
        self.hook_calls += 1

    def _module_post(self, module, args, output) -> None:
        if self._is_compiling():
            return
        stack = getattr(self._local, "stack", None)
        if not stack or stack[-1][0] is not module:
            return
        _, rf, inputs = stack.pop()
        rf.__exit__(None, None, None)
        if inputs is not None:
            self._signature(module, inputs, output)

    def _signature(self, module, inputs, output) -> None:
        outputs = _describe(output)
        path, cls = self.names[id(module)][len(annotate.MODULE_PREFIX) :].rsplit(":", 1)
        key = (path, cls, json.dumps(inputs), json.dumps(outputs))
        entry = self.signatures.get(key)
        if entry is None:
            params = sum(p.numel() * p.element_size() for p in module.parameters(recurse=False))
            entry = self.signatures[key] = {
                "path": path,
                "class": cls,
                "inputs": inputs,
                "outputs": outputs,
                "param_bytes": int(params),
                "calls": 0,
            }
        entry["calls"] += 1

    # --- output -------------------------------------------------------------------------

    def _trace_file(self) -> Path:
        name = rundir.TRACE if not self.config.get("distributed") else f"trace.rank{self.rank}.json.gz"
        return self.out / name

    def _export(self, prof) -> None:
        self.trace_path = _write_trace(prof, self._trace_file())

    def finish(self, status: str, error: str | None = None) -> None:
        """Write everything this process knows (idempotent)."""
        if getattr(self, "_finished", False):
            return
        self._finished = True
        self._remove_module_hooks()
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
        if self.mode == "timeline" and self.signatures and self.rank == 0:
            with open(self.out / rundir.REGIONS, "w") as f:
                for entry in self.signatures.values():
                    f.write(json.dumps(entry) + "\n")
        if self.ncu_range is not None:
            self.torch.cuda.nvtx.range_end(self.ncu_range)
            self.ncu_range = None
        self._write_status(status, error=error)

    def _write_status(self, status: str, error: str | None = None) -> None:
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
            "module_calls": self.hook_calls,
            # Left installed (inert) because Dynamo compiled while they were in place.
            "module_hooks_kept": bool(self.hook_handles),
            "environment": _environment(self.torch),
        }
        if self.mode in ("timeline", "timing"):
            data["phases"] = self.phase_log
            data["plain_steps"] = self.plan.plain_count
            data["plain_extended"] = self.plain_extended
        if self.mode == "timeline":
            data["dynamo"] = {"plain": self.dynamo_plain, "end": _dynamo_facts()}
        if self.mode in ("timeline", "timing") and self.torch is not None:
            try:
                data["step_times"] = self.step_times()
            except Exception as exc:  # a failed CUDA context must not lose the status
                data["step_times"] = {"error": str(exc)}
        logs = self.out / rundir.LOGS
        logs.mkdir(parents=True, exist_ok=True)
        path = logs / f"status.{self.mode}.rank{self.rank}.json"
        path.write_text(json.dumps(data, indent=2) + "\n")


def _dynamo_graphs() -> int:
    """Graphs Dynamo has compiled in this process so far (0 when it never ran)."""
    utils = sys.modules.get("torch._dynamo.utils")
    counters = getattr(utils, "counters", None)
    return int(counters["stats"]["unique_graphs"]) if counters is not None else 0


def _dynamo_facts() -> dict[str, Any] | None:
    """Dynamo's own counts so far, as ``TORCH_LOGS=graph_breaks,recompiles`` reports them:
    graph breaks (with the first line of each reason), graphs compiled, and recompiles with
    the guard that failed. None when Dynamo never ran in this process."""
    utils = sys.modules.get("torch._dynamo.utils")
    counters = getattr(utils, "counters", None)
    if counters is None or (not counters["stats"]["unique_graphs"] and not counters["graph_break"]):
        return None
    breaks = counters["graph_break"]
    failures = getattr(utils, "guard_failures", None) or {}
    recompiles = [
        {"code": getattr(code, "co_name", str(code)), "reason": str(reason).strip()[:300]}
        for code, reasons in list(failures.items())
        for reason in reasons
    ]
    return {
        "graph_breaks": int(sum(breaks.values())),
        "graph_break_reasons": [
            {"reason": str(r).strip().splitlines()[0][:300], "count": int(n)}
            for r, n in list(breaks.items())[:20]
        ],
        "unique_graphs": int(counters["stats"]["unique_graphs"]),
        "frames": int(counters["frames"]["total"]),
        "recompiles": len(recompiles),
        "recompile_reasons": recompiles[:20],
    }


def _profiler_enabled(torch) -> bool:
    """Whether any torch profiler (autograd or Kineto) is on in this process now."""
    if torch is None:
        return False
    check = getattr(getattr(torch._C, "_autograd", None), "_profiler_enabled", None)
    try:
        return bool(check()) if check is not None else False
    except Exception:
        return False


def _not_compiling() -> bool:
    return False


def _no_range(name: str) -> Any:
    raise RuntimeError("Session.prepare() resolves the profiler range type before any hook runs")


def _is_compiling_function(torch) -> Callable[[], bool]:
    """``torch.compiler.is_compiling``: Dynamo reads it as True while it traces."""
    compiler = getattr(torch, "compiler", None)
    fn = getattr(compiler, "is_compiling", None)
    return fn if fn is not None else _not_compiling


def _fast_range_type(torch) -> Callable[[str], Any]:
    """A profiler range entered from Python at the cost of one C++ call: ``_RecordFunctionFast``
    (torch ≥ 2.2, what Inductor uses around its kernels), else ``record_function``."""
    fast = getattr(getattr(torch._C, "_profiler", None), "_RecordFunctionFast", None)
    return fast if fast is not None else torch.autograd.profiler.record_function


def _describe(value, depth: int = 0) -> list[dict[str, Any]]:
    """Shapes, dtypes and strides of the tensors in a module's inputs or outputs."""
    out: list[dict[str, Any]] = []
    if depth > 2:
        return out
    if hasattr(value, "shape") and hasattr(value, "dtype") and hasattr(value, "stride"):
        out.append(
            {
                "shape": list(value.shape),
                "dtype": str(value.dtype).replace("torch.", ""),
                "stride": list(value.stride()),
            }
        )
    elif isinstance(value, (list, tuple)):
        for v in value[:8]:
            out.extend(_describe(v, depth + 1))
    elif isinstance(value, dict):
        for v in list(value.values())[:8]:
            out.extend(_describe(v, depth + 1))
    return out


def _environment(torch) -> dict[str, Any]:
    import platform

    env: dict[str, Any] = {"python": platform.python_version()}
    if torch is None:
        return env
    env["torch"] = torch.__version__
    env["cuda"] = torch.version.cuda
    try:
        import triton

        env["triton"] = triton.__version__
    except ImportError:
        env["triton"] = None
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(torch.cuda.current_device())
        env["gpu"] = {
            "name": p.name,
            "sms": p.multi_processor_count,
            "memory_gb": round(p.total_memory / 1e9, 1),
            "capability": f"{p.major}.{p.minor}",
            "count": torch.cuda.device_count(),
        }
    return env


def _write_trace(prof, path: Path) -> Path:
    """The profiler's trace at ``path``, written atomically: a reader never sees half a trace."""
    tmp = path.with_name(path.name.replace(".json.gz", ".tmp.json.gz"))
    prof.export_chrome_trace(str(tmp))
    os.replace(tmp, path)
    return path
