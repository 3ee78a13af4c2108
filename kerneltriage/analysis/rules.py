"""Rules: the thresholds, op classes, region patterns and recommendations, as data.

``kerneltriage/data/rules/default.yaml`` is the base; a user file given with ``--rules`` is merged over it
(mappings merge key by key, lists replace). Each file is validated as it is read, and the
merged rules once more as a whole, into ``rules_schema.RulesFile``: its patterns are compiled
there, once, and ``Rules`` reads that model. Nothing from a rules file is evaluated as code.
"""

from __future__ import annotations

import copy
import difflib
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, get_type_hints

import yaml

from kerneltriage.analysis.fixes.fix_recipes import Recipe, load_recipes, parse_recipes
from kerneltriage.analysis.kernel_classes import KernelClass, classify_kernel
from kerneltriage.analysis.rules_schema import (
    Norm,
    OpClassEntry,
    Recommendation,
    Regions,
    RulesFile,
    check_rules_file,
    validate_rules,
)
from kerneltriage.analysis.rules_schema import default_rules_path as default_rules_path
from kerneltriage.analysis.vocabulary import Verdict
from kerneltriage.errors import RulesError
from kerneltriage.inputs import read_text
from kerneltriage.patterns import Pattern

SCHEMA = "kerneltriage.rules/1"


@dataclass(frozen=True)
class Thresholds:
    """The named thresholds of ``thresholds:`` in the rules (their meaning: default.yaml).
    Every one must be given there; nothing else in kerneltriage has a default for them."""

    min_headroom: float
    min_share: float
    top_fraction: float
    min_share_floor: float
    max_shapes: int
    min_dominant_coverage: float
    idle_warn: float
    idle_noise: float
    gap_us: float
    join_warn: float
    join_max_duration_ratio: float
    max_estimated_headroom: float
    min_estimated_headroom: float
    at_roof: float

    def to_json(self) -> dict[str, float]:
        return asdict(self)


@dataclass(frozen=True)
class Cutoffs:
    """The cut-offs the verdicts apply beyond the three conditions, under ``thresholds:`` in
    the rules beside the named thresholds (default.yaml says what each is and where its figure
    came from). Not command-line flags and not in the report's JSON ``thresholds``; a rules
    file that leaves one out keeps default.yaml's, the one source of every figure."""

    near_floor: float
    library_vendor_share: float
    switch_ratio: float
    switch_min_rate: float
    fp32_simt_share: float
    fp32_min_speedup: float
    layout_share: float
    compiles_also_min_share: float


#: Cut-off -> (lowest, highest, what the range means), checked as ``RANGES`` are.
CUTOFF_RANGES: dict[str, tuple[float, float, str]] = {
    "near_floor": (1.0, math.inf, "a multiple of the launch floor and must be at least 1"),
    "library_vendor_share": (0.0, 1.0, "a share of kernel time and must be in [0, 1]"),
    "switch_ratio": (1.0, math.inf, "a ratio of rates and must be at least 1"),
    "switch_min_rate": (0.0, 1.0, "a share of the measured rate and must be in [0, 1]"),
    "fp32_simt_share": (0.0, 1.0, "a share of kernel time and must be in [0, 1]"),
    "fp32_min_speedup": (1.0, math.inf, "a ratio of ceilings and must be at least 1"),
    "layout_share": (0.0, 1.0, "a share of kernel time and must be in [0, 1]"),
    "compiles_also_min_share": (0.0, 1.0, "a share of the step and must be in [0, 1]"),
}


#: Threshold name -> type, in the order of ``Thresholds`` (and of the report's JSON).
THRESHOLDS: dict[str, type] = {f.name: get_type_hints(Thresholds)[f.name] for f in fields(Thresholds)}


#: Threshold -> (lowest, highest, what the range means): the same check for a value from the
#: shipped file, a ``--rules`` file, a command-line flag or a keyword of the Python API.
RANGES: dict[str, tuple[float, float, str]] = {
    "min_headroom": (1.0, math.inf, "a ratio of times and must be at least 1"),
    "min_share": (0.0, 1.0, "a share of the step and must be in [0, 1]"),
    "top_fraction": (0.0, 1.0, "a fraction of the candidates and must be in (0, 1]"),
    "min_share_floor": (0.0, 1.0, "a share of the step and must be in [0, 1]"),
    "max_shapes": (1, math.inf, "a count of shapes and must be at least 1"),
    "min_dominant_coverage": (0.0, 1.0, "a share of time and must be in [0, 1]"),
    "idle_warn": (0.0, 1.0, "a share of the step and must be in [0, 1]"),
    "idle_noise": (0.0, 1000.0, "a multiple of the steps' spread and must be in [0, 1000]"),
    "gap_us": (0.0, math.inf, "a time in µs and must not be negative"),
    "join_warn": (0.0, 1.0, "a share of kernel time and must be in [0, 1]"),
    "join_max_duration_ratio": (1.0, math.inf, "a ratio of durations and must be at least 1"),
    "max_estimated_headroom": (1.0, math.inf, "a ratio of times and must be at least 1"),
    "min_estimated_headroom": (0.0, 1.0, "a ratio of times and must be in (0, 1]"),
    "at_roof": (1.0, math.inf, "a ratio of times and must be at least 1"),
}
#: Thresholds whose lowest value is excluded.
_ABOVE = frozenset({"top_fraction", "min_estimated_headroom"})

