"""The shape of a rules file (``data/rules/default.yaml``, or a user's ``--rules``), as pydantic
models: which keys are mappings, which are lists of patterns, which are numbers.

``rules.py`` checks a file against ``RulesFile`` before merging it over the defaults, so a
value of the wrong type is one line naming the key and the type expected (``RulesError``,
exit code 2), never a crash halfway through a report. What the types cannot say (regular
expressions that compile, verdicts, known kinds, threshold ranges) ``rules.py`` checks next.
Unknown keys are allowed: a newer rules file may carry keys this version does not read. A list
or mapping may not be null: merged over the defaults, a null would erase them.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, StrictFloat, StrictInt, StrictStr, ValidationError

from kerneltriage.errors import RulesError
from kerneltriage.ingest.schemas import describe

_Open = ConfigDict(extra="allow")
Patterns = list[StrictStr]


Number = StrictFloat | StrictInt


class Thresholds(BaseModel):
    """``thresholds:``. The named thresholds (``rules.Thresholds``) are numbers checked by
    rules.py, which names a command-line flag when one gave it; the verdicts' cut-offs
    (``rules.Cutoffs``) are typed here, each defaulting to its figure in default.yaml."""

    model_config = _Open
    at_roof: Number = 1.1
    near_floor: Number = 3.0
    library_vendor_share: Number = 0.5
    switch_ratio: Number = 1.15
    switch_min_rate: Number = 0.8
    fp32_simt_share: Number = 0.5
    fp32_min_speedup: Number = 2.0
    layout_share: Number = 0.1
    compiles_also_min_share: Number = 0.01


#: The cut-offs a rules file leaves out take these (default.yaml gives the same figures).
CUTOFF_DEFAULTS: dict[str, float] = {
    name: float(field.default) for name, field in Thresholds.model_fields.items()
}


class OpClassEntry(BaseModel):
    model_config = _Open
    kind: StrictStr
    ops: Patterns = []
    kernels: Patterns = []
    activity: list[StrictStr] = []


class Recommendation(BaseModel):
    model_config = _Open
    verdict: Any = None  # its values are checked by rules.py, with the list of verdicts
    reason: StrictStr | None = None
    builtin: StrictStr | None = None
    variant_builtin: StrictStr | None = None
    candidates: list[StrictStr] = []
    already: Patterns = []
    note: StrictStr | None = None


class Attention(BaseModel):
    model_config = _Open
    matmul_ops: Patterns = []
    softmax_ops: Patterns = []
    causal_ops: Patterns = []
    mask_ops: Patterns = []
    softcap_ops: Patterns = []
    dropout_ops: Patterns = []
    max_ops_between: StrictInt = Field(default=32, ge=1)


class Norm(BaseModel):
    model_config = _Open
    variant: StrictStr
    any_of: Patterns = []
    all_of: Patterns = []


class Regions(BaseModel):
    model_config = _Open
    boundary_kinds: list[StrictStr] = []
    unabsorbed_kinds: list[StrictStr] = []
    compiled_ops: Patterns = []
    attention: Attention = Attention()
    norms: list[Norm] = []
    residual_add_ops: Patterns = []
    gemm_leaf_ops: Patterns = []
    kind_priority: list[StrictStr] = []


class RulesFile(BaseModel):
    """A rules file; every key optional (a user file overrides only what it names)."""

    model_config = _Open
    schema_: StrictStr | None = Field(default=None, alias="schema")
    thresholds: Thresholds = Thresholds()
    op_classes: list[OpClassEntry] = []
    kernel_kinds: dict[StrictStr, StrictStr] = {}
    extension_ops: Patterns = []
    library_ops: Patterns = []
    layout_kernels: Patterns = []
    regions: Regions = Regions()
    recommendations: dict[StrictStr, Recommendation] = {}
    # Fix recipes in fixes.yaml's shape; analysis/fixes.py validates each one.
    fixes: list[dict[StrictStr, Any]] = []


def check_rules_file(data: dict[str, Any], where: str) -> None:
    """Raise ``RulesError`` (the key, the type expected) unless ``data`` fits ``RulesFile``."""
    try:
        RulesFile.model_validate(data)
    except ValidationError as exc:
        raise RulesError(describe(exc), path=where) from None
