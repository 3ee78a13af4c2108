"""NVTX ranges of an Nsight Systems export, as the cpu rows of ``tables.Timeline``.

PyTorch op ranges (``nsys profile --pytorch=autograd-nvtx`` or
``torch.autograd.profiler.emit_nvtx``) are named ``aten::mul, seq = 7, op_id = 12`` (and
``, sizes = [[…]]`` with ``record_shapes=True``); they become ``cpu_op`` rows named
``aten::mul`` with ``seq`` and ``dims``. Other ranges (``kerneltriage.step``, NCCL's
``ncclSend``, the user's own) become ``user_annotation`` rows.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import orjson
import pandas as pd

from kerneltriage.ingest.tables import CPU_COLUMNS, frame

PROFILE_HINT = "capture with `nsys profile -t cuda,nvtx --pytorch=autograd-nvtx`"
NVTX = "NVTX_EVENTS"
STRINGS = "StringIds"

# NVTX event types that are ranges with an end (push/pop, start/end; "Nvtxt" are the
# NVTX-text variants), by their ENUM_NSYS_EVENT_TYPE names and, without that table, their ids.
_RANGE_TYPES = ("NvtxPushPopRange", "NvtxStartEndRange", "NvtxtPushPopRange", "NvtxtStartEndRange")
_RANGE_TYPE_IDS = (59, 60, 70, 71)

# What emit_nvtx appends to a RecordFunction's name, in this order (torch/csrc/profiler).
_SEQ = ", seq = "
_OP_ID = ", op_id = "
_SIZES = ", sizes = "
_INPUT_OP_IDS = ", input_op_ids = "

# A PyTorch op or autograd function name: aten::mul, c10d::allreduce_, FlashAttnFunc,
# autograd::engine::evaluate_function: MmBackward0. Not record_function scopes such as
# "ProfilerStep#3", "nccl:all_reduce", "FSDP::pre_forward (layers.0)", "Optimizer.step#…".
_OP_NAME = re.compile(r"^(?:autograd::engine::evaluate_function: \S+|[A-Za-z_]\w*(?:::[A-Za-z_]\w*)*)$")
_OP_PREFIX = re.compile(r"^(?:aten|autograd|prim|c10d|torch)::")
_USER_SCOPE = re.compile(r"^(?:FSDP::|DDP::|ProfilerStep#|Optimizer\.|kerneltriage\.)")


def read_ranges(reader: Any, pids: set[int] | None) -> pd.DataFrame | None:
    """The export's NVTX ranges of processes ``pids`` (all: None), emit_nvtx's suffixes split
    off in SQL; None, with a warning, when it has none. ``reader``: the export (``nsys``'s
    reader: its tables, columns, queries and warnings)."""
    t = NVTX
    if t not in reader.tables:
        reader.warnings.append(
            f"the export has no NVTX ranges: kernels cannot be attributed to ops; {PROFILE_HINT}"
        )
        return None
    cols = reader.cols(t)
    if not {"start", "end"} <= cols or not {"text", "textId"} & cols:
        reader.warnings.append(
            f"{t} lacks start/end/text columns (export {reader.schema}): NVTX ranges left out"
        )
        return None
    if "textId" in cols and STRINGS in reader.tables:
        text = "COALESCE(t.text, s.value)" if "text" in cols else "s.value"
        join = f"LEFT JOIN {STRINGS} AS s ON s.id = t.textId"
    else:
        text, join = "t.text", ""
    filters = ['t."end" IS NOT NULL', 't."end" >= t."start"']
    if "eventType" in cols:
        ids = list(_RANGE_TYPE_IDS)
        if {"id", "name"} <= reader.cols("ENUM_NSYS_EVENT_TYPE"):
            marks = ",".join("?" * len(_RANGE_TYPES))
            found = reader.query(f"SELECT id FROM ENUM_NSYS_EVENT_TYPE WHERE name IN ({marks})", _RANGE_TYPES)
            ids = [int(r[0]) for r in found] or ids
        filters.append(f"t.eventType IN ({','.join(map(str, ids))})")
    if "globalTid" in cols:
        pid, tid = reader.thread_sql("t.globalTid")
        if pids is not None:
            filters.append(f"{pid} IN ({','.join(str(int(p)) for p in sorted(pids))})")
    else:
        reader.warnings.append(f"{t} has no globalTid column: NVTX ranges cannot be placed on threads")
        pid = tid = "-1"
    # emit_nvtx's suffixes are split off in SQL, so only the short op name reaches Python.
    sql = f"""
        WITH r AS (
            SELECT t."start" AS start, t."end" - t."start" AS dur, COALESCE({pid}, -1) AS pid,
                   COALESCE({tid}, -1) AS tid, {text} AS x
            FROM {t} AS t {join}
            WHERE {" AND ".join(filters)}
        ), p AS (
            SELECT start, dur, pid, tid, x,
                   instr(x, '{_SEQ}') AS iseq, instr(x, '{_OP_ID}') AS iop, instr(x, '{_SIZES}') AS isz
            FROM r WHERE x IS NOT NULL
        )
        SELECT start, dur, pid, tid,
               CASE WHEN iseq > 0 THEN substr(x, 1, iseq - 1)
                    WHEN iop > 0 THEN substr(x, 1, iop - 1)
                    WHEN isz > 0 THEN substr(x, 1, isz - 1)
                    ELSE x END,
               CASE WHEN iseq > 0 THEN CAST(substr(x, iseq + {len(_SEQ)}) AS INTEGER) ELSE -1 END,
               iseq > 0 OR iop > 0,
               CASE WHEN isz > 0 THEN substr(x, isz + {len(_SIZES)}) END
        FROM p
    """
    spec = {
        "start": "int64",
        "dur": "int64",
        "pid": "int64",
        "tid": "int64",
        "name": "object",
        "seq": "int64",
        "emitted": "bool",
        "sizes": "object",
    }
    return pd.DataFrame(reader.columns(sql, spec))


def cpu_rows(nvtx: pd.DataFrame | None, warnings: list[str]) -> tuple[pd.DataFrame, list[Any]]:
    """NVTX ranges → cpu rows (``cpu_op`` for PyTorch op ranges, else ``user_annotation``)."""
    if nvtx is None or nvtx.empty:
        if nvtx is not None:
            warnings.append(
                f"no NVTX ranges for this process: kernels cannot be attributed to ops; {PROFILE_HINT}"
            )
        return frame({}, CPU_COLUMNS), []
    names = nvtx["name"]
    codes, uniques = pd.factorize(names)
    op_like = np.array([bool(_OP_NAME.match(n)) and not _USER_SCOPE.match(n) for n in uniques], dtype=bool)
    prefixed = np.array([bool(_OP_PREFIX.match(n)) for n in uniques], dtype=bool)
    emitted = nvtx["emitted"].to_numpy()
    is_op = op_like[codes] & (emitted | prefixed[codes])
    cat = np.where(is_op, "cpu_op", "user_annotation")

    keep = ~_duplicate_annotations(nvtx, is_op)

    args: list[Any] = []
    dims = np.full(len(nvtx), -1, dtype=np.int64)
    sizes = nvtx["sizes"]
    has_sizes = sizes.notna().to_numpy()
    if has_sizes.any():
        index: dict[str, int] = {}
        bad = 0
        for i in np.flatnonzero(has_sizes).tolist():
            text = sizes.iat[i]
            cut = text.find(_INPUT_OP_IDS)
            key = text[:cut] if cut >= 0 else text
            j = index.get(key)
            if j is None:
                try:
                    value = orjson.loads(key)
                except orjson.JSONDecodeError:
                    bad += 1
                    continue
                j = index[key] = len(args)
                args.append(value)
            dims[i] = j
        if bad:
            warnings.append(f"{bad} NVTX op range(s) carry a 'sizes = …' list that could not be parsed")
    elif is_op.any():
        warnings.append(
            "the PyTorch op ranges carry no input shapes (capture with `nsys profile "
            "--pytorch=autograd-shapes-nvtx` to record them): no shape-based roofline estimates, and shape "
            "stability can only be judged from launch configuration (grid/block)"
        )
    if not is_op.any():
        warnings.append(
            f"no PyTorch op ranges in the NVTX data (aten::…, op_id = …): kernels are attributed to "
            f"annotations and kernel names only; {PROFILE_HINT}"
        )
    seq = np.where(is_op, nvtx["seq"].to_numpy(), -1)
    columns = {
        "name": names.to_numpy()[keep],
        "cat": cat.astype(object)[keep],
        "start": nvtx["start"].to_numpy()[keep],
        "dur": nvtx["dur"].to_numpy()[keep],
        "pid": nvtx["pid"].to_numpy()[keep],
        "tid": nvtx["tid"].to_numpy()[keep],
        "ext_id": np.full(int(keep.sum()), -1, dtype=np.int64),
        "seq": seq[keep],
        "dims": dims[keep],
        "finished": np.ones(int(keep.sum()), dtype=bool),
    }
    cpu = frame(columns, CPU_COLUMNS)
    order = np.lexsort((-cpu["dur"].to_numpy(), cpu["start"].to_numpy()))
    return cpu.iloc[order].reset_index(drop=True), args


def _duplicate_annotations(nvtx: pd.DataFrame, is_op: np.ndarray) -> np.ndarray:
    """Annotations recorded twice: ``kerneltriage.step()`` pushes an NVTX range and opens a
    record_function, which emit_nvtx turns into a second range of the same name inside the
    first. Marks the inner (emitted) copy of such pairs."""
    out = np.zeros(len(nvtx), dtype=bool)
    emitted = nvtx["emitted"].to_numpy()
    inner_mask = emitted & ~is_op
    outer_mask = ~emitted & ~is_op
    if not inner_mask.any() or not outer_mask.any():
        return out
    cols = ["start", "dur", "pid", "tid", "name"]
    inner = nvtx.loc[inner_mask, cols].assign(row=np.flatnonzero(inner_mask))
    outer = nvtx.loc[outer_mask, cols].rename(columns={"start": "o_start", "dur": "o_dur"})
    outer["start"] = outer["o_start"]
    inner = inner.sort_values("start")
    outer = outer.sort_values("start")
    inner["name"] = inner["name"].astype(str)
    outer["name"] = outer["name"].astype(str)
    merged = pd.merge_asof(inner, outer, on="start", by=["pid", "tid", "name"], direction="backward")
    hit = merged["o_start"].notna() & (merged["o_start"] + merged["o_dur"] >= merged["start"] + merged["dur"])
    out[merged.loc[hit, "row"].to_numpy(dtype=np.int64)] = True
    return out
