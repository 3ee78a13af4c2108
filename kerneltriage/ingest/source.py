"""Open what the user points ``report`` at: a run directory, a folder of per-rank traces, or a
trace file plus counters.

A run directory is read through ``rundir``; a bare trace (``.json``/``.json.gz`` Kineto trace,
``.sqlite``/``.nsys-rep`` Nsight Systems export) and an optional ``--ncu`` file work too.

A folder without ``manifest.json`` is read as one trace per rank (any names: ``.json``,
``.json.gz``, ``.pt.trace.json.gz``). A file's rank is its trace's ``distributedInfo.rank``,
else a rank in its name (``rank-0``, ``rank0``, ``_rank_1``, ``worker1``), else the next free
rank in sorted file-name order, with a warning. Two files that claim the same rank are not
ranks of one job but separate captures (two runs of a single-process script, say): the folder
is refused with one line that names them, and the user reports one file at a time. Stitching
them into a cross-rank summary would compare unrelated runs as if one were a straggler.
"""

from __future__ import annotations

import gzip
import itertools
import json
import os
import re
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kerneltriage import rundir
from kerneltriage.errors import InputError, RunDirError, TraceFormatError
from kerneltriage.ingest.kineto import read_trace
from kerneltriage.ingest.ncu_csv import Counters, merge_counters, read_counters
from kerneltriage.ingest.schemas import read_regions
from kerneltriage.ingest.tables import Timeline
from kerneltriage.inputs import check_file, is_directory


