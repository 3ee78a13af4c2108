"""Rules: the thresholds, op classes, region patterns and recommendations, as data.

``kerneltriage/data/rules/default.yaml`` is the base; a user file given with ``--rules`` is merged over it
(mappings merge key by key, lists replace). Patterns are compiled regular expressions used
with ``re.search``; nothing from a rules file is evaluated as code.
"""

from __future__ import annotations

import copy
import difflib
import functools
import math
import re
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, get_type_hints

import yaml

from kerneltriage.analysis.fixes import Recipe, load_recipes, parse_recipes
from kerneltriage.analysis.kernel_classes import KernelClass, classify_kernel
from kerneltriage.analysis.rules_schema import RulesFile, check_rules_file
from kerneltriage.errors import RulesError
from kerneltriage.inputs import read_text
from kerneltriage.patterns import Pattern, compile_user_pattern
from kerneltriage.resources import data_path

SCHEMA = "kerneltriage.rules/1"
VERDICTS = ("write", "use-builtin", "compile", "skip")


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


def default_rules_path() -> Path:
    return data_path("rules", "default.yaml")


@dataclass(frozen=True)
class OpClass:
    kind: str
    ops: tuple[Pattern, ...]
    kernels: tuple[Pattern, ...]
    activity: tuple[str, ...]


@dataclass
class Rules:
    """Validated rules. ``raw`` keeps the merged YAML for the report's provenance."""

    thresholds: Thresholds
    classes: list[OpClass]
    library_ops: tuple[Pattern, ...]
    regions: dict[str, Any]
    recommendations: dict[str, dict[str, Any]]
    sources: list[str]
    raw: dict[str, Any]
    norms: list[tuple[str, tuple[Pattern, ...], tuple[Pattern, ...]]] = field(default_factory=list)
    # Kernel class (kernel_classes.yaml) -> candidate kind; kinds a fused region never absorbs;
    # ops of a library or extension namespace (fbgemm::, vllm::, …), judged by their kernels.
    kernel_kinds: dict[str, str] = field(default_factory=dict)
    unabsorbed_kinds: frozenset[str] = frozenset()
    extension_ops: tuple[Pattern, ...] = ()
    # A rules file's own fix recipes (fixes.yaml's shape), tried before the shipped ones.
    fixes: tuple[Recipe, ...] = ()
    # What the rules file said that this version does not read (unknown keys), one line each.
    warnings: list[str] = field(default_factory=list)
    # Classifications are asked for the same few hundred names millions of times.
    _memo: dict[tuple, Any] = field(default_factory=dict, repr=False)

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

    def recommendation(self, kind: str, variant: str | None = None) -> dict[str, Any]:
        if variant and f"{kind}/{variant}" in self.recommendations:
            return self.recommendations[f"{kind}/{variant}"]
        return self.recommendations.get(kind) or self.recommendations.get("other", {"verdict": "write"})

    def patterns(self, *keys: str) -> tuple[Pattern, ...]:
        """Compiled patterns from ``regions`` (e.g. ``patterns("attention", "matmul_ops")``)."""
        node: Any = self.regions
        for key in keys:
            node = node.get(key, {}) if isinstance(node, dict) else {}
        return tuple(_compile(p, ".".join(("regions", *keys))) for p in (node or []))


def load_rules(user_file: str | Path | None = None, overrides: dict[str, float] | None = None) -> Rules:
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
    try:
        rules = _validate(raw, sources, set(given))
    except RulesError as exc:
        if exc.path is not None or user_file is None:
            raise
        # A pattern or value with no file named: the shipped rules are checked in CI, so it came
        # from the user's file.
        raise RulesError(exc.message, path=str(user_file), hint=exc.hint) from None
    rules.warnings = warnings
    return rules


def unknown_key_warnings(data: dict[str, Any], where: str) -> list[str]:
    """One warning per top-level key of a rules file this version does not read, naming the
    closest known key (a typo such as ``threshold:`` for ``thresholds:``). Unknown keys stay
    allowed: a newer rules file may carry keys this version does not know."""
    known = sorted(RULES_KEYS)
    out = []
    for key in data:
        if key in RULES_KEYS:
            continue
        close = difflib.get_close_matches(str(key), known, n=1, cutoff=0.0)
        hint = f"the closest known key is {close[0]!r}" if close else f"known keys: {', '.join(known)}"
        out.append(f"rules file {where}: unknown key {key!r} is ignored ({hint})")
    return out


def default_thresholds() -> Thresholds:
    """The thresholds of the shipped rules file alone (for help texts)."""
    path = default_rules_path()
    return _thresholds(_read_yaml(path).get("thresholds") or {}, str(path), set())


def _read_yaml(path: Path) -> dict[str, Any]:
    text = read_text(path, "rules file", RulesError)  # a directory, a pipe, not UTF-8: refused
    try:
        data = yaml.safe_load(text)
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


@functools.cache
def _shipped_patterns() -> frozenset[str]:
    """Every string of the shipped rules file: its patterns are compiled with ``re``."""
    found: set[str] = set()

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)
        elif isinstance(node, str):
            found.add(node)

    walk(yaml.safe_load(default_rules_path().read_text()))
    return frozenset(found)


