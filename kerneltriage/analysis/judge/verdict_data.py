"""The data of the verdict's steps (``kerneltriage/data/verdicts.yaml``) as validated models:
the decision ladders (which steps, in which order, with which words), the advice steps run on
library GEMMs and convolutions, and library attention's advice.

A text with ``{fields}`` is a ``str.format`` template: each model lists the fields each of its
texts may name (``TEMPLATES``), and a text naming another is refused as the file is read, as a
wrong type, an unknown step or a pattern that does not compile is (``RulesError`` naming the
file and the key). Nothing from the file is evaluated.
"""

from __future__ import annotations

import functools
import re
import string
from typing import Annotated, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictStr, model_validator

from kerneltriage.analysis.vocabulary import Reason
from kerneltriage.validation import load_shipped


def check_template(text: str, allowed: tuple[str, ...], key: str) -> None:
    """Refuse a template naming a field outside ``allowed`` (or one that is not a plain name)."""
    try:
        names = [name for _, name, _, _ in string.Formatter().parse(text) if name is not None]
    except ValueError as exc:
        raise ValueError(f"{key}: not a template ({exc})") from None
    for name in names:
        if name not in allowed:
            known = ", ".join(allowed) or "none"
            raise ValueError(f"{key}: unknown field {{{name}}} (known: {known})")


