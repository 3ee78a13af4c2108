"""GPU kernel name → class (what it computes) and library (who wrote it), as data.

The table is ``kerneltriage/data/kernel_classes.yaml``: ordered regular expressions, first
match wins, library families before generic keywords. Names come as Kineto / Nsight show them:
demangled C++ signatures, plain symbols (``nvjet_…``, ``Cijk_…``, Triton kernels) or mangled
names (``_ZN5aiter…``); a mangled name is also tried in a light demangled form
(``aiter::add_rmsnorm_quant_kernel``) so one pattern covers both spellings.

What a name says beyond its class (FP32 SIMT, tensor-core, CUTLASS's unaligned variants, a
backward kernel, a template's data type) is the table's ``traits``, read by ``has_trait``.

Pure: no torch, no pandas. The YAML is read once per process, each name classified once.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache, lru_cache
from typing import Any

from kerneltriage.errors import RulesError
from kerneltriage.resources import data_path, load_yaml

SCHEMA = "kerneltriage.kernel_classes/1"
FILE = "kernel_classes.yaml"
ACTIVITIES = ("kernel", "memcpy", "memset")
#: What a kernel's name says beyond its class (``traits``), as the verdicts' advice reads it.
TRAITS = (
    "fp32_simt",
    "fp32_template",
    "tensor_op",
    "unaligned",
    "depthwise",
    "backward",
    "half_template",
    "float_template",
)
_FLAGS = {"ignorecase": re.IGNORECASE}


@dataclass(frozen=True)
class KernelClass:
    """``kind``: one of ``known_kinds()``. ``library``: who wrote the kernel (None: unknown).
    ``vendor_library``: a tuned library kernel (cuBLAS, cuDNN, CUTLASS, FlashAttention,
    hipBLASLt, CK, NCCL, …) that users do not rewrite."""

    kind: str
    library: str | None
    vendor_library: bool


@dataclass(frozen=True)
class _Entry:
    kind: str
    library: str | None
    activity: tuple[str, ...]
    patterns: tuple[re.Pattern[str], ...]


@dataclass(frozen=True)
class _Library:
    name: str
    vendor: bool
    patterns: tuple[re.Pattern[str], ...]


@dataclass(frozen=True)
class _Table:
    kinds: tuple[str, ...]
    libraries: tuple[_Library, ...]
    vendor: dict[str, bool]
    entries: tuple[_Entry, ...]
    traits: dict[str, tuple[re.Pattern[str], ...]]
    memory_bound: frozenset[str]
    memory_bound_libraries: frozenset[str]


def _fail(message: str) -> RulesError:
    return RulesError(message, path=str(data_path(FILE)))


def _compile(patterns: Any, flags: Any, where: str) -> tuple[re.Pattern[str], ...]:
    if not isinstance(patterns, list) or not all(isinstance(p, str) for p in patterns):
        raise _fail(f"{where}: patterns must be a list of strings")
    bits = 0
    for flag in flags or []:
        if flag not in _FLAGS:
            raise _fail(f"{where}: unknown flag {flag!r} (known: {', '.join(_FLAGS)})")
        bits |= _FLAGS[flag]
    try:
        return tuple(re.compile(p, bits) for p in patterns)
    except re.error as exc:
        raise _fail(f"{where}: bad pattern ({exc})") from None


@cache
def _table() -> _Table:
    raw = load_yaml(FILE)
    if not isinstance(raw, dict) or raw.get("schema") != SCHEMA:
        raise _fail(f"schema must be {SCHEMA}")
    kinds = raw.get("kinds")
    if not isinstance(kinds, dict) or "unknown" not in kinds:
        raise _fail("kinds must be a mapping that includes 'unknown'")
    libraries = []
    for i, item in enumerate(raw.get("libraries") or []):
        where = f"libraries[{i}]"
        if not isinstance(item, dict) or not isinstance(item.get("library"), str):
            raise _fail(f"{where}: needs a library name")
        if not isinstance(item.get("vendor"), bool):
            raise _fail(f"{where}: vendor must be true or false")
        patterns = _compile(item.get("patterns", []), item.get("flags"), where)
        libraries.append(_Library(item["library"], item["vendor"], patterns))
    vendor = {lib.name: lib.vendor for lib in libraries}
    entries = []
    for i, item in enumerate(raw.get("kernels") or []):
        where = f"kernels[{i}]"
        if not isinstance(item, dict) or item.get("kind") not in kinds:
            raise _fail(f"{where}: kind must be one of the declared kinds")
        library = item.get("library")
        if library is not None and library not in vendor:
            raise _fail(f"{where}: library {library!r} is not declared under libraries")
        activity = tuple(item.get("activity") or ("kernel",))
        if not set(activity) <= set(ACTIVITIES):
            raise _fail(f"{where}: activity must be among {', '.join(ACTIVITIES)}")
        patterns = _compile(item.get("patterns"), item.get("flags"), where)
        if not patterns:
            raise _fail(f"{where}: needs at least one pattern")
        entries.append(_Entry(item["kind"], library, activity, patterns))
    traits = raw.get("traits")
    if not isinstance(traits, dict) or set(traits) != set(TRAITS):
        raise _fail(f"traits must be a mapping of exactly {', '.join(TRAITS)}")
    compiled = {}
    for name, item in traits.items():
        if not isinstance(item, dict) or not isinstance(item.get("source"), str):
            raise _fail(f"traits.{name}: needs patterns and a source")
        compiled[name] = _compile(item.get("patterns"), item.get("flags"), f"traits.{name}")
    memory = raw.get("memory_bound")
    if (
        not isinstance(memory, dict)
        or not isinstance(memory.get("source"), str)
        or not isinstance(memory.get("kinds"), list)
        or not set(memory["kinds"]) <= set(kinds)
        or not isinstance(memory.get("libraries"), list)
        or not set(memory["libraries"]) <= set(vendor)
    ):
        raise _fail("memory_bound: needs kinds and libraries (declared ones) and a source")
    return _Table(
        tuple(kinds),
        tuple(libraries),
        vendor,
        tuple(entries),
        compiled,
        frozenset(memory["kinds"]),
        frozenset(memory["libraries"]),
    )


_SOURCE_NAME = re.compile(r"(\d+)")
# nvcc names an anonymous namespace after its source file: _GLOBAL__N__50c743a2_11_Indexing_cu_89862edb.
# The file name ("Indexing") says nothing of the kernel and must not match a keyword.
_ANON_FILE = re.compile(r"_GLOBAL__N__[0-9a-f]{8}_\d+_\w+?_cu_[0-9a-f]{8}")


def demangle_lite(name: str) -> str | None:
    """The nested name of an Itanium-mangled symbol joined with ``::``, or None.

    ``_ZN5aiter24add_rmsnorm_quant_kernelI…`` → ``aiter::add_rmsnorm_quant_kernel``. Only the
    leading source names are read (no templates, no substitutions): enough to see the
    namespace and the function, which is what the patterns need. nvcc's anonymous namespaces
    (``_GLOBAL__N_…``) read as ``(anonymous namespace)``, as Kineto prints them.
    """
    if not name.startswith("_Z"):
        return None
    pos = 3 if name.startswith("_ZN") else 2
    parts: list[str] = []
    while pos < len(name):
        if name.startswith("St", pos):  # std::
            parts.append("std")
            pos += 2
            continue
        while pos < len(name) and name[pos] in "rVKL":  # cv-qualifiers, internal linkage
            pos += 1
        m = _SOURCE_NAME.match(name, pos)
        if not m:
            break
        size = int(m.group(1))
        start = m.end()
        if size == 0 or start + size > len(name):
            break
        part = name[start : start + size]
        parts.append("(anonymous namespace)" if part.startswith("_GLOBAL__N_") else part)
        pos = start + size
    return "::".join(parts) or None


def _library_of(texts: tuple[str, ...], table: _Table) -> str | None:
    for lib in table.libraries:
        if any(p.search(t) for p in lib.patterns for t in texts):
            return lib.name
    return None


def _activity(activity: str) -> str:
    """Kineto spells activities ``kernel``, ``gpu_memcpy``, ``Memcpy``, ``gpu_memset`` …"""
    a = activity.lower()
    return "memcpy" if "memcpy" in a else "memset" if "memset" in a else "kernel"


@lru_cache(maxsize=1 << 16)
def classify_kernel(name: str, activity: str = "kernel") -> KernelClass:
    """Class and library of one GPU activity by its name (first matching table entry)."""
    table = _table()
    act = _activity(activity)
    lite = demangle_lite(name)
    texts = (name,) if lite is None else (_ANON_FILE.sub("_GLOBAL__N_", name), lite)
    for entry in table.entries:
        if act not in entry.activity:
            continue
        if any(p.search(t) for p in entry.patterns for t in texts):
            # copies and sets have no library; a kernel entry without one takes it from the
            # namespace table
            if entry.kind in ("memcpy", "memset"):
                library = None
            else:
                library = entry.library or _library_of(texts, table)
            return KernelClass(entry.kind, library, _vendor(table, library))
    library = _library_of(texts, table) if act == "kernel" else None
    return KernelClass("unknown", library, _vendor(table, library))


def _vendor(table: _Table, library: str | None) -> bool:
    """Whether ``library`` is a tuned vendor library (no library: not one)."""
    return library is not None and table.vendor.get(library, False)


def known_kinds() -> tuple[str, ...]:
    """Every kind ``classify_kernel`` can return, in the table's order."""
    return _table().kinds


def memory_bound(name: str) -> bool:
    """Whether a kernel is memory-bound by what it computes (``memory_bound``: its kind and
    library): its FLOPs never set its ceiling."""
    table, found = _table(), classify_kernel(name)
    return found.kind in table.memory_bound and found.library in table.memory_bound_libraries


@lru_cache(maxsize=1 << 14)
def has_trait(name: str, trait: str) -> bool:
    """Whether a kernel's name shows ``trait`` (one of ``TRAITS``, ``kernel_classes.yaml``)."""
    return any(p.search(name) for p in _table().traits[trait])