def _compile(pattern: Any, where: str) -> Pattern:
    """A pattern of the rules: the shipped file's with ``re``, a user's in linear time (RE2)."""
    if isinstance(pattern, str) and pattern in _shipped_patterns():
        return re.compile(pattern)
    return compile_user_pattern(pattern, where, RulesError)


def _thresholds(given: dict[str, Any], where: str, overridden: set[str]) -> Thresholds:
    unknown = sorted(set(given) - set(THRESHOLDS))
    if unknown:
        raise RulesError(
            f"unknown threshold(s) {', '.join(unknown)}; known: {', '.join(THRESHOLDS)}", path=where
        )
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
        if kind is int and value != float(given[name]):
            raise RulesError(f"threshold {name!r} must be a whole number, got {given[name]!r}", path=path)
        low, high, meaning = RANGES[name]
        if not (value >= low if name not in _ABOVE else value > low) or value > high:
            got = "" if name in overridden else f"; got {given[name]!r}"  # a flag's value is in view
            raise RulesError(f"{name} is {meaning}{got}", path=path)
        values[name] = value
    return Thresholds(**values)


def _fixes(entries: Any, where: str) -> tuple[Recipe, ...]:
    """A rules file's own fix recipes (the shape of ``fixes.yaml``'s), tried before the
    shipped ones."""
    if not isinstance(entries, list):
        raise RulesError(
            "fixes must be a list of recipes (the shape of kerneltriage/data/fixes.yaml)", path=where
        )
    return parse_recipes(entries, where, user=True)


def _validate(raw: dict[str, Any], sources: list[str], overridden: set[str]) -> Rules:
    where = sources[-1]
    thresholds = _thresholds(raw.get("thresholds") or {}, where, overridden)

    classes = []
    for i, entry in enumerate(raw.get("op_classes") or []):
        if not isinstance(entry, dict) or "kind" not in entry:
            raise RulesError(f"op_classes[{i}] needs a 'kind'", path=where)
        classes.append(
            OpClass(
                kind=str(entry["kind"]),
                ops=tuple(_compile(p, f"op_classes[{i}].ops") for p in entry.get("ops") or []),
                kernels=tuple(_compile(p, f"op_classes[{i}].kernels") for p in entry.get("kernels") or []),
                activity=tuple(str(a) for a in entry.get("activity") or []),
            )
        )
    if not classes:
        raise RulesError("op_classes is empty", path=where)

    recommendations = raw.get("recommendations") or {}
    # A kind is known by its recommendation ("norm", or "norm/rmsnorm" for a variant): a class
    # of another kind would be ranked with no verdict behind it (a misspelt kind, say).
    kinds = {key.split("/")[0] for key in recommendations}
    for i, c in enumerate(classes):
        if c.kind not in kinds:
            raise RulesError(
                f"op_classes[{i}].kind {c.kind!r} is not a known kind (one of {', '.join(sorted(kinds))}; "
                f"a new kind needs recommendations.{c.kind})",
                path=where,
            )
    for key, rec in recommendations.items():
        if not isinstance(rec, dict) or rec.get("verdict") not in VERDICTS:
            raise RulesError(
                f"recommendations.{key}.verdict must be one of {', '.join(VERDICTS)}", path=where
            )
        if rec["verdict"] == "skip" and not rec.get("reason"):
            raise RulesError(f"recommendations.{key}: a skip needs a 'reason'", path=where)

    regions = raw.get("regions") or {}
    if not isinstance(regions, dict):
        raise RulesError("regions must be a mapping", path=where)
    kernel_kinds = raw.get("kernel_kinds") or {}
    if not isinstance(kernel_kinds, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in kernel_kinds.items()
    ):
        raise RulesError("kernel_kinds must map kernel classes to candidate kinds (strings)", path=where)
    unabsorbed = regions.get("unabsorbed_kinds") or []
    if not isinstance(unabsorbed, list) or not all(isinstance(k, str) for k in unabsorbed):
        raise RulesError("regions.unabsorbed_kinds must be a list of kinds", path=where)
    rules = Rules(
        thresholds=thresholds,
        classes=classes,
        library_ops=tuple(_compile(p, "library_ops") for p in raw.get("library_ops") or []),
        regions=regions,
        recommendations=recommendations,
        sources=sources,
        raw=raw,
        kernel_kinds=dict(kernel_kinds),
        unabsorbed_kinds=frozenset(unabsorbed),
        extension_ops=tuple(_compile(p, "extension_ops") for p in raw.get("extension_ops") or []),
        fixes=_fixes(raw.get("fixes") or [], where),
    )
    # Compile every region pattern once now, so a bad one fails here and not mid-report.
    for key in ("matmul_ops", "softmax_ops", "causal_ops", "mask_ops", "softcap_ops", "dropout_ops"):
        rules.patterns("attention", key)
    rules.patterns("residual_add_ops")
    rules.patterns("compiled_ops")
    for i, norm in enumerate(regions.get("norms") or []):
        if not isinstance(norm, dict) or "variant" not in norm:
            raise RulesError(f"regions.norms[{i}] needs a 'variant'", path=where)
        any_of = tuple(_compile(p, f"regions.norms[{i}].any_of") for p in norm.get("any_of") or [])
        all_of = tuple(_compile(p, f"regions.norms[{i}].all_of") for p in norm.get("all_of") or [])
        rules.norms.append((str(norm["variant"]), any_of, all_of))
    return rules
