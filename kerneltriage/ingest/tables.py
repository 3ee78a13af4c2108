"""Typed tables shared by every timeline reader.

Times are integer nanoseconds on the profiler's clock; durations too. Each table is a pandas
DataFrame with exactly the columns listed here (readers build them through ``frame``), so the
analysis layer never guesses a column name.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

#: GPU activity: kernels, memcpy and memset. ``kind`` is "kernel", "memcpy" or "memset".
KERNEL_COLUMNS: dict[str, str] = {
    "name": "object",
    "kind": "object",
    "device": "int32",
    "stream": "int64",
    "start": "int64",
    "dur": "int64",
    "correlation": "int64",
    "grid_x": "int32",
    "grid_y": "int32",
    "grid_z": "int32",
    "block_x": "int32",
    "block_y": "int32",
    "block_z": "int32",
    "registers": "int32",
    "shared_mem": "int64",
    "bytes": "int64",
    "pid": "int64",
}

#: A kernel's launch configuration: its grid and block, the columns of ``KERNEL_COLUMNS``
#: that say it (a kernel row, a counter row, a launch are told apart by name and these).
LAUNCH_CONFIG: list[str] = ["grid_x", "grid_y", "grid_z", "block_x", "block_y", "block_z"]

#: CUDA runtime/driver calls. ``ext_id`` links to the cpu op that made the call (-1: none).
RUNTIME_COLUMNS: dict[str, str] = {
    "name": "object",
    "start": "int64",
    "dur": "int64",
    "pid": "int64",
    "tid": "int64",
    "correlation": "int64",
    "ext_id": "int64",
}

#: CPU-side ranges: aten/autograd ops (``cat`` "cpu_op") and annotations (``cat``
#: "user_annotation": record_function / NVTX ranges such as ProfilerStep#N or module paths).
#: ``dims``/``types``/``strides``/``concrete`` index ``Timeline.args`` (-1: not recorded).
CPU_COLUMNS: dict[str, str] = {
    "name": "object",
    "cat": "object",
    "start": "int64",
    "dur": "int64",
    "pid": "int64",
    "tid": "int64",
    "ext_id": "int64",
    "seq": "int64",
    "dims": "int64",
    "types": "int64",
    "strides": "int64",
    "concrete": "int64",
    "finished": "bool",
}

#: GPU-side projections of annotations (Kineto's gpu_user_annotation).
GPU_ANNOTATION_COLUMNS: dict[str, str] = {
    "name": "object",
    "start": "int64",
    "dur": "int64",
    "device": "int32",
    "ext_id": "int64",
}


#: The text columns' dtype: pandas' ``str``, its values kept as Python strings. The readers
#: intern names, so a million rows of one kernel share one string; pyarrow's storage (pandas'
#: default when it is installed) would copy every name into the table (0.14 GB of kernel
#: names for a 1 GB trace) and again into every row selection.
TEXT = pd.StringDtype("python", na_value=np.nan)


def frame(columns: Mapping[str, list[Any] | np.ndarray], spec: dict[str, str]) -> pd.DataFrame:
    """Build a DataFrame with exactly ``spec``'s columns and dtypes (missing columns → empty;
    ``object`` columns hold text, as ``TEXT``)."""
    n = len(next(iter(columns.values()))) if columns else 0
    data = {}
    for name, dtype in spec.items():
        values = columns.get(name)
        if values is None:
            values = [None if dtype == "object" else (False if dtype == "bool" else -1)] * n
        if dtype == "object":
            array = np.empty(n, dtype=object)
            array[:] = values
            data[name] = pd.array(array, dtype=TEXT)
        else:
            data[name] = np.asarray(values, dtype=dtype)
    # The columns are the table's own: no copy of them into one block (a second 100 MB for a
    # million rows, and a pass over it).
    return pd.DataFrame(data, columns=list(spec), copy=False)


def int_array(values: list[Any], default: int = -1) -> np.ndarray:
    """An int64 column of JSON values: ``default`` for None and for what ``int()`` refuses."""
    try:
        return np.array([default if v is None else v for v in values], dtype=np.int64)
    except (TypeError, ValueError, OverflowError):
        return np.array([_int(v, default) for v in values], dtype=np.int64)


def _int(value: Any, default: int = -1) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


@dataclass
class Timeline:
    """One process's profile: what ran on the GPU, what launched it, and what the CPU did.

    ``args`` is an interning table: the same shape list recorded by a million ops is stored
    once, and ops refer to it by index (``json`` text, parsed on demand by ``arg``).
    """

    source: str
    format: str  # "kineto" or "nsys"
    kernels: pd.DataFrame
    runtime: pd.DataFrame
    cpu: pd.DataFrame
    gpu_annotations: pd.DataFrame
    device_properties: list[dict[str, Any]] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)
    args: list[Any] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    rank: int | None = None

    def arg(self, index: int) -> Any:
        """The recorded argument list behind an interned index (None when not recorded)."""
        return None if index < 0 else self.args[index]

    @property
    def gpu_properties(self) -> dict[str, Any] | None:
        """The full deviceProperties entry (Kineto's keys: name, computeMajor/Minor, numSms,
        totalGlobalMem, warpSize, …) of the device most kernels ran on; None without any.

        ROCm traces number kernel devices apart from deviceProperties ids (kernels on device 2
        or 9, properties with id 0 only), so without an entry of that id the first one is used.
        """
        props = [p for p in self.device_properties if isinstance(p, dict)]
        if not props:
            return None
        if not self.kernels.empty:
            device = int(self.kernels["device"].value_counts().idxmax())
            for p in props:
                if p.get("id") == device:
                    return p
        return props[0]

    @property
    def gpu_name(self) -> str | None:
        """The GPU's name: its properties entry's, else any entry's (None when all are empty)."""
        own = self.gpu_properties
        if own and own.get("name"):
            return str(own["name"])
        for props in self.device_properties:
            if props.get("name"):
                return str(props["name"])
        return None