@dataclass
class LoadedProfile:
    """Everything read from disk for one report."""

    timelines: dict[int, Timeline]  # rank -> timeline (rank 0 for one process)
    counters: Counters | None
    manifest: rundir.Manifest | None
    run_dir: Path | None
    regions: list[dict[str, Any]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    # rank -> its trace file, for every rank asked for (read or not: ``read_traces=False``)
    trace_files: dict[int, Path] = field(default_factory=dict)

    @property
    def timeline(self) -> Timeline:
        return self.timelines[min(self.timelines)]

    @property
    def counters_rank(self) -> int:
        """The rank ncu profiled (``--ncu-rank``; the first rank when the manifest does not say)."""
        if self.manifest and self.manifest.schedule.ncu_rank is not None:
            return self.manifest.schedule.ncu_rank
        return min(self.timelines or self.trace_files)

    @property
    def default_rank(self) -> int:
        """The rank one report is of when none is named: the only one, else the rank ncu
        profiled (the one with counters) when it is held, else the first."""
        ranks = sorted(self.timelines or self.trace_files)
        if len(ranks) == 1:
            return ranks[0]
        return self.counters_rank if self.counters_rank in ranks else ranks[0]

    @property
    def hot_kernels(self) -> list[str] | None:
        """Base names phase 2 was asked to profile (None for counters not made by ``profile``)."""
        if self.manifest is None:
            return None
        ncu = self.manifest.phases.ncu
        return list(ncu.kernels) if ncu and ncu.kernels else None

    @property
    def tensor_precisions(self) -> list[str] | None:
        """The tensor-core precisions phase 2 counted (None: every one, or not ``profile``'s)."""
        ncu = self.manifest.phases.ncu if self.manifest is not None else None
        return list(ncu.tensor_precisions) if ncu and ncu.tensor_precisions is not None else None

    def step_timing(self, rank: int) -> dict[str, Any] | None:
        """``profile``'s timing of ``rank`` (``phases.timeline.step_time``: plain, clean and
        recorded steps) when it has plain steps and clean steps; else None (older runs, and
        runs stopped before them: the report then times the recorded steps)."""
        if self.manifest is None:
            return None
        timeline = self.manifest.phases.timeline
        timing = timeline.step_time if timeline else None
        if timing is None or not timing.plain_median_ms or "clean_ms" not in timing.model_fields_set:
            return None
        return timing.to_json() if timing.rank == rank else None

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
            timeline = self.manifest.phases.timeline
            dynamo = ((timeline.dynamo if timeline else None) or {}).get("plain")
            if dynamo:
                # Dynamo's own counts after the plain steps, before any profiler or hook ran.
                info["dynamo"] = dynamo
            if self.manifest.applied_fixes:  # profile --apply: the fixes, and the run before them
                info["applied_fixes"] = [f.to_json() for f in self.manifest.applied_fixes]
                info["parent_run"] = self.manifest.parent_run
        return info


# A rank in a trace's file name: sampled_rank-0, rank0, graph_capture_rank_1., trace.rank2,
# worker3 (the TensorBoard plugin's worker names).
_RANK_IN_NAME = re.compile(r"(?:^|[^a-z0-9])(?:rank|worker)[-_.]?(\d+)(?![0-9])", re.IGNORECASE)
_DIST_INFO = b'"distributedInfo"'
_EVENTS_KEY = b'"traceEvents"'
_PEEK_BYTES = 1 << 20


def _is_nsys(path: Path) -> bool:
    return path.suffix in (".sqlite", ".nsys-rep", ".qdrep")


def read_timeline(path: Path) -> Timeline:
    if _is_nsys(path):
        from kerneltriage.ingest.nsys import read_nsys  # only needed for Nsight Systems input

        return read_nsys(path)
    return read_trace(path)


def load_profile(
    path: str | os.PathLike[str],
    ncu: str | os.PathLike[str] | None = None,
    ranks: list[int] | None = None,
    progress: Callable[[str], None] | None = None,
    *,
    read_traces: bool = True,
) -> LoadedProfile:
    """Read a run directory or a trace file (and counters) from disk. ``read_traces=False``
    (run directories and folders of Kineto traces): everything but the timelines, which stay
    empty, with ``trace_files`` naming each rank's file (``kerneltriage.parallel`` reads them)."""
    path = Path(path)
    say = progress or (lambda _msg: None)
    if not is_directory(path):
        if not os.path.lexists(path) and len(path.name) < 255:
            raise InputError("no such file or directory", path=str(path))
        # A named pipe or device (a read would block or never end), a name too long.
        check_file(path, "trace file", TraceFormatError)
    if path.is_dir() and not rundir.is_run_dir(path):
        return _load_trace_folder(path, ncu, ranks, say, read_traces)
    if path.is_dir():
        return _load_run_dir(path, ncu, ranks, say, read_traces)
    return _load_trace_file(path, ncu, ranks, say)


def _load_run_dir(
    path: Path,
    ncu: str | os.PathLike[str] | None,
    ranks: list[int] | None,
    say: Callable[[str], None],
    read_traces: bool,
) -> LoadedProfile:
    """A run directory: its manifest, the traces of ``ranks`` (all by default), its counters
    (or ``ncu``'s), its module signatures, and what the manifest says the report must repeat."""
    run = rundir.open_run(path)
    stray = _drop_stray_traces(run)
    timelines = _run_timelines(run, ranks, say, read_traces)
    wanted = sorted(run.traces) if ranks is None else ranks
    # Every-launch captures join first (exact per launch), then one launch per configuration.
    paths = [Path(ncu)] if ncu else [p for p in (run.ncu_launches_csv, run.ncu_csv) if p is not None]
    counters = None
    if paths:
        parts = []
        ncu_phase = run.manifest.phases.ncu
        first_of_size = ncu_phase is not None and ncu_phase.variable_selection == "first-of-size"
        for counters_path in paths:
            say(f"reading {counters_path.name}")
            part = read_counters(counters_path)
            if first_of_size and not ncu and counters_path == run.ncu_launches_csv:
                part.first_of_size = frozenset({0})
            parts.append(part)
        counters = merge_counters(parts)
        if not ncu and ncu_phase is not None and ncu_phase.kernel_instances:
            counters.hot_instances = dict(ncu_phase.kernel_instances)
        if not ncu and ncu_phase is not None and ncu_phase.scaled_kernels:
            counters.scaled_kernels = frozenset(ncu_phase.scaled_kernels)
    profile = LoadedProfile(timelines, counters, run.manifest, path)
    profile.trace_files = {r: run.traces[r] for r in wanted}
    # What profile measured about itself (overhead above 5%, counters it could not take).
    profile.warnings.extend(run.manifest.warnings)
    if run.regions:
        profile.regions = read_regions(run.regions, profile.warnings)
    profile.warnings.extend(_run_warnings(run))
    profile.warnings.extend(stray)
    return profile


def _drop_stray_traces(run: rundir.RunDir) -> list[str]:
    """Rank traces the manifest does not list (``ranks``): files of another run left beside
    this one. They are left out, with a warning naming them; a manifest that lists no rank
    present keeps them all (the run's own record is then wrong, and ``_run_warnings`` says so)."""
    listed = set(run.manifest.ranks)
    stray = sorted(r for r in run.traces if r not in listed)
    if not listed or not stray or len(stray) == len(run.traces):
        return []
    names = ", ".join(run.traces[r].name for r in stray)
    for r in stray:
        del run.traces[r]
    return [
        f"stray trace(s) {names}: rank(s) {', '.join(map(str, stray))} are not among the ranks the "
        f"manifest recorded ({', '.join(map(str, sorted(listed)))}); left out (from another run?)"
    ]


def _run_timelines(
    run: rundir.RunDir, ranks: list[int] | None, say: Callable[[str], None], read_traces: bool
) -> dict[int, Timeline]:
    """The timelines of ``ranks`` (all the run's by default; none unless ``read_traces``, but
    for an Nsight Systems export, read whole). ``run.traces`` names each rank's file after."""
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
            path=str(run.path),
        )
    timelines = {}
    for r in wanted if read_traces or preloaded else []:
        if r in preloaded:
            timelines[r] = preloaded[r]
            continue
        say(f"reading {run.traces[r].name}")
        timelines[r] = read_timeline(run.traces[r])
        timelines[r].rank = r
    return timelines


