"""The host's share of the step, and what it leaves to a fix that only shortens kernels.

``profile``'s timing processes issue a few steps from an idle GPU and time them on the host's
clock: the host's own time to issue a step (its Python, dispatch and launches). The GPU
cannot finish a step before the host has issued it, so the step is at least that long: a fix
that makes kernels faster and leaves the host's work as it is shortens the step by at most
``step − host``. Where the host takes nearly the whole step (a conv net of small kernels, 90% or
more: ``measurement.yaml``'s ``host.bound_share``), every prediction made from kernel time (a
norm swap, a library kernel, a compile's fused kernels, a kernel to write) is capped to that
room and the report says the step waits on the host.
Only CUDA graphs (``mode="reduce-overhead"``: a step's launches replayed at once) are
predicted from the host's side and left uncapped; a whole-model compile also launches less,
which no kernel-time prediction counts, and a module-class compile adds host time at every
compiled call (measured: ``measurement.yaml``'s ``host``).

The measure is an upper bound of the host's own work: a step of more launches than the GPU's
launch queue holds waits for the GPU to drain it too (BERT-base, GPU-bound: 77% of its step).
Below the bound share the room it leaves is only a lower bound, so nothing is capped there.

Not judged where the recorded steps block the host in synchronizing calls (a ``.item()``, a
copy to the host), or make more launches than the launch queue holds (``host.launch_queue``)
and, played at the measured host pace against a GPU running them one after another
(``queue_depth``), leave the GPU behind by half the queue or more: the host's clock then may
time the GPU's work too (T5-base, 4,365 launches: 91% of its step, while verify realized 36% on
its kernels' side). A fix that replaces the candidate's launches by fused ones from one call
(``host.fewer_launches``) also takes those launches off the host, at its time per launch.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from kerneltriage.analysis.model import Candidate
from kerneltriage.ingest.tables import Timeline

#: Runtime calls that launch a kernel (CUDA runtime and driver, HIP).
_LAUNCH = r"LaunchKernel|LaunchCooperativeKernel|^cuLaunch|hipModuleLaunch|hipLaunch"
#: Runtime calls that hold the host until the GPU has caught up.
_BLOCKING = ("Synchronize", "cudaMemcpy", "hipMemcpy")
#: The compile mode whose prediction is the host's launches themselves (CUDA graphs replay a
#: step's launches at once): the one fix the cap does not bound.
_HOST_MODE = "reduce-overhead"


@dataclass(frozen=True)
class HostTime:
    """The host's time to issue a step against the step time (ms), as measured."""

    host_ms: float
    step_ms: float
    samples: int
    sync_ms: float  # blocking runtime calls per recorded step
    judged: bool  # False: the script blocks on the GPU inside its step (``why``)
    why: str = ""
    launches: float = 0.0  # kernel launches a step
    queue_depth: int | None = None  # the most launches left queued in a plain step (simulated)

    @property
    def share(self) -> float:
        return self.host_ms / self.step_ms if self.step_ms else 0.0

    @property
    def paces_step(self) -> bool:
        """Judged, and the host takes ``bound_share`` of the step or more: below it a full
        launch queue may be what held the host, not its own work."""
        return self.judged and self.share >= float(settings()["bound_share"])

    @property
    def room_ms(self) -> float:
        """What a kernel-only fix can take off the step at most."""
        return max(0.0, self.step_ms - self.host_ms)

    def to_json(self) -> dict[str, Any]:
        return {
            "host_issue_ms": round(self.host_ms, 3),
            "share_of_step": round(self.share, 4),
            "samples": self.samples,
            "blocking_sync_ms_per_step": round(self.sync_ms, 3),
            "judged": self.judged,
            **({"why_not": self.why} if self.why else {}),
            "launches_per_step": round(self.launches, 1),
            **({"launch_queue_depth": self.queue_depth} if self.queue_depth is not None else {}),
        }

    @property
    def per_launch_ms(self) -> float:
        """The host's time per kernel launch it issues (its Python, dispatch and the launch)."""
        return self.host_ms / self.launches if self.launches else 0.0


def launches_removed(c: Candidate) -> float:
    """Kernel launches a step the candidate's fused form saves: those its kernels make now, less
    the one per fused instance its ceiling allows (``Roofline.launches_per_step``)."""
    now = sum(k.launches_per_step for k in c.kernels)
    fused = c.roofline.launches_per_step or c.instances_per_step
    return max(0.0, now - fused)


