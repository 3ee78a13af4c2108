"""Schemas of what kerneltriage reads: ``regions.jsonl``, a Kineto
trace's metadata and its ops' recorded arguments (pydantic models).

What fails a schema is handled by how much it matters:

- ``manifest.json`` says how the run was made: its model is ``rundir.Manifest``; a field of
  the wrong type is refused with one line naming the field and the type expected
  (``RunDirError``, exit code 2), in the words of ``describe`` here.
- A line of ``regions.jsonl``, a Kineto metadata key (``deviceProperties``,
  ``distributedInfo``) or an op's argument list of the wrong shape is left out with a warning
  that says what was skipped; the report is made without it.

Per-event checks of a trace's millions of events are not here: ``kineto.py`` tests the few
fields it reads with ``type()`` in its own loop (a model per event would triple the parse), or
``kineto_typed`` has msgspec decode them into structs of those fields' types.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictInt,
    StrictStr,
    TypeAdapter,
    ValidationError,
)

from kerneltriage.errors import InputError
from kerneltriage.validation import describe

_Open = ConfigDict(extra="allow")  # a newer kerneltriage may add keys; they are kept, unread


# --- regions.jsonl --------------------------------------------------------------------------


class RegionLine(BaseModel):
    """One line of ``regions.jsonl``: a module signature recorded by ``profile``."""

    model_config = _Open
    path: StrictStr
    class_: StrictStr | None = Field(default=None, alias="class")
    inputs: list[dict[StrictStr, Any]] | None = None
    outputs: list[dict[StrictStr, Any]] | None = None
    param_bytes: StrictInt | None = Field(default=None, ge=0)
    calls: StrictInt | None = Field(default=None, ge=0)


def read_regions(path: Path, warnings: list[str]) -> list[dict[str, Any]]:
    """The lines of ``regions.jsonl`` that follow ``RegionLine``; the rest are skipped with one
    warning that counts them (the file is optional: it never stops a report)."""
    from kerneltriage.inputs import read_text

    try:
        text = read_text(path, "regions file")
    except InputError as exc:
        warnings.append(f"{exc}; module signatures skipped")
        return []
    out: list[dict[str, Any]] = []
    bad: list[str] = []
    for i, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
            RegionLine.model_validate(value)
        except (json.JSONDecodeError, RecursionError):
            bad.append(f"line {i} is not JSON (or nested too deeply)")
        except ValidationError as exc:
            bad.append(f"line {i}: {describe(exc)}")
        else:
            out.append(value)
    if bad:
        warnings.append(f"{path}: skipped {len(bad)} malformed line(s) ({bad[0]})")
    return out


# --- Kineto metadata and op arguments -----------------------------------------------------


class DistributedInfo(BaseModel):
    model_config = _Open
    rank: int | None = Field(default=None, ge=0)  # "1" reads as 1; "x", 1.5 or -1 do not


_DEVICE_PROPERTIES = TypeAdapter(list[Any])
_DISTRIBUTED = TypeAdapter(DistributedInfo)


def validate_trace_meta(meta: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """The trace's top-level keys with those of the wrong type left out, and a warning for each:
    ``deviceProperties`` a list (entries that are not mappings are dropped), ``distributedInfo``
    a mapping whose ``rank`` is an integer."""
    meta = dict(meta)
    warnings: list[str] = []
    props = meta.get("deviceProperties")
    if props is not None:
        try:
            props = _DEVICE_PROPERTIES.validate_python(props, strict=True)
        except ValidationError:
            warnings.append(f"deviceProperties is not a list ({type(props).__name__}); ignored")
            props = []
        kept = [p for p in props if isinstance(p, dict)]
        if len(kept) < len(props):
            warnings.append(f"skipped {len(props) - len(kept)} deviceProperties entries that are not objects")
        meta["deviceProperties"] = kept
    info = meta.get("distributedInfo")
    if info is not None:
        try:
            meta["distributedInfo"] = _DISTRIBUTED.validate_python(info).model_dump(exclude_unset=True)
        except ValidationError as exc:
            warnings.append(f"{describe(exc, 'distributedInfo')}; ignored")
            meta["distributedInfo"] = {}
    return meta, warnings


def _checker(shape: Any) -> Callable[[Any], bool]:
    adapter = TypeAdapter(shape)

    def valid(value: Any) -> bool:
        try:
            adapter.validate_python(value, strict=True)
        except ValidationError:
            return False
        return True

    return valid


_DIMS = list[list[StrictInt] | list[list[StrictInt]] | None]  # a tensor's sizes, or a list's
#: Elements of one tensor above this (2^44, 17.6 T: over 17 TB even at one byte an element) are
#: more than any GPU holds: Input Dims that name such a tensor, or a negative size, are not real.
MAX_TENSOR_ELEMENTS = 2**44


def implausible_dims(value: list[Any]) -> list[int] | None:
    """The first tensor's sizes in an op's (well-formed) Input Dims that no GPU could hold (a
    negative size, or more than ``MAX_TENSOR_ELEMENTS`` elements); None when all are possible."""
    for entry in value:
        if not entry:
            continue
        tensors = entry if isinstance(entry[0], list) else [entry]
        for sizes in tensors:
            n = 1
            for d in sizes:
                if d < 0:
                    return list(sizes)
                n *= d
            if n > MAX_TENSOR_ELEMENTS:
                return list(sizes)
    return None


#: Kineto's recorded op arguments (by ``CPU_COLUMNS`` name) -> a check of one value's shape.
#: "" is a value checked already (by the worker that interned it).
OP_ARGUMENTS: dict[str, Callable[[Any], bool]] = {
    "dims": _checker(_DIMS),
    "strides": _checker(_DIMS),
    "types": _checker(list[StrictStr | None]),
    "concrete": _checker(list[StrictStr | None]),
    "": lambda _value: True,
}


# --- Nsight Compute rows --------------------------------------------------------------------


def _cell_number(value: Any) -> Any:
    """A CSV cell as ncu prints numbers ("1,024", "n/a", ""): its number, None when empty."""
    if not isinstance(value, str):
        return value
    text = value.strip().replace(",", "")
    if text in ("", "n/a", "N/A"):
        return None
    try:
        number = float(text)
    except ValueError:
        return value  # the model names it
    return int(number) if number.is_integer() else number


_CellInt = Annotated[StrictInt, BeforeValidator(_cell_number)]


class NcuRow(BaseModel):
    """The identity cells of one profiled launch in ncu's raw CSV: without a launch id, a
    device, or a kernel name, a row cannot be joined to the trace."""

    id: _CellInt = Field(ge=0)
    device: _CellInt = Field(ge=0)
    stream: _CellInt | None = None
    kernel_name: StrictStr = Field(min_length=1)
