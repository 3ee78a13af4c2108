"""The shape of a rules file (``data/rules/default.yaml``, or a user's ``--rules``), as pydantic
models: which keys are mappings, which are lists of patterns, which are numbers. The validated
models are what the analysis reads (``rules.Rules`` holds them).

Each file is checked on its own as it is read (``check_rules_file``): a value of the wrong type
or a pattern that does not compile is one line naming the file, the key and what was expected
(``RulesError``, exit code 2), never a crash halfway through a report. The file merged over the
defaults is then validated once more with ``MERGED`` in the context: what only the whole says
(every verdict known, every op class of a kind with a recommendation) is checked there.

Patterns are compiled by the validators, once each: the shipped file's with ``re`` (they are
reviewed, and one uses a lookahead), a user's with RE2 (``kerneltriage.patterns``), in linear
time. Unknown keys are allowed: a newer rules file may carry keys this version does not read.
A list or mapping may not be null: merged over the defaults, a null would erase them.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PlainValidator,
    StrictFloat,
    StrictInt,
    StrictStr,
    ValidationError,
    ValidationInfo,
    model_validator,
)
from pydantic_core import PydanticCustomError

from kerneltriage.analysis.vocabulary import Verdict
from kerneltriage.errors import RulesError
from kerneltriage.patterns import Pattern, PatternError, compile_linear
from kerneltriage.resources import data_path
from kerneltriage.validation import describe

VERDICTS = tuple(v.value for v in Verdict)
#: Validation context of the rules merged over the defaults (checks of the whole).
MERGED = "merged"


def default_rules_path() -> Path:
    return data_path("rules", "default.yaml")


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


@functools.cache
def _compiled(pattern: str) -> Pattern:
    # A pattern is compiled once per process, however many files and merges name it.
    if pattern in _shipped_patterns():
        return re.compile(pattern)
    return compile_linear(pattern)


def _pattern(value: Any) -> Pattern:
    try:
        return _compiled(value) if isinstance(value, str) else compile_linear(value)
    except PatternError as exc:
        raise PydanticCustomError("pattern", "{reason}", {"reason": exc.reason, "hint": exc.hint}) from None


if TYPE_CHECKING:
    CompiledPattern = Pattern
else:
    CompiledPattern = Annotated[Any, PlainValidator(_pattern)]
Patterns = tuple[CompiledPattern, ...]

_Open = ConfigDict(extra="allow", frozen=True)
_Closed = ConfigDict(extra="forbid", frozen=True)


def _rules_error(reason: str) -> PydanticCustomError:
    return PydanticCustomError("rules", "{reason}", {"reason": reason})


def _merged(info: ValidationInfo) -> bool:
    return bool(info.context and info.context.get(MERGED))


Number = StrictFloat | StrictInt
#: The default of a key a file may leave out and no code gives a figure for.
_GIVEN: Any = Field(default=None, validate_default=False)


class ThresholdsSection(BaseModel):
    """``thresholds:``. The named thresholds (``rules.Thresholds``) are numbers checked by
    rules.py, which names a command-line flag when one gave it; the verdicts' cut-offs
    (``rules.Cutoffs``) are typed here. Neither has a default in code: default.yaml gives every
    figure, and a user's file merged over it keeps those it leaves out."""

    model_config = _Open
    # A cut-off a file leaves out is not set here (default.yaml is merged under a user's file);
    # one given must be a number, null included.
    near_floor: Number = _GIVEN
    library_vendor_share: Number = _GIVEN
    switch_ratio: Number = _GIVEN
    switch_min_rate: Number = _GIVEN
    fp32_simt_share: Number = _GIVEN
    fp32_min_speedup: Number = _GIVEN
    layout_share: Number = _GIVEN
    compiles_also_min_share: Number = _GIVEN


class OpClassEntry(BaseModel):
    model_config = _Open
    kind: StrictStr
    ops: Patterns = ()
    kernels: Patterns = ()
    activity: tuple[StrictStr, ...] = ()


class AloneSkip(BaseModel):
    """``already_alone:`` of a recommendation: the skip of an op that is, alone, the fused
    kernel its ``already`` names (no neighbour for a compile to fuse, nothing to swap in)."""

    model_config = _Closed
    reason: StrictStr
    note: StrictStr