def settings() -> dict[str, Any]:
    from kerneltriage.resources import load_yaml

    return dict(load_yaml("measurement.yaml")["host"])


def blocking_ms(timeline: Timeline, windows: list[tuple[int, int]]) -> float:
    """Milliseconds per step the host spent in blocking runtime calls that the script's ops made
    (a synchronize, a synchronous copy) inside the step ``windows`` (ns)."""
    rt = timeline.runtime
    if rt is None or rt.empty or not windows:
        return 0.0
    names = rt["name"].astype(str)
    # Made by an op of the script (``ext_id``): the profiler's own synchronize at a step's end
    # is no wait of the script's.
    rows = rt[
        names.str.contains("|".join(_BLOCKING))
        & ~names.str.contains("Async")
        & (rt["ext_id"].to_numpy() >= 0)
    ]
    if rows.empty:
        return 0.0
    start = rows["start"].to_numpy(dtype=np.int64)
    end = start + rows["dur"].to_numpy(dtype=np.int64)
    total = 0
    for w0, w1 in windows:
        total += int(np.clip(np.minimum(end, w1) - np.maximum(start, w0), 0, None).sum())
    return total / len(windows) / 1e6


def loading_ms(timeline: Timeline, windows: list[tuple[int, int]]) -> float:
    """Milliseconds per step of data loading on the host (``idle_causes.yaml``'s
    ``data_loading`` annotations and ops) inside the step ``windows`` (ns): host time that
    CUDA graphs leave as it is."""
    from kerneltriage.analysis.timeline.attribution import name_mask
    from kerneltriage.analysis.timeline.idle import is_data_loading, union

    cpu = timeline.cpu
    if cpu is None or cpu.empty or not windows:
        return 0.0
    hit = name_mask(cpu["name"], is_data_loading)
    if not hit.any():
        return 0.0
    start = cpu["start"].to_numpy(dtype=np.int64)[hit]
    end = start + cpu["dur"].to_numpy(dtype=np.int64)[hit]
    total = 0
    for w0, w1 in windows:
        inside = (start < w1) & (end > w0)
        if inside.any():
            total += sum(b - a for a, b in union(np.maximum(start[inside], w0), np.minimum(end[inside], w1)))
    return total / len(windows) / 1e6


def launches_per_step(timeline: Timeline, windows: list[tuple[int, int]]) -> float:
    """Kernel launches the host made per step ``window`` (ns), by their runtime calls."""
    rt = timeline.runtime
    if rt is None or rt.empty or not windows:
        return 0.0
    names = rt["name"].astype(str)
    start = rt.loc[names.str.contains(_LAUNCH), "start"].to_numpy(dtype=np.int64)
    return sum(int(((start >= w0) & (start < w1)).sum()) for w0, w1 in windows) / len(windows)


def queue_depth(timeline: Timeline, windows: list[tuple[int, int]], host_ms: float) -> int | None:
    """The most kernels launched and not yet finished at any launch of a plain step, simulated
    from each recorded step ``window`` (ns): its launches at their recorded host times, scaled
    so that they span ``host_ms`` (the host's measured time to issue a step), against a GPU that
    starts from idle and runs the kernels one after another in launch order (a kernel starts
    once launched and once the one before it has ended: streams that overlap would lag less).
    The deepest of the steps; None where the launches and their kernels cannot be matched."""
    rt, kernels = timeline.runtime, timeline.kernels
    if rt is None or rt.empty or kernels.empty or not windows or host_ms <= 0:
        return None
    launch = rt[rt["name"].astype(str).str.contains(_LAUNCH)]
    start = launch["start"].to_numpy(dtype=np.int64)
    corr = launch["correlation"].to_numpy(dtype=np.int64)
    dur = kernels.groupby("correlation")["dur"].sum()
    deepest = 0
    for w0, w1 in windows:
        inside = (start >= w0) & (start < w1)
        order = np.argsort(start[inside], kind="stable")
        t, c = start[inside][order], corr[inside][order]
        if len(t) < 2:
            continue
        d = dur.reindex(c).to_numpy(dtype=np.float64)
        if np.isnan(d).mean() > 0.1:  # launches without their kernel: cannot tell
            return None
        span = float(t[-1] - t[0])
        if span <= 0:
            continue
        issue = (t - t[0]) * (host_ms * 1e6 / span)
        end = np.empty(len(t))
        previous = 0.0
        for i, (at, took) in enumerate(zip(issue, np.nan_to_num(d))):
            previous = max(at, previous) + took
            end[i] = previous
        # Ends are in launch order and never decrease: those finished by each launch, by search.
        done = np.searchsorted(end, issue, side="right")
        deepest = max(deepest, int((np.arange(len(t)) - np.minimum(done, np.arange(len(t)))).max()))
    return deepest


