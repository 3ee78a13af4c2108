"""Fix recipes (``kerneltriage/data/fixes.yaml``, schema ``kerneltriage.fixes/1``), the one
source of the `fix` line a candidate gets and of the application ``kerneltriage verify``
performs: their schema, and loading them. Pure Python: no torch.

``parse_recipes`` validates recipe mappings (pydantic), compiles their ``when`` patterns and
checks that every template names known fields only and every ``apply`` kind is one the runner
knows; ``load_recipes`` reads the shipped file with a rules file's own recipes in front.
"""

from __future__ import annotations

import re
import string
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictStr, ValidationError

from kerneltriage.errors import RulesError
from kerneltriage.patterns import Pattern, compile_user_pattern
from kerneltriage.resources import data_path
from kerneltriage.validation import describe

SCHEMA = "kerneltriage.fixes/1"
SCOPES = ("candidate", "module-class", "model", "loss", "optimizer", "process")
PARAMS = (
    "causal",
    "custom-mask",
    "softcap",
    "window",
    "scale",
    "gqa",
    "dropout",
    "bias",
    "ignore-index",
    "label-smoothing",
    "residual-add",
)
#: Apply kind -> its fields (what recipes/install.py installs for each).
APPLY_KINDS: dict[str, tuple[str, ...]] = {
    "norm-swap": ("classes",),
    "liger": ("arch", "kernel"),
    "compile-module": ("classes", "mode"),
    "compile-model": ("mode",),
    "compile-mode": ("mode", "options"),
    "sdpa-backend": ("backend",),
    "sdpa-mask": (),
    "hf-attention": ("causal", "softcap", "scale", "sliding_window", "gqa"),
    "autocast": ("dtype",),
    "tf32": (),
    "channels-last": (),
    "cudnn-benchmark": (),
    "inductor-config": ("settings",),
    "fused-optimizer": (),
    "ddp": ("gradient_as_bucket_view", "static_graph", "bucket_cap_mb"),
    "fsdp-prefetch": ("forward", "backward"),
    "fsdp-reshard": ("last",),
    "gemm-pad": ("modules", "multiple"),
}
#: Candidate fields a recipe's ``when`` may test.
WHEN_FIELDS = (
    "verdict",
    "reason",
    "builtin",
    "kind",
    "written",
    "module_class",
    "module_path",
    "variant",
    "compiled",
    "classes",
    "norm_class",
    "server",
)
#: Fields a template may name.
FIELDS = frozenset(
    {
        *WHEN_FIELDS,
        "id",
        "candidate_id",
        "module_classes",
        "module_list",
        "module_leaf",
        "arch",
        "liger_switches",
        "classes_repr",
        "causal",
        "causal_value",
        "scale",
        "scale_arg",
        "softcap",
        "softcap_arg",
        "sliding_window",
        "gqa",
        "gqa_arg",
        "dropout_arg",
        "ce_args",
        "bias_arg",
        "backend",
        "kernels",
        "in_module",
        "fused_path_edit",
        "pad_edit",
        "norm_check",
        "op_name",
        "norm_function",
        "norm_call",
    }
)
#: A ``requires`` entry: an operator and a version (">=2.0").
VERSION_REQUIREMENT = re.compile(r"^\s*(>=|<=|==|<|>)\s*(\d+(?:\.\d+)*)\s*$")


class Requires(BaseModel):
    model_config = ConfigDict(extra="forbid")
    torch: StrictStr | None = None
    capability: StrictStr | None = None
    packages: list[StrictStr] = []
    bf16: StrictBool | None = None
    tf32: StrictBool | None = None  # TF32 matrix units (gpus.yaml: a tf32 rate)
    # A fused linear cross-entropy is offered only where its model predicts a gain.
    fused_linear_ce_gain: StrictBool | None = None


class RenameBuiltin(BaseModel):
    model_config = ConfigDict(extra="forbid")
    of: StrictStr  # a pattern of the verdict's built-in
    to: StrictStr


