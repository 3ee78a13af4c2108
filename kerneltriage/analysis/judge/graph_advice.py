"""Advice on a launch-bound compiled graph: many small kernels, the GPU idle between them
while the host launches them. It gets `compile (launch-bound)`, mode="reduce-overhead" (CUDA
graphs), with the fix a recipe gives it as if it were a candidate.
"""

from __future__ import annotations

from typing import Any

from kerneltriage.analysis.fixes.fix_choice import choose
from kerneltriage.analysis.fixes.fix_environment import Environment
from kerneltriage.analysis.rules import Rules
from kerneltriage.analysis.vocabulary import Reason, Verdict


class LaunchBoundCandidate:
    """Launches seen as a candidate by the recipes, `compile (launch-bound)`: a compiled graph
    (``compiled``), or a whole step the host paces (``host_bound.step_fix``)."""

    def __init__(self, builtin: str | None, launches: float, *, compiled: bool) -> None:
        self.verdict, self.reason, self.builtin = Verdict.COMPILE, Reason.LAUNCH_BOUND, builtin
        self.kind, self.variant, self.module = "other", None, None
        self.attrs: dict[str, Any] = {}
        self.compiled, self.inductor = compiled, False
        self.instances_per_step = 1.0
        self.roofline = type("R", (), {"launches_per_step": launches})()


def compiled_graph_advice(
    compiled: dict[str, Any] | None, rules: Rules, env: Environment | None = None
) -> None:
    """A launch-bound compiled graph (many small kernels, the GPU idle between them) gets
    `compile (launch-bound)`: mode="reduce-overhead" (CUDA graphs), with its fix and note."""
    if not compiled:
        return
    lb = rules.regions.compiled_launch_bound
    for g in compiled.get("graphs", []):
        if not g.get("launch_bound"):
            continue
        g.update(
            verdict=Verdict.COMPILE,
            reason=Reason.LAUNCH_BOUND,
            builtin='torch.compile(mode="reduce-overhead")',
        )
        idle = f"{g['host_launch_idle_ms_per_step']:.2f} ms per step"
        g["note"] = lb.note.format(
            kernels=g["kernels_per_step"],
            median_us=g["median_kernel_us"],
            idle=idle,
            idle_share=g["idle_share_of_span"],
        )
        graph = LaunchBoundCandidate(g.get("builtin"), float(g.get("kernels_per_step") or 0.0), compiled=True)
        recipe = choose(graph, rules.recipes, env or Environment(), {})
        if recipe and not recipe["blocked"]:
            g["fix"] = recipe.pop("text")
            recipe.pop("needs", None)
            recipe.pop("declined", None)
            recipe.pop("fuses_residual_add", None)
            g["recipe"] = recipe