#: The top-level keys of a rules file (``rules_schema.RulesFile``, ``schema`` by its alias).
RULES_KEYS = frozenset(f.alias or name for name, f in RulesFile.model_fields.items())


@dataclass
class Rules:
    """Validated rules: the merged rules file's model (``rules_schema.RulesFile``, patterns
    compiled) and the thresholds checked against their ranges."""

    thresholds: Thresholds
    file: RulesFile
    cutoffs: Cutoffs
    sources: list[str]
    # A rules file's own fix recipes (fixes.yaml's shape), tried before the shipped ones.
    fixes: tuple[Recipe, ...] = ()
    # What the rules file said that this version does not read (unknown keys), one line each.
    warnings: list[str] = field(default_factory=list)
    # Classifications are asked for the same few hundred names millions of times.
    _memo: dict[tuple, Any] = field(default_factory=dict, repr=False)

    @property
    def classes(self) -> tuple[OpClassEntry, ...]:
        return self.file.op_classes

    @property
    def library_ops(self) -> tuple[Pattern, ...]:
        return self.file.library_ops

    @property
    def extension_ops(self) -> tuple[Pattern, ...]:
        """Ops of a library or extension namespace (fbgemm::, vllm::, …), judged by their kernels."""
        return self.file.extension_ops

    @property
    def layout_kernels(self) -> tuple[Pattern, ...]:
        """Kernels that only transpose a layout (NCHW <-> NHWC) around a convolution."""
        return self.file.layout_kernels

    @property
    def regions(self) -> Regions:
        return self.file.regions

    @property
    def norms(self) -> tuple[Norm, ...]:
        return self.file.regions.norms

    @property
    def recommendations(self) -> dict[str, Recommendation]:
        return self.file.recommendations

    @property
    def kernel_kinds(self) -> dict[str, str]:
        """Kernel class (kernel_classes.yaml) -> candidate kind."""
        return self.file.kernel_kinds

    @property
    def unabsorbed_kinds(self) -> frozenset[str]:
        """Kinds a fused region never absorbs."""
        return self.file.regions.unabsorbed_kinds

    @property
    def recipes(self) -> tuple[Recipe, ...]:
        """The fix recipes: the rules file's ``fixes`` in front of ``fixes.yaml``'s."""
        key = ("recipes",)
        if key not in self._memo:
            self._memo[key] = load_recipes(extra=self.fixes)
        return self._memo[key]

    def classify(self, op: str | None, kernel: str | None, activity: str = "kernel") -> str:
        """Kind of a kernel: by activity, then by its op, then by its own name."""
        key = ("classify", op, kernel, activity)
        if key not in self._memo:
            self._memo[key] = self._classify(op, kernel, activity)
        return self._memo[key]

    def _classify(self, op: str | None, kernel: str | None, activity: str) -> str:
        for c in self.classes:
            if c.activity and activity in c.activity:
                return c.kind
        if activity != "kernel":
            return "memcpy"
        if op:
            for c in self.classes:
                if any(p.search(op) for p in c.ops):
                    return c.kind
        if kernel:
            # A user rules file may name kernels itself; the shipped table does the rest.
            for c in self.classes:
                if any(p.search(kernel) for p in c.kernels):
                    return c.kind
            return self.kernel_kind(kernel, activity)
        return "other"

    def kernel_class(self, kernel: str, activity: str = "kernel") -> KernelClass:
        """What a kernel computes and who wrote it (``kernel_classes.yaml``)."""
        return classify_kernel(kernel, activity if activity in ("kernel", "memcpy", "memset") else "kernel")

    def kernel_kind(self, kernel: str, activity: str = "kernel") -> str:
        """The candidate kind of a kernel: its class mapped through ``kernel_kinds``."""
        key = ("kernel_kind", kernel, activity)
        if key not in self._memo:
            kind = self.kernel_class(kernel, activity).kind
            self._memo[key] = self.kernel_kinds.get(kind, kind if kind in self.recommendations else "other")
        return self._memo[key]

    def is_extension_op(self, op: str) -> bool:
        """An op of a library or extension namespace (``fbgemm::``, ``vllm::``, ``_C::`` …)."""
        key = ("extension", op)
        if key not in self._memo:
            self._memo[key] = any(p.search(op) for p in self.extension_ops)
        return self._memo[key]

    def classify_op(self, op: str) -> str | None:
        """Kind of an op name alone (None if no op pattern matches)."""
        key = ("op", op)
        if key not in self._memo:
            self._memo[key] = next((c.kind for c in self.classes if any(p.search(op) for p in c.ops)), None)
        return self._memo[key]

    def is_library_op(self, op: str) -> bool:
        key = ("library", op)
        if key not in self._memo:
            self._memo[key] = any(p.search(op) for p in self.library_ops)
        return self._memo[key]

    def match(self, name: str, *keys: str) -> bool:
        """Does ``name`` match a pattern of ``regions.<keys>`` (e.g. "attention", "matmul_ops")?"""
        key = ("match", name, *keys)
        if key not in self._memo:
            self._memo[key] = any(p.search(name) for p in self.patterns(*keys))
        return self._memo[key]

    def recommendation(self, kind: str, variant: str | None = None) -> Recommendation:
        if variant and f"{kind}/{variant}" in self.recommendations:
            return self.recommendations[f"{kind}/{variant}"]
        return self.recommendations.get(kind) or self.recommendations.get("other") or _WRITE

    def patterns(self, *keys: str) -> tuple[Pattern, ...]:
        """Compiled patterns of ``regions`` (e.g. ``patterns("attention", "matmul_ops")``)."""
        node: Any = self.regions
        for key in keys:
            node = getattr(node, key)
        return tuple(node)