class RecipeModel(BaseModel):
    model_config = ConfigDict(extra="forbid")
    id: StrictStr = Field(pattern=r"^[a-z0-9]+(-[a-z0-9]+)*$")
    title: StrictStr
    when: dict[StrictStr, StrictStr]
    scope: Literal["candidate", "module-class", "model", "loss", "optimizer", "process"]
    requires: Requires = Requires()
    carries: list[StrictStr] = []
    cannot_carry: list[StrictStr] = []
    text: StrictStr
    apply: dict[StrictStr, Any] | None = None
    apply_why_not: StrictStr | None = None
    alternatives: list[StrictStr] = []
    # False: the fix swaps the norm only; a residual add before it stays an eager op.
    fuses_residual_add: StrictBool = True
    # What the fix's prediction counts, where not Amdahl on the candidate: "fused-linear-ce",
    # the lm_head GEMM and the loss it replaces (their savings counted once); "upcast-kept", the
    # loss without the logits' fp32 upcast the patch leaves.
    saving: Literal["fused-linear-ce", "upcast-kept"] | None = None
    # The built-in the verdict names when this recipe is the fix of a verdict whose built-in
    # matches ``of`` (a declined fused linear CE: the loss-only kernel the fix pastes).
    renames_builtin: RenameBuiltin | None = None


class FixesFile(BaseModel):
    model_config = ConfigDict(extra="forbid")
    schema_: StrictStr = Field(alias="schema")
    recipes: list[RecipeModel]


@dataclass(frozen=True)
class Recipe:
    id: str
    title: str
    when: dict[str, Pattern]
    scope: str
    requires: Requires
    carries: tuple[str, ...]
    cannot_carry: tuple[str, ...]
    text: str
    apply: dict[str, Any] | None
    apply_why_not: str | None
    alternatives: tuple[str, ...] = ()
    fuses_residual_add: bool = True
    saving: str | None = None
    renames_builtin: tuple[Pattern, str] | None = None

    def matches(self, fields: dict[str, str]) -> bool:
        return all(p.search(_when_value(fields.get(k))) for k, p in self.when.items())


def _when_value(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, (list, tuple)):
        return ",".join(map(str, value))
    return str(value)


def fixes_path() -> Path:
    return data_path("fixes.yaml")


def _template_fields(template: Any) -> set[str]:
    if isinstance(template, dict):
        return set().union(*(_template_fields(v) for v in template.values())) if template else set()
    if isinstance(template, list):
        return set().union(*(_template_fields(v) for v in template)) if template else set()
    if not isinstance(template, str):
        return set()
    names = set()
    for _, name, spec, _ in string.Formatter().parse(template):
        if name is not None:
            if not name.isidentifier():
                raise ValueError(f"field {{{name}}}: only plain named fields are allowed")
            names.add(name)
            names |= _template_fields(spec or "")
    return names


def _pattern(text: str, key: str, rid: str, where: str, user: bool) -> Pattern:
    """A recipe's pattern: a user's compiled for linear-time matching, as every user pattern is."""
    if user:
        return compile_user_pattern(text, f"{where}: recipe {rid}: {key}", RulesError)
    try:
        return re.compile(text)
    except re.error as exc:
        raise RulesError(
            f"recipe {rid}: {key}: bad regular expression {text!r} ({exc})", path=where
        ) from None


