"""``python -m kerneltriage.verify.harness SCRIPT ARGS…`` (or ``-m MODULE ARGS…``).

Runs the user's script as ``python SCRIPT ARGS`` would (``runpy``, ``__main__``, same argv),
in a process where no profiler ever runs:

- seeds Python, NumPy and torch (the script's own seeding, if any, comes after and wins), so
  the baseline and the fixed runs see the same data and initial weights;
- applies the fix (``kerneltriage.recipes``) when the config names one;
- counts steps as ``profile`` does: ``kerneltriage.step()`` when the script uses it, else a
  global optimizer step post-hook;
- stamps each step end (CUDA events on the GPU, no synchronization; ``perf_counter`` on CPU);
- captures the first steps' losses at ``backward`` (a scalar tensor's value);
- stops after warm-up + timed steps (or when the script ends) and writes a small JSON result;
- started with the other runs of its round (``--start-together``), waits at its first CUDA use
  until the parent gives it the GPU (``profile/gate.py``).

The parent (``trials.py``) passes its settings in the file named by ``KERNELTRIAGE_VERIFY``.
"""

from __future__ import annotations

import itertools
import json
import os
import random
import runpy
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from kerneltriage import annotate
from kerneltriage.recipes.install import Applied, ApplyFailed, install

CONFIG_ENV = "KERNELTRIAGE_VERIFY"
MODULE = "kerneltriage.verify.harness"


class Done(BaseException):
    """Raised at the end of the last timed step to end the script early (a BaseException, so
    a script's ``except Exception`` does not swallow it)."""


class Stepper:
    """Step ends, their time stamps and the first steps' losses, in the script's process."""

    def __init__(self, torch, *, warmup: int, steps: int, loss_steps: int, cpu: bool = False):
        self.torch = torch
        self.warmup = warmup
        self.steps = steps
        self.loss_steps = loss_steps
        self.cuda = bool(torch.cuda.is_available() and not cpu)
        self.seen = 0
        self.source: str | None = None
        self.marks: dict[int, Any] = {}
        self.losses: list[dict[str, Any]] = []
        self.scale_loss = None  # fp16 autocast: the GradScaler's scale()
        self._inside_backward = False
        self._undo: list = []

    def install(self) -> None:
        torch = self.torch
        from torch.optim.optimizer import register_optimizer_step_post_hook

        handle = register_optimizer_step_post_hook(self._on_optimizer_step)
        self._undo.append(handle.remove)
        annotate.step_listeners.append(self._on_user_step)
        self._undo.append(lambda: annotate.step_listeners.remove(self._on_user_step))
        if self.warmup == 0:
            self._mark(0)
        tensor_backward, autograd_backward = torch.Tensor.backward, torch.autograd.backward
        stepper = self

        def backward_tensor(self, *args, **kwargs):
            return stepper._backward(tensor_backward, self, args, kwargs)

        def backward_autograd(tensors, *args, **kwargs):
            return stepper._backward(autograd_backward, tensors, args, kwargs)

        torch.Tensor.backward = backward_tensor
        torch.autograd.backward = backward_autograd

        def undo():
            torch.Tensor.backward, torch.autograd.backward = tensor_backward, autograd_backward

        self._undo.append(undo)

    def remove(self) -> None:
        while self._undo:
            self._undo.pop()()

    # --- losses -------------------------------------------------------------------------

    def _backward(self, original, tensors, args, kwargs):
        if self._inside_backward:  # Tensor.backward calls torch.autograd.backward
            return original(tensors, *args, **kwargs)
        self._inside_backward = True
        try:
            loss = tensors[0] if isinstance(tensors, (list, tuple)) and len(tensors) == 1 else tensors
            if isinstance(loss, self.torch.Tensor) and loss.numel() == 1:
                if self.seen < self.loss_steps:
                    # float() synchronizes: only in the first steps, which are never timed.
                    self.losses.append({"step": self.seen + 1, "value": float(loss.detach().float())})
                if self.scale_loss is not None and loss.dtype.is_floating_point:
                    tensors = self.scale_loss(loss)
            return original(tensors, *args, **kwargs)
        finally:
            self._inside_backward = False

    # --- steps --------------------------------------------------------------------------

    def _on_user_step(self, event: str) -> None:
        self.source = "kerneltriage.step"
        if event == "end":
            self._ended()

    def _on_optimizer_step(self, optimizer, args, kwargs) -> None:
        compiler = getattr(self.torch, "compiler", None)
        if compiler is not None and compiler.is_compiling():
            return
        if self.source == "kerneltriage.step":
            return  # the script marks its own steps
        self.source = "optimizer"
        self._ended()

    def _ended(self) -> None:
        self.seen += 1
        if self.seen >= self.warmup:
            self._mark(self.seen)
        if self.seen >= self.warmup + self.steps:
            raise Done

    def _mark(self, step: int) -> None:
        if self.cuda:
            event = self.torch.cuda.Event(enable_timing=True)
            event.record()
            self.marks[step] = event
        else:
            self.marks[step] = time.perf_counter()

    def step_ms(self) -> list[float]:
        """Milliseconds of each timed step (those after the warm-up), in order."""
        if len(self.marks) < 2:
            return []
        order = sorted(self.marks)
        if self.cuda:
            self.marks[order[-1]].synchronize()
            between = [float(self.marks[a].elapsed_time(self.marks[b])) for a, b in itertools.pairwise(order)]
        else:
            between = [1000.0 * (self.marks[b] - self.marks[a]) for a, b in itertools.pairwise(order)]
        return [round(t, 4) for t in between]


