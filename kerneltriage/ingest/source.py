"""Open what the user points ``report`` at: a run directory, or a trace file plus counters.

A run directory is read through ``rundir``; a bare trace (``.json``/``.json.gz`` Kineto trace,
``.sqlite``/``.nsys-rep`` Nsight Systems export) and an optional ``--ncu`` file work too.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kerneltriage import rundir
from kerneltriage.errors import InputError, TraceFormatError
from kerneltriage.ingest.kineto import read_trace
from kerneltriage.ingest.ncu_csv import Counters, merge_counters, read_counters
from kerneltriage.ingest.tables import Timeline


@dataclass
class Profile:
    """Everything read from disk for one report."""

    timelines: dict[int, Timeline]  # rank -> timeline (rank 0 for one process)
    counters: Counters | None
    manifest: rundir.Manifest | None
    run_dir: Path | None
    regions: list[dict[str, Any]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def timeline(self) -> Timeline:
        return self.timelines[min(self.timelines)]

    @property
    def counters_rank(self) -> int:
        """The rank ncu profiled (``--ncu-rank``; the first rank when the manifest does not say)."""
        if self.manifest and self.manifest.schedule.get("ncu_rank") is not None:
            return int(self.manifest.schedule["ncu_rank"])
        return min(self.timelines)

    @property
    def hot_kernels(self) -> list[str] | None:
        """Base names phase 2 was asked to profile (None for counters not made by ``profile``)."""
        if self.manifest is None:
            return None
        names = self.manifest.phases.get("ncu", {}).get("kernels")
        return list(names) if names else None

    def source_info(self) -> dict[str, Any]:
        info: dict[str, Any] = {
            "path": str(self.run_dir) if self.run_dir else self.timeline.source,
            "traces": {str(r): t.source for r, t in self.timelines.items()},
            "counters": self.counters.source if self.counters else None,
        }
        if self.manifest:
            info["command"] = self.manifest.command
            info["versions"] = self.manifest.versions
            info["status"] = self.manifest.status
        return info


def _is_nsys(path: Path) -> bool:
    return path.suffix in (".sqlite", ".nsys-rep", ".qdrep")


def read_timeline(path: Path) -> Timeline:
    if _is_nsys(path):
        from kerneltriage.ingest.nsys import read_nsys  # only needed for Nsight Systems input

        return read_nsys(path)
    return read_trace(path)


def load_profile(
    path: str | Path,
    ncu: str | Path | None = None,
    ranks: list[int] | None = None,
    progress: Callable[[str], None] | None = None,
) -> Profile:
    """Read a run directory or a trace file (and counters) from disk."""
    path = Path(path)
    say = progress or (lambda _msg: None)
    if not path.exists():
        raise InputError("no such file or directory", path=str(path))
    if path.is_dir():
        run = rundir.open_run(path)
        if run.trace.suffix == ".sqlite":
            # An Nsight Systems timeline: one export holds every device; each is a rank.
            from kerneltriage.ingest.nsys import read_nsys_all

            say(f"reading {run.trace.name}")
            every = read_nsys_all(run.trace)
            run.traces = dict.fromkeys(every, run.trace)
            preloaded = every
        else:
            preloaded = {}
        wanted = sorted(run.traces) if ranks is None else ranks
        missing = [r for r in wanted if r not in run.traces]
        if missing:
            raise InputError(
                f"rank(s) {', '.join(map(str, missing))} not in the run directory "
                f"(it has {', '.join(map(str, sorted(run.traces)))})",
                path=str(path),
            )
        timelines = {}
        for r in wanted:
            if r in preloaded:
                timelines[r] = preloaded[r]
                continue
            say(f"reading {run.traces[r].name}")
            timelines[r] = read_timeline(run.traces[r])
            timelines[r].rank = r
        # Every-launch captures join first (exact per launch), then one launch per configuration.
        paths = [Path(ncu)] if ncu else [p for p in (run.ncu_launches_csv, run.ncu_csv) if p is not None]
        counters = None
        if paths:
            parts = []
            for counters_path in paths:
                say(f"reading {counters_path.name}")
                parts.append(read_counters(counters_path))
            counters = merge_counters(parts)
        profile = Profile(timelines, counters, run.manifest, path)
        if run.regions:
            profile.regions = _read_regions(run.regions, profile.warnings)
        expected = run.manifest.ranks
        if expected and sorted(run.traces) != sorted(expected):
            absent = sorted(set(expected) - set(run.traces))
            profile.warnings.append(
                f"the run recorded ranks {expected} but traces of rank(s) {absent} are missing; "
                "reporting the ranks present"
            )
        if run.manifest.status != "ok":
            profile.warnings.append(
                f"the run's status is {run.manifest.status!r}: it may hold fewer steps than asked"
            )
        return profile
    if path.suffix not in (".json", ".gz", ".sqlite", ".nsys-rep", ".qdrep") and not path.name.endswith(
        ".json.gz"
    ):
        raise TraceFormatError(
            "unrecognised file type: expected a run directory, a Kineto trace (.json, .json.gz) "
            "or an Nsight Systems export (.sqlite, .nsys-rep)",
            path=str(path),
        )
    say(f"reading {path.name}")
    if _is_nsys(path):
        timelines = _read_nsys_ranks(path, ranks)
    else:
        timeline = read_timeline(path)
        timelines = {timeline.rank or 0: timeline}
    counters = None
    if ncu:
        say(f"reading {Path(ncu).name}")
        counters = read_counters(ncu)
    return Profile(timelines, counters, None, None)


def _read_nsys_ranks(path: Path, ranks: list[int] | None) -> dict[int, Timeline]:
    """An Nsight Systems export holds every process and GPU of the capture: one timeline per
    (process, device) pair with GPU work, as ranks 0..n-1 in device order."""
    from kerneltriage.ingest.nsys import read_nsys_all  # only needed for Nsight Systems input

    timelines = read_nsys_all(path)
    if ranks is None:
        return timelines
    missing = [r for r in ranks if r not in timelines]
    if missing:
        have = ", ".join(f"{r} (device {t.meta.get('device')})" for r, t in timelines.items())
        raise InputError(
            f"rank(s) {', '.join(map(str, missing))} not in the export (it has {have})", path=str(path)
        )
    return {r: timelines[r] for r in ranks}


def _read_regions(path: Path, warnings: list[str]) -> list[dict[str, Any]]:
    out = []
    for i, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            warnings.append(f"{path}: line {i} is not JSON; skipped")
    return out
