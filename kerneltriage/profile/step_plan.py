"""Which step of phase 1 does what (``StepPlan``), and the names the profiled process and the
parent share: exit codes, NVTX ranges, the traces under ``logs/``.

Imported inside the user's process (``hooks.py``) and by the parent (``session.py``): stdlib
only.
"""

from __future__ import annotations

from dataclasses import dataclass

EXIT_NO_GPU = 86
EXIT_NO_TORCH = 88  # the script's Python has no torch: one line, not its traceback
NCU_RANGE = "kerneltriage.ncu"
#: Around the first call of each op signature in the ncu step (``first_of_size.py``): the
#: every-launch pass profiles the launches inside it only.
TAKE_RANGE = "kerneltriage.ncu.take"
#: Around the calls of ops whose elementwise launches the per-configuration pass leaves out
#: (``analysis/timeline/one_size.py``): ncu excludes the launches inside it.
SKIP_RANGE = "kerneltriage.ncu.skip"
#: The recorded steps under Nsight Systems (``--capture-range=nvtx``).
CAPTURE_RANGE = "kerneltriage.capture"


def shapes_file(rank_: int) -> str:
    """The shapes pass's trace, under ``logs/`` of the run directory."""
    return f"shapes.rank{rank_}.json.gz"


def clean_file(rank_: int) -> str:
    """The clean steps' trace (CUDA activity only), under ``logs/`` of the run directory."""
    return f"clean.rank{rank_}.json.gz"


@dataclass(frozen=True)
class StepPlan:
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
    # settle (``ProfiledProcess._extend_plain``), so the later steps move with it.
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
        return self.stepped_shapes_step

    @property
    def stepped_shapes_step(self) -> int:
        """The shapes step of the stepped plan (a whole run has none)."""
        return self.warmup + (self.plain_count + self.timing + 2 if self.timing else 1)

    @property
    def first_recorded(self) -> int:
        return self.warmup + 1 if self.whole_run else self.stepped_shapes_step + 2

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
        if step == self.stepped_shapes_step + 1:
            return "recorded-warmup"
        if self.first_recorded <= step <= self.last_recorded:
            return "recorded"
        return "after"