def parse_recipes(entries: Any, where: str, *, user: bool = False) -> tuple[Recipe, ...]:
    """Validated recipes from a list of recipe mappings (``fixes.yaml``'s ``recipes`` or a
    rules file's ``fixes``). ``RulesError`` names the recipe and what is wrong. A user's
    patterns (``user``) are compiled for linear-time matching, as every user pattern is."""
    try:
        models = FixesFile.model_validate({"schema": SCHEMA, "recipes": entries}).recipes
    except ValidationError as exc:
        raise RulesError(describe(exc), path=where) from None
    out = []
    for m in models:
        bad = sorted(set(m.when) - set(WHEN_FIELDS))
        if bad:
            raise RulesError(
                f"recipe {m.id}: when: unknown field(s) {', '.join(bad)}; known: {', '.join(WHEN_FIELDS)}",
                path=where,
            )
        when = {k: _pattern(v, f"when.{k}", m.id, where, user) for k, v in m.when.items()}
        renames = None
        if m.renames_builtin is not None:
            of = _pattern(m.renames_builtin.of, "renames_builtin.of", m.id, where, user)
            renames = (of, m.renames_builtin.to)
        for name in ("carries", "cannot_carry"):
            unknown = sorted(set(getattr(m, name)) - set(PARAMS))
            if unknown:
                raise RulesError(
                    f"recipe {m.id}: {name}: unknown parameter(s) {', '.join(unknown)}; known: {', '.join(PARAMS)}",
                    path=where,
                )
        for what, value in (("torch", m.requires.torch), ("capability", m.requires.capability)):
            if value is not None and not VERSION_REQUIREMENT.match(value):
                raise RulesError(f"recipe {m.id}: requires.{what} {value!r} is not like '>=2.0'", path=where)
        try:
            used = _template_fields(m.text) | _template_fields(m.apply) | _template_fields(m.apply_why_not)
        except ValueError as exc:
            raise RulesError(f"recipe {m.id}: {exc}", path=where) from None
        unknown = sorted(used - FIELDS)
        if unknown:
            raise RulesError(
                f"recipe {m.id}: unknown template field(s) {', '.join(unknown)}; known: {', '.join(sorted(FIELDS))}",
                path=where,
            )
        if m.apply is None:
            if not m.apply_why_not:
                raise RulesError(f"recipe {m.id}: apply is null, so apply_why_not must say why", path=where)
        else:
            kind = m.apply.get("kind")
            if kind not in APPLY_KINDS:
                raise RulesError(
                    f"recipe {m.id}: apply kind {kind!r} is not one of {', '.join(APPLY_KINDS)}", path=where
                )
            given, wanted = set(m.apply) - {"kind"}, set(APPLY_KINDS[kind])
            if given != wanted:
                raise RulesError(
                    f"recipe {m.id}: apply kind {kind} takes {', '.join(sorted(wanted)) or 'no fields'}, "
                    f"got {', '.join(sorted(given)) or 'none'}",
                    path=where,
                )
        out.append(
            Recipe(
                id=m.id,
                title=m.title,
                when=when,
                scope=m.scope,
                requires=m.requires,
                carries=tuple(m.carries),
                cannot_carry=tuple(m.cannot_carry),
                text=m.text,
                apply=m.apply,
                apply_why_not=m.apply_why_not,
                alternatives=tuple(m.alternatives),
                fuses_residual_add=m.fuses_residual_add,
                saving=m.saving,
                renames_builtin=renames,
            )
        )
    ids = [r.id for r in out]
    dup = sorted({i for i in ids if ids.count(i) > 1})
    if dup:
        raise RulesError(f"recipe id(s) {', '.join(dup)} given twice", path=where)
    return tuple(out)


def load_recipes(path: str | Path | None = None, extra: tuple[Recipe, ...] = ()) -> tuple[Recipe, ...]:
    """The shipped recipes (or ``path``'s), with ``extra`` (a rules file's ``fixes``) in front:
    a user recipe of a shipped id replaces it."""
    where = str(path or fixes_path())
    try:
        data = yaml.safe_load(Path(where).read_text())
    except FileNotFoundError:
        raise RulesError("no such fixes file", path=where) from None
    except yaml.YAMLError as exc:
        raise RulesError(f"not valid YAML ({str(exc).splitlines()[0]})", path=where) from None
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        raise RulesError(f"a fixes file is a mapping with schema {SCHEMA!r}", path=where)
    shipped = parse_recipes(data.get("recipes"), where)
    ids = {r.id for r in extra}
    recipes = (*extra, *(r for r in shipped if r.id not in ids))
    known = {r.id for r in recipes}
    for r in recipes:
        missing = [a for a in r.alternatives if a not in known]
        if missing:
            raise RulesError(
                f"recipe {r.id}: alternatives name unknown recipe(s) {', '.join(missing)}", path=where
            )
    return recipes