_WRITE = Recommendation(verdict=Verdict.WRITE)


def load_rules(
    user_file: str | Path | None = None, overrides: Mapping[str, float | None] | None = None
) -> Rules:
    """Default rules, merged with ``user_file`` and then with threshold ``overrides`` (the
    command line's ``--min-headroom`` and the like; None values are not given)."""
    sources = [str(default_rules_path())]
    raw = _read_yaml(default_rules_path())
    if user_file is not None:
        user = _read_yaml(Path(user_file))
        raw = _merge(raw, user)
        sources.append(str(user_file))
    warnings = unknown_key_warnings(user, str(user_file)) if user_file is not None else []
    given = {key: value for key, value in (overrides or {}).items() if value is not None}
    raw.setdefault("thresholds", {}).update(given)
    # Each file was checked as it was read; what is left to check is the whole (the shipped
    # rules are checked in CI, so what fails here came from the user's file).
    where = sources[-1]
    thresholds = _thresholds(raw.get("thresholds") or {}, where, set(given))
    merged = validate_rules(raw, where, merged=True)
    return Rules(
        thresholds=thresholds,
        cutoffs=_cutoffs(raw.get("thresholds") or {}, where),
        file=merged,
        sources=sources,
        fixes=parse_recipes(merged.fixes, where, user=True),
        warnings=warnings,
    )


def unknown_key_warnings(data: dict[str, Any], where: str) -> list[str]:
    """One warning per top-level key of a rules file this version does not read, naming the
    closest known key (a typo such as ``threshold:`` for ``thresholds:``). Unknown keys stay
    allowed: a newer rules file may carry keys this version does not know."""
    out = []
    for key, known in _unknown_keys(data, RulesFile, ""):
        name = key.rsplit(".", 1)[-1].split("[")[0]
        close = difflib.get_close_matches(name, known, n=1, cutoff=0.0)
        hint = f"the closest known key is {close[0]!r}" if close else f"known keys: {', '.join(known)}"
        out.append(f"rules file {where}: unknown key {key!r} is ignored ({hint})")
    return out


def _unknown_keys(data: Any, model: Any, path: str) -> list[tuple[str, list[str]]]:
    """(dotted key, the keys known there) for each key of ``data`` that ``model`` (a rules
    schema model) does not read, at any depth. ``thresholds`` is left to ``_thresholds``,
    which refuses an unknown threshold."""
    from typing import get_args, get_origin

    from pydantic import BaseModel

    if not isinstance(data, dict):
        return []
    fields_by_key = {f.alias or name: f for name, f in model.model_fields.items()}
    known = sorted(fields_by_key)
    out: list[tuple[str, list[str]]] = []

    def is_model(kind: Any) -> bool:
        return isinstance(kind, type) and issubclass(kind, BaseModel)

    for key, value in data.items():
        where = f"{path}{key}"
        spec = fields_by_key.get(key)
        if spec is None:
            out.append((where, known))
            continue
        if key == "thresholds" and model is RulesFile:
            continue
        kind, args = spec.annotation, get_args(spec.annotation)
        if is_model(kind):
            out += _unknown_keys(value, kind, f"{where}.")
        elif get_origin(kind) in (tuple, list) and args and is_model(args[0]) and isinstance(value, list):
            for i, item in enumerate(value):
                out += _unknown_keys(item, args[0], f"{where}[{i}].")
        elif get_origin(kind) is dict and len(args) == 2 and is_model(args[1]) and isinstance(value, dict):
            for name, item in value.items():
                out += _unknown_keys(item, args[1], f"{where}.{name}.")
    return out


