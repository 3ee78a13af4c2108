"""The run directory: what ``profile`` writes and ``report`` reads. Versioned, in one place.

Layout of schema ``kerneltriage.run/1``::

    RUN/
      manifest.json        this module's Manifest: command, GPU, versions, schedule, phases, status,
                           warnings for the report
      trace.json.gz        PyTorch profiler (Kineto) chrome trace of the recorded steps
      trace.rank{N}.json.gz  one per rank instead, for multi-process (torchrun) runs
      timeline.sqlite      instead of a trace: an Nsight Systems export (profile --timeline nsys)
      ncu.csv.gz           optional: ``ncu --import ncu.ncu-rep --csv --page raw`` (one launch per
                           unique kernel/grid/block of the profiled step)
      ncu.launches.csv.gz  optional: every launch of the kernels whose one configuration runs
                           several problem sizes (persistent GEMMs), from a second ncu pass
      ncu.ncu-rep          optional: the Nsight Compute report (open it in the GUI)
      regions.jsonl        optional: one JSON object per module signature (path, class, shapes)
      logs/                stdout/stderr of each phase, per-process status, the shapes step's trace

Only ``manifest.json`` and a trace are required. Every other file is optional and the report
says what it used.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from kerneltriage.errors import RunDirError

SCHEMA = "kerneltriage.run/1"
MANIFEST = "manifest.json"
TRACE = "trace.json.gz"
TRACE_RANK_GLOB = "trace.rank*.json.gz"
TRACE_NSYS = "timeline.sqlite"
NCU_CSV = "ncu.csv.gz"
NCU_LAUNCHES_CSV = "ncu.launches.csv.gz"
NCU_REP = "ncu.ncu-rep"
REGIONS = "regions.jsonl"
LOGS = "logs"

_RANK_RE = re.compile(r"trace\.rank(\d+)\.json\.gz$")


@dataclass
class Manifest:
    """Everything about how a run was made. Unknown keys in a file are kept in ``extra``."""

    schema: str = SCHEMA
    kerneltriage_version: str = ""
    created: str = ""
    command: list[str] = field(default_factory=list)
    cwd: str = ""
    env: dict[str, str] = field(default_factory=dict)
    gpu: dict[str, Any] = field(default_factory=dict)
    versions: dict[str, str] = field(default_factory=dict)
    schedule: dict[str, Any] = field(default_factory=dict)
    phases: dict[str, Any] = field(default_factory=dict)
    calibration: dict[str, Any] = field(default_factory=dict)
    status: str = "ok"
    exit_code: int | None = None
    ranks: list[int] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    #: What the report must repeat about how the run was measured (the profiler's overhead on
    #: the step time, hot kernels left without counters and why); a subset of ``notes``.
    warnings: list[str] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        extra = data.pop("extra")
        data.update(extra)
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Manifest:
        known = {f for f in cls.__dataclass_fields__ if f != "extra"}
        kwargs = {k: v for k, v in data.items() if k in known}
        extra = {k: v for k, v in data.items() if k not in known}
        return cls(**kwargs, extra=extra)


@dataclass
class RunDir:
    """A run directory on disk and the files it holds."""

    path: Path
    manifest: Manifest
    traces: dict[int, Path]  # rank -> trace file; rank 0 for a single-process run
    ncu_csv: Path | None
    ncu_launches_csv: Path | None
    ncu_rep: Path | None
    regions: Path | None

    @property
    def trace(self) -> Path:
        return self.traces[min(self.traces)]


def is_run_dir(path: Path) -> bool:
    # exists(), not is_file(): a manifest.json that cannot be read is an error, not a trace folder.
    return path.is_dir() and (path / MANIFEST).exists()


def read_manifest(path: Path) -> Manifest:
    from kerneltriage.inputs import read_text

    file = path / MANIFEST
    if not os.path.lexists(file):
        raise RunDirError("no manifest.json: not a kerneltriage run directory", path=str(path))
    text = read_text(file, "manifest", RunDirError)  # a directory, a pipe, not UTF-8: refused
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise RunDirError(f"manifest.json is not valid JSON ({exc})", path=str(path)) from None
    except RecursionError:
        raise RunDirError("manifest.json is nested too deeply to be a manifest", path=str(path)) from None
    if not isinstance(data, dict):
        raise RunDirError("manifest.json is not a JSON object", path=str(path))
    schema = data.get("schema", "")
    if not str(schema).startswith("kerneltriage.run/"):
        raise RunDirError(f"manifest.json has schema {schema!r}, expected {SCHEMA!r}", path=str(path))
    if schema != SCHEMA:
        raise RunDirError(
            f"run directory schema {schema!r} is not supported by this kerneltriage ({SCHEMA})",
            path=str(path),
        )
    from kerneltriage.ingest.schemas import validate_manifest  # pydantic: only when a run is read

    validate_manifest(data, str(path))
    return Manifest.from_json(data)


def open_run(path: str | os.PathLike[str]) -> RunDir:
    """Read a run directory's manifest and locate its files."""
    root = Path(path)
    if not root.exists():
        raise RunDirError("no such file or directory", path=str(root))
    if not root.is_dir():
        raise RunDirError("not a directory", path=str(root))
    manifest = read_manifest(root)
    traces: dict[int, Path] = {}
    for file in sorted(root.glob(TRACE_RANK_GLOB)):
        match = _RANK_RE.search(file.name)
        if match:
            traces[int(match.group(1))] = file
    if (root / TRACE).is_file():
        traces.setdefault(0, root / TRACE)
    elif not traces and (root / TRACE_NSYS).is_file():
        traces[0] = root / TRACE_NSYS
    if not traces:
        hint = f"the run's status is {manifest.status!r}" if manifest.status != "ok" else None
        raise RunDirError(f"no {TRACE} in the run directory", path=str(root), hint=hint)
    return RunDir(
        path=root,
        manifest=manifest,
        traces=traces,
        ncu_csv=_optional(root / NCU_CSV),
        ncu_launches_csv=_optional(root / NCU_LAUNCHES_CSV),
        ncu_rep=_optional(root / NCU_REP),
        regions=_optional(root / REGIONS),
    )


def write_manifest(path: Path, manifest: Manifest) -> None:
    """Write atomically: a run interrupted mid-write keeps its previous manifest."""
    path.mkdir(parents=True, exist_ok=True)
    tmp = path / (MANIFEST + ".tmp")
    tmp.write_text(json.dumps(manifest.to_json(), indent=2, sort_keys=False) + "\n")
    os.replace(tmp, path / MANIFEST)


def _optional(file: Path) -> Path | None:
    return file if file.is_file() else None