def _run_warnings(run: rundir.RunDir) -> list[str]:
    """What the report must say about the run as a whole: an ncu rank with no trace (its
    counters then go to the first rank), ranks missing, a run that did not finish."""
    out = []
    ncu_rank = run.manifest.schedule.ncu_rank
    if ncu_rank is not None and ncu_rank not in run.traces:
        run.manifest.schedule.ncu_rank = None  # this copy: the counters go to the first rank
        out.append(
            f"the manifest's ncu_rank {ncu_rank} names no trace of the run (it has rank(s) "
            f"{', '.join(map(str, sorted(run.traces)))}): its counters are joined to rank "
            f"{min(run.traces)} instead"
        )
    expected = run.manifest.ranks
    absent = sorted(set(expected) - set(run.traces)) if expected else []
    if absent:
        out.append(
            f"the run recorded ranks {expected} but traces of rank(s) {absent} are missing; "
            "reporting the ranks present"
        )
    timeline = run.manifest.phases.timeline
    timing = timeline.step_time if timeline else None
    if timing is not None and timing.plain_median_ms and timing.rank not in run.traces:
        out.append(
            f"the manifest's phases.timeline.step_time.rank {timing.rank} names no trace of the run "
            f"(it has rank(s) {', '.join(map(str, sorted(run.traces)))}): its plain step time is not "
            "used; the recorded steps are timed instead"
        )
    if run.manifest.status != "ok":
        out.append(f"the run's status is {run.manifest.status!r}: it may hold fewer steps than asked")
    return out


def _load_trace_file(
    path: Path, ncu: str | os.PathLike[str] | None, ranks: list[int] | None, say: Callable[[str], None]
) -> LoadedProfile:
    """One trace file (Kineto, or an Nsight Systems export of one or more devices) and ``ncu``."""
    if path.suffix not in (".json", ".gz", ".sqlite", ".nsys-rep", ".qdrep") and not path.name.endswith(
        ".json.gz"
    ):
        raise TraceFormatError(
            "unrecognised file type: expected a run directory, a Kineto trace (.json, .json.gz) "
            "or an Nsight Systems export (.sqlite, .nsys-rep)",
            path=str(path),
        )
    if _is_nsys(path):
        say(f"reading {path.name}")
        timelines = _read_nsys_ranks(path, ranks)
    else:
        # Check --rank against the file's own rank before reading all of it.
        claimed, _ = _peek_rank(path)
        if claimed is not None and ranks is not None:
            _check_ranks(ranks, [claimed], path, "the trace")
        say(f"reading {path.name}")
        timeline = read_timeline(path)
        # distributedInfo (wherever in the file), else a rank in the name, else 0.
        for found in (claimed, timeline.rank, _rank_from_name(path.name)):
            if found is not None:
                timeline.rank = rank = found
                break
        else:
            rank = 0  # a single-process trace: rank 0, though it names none
        if ranks is not None:
            _check_ranks(ranks, [rank], path, "the trace")
        timelines = {rank: timeline}
    counters = None
    if ncu:
        say(f"reading {Path(ncu).name}")
        counters = read_counters(ncu)
    return LoadedProfile(timelines, counters, None, None)


def _check_ranks(wanted: list[int], present: list[int], path: Path, what: str) -> None:
    missing = [r for r in wanted if r not in present]
    if missing:
        have = ", ".join(map(str, sorted(present)))
        have = f"rank {have}" if len(present) == 1 else f"ranks {have}"
        raise InputError(
            f"rank(s) {', '.join(map(str, missing))} not in {what} (it has {have})", path=str(path)
        )


def _is_trace_name(name: str) -> bool:
    return name.endswith((".json", ".json.gz")) and name != rundir.MANIFEST and not name.startswith(".")


def _rank_from_name(name: str) -> int | None:
    found = _RANK_IN_NAME.findall(name)
    return int(found[-1]) if found else None