class Recommendation(BaseModel):
    """What a kind is recommended. Read by key as well (``rec["verdict"]``, ``rec.get("note",
    "")``): a key that is absent or null gives the default."""

    model_config = _Open
    verdict: Any = None  # one of VERDICTS once merged (a user file may name only a note)
    reason: StrictStr | None = None
    builtin: StrictStr | None = None
    variant_builtin: StrictStr | None = None
    candidates: tuple[StrictStr, ...] = ()
    already: Patterns = ()
    already_alone: AloneSkip | None = None
    note: StrictStr | None = None
    # The ``compiled`` recommendation's texts (an Inductor kernel's verdict).
    at_roof_note: StrictStr | None = None
    rungs: dict[StrictStr, StrictStr] = {}
    estimate_unavailable: StrictStr | None = None

    @model_validator(mode="after")
    def _complete(self, info: ValidationInfo) -> Recommendation:
        if _merged(info):
            if self.verdict not in VERDICTS:
                raise _rules_error(f"verdict must be one of {', '.join(VERDICTS)}")
            if self.verdict == Verdict.SKIP and not self.reason:
                raise _rules_error("a skip needs a 'reason'")
        return self

    def __getitem__(self, key: str) -> Any:
        value = self.get(key)
        if value is None:
            raise KeyError(key)
        return value

    def get(self, key: str, default: Any = None) -> Any:
        value = getattr(self, key, None)
        return default if value is None else value


class Attention(BaseModel):
    model_config = _Open
    matmul_ops: Patterns = ()
    softmax_ops: Patterns = ()
    causal_ops: Patterns = ()
    mask_ops: Patterns = ()
    softcap_ops: Patterns = ()
    dropout_ops: Patterns = ()
    max_ops_between: StrictInt = Field(default=32, ge=1)


class Norm(BaseModel):
    model_config = _Open
    variant: StrictStr
    any_of: Patterns = ()
    all_of: Patterns = ()


class BatchStatistics(BaseModel):
    """Norms whose statistics span the batch and spatial dims in training: their fused ceiling
    counts a pass over the input for the statistics besides the one that normalizes it."""

    model_config = _Open
    ops: Patterns = ()
    training_arg: StrictInt = Field(default=5, ge=0)


class LaunchBound(BaseModel):
    """When a compiled graph is launch-bound: many short kernels, the GPU idle between them."""

    model_config = _Open
    min_kernels_per_step: float = 20
    max_median_kernel_us: float = 25
    min_idle_share: float = 0.10
    min_step_share: float = 0.02
    note: StrictStr = ""


class Regions(BaseModel):
    model_config = _Open
    boundary_kinds: frozenset[StrictStr] = frozenset()
    unabsorbed_kinds: frozenset[StrictStr] = frozenset()
    compiled_ops: Patterns = ()
    inductor_op_names: tuple[StrictStr, ...] = ()
    compiled_launch_bound: LaunchBound = LaunchBound()
    attention: Attention = Attention()
    norms: tuple[Norm, ...] = ()
    batch_statistics: BatchStatistics = BatchStatistics()
    residual_add_ops: Patterns = ()
    gemm_leaf_ops: Patterns = ()
    kind_priority: tuple[StrictStr, ...] = ()


class RulesFile(BaseModel):
    """A rules file; every key optional (a user file overrides only what it names)."""

    model_config = _Open
    schema_: StrictStr | None = Field(default=None, alias="schema")
    thresholds: ThresholdsSection = ThresholdsSection()
    op_classes: tuple[OpClassEntry, ...] = ()
    kernel_kinds: dict[StrictStr, StrictStr] = {}
    extension_ops: Patterns = ()
    library_ops: Patterns = ()
    layout_kernels: Patterns = ()
    regions: Regions = Regions()
    recommendations: dict[StrictStr, Recommendation] = {}
    # Fix recipes in fixes.yaml's shape; analysis/fixes/fix_recipes.py validates each one.
    fixes: list[dict[StrictStr, Any]] = []

    @model_validator(mode="after")
    def _complete(self, info: ValidationInfo) -> RulesFile:
        if not _merged(info):
            return self
        if not self.op_classes:
            raise _rules_error("op_classes is empty")
        # A kind is known by its recommendation ("norm", or "norm/rmsnorm" for a variant): a
        # class of another kind would be ranked with no verdict behind it (a misspelt kind).
        kinds = {key.split("/")[0] for key in self.recommendations}
        for i, c in enumerate(self.op_classes):
            if c.kind not in kinds:
                raise _rules_error(
                    f"op_classes[{i}].kind {c.kind!r} is not a known kind (one of "
                    f"{', '.join(sorted(kinds))}; a new kind needs recommendations.{c.kind})",
                )
        return self


def validate_rules(data: dict[str, Any], where: str, *, merged: bool = False) -> RulesFile:
    """``data`` as a ``RulesFile``, patterns compiled; else ``RulesError`` naming ``where``, the
    key and what was expected. ``merged``: the rules merged over the defaults, checked whole."""
    try:
        return RulesFile.model_validate(data, context={MERGED: merged})
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        hint = (first.get("ctx") or {}).get("hint")
        raise RulesError(describe(exc), path=where, hint=hint) from None


def check_rules_file(data: dict[str, Any], where: str) -> None:
    """Raise ``RulesError`` (the key, the type expected) unless ``data`` fits ``RulesFile``."""
    validate_rules(data, where)