def host_time(
    timing: dict[str, Any] | None,
    step_ms: float,
    sync_ms: float,
    recorded_ms: float,
    launches: float = 0.0,
    depth: Callable[[float], int | None] | None = None,
) -> HostTime | None:
    """The host's time to issue a step from ``profile``'s timing processes (None: not measured,
    or fewer samples than measurement.yaml's ``host.min_samples``); ``launches`` a step.
    ``depth(host_ms)``: how deep the launch queue gets in a plain step (``queue_depth``), asked
    where the step makes more launches than the queue holds."""
    conf = settings()
    samples = [float(x) for x in (timing or {}).get("host_issue_ms") or [] if x and x > 0]
    if len(samples) < int(conf["min_samples"]) or step_ms <= 0:
        return None
    host = statistics.median(samples)
    queue = int(conf["launch_queue"])
    share_sync = sync_ms / recorded_ms if recorded_ms else 0.0
    why = ""
    deepest = depth(host) if depth is not None and launches > queue else None
    if launches > queue and (deepest is None or deepest >= float(conf["queue_fill_share"]) * queue):
        behind = (
            f", and the GPU runs up to {deepest:,} of them behind the host (simulated from the recorded steps)"
            if deepest is not None
            else ""
        )
        why = (
            f"a step makes {launches:,.0f} kernel launches, more than the {queue:,} the launch queue "
            f"holds{behind}: the host may wait for the GPU to drain it, and its clock then times the "
            "GPU's work too"
        )
    elif share_sync >= float(conf["max_sync_share"]):
        why = (
            f"the recorded steps block the host for {sync_ms:.2f} ms a step in synchronizing calls "
            f"({share_sync:.0%} of the step): its clock times the GPU's work too"
        )
    return HostTime(host, step_ms, len(samples), sync_ms, not why, why, launches, deepest)


def cap_to_host(candidates: list[Candidate], host: HostTime | None) -> list[str]:
    """Where the host paces the step (``bound_share`` of it or more), cap every kernel-only
    fix's predicted saving to the room the host leaves (``step − host``); the warning lines to
    add. Below that share nothing is capped: a step of more launches than the launch queue
    holds makes the host wait for the GPU too, so its issue time overstates the host's own work
    (BERT-base, GPU-bound, 1,391 launches a step: 77%), and the room it leaves is only a lower
    bound; at 90% the GPU had at most a tenth of the step queued when the host was done."""
    if host is None or not host.paces_step:
        return []
    fewer = set(settings()["fewer_launches"])
    capped: list[Candidate] = []
    for c in candidates:
        apply = (c.recipe or {}).get("apply") or {}
        if apply.get("mode") == _HOST_MODE or not c.expected_saving_share:
            continue
        # A fix that launches its fused kernels from one call also takes the launches it
        # replaces off the host, at the host's time per launch.
        removed = launches_removed(c) if apply.get("kind") in fewer else 0.0
        freed = removed * host.per_launch_ms
        room = min(host.step_ms, host.room_ms + freed)
        whole = float(c.attrs.get("fix_saving_share") or 0.0)
        saving_ms = c.expected_saving_share * host.step_ms
        if saving_ms <= room and whole * host.step_ms <= room:
            continue
        c.attrs["saving_before_host"] = c.expected_saving_share
        c.expected_saving_share = min(c.expected_saving_share, room / host.step_ms)
        if whole:
            c.attrs["fix_saving_share"] = min(whole, room / host.step_ms)
        off_host = (
            f" + the {removed:.0f} launches it replaces at {1e3 * host.per_launch_ms:.3g} µs of host each"
            if freed
            else ""
        )
        c.attrs["saving_basis"] = (
            f"at most step − host{off_host} = {room:.3g} ms: the host takes {host.host_ms:.3g} ms to issue "
            f"a step, so {saving_ms:.3g} ms less kernel time shortens the step by that much at most"
        )
        extra = (
            "; a module compile also adds host time at every compiled call"
            if apply.get("kind") == "compile-module"
            else ""
        )
        c.note = "; ".join(
            x
            for x in (
                c.note,
                f"the step waits on the host ({host.host_ms:.3g} of {host.step_ms:.3g} ms): "
                f"{saving_ms / host.step_ms:.1%} predicted on the kernels' side leaves "
                f"{c.expected_saving_share:.1%} of the step{extra}",
            )
            if x
        )
        capped.append(c)
    said = ", ".join(c.id or "?" for c in capped[:6]) + ("…" if len(capped) > 6 else "")
    return [
        f"host: issuing a step from an idle GPU takes {host.host_ms:.2f} ms ({host.samples} steps), "
        f"{host.share:.0%} of the {host.step_ms:.2f} ms step: the GPU waits on the host, so faster "
        f"kernels shorten the step by at most {room:.2f} ms"
        + (f" (the savings of {said} capped to that)" if capped else "")
        + "; what shortens the host's side: torch.compile(model) (fewer, fused launches), then "
        'mode="reduce-overhead" (CUDA graphs); a module-class compile adds host time at every call. '
        "Such a step also moves with the machine's other load, so another run may fall outside the "
        "step's interval (ConvNeXt-T on an H200: 26.7 ms in the profile's processes, 29.6-33.9 ms in "
        "verify's)"
    ]