def seed_everything(seed: int, torch) -> None:
    random.seed(seed)
    torch.manual_seed(seed)
    try:
        import numpy
    except ImportError:
        return
    numpy.random.seed(seed)


def run(config: dict[str, Any], argv: list[str]) -> tuple[int, dict[str, Any]]:
    """Run the script ``argv`` under ``config``; (exit code, result)."""
    import torch

    if config.get("gate"):
        from kerneltriage.profile.gate import hold_at_first_cuda_use

        hold_at_first_cuda_use(torch, Path(config["gate"]), int(config["parent_pid"]))
    seed_everything(int(config.get("seed", 0)), torch)
    stepper = Stepper(
        torch,
        warmup=int(config["warmup"]),
        steps=int(config["steps"]),
        loss_steps=int(config.get("loss_steps", 3)),
        cpu=bool(config.get("cpu")),
    )
    result: dict[str, Any] = {"status": "ok", "error": None, "apply": config.get("apply")}
    applied: Applied | None = None
    code = 0
    try:
        if config.get("apply"):
            applied = install(config["apply"])
            stepper.scale_loss = _scale_loss(applied)
        stepper.install()
        if argv[0] == "-m":
            sys.argv = [argv[1], *argv[2:]]
            runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        else:
            sys.argv = list(argv)
            sys.path.insert(0, os.path.dirname(os.path.abspath(argv[0])))
            runpy.run_path(argv[0], run_name="__main__")
    except Done:
        pass
    except ApplyFailed as exc:
        result.update(status="not-applied", error=str(exc))
        code = 4
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if code != 0:
            result.update(status="failed", error=f"the script exited with {code}")
    except KeyboardInterrupt:
        result.update(status="interrupted", error="interrupted")
        code = 130
    except BaseException as exc:
        result.update(status="failed", error=_last_line(exc))
        traceback.print_exc()
        code = 1
    if applied is not None and result["status"] == "ok" and applied.problem:
        result.update(status="not-applied", error=applied.problem)
        code = 4
    try:
        result["step_ms"] = stepper.step_ms()
    except Exception as exc:  # a failed CUDA context must not lose the result
        result["step_ms"] = []
        result["error"] = result["error"] or f"could not read the step times: {exc}"
    result.update(
        steps_seen=stepper.seen,
        step_source=stepper.source,
        clock="cuda events" if stepper.cuda else "perf_counter",
        losses=stepper.losses,
        applied=applied.details if applied is not None else None,
        device=_device(torch, stepper.cuda),
    )
    return code, result


def _scale_loss(applied: Applied):
    # The GradScaler exists only once the first forward ran; read it at each backward.
    return lambda loss: applied.scale_loss(loss) if applied.scale_loss is not None else loss


def _last_line(exc: BaseException) -> str:
    return "".join(traceback.format_exception_only(type(exc), exc)).strip().splitlines()[-1]


def _device(torch, cuda: bool) -> str:
    if not cuda:
        return "cpu"
    return torch.cuda.get_device_name(torch.cuda.current_device())


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    path = os.environ.get(CONFIG_ENV)
    if not path:
        print("kerneltriage.verify.harness is started by `kerneltriage verify`, not by hand", file=sys.stderr)
        return 2
    if not argv:
        print("kerneltriage verify: no script given", file=sys.stderr)
        return 2
    config = json.loads(Path(path).read_text())
    code, result = run(config, argv)
    out = Path(str(config["result"]).format(rank=int(os.environ.get("RANK", "0"))))
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(json.dumps(result, indent=2) + "\n")
    os.replace(tmp, out)
    return code


if __name__ == "__main__":
    sys.exit(main())