def default_thresholds() -> Thresholds:
    """The thresholds of the shipped rules file alone (for help texts)."""
    path = default_rules_path()
    return _thresholds(_read_yaml(path).get("thresholds") or {}, str(path), set())


class _UniqueKeys(yaml.SafeLoader):
    """YAML's safe loader, refusing a mapping that gives one key twice (YAML would keep the
    last silently: a rules file that says two things about one key means neither for sure)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, Any] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            try:
                first = seen.setdefault(key, key_node.start_mark)
            except TypeError:  # an unhashable key: the base class says so
                break
            if first is not key_node.start_mark:
                again = key_node.start_mark.line + 1
                lines = f"lines {first.line + 1} and {again}" if again != first.line + 1 else f"line {again}"
                raise RulesError(f"key {key!r} is given twice ({lines}); keep one")
        return super().construct_mapping(node, deep=deep)


def _read_yaml(path: Path) -> dict[str, Any]:
    text = read_text(path, "rules file", RulesError)  # a directory, a pipe, not UTF-8: refused
    try:
        data = yaml.load(text, Loader=_UniqueKeys)  # a SafeLoader
    except RulesError as exc:
        raise RulesError(exc.message, path=str(path)) from None
    except yaml.YAMLError as exc:
        raise RulesError(f"not valid YAML ({str(exc).splitlines()[0]})", path=str(path)) from None
    except RecursionError:
        raise RulesError("nested too deeply to be a rules file", path=str(path)) from None
    if not isinstance(data, dict):
        raise RulesError("a rules file must be a YAML mapping", path=str(path))
    schema = data.get("schema", SCHEMA)
    if schema != SCHEMA:
        raise RulesError(f"schema {schema!r} is not {SCHEMA!r}", path=str(path))
    check_rules_file(data, str(path))
    return data


def _merge(base: Any, over: Any) -> Any:
    if isinstance(base, dict) and isinstance(over, dict):
        merged = copy.deepcopy(base)
        for key, value in over.items():
            merged[key] = _merge(base.get(key), value) if key in base else copy.deepcopy(value)
        return merged
    return copy.deepcopy(over)


def _thresholds(given: dict[str, Any], where: str, overridden: set[str]) -> Thresholds:
    unknown = sorted(set(given) - set(THRESHOLDS) - set(CUTOFF_RANGES))
    if unknown:
        known = ", ".join([*THRESHOLDS, *CUTOFF_RANGES])
        raise RulesError(f"unknown threshold(s) {', '.join(unknown)}; known: {known}", path=where)
    values: dict[str, Any] = {}
    for name, kind in THRESHOLDS.items():
        # An error in a value given on the command line names its flag, not the rules file.
        path = f"--{name.replace('_', '-')}" if name in overridden else where
        if name not in given:
            raise RulesError(f"threshold {name!r} is missing", path=path)
        try:
            if isinstance(given[name], bool) or not math.isfinite(float(given[name])):
                raise ValueError
            value = kind(given[name])
        except (TypeError, ValueError, OverflowError):
            raise RulesError(
                f"threshold {name!r} must be a number (finite), got {given[name]!r}", path=path
            ) from None
        if kind is int and not isinstance(given[name], int) and not float(given[name]).is_integer():
            raise RulesError(f"threshold {name!r} must be a whole number, got {given[name]!r}", path=path)
        low, high, meaning = RANGES[name]
        if not (value >= low if name not in _ABOVE else value > low) or value > high:
            got = "" if name in overridden else f"; got {given[name]!r}"  # a flag's value is in view
            raise RulesError(f"{name} is {meaning}{got}", path=path)
        values[name] = value
    return Thresholds(**values)


def _cutoffs(given: dict[str, Any], where: str) -> Cutoffs:
    """The verdicts' cut-offs, each in its range (default.yaml gives every one; a user's file
    merged over it keeps those it leaves out)."""
    values: dict[str, float] = {}
    for name, (low, high, meaning) in CUTOFF_RANGES.items():
        if name not in given:
            raise RulesError(f"cut-off {name!r} is missing", path=where)
        value = given[name]
        try:
            if isinstance(value, bool) or not math.isfinite(float(value)):
                raise ValueError
        except (TypeError, ValueError, OverflowError):
            raise RulesError(
                f"threshold {name!r} must be a number (finite), got {value!r}", path=where
            ) from None
        if not low <= float(value) <= high:
            raise RulesError(f"{name} is {meaning}; got {value!r}", path=where)
        values[name] = float(value)
    return Cutoffs(**values)