def _peek_rank(path: Path | str, opener: Callable[..., Any] = open) -> tuple[int | None, bool]:
    """(``distributedInfo.rank``, whether the head of the file looks like a Kineto trace), read
    from the file's first MiB only. Kineto writes its metadata before ``traceEvents``.
    ``opener``: ``fsspec.open`` for a URL."""
    try:
        with opener(path, "rb") as raw:
            magic = raw.read(2)
            raw.seek(0)
            stream = gzip.GzipFile(fileobj=raw) if magic == b"\x1f\x8b" else raw
            head = stream.read(_PEEK_BYTES)
    except (OSError, EOFError, zlib.error):
        return None, True  # the full read reports what is wrong with the file
    events = head.find(_EVENTS_KEY)
    at = head.find(_DIST_INFO)
    if at < 0 or (0 <= events < at):
        return None, events >= 0
    brace = head.find(b"{", at)
    try:
        info, _ = json.JSONDecoder().raw_decode(head[brace:].decode("utf-8", "replace"))
    except ValueError:
        return None, events >= 0
    rank = info.get("rank") if isinstance(info, dict) else None
    try:
        return (int(rank) if rank is not None else None), True
    except (TypeError, ValueError):
        return None, True


def _load_trace_folder(
    path: Path,
    ncu: str | os.PathLike[str] | None,
    ranks: list[int] | None,
    say: Callable[[str], None],
    read_traces: bool = True,
) -> LoadedProfile:
    """A folder of Kineto traces, one per rank, without a manifest."""
    files = sorted(f for f in path.iterdir() if f.is_file() and _is_trace_name(f.name))
    traces, warnings = assign_ranks(files, _peek_rank, str(path))
    wanted = sorted(traces) if ranks is None else list(ranks)
    _check_ranks(wanted, list(traces), path, "the folder")
    timelines: dict[int, Timeline] = {}
    for r in wanted if read_traces else []:
        say(f"reading {traces[r].name}")
        timelines[r] = read_timeline(traces[r])
        timelines[r].rank = r
    counters = None
    if ncu:
        say(f"reading {Path(ncu).name}")
        counters = read_counters(ncu)
    profile = LoadedProfile(timelines, counters, None, path, warnings=warnings)
    profile.trace_files = {r: traces[r] for r in wanted}
    return profile


def assign_ranks(
    files: list[Any], peek: Callable[[Any], tuple[int | None, bool]], where: str
) -> tuple[dict[int, Any], list[str]]:
    """The rank of each trace of a folder (paths, or URLs with ``peek`` reading through fsspec):
    ``({rank: file}, warnings)``, as the module's docstring says."""
    warnings: list[str] = []
    claims: dict[Any, tuple[int | None, str]] = {}
    for f in files:
        rank, looks_like_trace = peek(f)
        if rank is not None:
            claims[f] = (rank, "distributedInfo")
        elif looks_like_trace or len(files) == 1:
            named = _rank_from_name(_name(f))
            claims[f] = (named, "file name") if named is not None else (None, "")
        else:
            warnings.append(f"{_name(f)}: not a PyTorch profiler trace (no traceEvents); skipped")
    if not claims:
        raise RunDirError(
            "neither a run directory (no manifest.json) nor a folder of traces "
            "(no .json, .json.gz or .pt.trace.json.gz file)",
            path=where,
        )
    by_rank: dict[int, list[Any]] = {}
    for f, (rank, _) in claims.items():
        if rank is not None:
            by_rank.setdefault(rank, []).append(f)
    unnamed = [f for f, (rank, _) in claims.items() if rank is None]
    clash = {r: fs for r, fs in by_rank.items() if len(fs) > 1}
    if not clash and len(unnamed) == 1 and len(claims) == 1:
        by_rank[0] = unnamed  # one trace with no rank: rank 0, as a bare file
        unnamed = []
    if clash:
        rank, fs = min(clash.items())
        why = claims[fs[0]][1]
        raise InputError(
            f"{len(fs)} traces claim rank {rank} (from their {why}): "
            f"{', '.join(_name(f) for f in fs)}; they are separate captures, not one trace per rank: "
            f"report one file at a time, e.g. kerneltriage report {fs[0]}",
            path=where,
        )
    if unnamed:
        free = (r for r in itertools.count() if r not in by_rank)
        numbered = [(f, next(free)) for f in unnamed]
        for f, r in numbered:
            by_rank[r] = [f]
        warnings.append(
            f"{len(unnamed)} trace(s) name no rank (no distributedInfo, no rank in the file name); "
            "numbered in file-name order: " + ", ".join(f"{_name(f)} → rank {r}" for f, r in numbered)
        )
    return {r: fs[0] for r, fs in sorted(by_rank.items())}, warnings


def _name(file: Any) -> str:
    """A path's or URL's last part."""
    return str(file).rstrip("/").rsplit("/", 1)[-1]


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