class _Texts(BaseModel):
    """Words, some of them templates: ``TEMPLATES`` names the fields each text may use (a text
    not listed is never formatted, so it may not name any)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    TEMPLATES: ClassVar[dict[str, tuple[str, ...]]] = {}

    @model_validator(mode="after")
    def _templates(self) -> _Texts:
        for key, value in self:
            if isinstance(value, str):
                check_template(value, self.TEMPLATES.get(key, ()), key)
        return self


class DisagreesWords(_Texts):
    TEMPLATES = dict.fromkeys(("counters", "implausible", "shape_model"), ("times",))
    counters: StrictStr
    implausible: StrictStr
    shape_model: StrictStr


class Words(_Texts):
    TEMPLATES = {
        "low_headroom": ("what", "achieved", "headroom", "min_headroom", "saving"),
        "failed_estimate": ("why",),
    }
    disagrees: DisagreesWords
    low_headroom: StrictStr
    failed_estimate: StrictStr
    no_gpu: StrictStr
    no_counters: StrictStr
    launch_floor: StrictStr
    compiled_fallback: StrictStr


# --- the ladders' steps ----------------------------------------------------------------------


class DisagreesStep(_Texts):
    step: Literal["disagrees"]


class ColdStep(_Texts):
    step: Literal["cold"]


class NoCeilingStep(_Texts):
    TEMPLATES = {"library_kernels": ("library",)}
    step: Literal["no-ceiling"]
    library_kernels: StrictStr | None = None  # None: vendor library kernels get no skip of their own
    estimate_unavailable: StrictBool = False  # say why, in the rules' words (estimate_unavailable)


class FailedEstimateStep(_Texts):
    TEMPLATES = {"why": ("headroom",)}
    step: Literal["failed-estimate"]
    why: StrictStr


class LaunchBoundStep(_Texts):
    TEMPLATES = {"note": ("launches",)}
    step: Literal["launch-bound"]
    near_floor_only: StrictBool
    builtin: StrictStr
    note: StrictStr


class BelowHeadroomStep(_Texts):
    step: Literal["below-headroom"]
    at_roof: Reason
    library_at_roof: Reason | None = None  # None: library ops are not told apart
    what: StrictStr
    library_what: StrictStr | None = None
    rules_at_roof_note: StrictBool = False  # at the roof, the rules' at_roof_note


class UnstableStep(_Texts):
    step: Literal["unstable"]
    note: StrictStr | None = None  # None: the rules' note stays


class RecommendStep(_Texts):
    TEMPLATES = {"compiled_library": ("library", "builtin")}
    step: Literal["recommend"]
    already_builtin: StrictStr
    already_note: StrictStr
    compiled_modes: re.Pattern[str]  # a compile whose built-in names one still changes a kept library kernel
    compiled_library: StrictStr  # the note of a library kernel a compiled graph kept


class CompiledWriteStep(_Texts):
    step: Literal["compiled-write"]


Step = Annotated[
    DisagreesStep
    | ColdStep
    | NoCeilingStep
    | FailedEstimateStep
    | LaunchBoundStep
    | BelowHeadroomStep
    | UnstableStep
    | RecommendStep
    | CompiledWriteStep,
    Field(discriminator="step"),
]
#: The steps that end a ladder: what is left after every other step gets its verdict there.
LAST_STEPS = ("recommend", "compiled-write")


class Ladder(_Texts):
    TEMPLATES = {"estimate_unavailable": ("why",)}
    # A rules recommendation read in place of the candidate's kind's (its built-in and note
    # dropped), and what the headroom condition says when the estimate was unavailable.
    recommendation: StrictStr | None = None
    estimate_unavailable: StrictStr | None = None
    steps: tuple[Step, ...]

    @model_validator(mode="after")
    def _ends_once(self) -> Ladder:
        last = [i for i, s in enumerate(self.steps) if s.step in LAST_STEPS]
        if last != [len(self.steps) - 1]:
            raise ValueError(f"a ladder ends with one of {', '.join(LAST_STEPS)}, and only there")
        return self


# --- the advice on library GEMMs and convolutions ----------------------------------------------


class Fp32SimtWords(_Texts):
    TEMPLATES = {"note": ("share", "fix"), "saving": ("gain",)}
    fix_tf32: StrictStr
    fix_bf16: StrictStr
    fix_fp16: StrictStr
    note: StrictStr
    saving: StrictStr


class ChannelsLastWords(_Texts):
    TEMPLATES = {"note": ("share",)}
    note: StrictStr
    builtin: StrictStr
    then: StrictStr


class DepthwiseWords(_Texts):
    TEMPLATES = {
        "what": ("size", "channels"),
        "what_kernels": ("kernels",),
        "forward": ("what",),
        "backward": ("what", "share"),
    }
    ops: re.Pattern[str]
    what: StrictStr
    what_kernels: StrictStr
    forward: StrictStr
    backward: StrictStr


class AlignmentWords(_Texts):
    TEMPLATES = {
        "unaligned_kernels": ("share",),
        "unaligned_at": ("share", "m", "n", "k"),
        "note": ("what", "multiple"),
        "builtin": ("what",),
        "pad_k": ("pad", "dim", "padded"),
        "pad_n": ("dim", "padded"),
        "unknown_dims": ("multiple",),
        "pad_unknown": ("multiple",),
        "measured": ("gain", "case", "precision", "gpu", "saving"),
        "saving_basis": ("gain", "case", "precision", "gpu"),
        "condition": ("gain", "case", "precision", "gpu"),
        "shape_pad": ("low", "high", "gpu"),
    }
    unaligned_kernels: StrictStr
    unaligned_at: StrictStr
    note: StrictStr
    builtin: StrictStr
    verdict_note: StrictStr
    pad_k: StrictStr
    pad_n: StrictStr
    vocabulary_modules: re.Pattern[str]
    pad_vocabulary: StrictStr
    measured: StrictStr
    condition: StrictStr
    saving_basis: StrictStr
    shape_pad: StrictStr
    unknown_dims: StrictStr
    pad_unknown: StrictStr


# --- library attention -----------------------------------------------------------------------


class CauseEdit(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    cause: StrictStr
    edit: StrictStr


class MathPathWords(_Texts):
    TEMPLATES = {"builtin": ("unit",), "note": ("unit",), "dropout": ("p",)}
    #: (cause's fields, edit's fields) of each cause.
    CAUSES: ClassVar[dict[str, tuple[tuple[str, ...], tuple[str, ...]]]] = {
        "no_inputs": ((), ()),
        "fp32_inputs": (("dtype",), ()),
        "mask_dtype": (("shape", "mask_dtype", "q_dtype"), ()),
        "mask_layout": (("shape", "stride"), ()),
        "head_dim": (("head_dim",), ("padded",)),
        "unknown": ((), ()),
    }
    sdpa_ops: re.Pattern[str]
    builtin: StrictStr
    note: StrictStr
    no_inputs: CauseEdit
    fp32_inputs: CauseEdit
    mask_dtype: CauseEdit
    mask_layout: CauseEdit
    mask_both_edit: StrictStr
    head_dim: CauseEdit
    dropout: StrictStr
    unknown: CauseEdit
    any_edit: StrictStr

    @model_validator(mode="after")
    def _causes(self) -> MathPathWords:
        for key, (cause, edit) in self.CAUSES.items():
            pair = getattr(self, key)
            check_template(pair.cause, cause, f"{key}.cause")
            check_template(pair.edit, edit, f"{key}.edit")
        return self


class AttentionWords(_Texts):
    TEMPLATES = {"faster_backend": ("gpu",)}
    faster_backend: StrictStr
    check_shapes: StrictStr
    #: By GPU vendor (gpus.yaml's ``vendor``); ``nvidia`` stands for a vendor not listed.
    try_backends: dict[str, StrictStr]

    @model_validator(mode="after")
    def _every_vendor_falls_back(self) -> AttentionWords:
        if "nvidia" not in self.try_backends:
            raise ValueError("attention.try_backends needs an 'nvidia' entry, the fallback for other vendors")
        return self

    def backends_to_try(self, vendor: str) -> str:
        return self.try_backends.get(vendor, self.try_backends["nvidia"])

    math_path: MathPathWords


class SecondRungWords(_Texts):
    TEMPLATES = {
        "fix": ("id", "recipe"),
        "verified": ("id", "recipe", "realized"),
        "ruled_out": ("fixes", "headroom"),
    }
    fix: StrictStr
    verified: StrictStr
    ruled_out: StrictStr


class VerdictsFile(_Texts):
    schema_: Literal["kerneltriage.verdicts/1"] = Field(alias="schema")
    words: Words
    ladders: dict[Literal["eager", "compiled"], Ladder]
    advice: dict[StrictStr, tuple[Literal["fp32-simt", "channels-last", "depthwise", "alignment"], ...]]
    fp32_simt: Fp32SimtWords
    channels_last: ChannelsLastWords
    depthwise: DepthwiseWords
    alignment: AlignmentWords
    attention: AttentionWords
    second_rung: SecondRungWords

    @model_validator(mode="after")
    def _both_ladders(self) -> VerdictsFile:
        if set(self.ladders) != {"eager", "compiled"}:
            raise ValueError("ladders: both eager and compiled are needed")
        return self


@functools.cache
def verdicts() -> VerdictsFile:
    """The shipped ``verdicts.yaml``, validated (once per process)."""
    return load_shipped(VerdictsFile, "verdicts.yaml")
