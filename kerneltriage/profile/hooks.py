"""In the user's process: find the steps, drive the profiler, name modules, mark the ncu step.

Runs inside the training script's interpreter (started by ``runner.py``). torch is imported
here, never in the report path.

Steps come from ``kerneltriage.step()`` when the script uses it, else from a global optimizer
step post-hook (every ``torch.optim`` optimizer), else nothing fires and the whole run is
recorded. Phase 1 ("timeline") runs the PyTorch profiler with the schedule: skip ``warmup``
steps, record ``steps``; module forward hooks add ``kerneltriage.module:<path>:<Class>``
ranges (record_function + NVTX) while recording. Phase 2 ("ncu") records nothing itself: it
opens an NVTX *start/end* range around one step (start/end ranges are process-wide, so the
autograd thread's backward kernels fall inside it, unlike push/pop ranges) for Nsight
Compute's ``--nvtx-include`` filter.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any

from kerneltriage import annotate, rundir

EXIT_NO_GPU = 86
NCU_RANGE = "kerneltriage.ncu"
#: The recorded steps under Nsight Systems (``--capture-range=nvtx``).
CAPTURE_RANGE = "kerneltriage.capture"


class Done(BaseException):
    """Raised once the recorded steps are written, to end the script early.

    A BaseException, so that a script's ``except Exception`` does not swallow it.
    """


def rank() -> int:
    return int(os.environ.get("RANK", "0"))


class Session:
    """One profiled process. ``config`` is the JSON written by the parent (``session.py``)."""

    def __init__(self, config: dict[str, Any]):
        self.config = config
        self.mode = config["mode"]  # "timeline" or "ncu"
        self.out = Path(config["out"])
        self.warmup = int(config["warmup"])
        self.steps = int(config["steps"])
        self.whole_run = bool(config.get("whole_run"))
        self.rank = rank()
        self.steps_seen = 0
        self.step_source: str | None = None
        self.recording = False
        self.done = False
        self.trace_path: Path | None = None
        self.hook_seconds = 0.0
        self.prof = None
        self.ncu_range = None
        self.signatures: dict[tuple, dict[str, Any]] = {}
        self.paths: dict[int, str] = {}
        self._local = threading.local()
        self.torch = None

    # --- set-up -------------------------------------------------------------------------

    def install(self) -> None:
        import torch

        self.torch = torch
        if not self.config.get("cpu") and not torch.cuda.is_available():
            self._write_status("no-gpu", error="torch.cuda.is_available() is False in the script's Python")
            raise SystemExit(EXIT_NO_GPU)
        if torch.cuda.is_available() and self.config.get("distributed"):
            local = int(os.environ.get("LOCAL_RANK", "0"))
            torch.cuda.set_device(local % torch.cuda.device_count())
        from torch.optim.optimizer import register_optimizer_step_post_hook

        register_optimizer_step_post_hook(self._on_optimizer_step)
        annotate.step_listeners.append(self._on_user_step)
        if self.mode == "timeline":
            from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook

            register_module_forward_pre_hook(self._module_pre)
            register_module_forward_hook(self._module_post)
            self._start_profiler()
        elif self.mode == "ncu" and self.warmup == 0 and not self.whole_run:
            self._open_ncu_range()
        elif self.mode == "nsys" and self.warmup == 0:
            self._open_capture()

    def _start_profiler(self) -> None:
        torch = self.torch
        activities = [torch.profiler.ProfilerActivity.CPU]
        if torch.cuda.is_available() and not self.config.get("cpu"):
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        schedule = None
        if not self.whole_run:
            # Kineto needs one warm-up step of its own; the rest of the user's warm-up waits.
            schedule = torch.profiler.schedule(
                wait=max(0, self.warmup - 1), warmup=min(1, self.warmup), active=self.steps, repeat=1
            )
        self.prof = torch.profiler.profile(
            activities=activities,
            schedule=schedule,
            on_trace_ready=self._export,
            record_shapes=True,
            with_flops=True,
        )
        self.prof.start()
        self.recording = self.whole_run or self.warmup <= 1

    # --- steps --------------------------------------------------------------------------

    def _on_user_step(self, event: str) -> None:
        if self.step_source != "kerneltriage.step":
            self.step_source = "kerneltriage.step"
        if event == "end":
            self._step_ended()
        elif event == "begin" and self.mode == "ncu" and self.steps_seen == self.warmup:
            self._open_ncu_range()

    def _on_optimizer_step(self, optimizer, args, kwargs) -> None:
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
        if self.mode == "timeline":
            if self.whole_run:
                return
            # Module ranges only while the profiler records (its warm-up step included).
            self.recording = self.warmup - 1 <= self.steps_seen < self.warmup + self.steps
            self.prof.step()  # may call _export
            if self.trace_path is not None:
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

    def _path(self, module) -> str:
        key = id(module)
        path = self.paths.get(key)
        if path is None:
            # The first module seen without a path is a root: name it and its submodules.
            root = type(module).__name__
            for name, sub in module.named_modules():
                self.paths.setdefault(id(sub), name or root)
            path = self.paths[key]
        return path

    def _module_pre(self, module, args) -> None:
        if not self.recording:
            return
        t0 = time.perf_counter()
        torch = self.torch
        name = f"{annotate.MODULE_PREFIX}{self._path(module)}:{type(module).__name__}"
        rf = torch.autograd.profiler.record_function(name)
        rf.__enter__()
        if torch.cuda.is_available():
            torch.cuda.nvtx.range_push(name)
        stack = getattr(self._local, "stack", None)
        if stack is None:
            stack = self._local.stack = []
        stack.append((module, rf, _describe(args)))
        self.hook_seconds += time.perf_counter() - t0

    def _module_post(self, module, args, output) -> None:
        stack = getattr(self._local, "stack", None)
        if not stack or stack[-1][0] is not module:
            return
        t0 = time.perf_counter()
        _, rf, inputs = stack.pop()
        if self.torch.cuda.is_available():
            self.torch.cuda.nvtx.range_pop()
        rf.__exit__(None, None, None)
        outputs = _describe(output)
        key = (self._path(module), type(module).__name__, json.dumps(inputs), json.dumps(outputs))
        entry = self.signatures.get(key)
        if entry is None:
            params = sum(p.numel() * p.element_size() for p in module.parameters(recurse=False))
            entry = self.signatures[key] = {
                "path": key[0],
                "class": key[1],
                "inputs": inputs,
                "outputs": outputs,
                "param_bytes": int(params),
                "calls": 0,
            }
        entry["calls"] += 1
        self.hook_seconds += time.perf_counter() - t0

    # --- output -------------------------------------------------------------------------

    def _trace_file(self) -> Path:
        name = rundir.TRACE if not self.config.get("distributed") else f"trace.rank{self.rank}.json.gz"
        return self.out / name

    def _export(self, prof) -> None:
        path = self._trace_file()
        tmp = path.with_name(path.name.replace(".json.gz", ".tmp.json.gz"))
        prof.export_chrome_trace(str(tmp))
        os.replace(tmp, path)  # a reader never sees half a trace
        self.trace_path = path

    def finish(self, status: str, error: str | None = None) -> None:
        """Write everything this process knows (idempotent)."""
        if getattr(self, "_finished", False):
            return
        self._finished = True
        if self.mode == "timeline" and self.prof is not None and self.trace_path is None:
            try:
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
            "hook_ms": 1000.0 * self.hook_seconds,
            "environment": _environment(self.torch),
        }
        logs = self.out / rundir.LOGS
        logs.mkdir(parents=True, exist_ok=True)
        path = logs / f"status.{self.mode}.rank{self.rank}.json"
        path.write_text(json.dumps(data, indent=2) + "\n")


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