#: The id of the step-level fix for a step the host paces (verify's ``--candidates S1``).
STEP_FIX_ID = "S1"


def step_fix(
    candidates: list[Candidate],
    host: HostTime | None,
    busy_ms: float,
    launches: float,
    compiled: bool,
    recipes: Any,
    env: Any,
    loading: float = 0.0,
) -> dict[str, Any] | None:
    """For a step the host paces (the host takes ``bound_share`` of it or more): CUDA graphs
    over the whole model, which replay the step's launches at once and fuse what Inductor
    fuses. Predicted as the kernels' work after the compile: their time in the step, less what
    fusing takes from every fusable candidate (its time × (1 − 1/headroom), verdict aside, a
    batch norm's region at what fusing its neighbours removes: ``compile_headroom``);
    GEMMs and convolutions keep theirs (timm ConvNeXt-T on an H100: predicted 28.1%, measured
    37.2% by ``benchmarks/probes/conv_layouts.py``: Inductor also fuses GEMM epilogues). The
    step stays at least the host's data loading (``loading``, ms a recorded step), which CUDA
    graphs do not replay. None where the host leaves the GPU the step, or no recipe
    fits (a serving engine, an old torch)."""
    from kerneltriage.analysis.fixes.attach import FUSABLE_KINDS
    from kerneltriage.analysis.fixes.fix_choice import choose
    from kerneltriage.analysis.judge.graph_advice import LaunchBoundCandidate

    if host is None or not host.paces_step:
        return None
    fused_off = sum(
        c.time_ms_per_step * (1.0 - 1.0 / c.compile_headroom)
        for c in candidates
        if c.kind in FUSABLE_KINDS and c.headroom and c.headroom > 1.0
    )
    # The kernels' own time (the candidates'), not the busy time: replayed at once, the gaps
    # between them go too.
    kernel_ms = min(sum(c.time_ms_per_step for c in candidates) or busy_ms, busy_ms, host.step_ms)
    # Data loading stays the host's however the launches go: the step is at least that.
    after_ms = max(0.0, kernel_ms - fused_off, loading)
    predicted = max(0.0, 1.0 - after_ms / host.step_ms)
    step = LaunchBoundCandidate('torch.compile(mode="reduce-overhead")', launches, compiled=compiled)
    recipe = choose(step, recipes, env, {})
    if not recipe or recipe["blocked"] or not predicted:
        return None
    text = recipe.pop("text")
    for key in ("needs", "declined", "fuses_residual_add"):
        recipe.pop(key, None)
    return {
        "id": STEP_FIX_ID,
        "name": f"the whole step: {launches:.0f} launches the host issues in {host.host_ms:.3g} ms",
        "predicted_saving_share": round(predicted, 4),
        # The step it becomes: a host-paced baseline moves with the host's load from process to
        # process, so verify judges the fix against this, not the share of another process's step.
        "predicted_step_ms": round(after_ms, 3),
        "saving_basis": (
            f"1 − (kernel time {kernel_ms:.3g} ms − {fused_off:.3g} ms that fusing takes from the norms and "
            f"elementwise chains) / step {host.step_ms:.3g} ms: the launches replayed at once, the step becomes "
            "the kernels' work"
            + (f", or the {loading:.3g} ms of data loading a step where that is longer" if loading else "")
        ),
        "fix": text,
        "recipe": recipe,
    }
