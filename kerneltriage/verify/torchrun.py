"""``verify`` of a torchrun job: the recorded multi-process command, every rank under the harness.

A run of a multi-process command is one process group: ``python -m torch.distributed.run
--nproc-per-node N -m kerneltriage.verify.harness train.py …`` (torchrun's own ``-m``), so every
rank runs the script with the same fix applied, seeded alike, and writes its own result
(``<label>.<n>.rank<r>.result.json``: the harness formats ``{rank}`` with its ``RANK``). The
group's result is one result of the single-process shape (``combine``), so the rest of
``verify`` (interleaving, statistics, verify.json) is unchanged:

- **step time**: per step, the slowest rank's (a step of the job ends when its last rank's
  does; in DDP the ranks wait for each other in every all-reduce);
- **losses**: every rank's, rank after rank, so the loss guard compares each rank's first
  steps with the same rank's in the baseline;
- **status**: ok only when every rank wrote an ok result; otherwise the first rank's failure.

A job that needs more GPUs than this machine has is refused in one line (``refusal``).
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

from kerneltriage.profile.command import Command

RANK_RESULT = ".rank{rank}.result.json"


def recorded(manifest: Any) -> Command:
    """The manifest's command, parsed where it ran (its script's path is relative to there)."""
    from kerneltriage.profile.command import parse_command

    cwd = Path(manifest.cwd or ".")
    with contextlib.chdir(cwd if cwd.is_dir() else Path.cwd()):
        return parse_command(list(manifest.command))


def world_size(command: Command) -> int | None:
    """Processes the recorded command starts on this machine (None: one, not torchrun). A
    torchrun command that does not say (``--nproc-per-node gpu``) counts as one per GPU."""
    if not command.distributed:
        return None
    n = command.world_size
    if n is None:
        n = _gpus() or 1
    return n


def refusal(
    command: Command, manifest_gpu: dict[str, Any] | None, available: int | None = None
) -> str | None:
    """Why the job cannot run here, in one line (None: it can). A job profiled on GPUs needs
    one GPU per process on this machine; one profiled without (gloo on CPU) needs none."""
    n = world_size(command)
    if n is None:
        return None
    if not (manifest_gpu or {}).get("name"):
        return None  # profiled on the CPU: its processes need no GPU
    have = _gpus() if available is None else available
    if have < n:
        return (
            f"the torchrun job starts {n} processes, one GPU each, and this machine has {have} GPU(s): "
            "run verify where the job was profiled, or record it with fewer processes"
        )
    return None


def plan_note(command: Command) -> str | None:
    """What each run of a torchrun job is, for ``verify --plan``."""
    n = world_size(command)
    if n is None:
        return None
    launcher = " ".join([*command.prefix, "-m", "kerneltriage.verify.harness", *command.target])
    return (
        f"torchrun job: each run (baseline or fix) is one process group of {n} ranks "
        f"(ranks {', '.join(str(r) for r in range(n))}), `{launcher}`, every rank with the same fix; "
        f"each rank writes logs/verify/<label>.<n>.rank<r>.result.json; a step's time is its slowest "
        "rank's, and the loss guard checks every rank's losses"
    )


def result_pattern(prefix: Path) -> str:
    """The result path the harness formats with its rank (``{rank}``)."""
    return str(Path(f"{prefix}").resolve()) + RANK_RESULT


def rank_results(prefix: Path, n: int) -> dict[int, Path]:
    return {r: Path(result_pattern(prefix).format(rank=r)) for r in range(n)}


def clear(prefix: Path, n: int) -> None:
    """Remove an earlier run's per-rank results."""
    for path in rank_results(prefix, n).values():
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def read_group(prefix: Path, n: int, code: int, last_line: str = "") -> dict[str, Any]:
    """The group's result from every rank's file: ``combine``d; a rank that wrote none failed."""
    per_rank: dict[int, dict[str, Any]] = {}
    for rank, path in rank_results(prefix, n).items():
        try:
            per_rank[rank] = json.loads(path.read_text())
        except (OSError, ValueError):
            per_rank[rank] = {
                "status": "failed",
                "error": f"rank {rank} wrote no result (exit code {code})"
                + (f": {last_line}" if last_line else ""),
                "step_ms": [],
            }
    return combine(per_rank)


def combine(per_rank: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """One process group's per-rank results as ONE result of the single-process shape:
    ``step_ms`` the elementwise max across ranks (as many steps as every rank timed),
    ``losses`` every rank's in rank order (each tagged with its ``rank``), ``status`` ok only
    when every rank's is. ``ranks`` keeps each rank's steps and status."""
    if not per_rank:
        return {"status": "failed", "error": "no rank wrote a result", "step_ms": []}
    ranks = sorted(per_rank)
    first = per_rank[ranks[0]]
    bad = next((r for r in ranks if per_rank[r].get("status") != "ok"), None)
    out: dict[str, Any] = dict(first)
    if bad is not None:
        worst = per_rank[bad]
        out["status"] = worst.get("status") or "failed"
        out["error"] = f"rank {bad}: {worst.get('error') or 'no result'}"
    series = [list(per_rank[r].get("step_ms") or []) for r in ranks]
    steps = min(len(s) for s in series)
    out["step_ms"] = [max(s[i] for s in series) for i in range(steps)]
    out["losses"] = [
        {**loss, "rank": r}
        for r in ranks
        for loss in (per_rank[r].get("losses") or [])
        if isinstance(loss, dict)
    ]
    out["steps_seen"] = min(int(per_rank[r].get("steps_seen") or 0) for r in ranks)
    out["world_size"] = len(ranks)
    out["ranks"] = {
        str(r): {
            "status": per_rank[r].get("status"),
            "error": per_rank[r].get("error"),
            "step_ms": per_rank[r].get("step_ms") or [],
        }
        for r in ranks
    }
    return out


def _gpus() -> int:
    """CUDA devices this machine shows (0 without torch or CUDA)."""
    try:
        import torch
    except ImportError:
        return 0
    try:
        return int(torch.cuda.device_count())
    except Exception:  # a broken driver counts as none
        return 0
