"""Two processes of the script on one GPU at once (``turns.py``): whether they fit, whether a
batch of them starts in pairs, held before their measured steps, and when one's GPU work is done."""

from __future__ import annotations

from collections.abc import Callable

from kerneltriage.profile.context import ProfileSession

#: The share of the GPU's memory two processes of the script may take together, each at phase
#: 1's peak, for one ncu pass's exit or warm-up to overlap the next one's.
OVERLAP_MEMORY_SHARE = 0.8


def two_processes_fit(session: ProfileSession) -> bool:
    """Whether two processes of the script fit on its GPU at once (phase 1's peak)."""
    return processes_fit(session, 2) >= 2


def processes_fit(session: ProfileSession, most: int) -> int:
    """How many processes of the script, up to ``most``, fit on its GPU at once at phase 1's
    peak (1 where that peak or the GPU's memory is not known)."""
    recorded = [s.get("gpu_peak_mb") for s in session.statuses("timeline")]
    peaks = [float(p) for p in recorded if isinstance(p, (int, float))]
    total_gb = session.manifest.gpu.get("memory_gb")
    if not peaks or len(peaks) < len(recorded) or not total_gb or max(peaks) <= 0:
        return 1
    fit = int(OVERLAP_MEMORY_SHARE * float(total_gb) * 1e9 // (max(peaks) * 2**20))
    return max(1, min(most, fit))


def measure_gates(session: ProfileSession, processes: int) -> bool:
    """Whether ``processes`` of the script that take the GPU in turn (timing processes, a GPU's
    ncu passes) start two at a time, each held before the steps it is there for until the GPU
    is its own (``turns.py``): a single-process script with warm-up steps, whose two processes
    fit on the GPU at once."""
    return (
        processes > 1
        and not session.command.distributed
        and not session.manifest.schedule.whole_run
        and session.options.warmup > 0
        and two_processes_fit(session)
    )


def status_written(session: ProfileSession, name: str) -> Callable[[], bool]:
    """Whether the ``name`` process has ended the steps it was there for: its status is written
    then, before it exits (an ncu pass: ncu then writes its report, 1.1-2.0 s on an H100), so
    the next turn can have the GPU meanwhile."""
    status = session.logs / f"status.{name}.rank0.json"
    return status.is_file
