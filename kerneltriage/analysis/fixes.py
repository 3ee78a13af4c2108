"""Fix recipes (``kerneltriage/data/fixes.yaml``, schema ``kerneltriage.fixes/1``): the one
source of the `fix` line a candidate gets and of the application ``kerneltriage verify``
performs. Pure Python: no torch.

- ``load_recipes`` validates the file (pydantic), compiles the ``when`` patterns and checks
  every template names known fields only and every ``apply`` kind is one the runner knows.
- ``detect_params`` reads what a fix must carry from the trace: an attention's causal mask,
  custom mask, logit softcap (``div → tanh → mul`` and its constant), scale, GQA group and
  dropout; a loss's ignore_index, label smoothing, final-logit softcap and lm_head bias.
- ``choose`` tries the matching recipes in order: a recipe is offered when the trace's GPU and
  PyTorch version meet its ``requires`` and it can carry every detected parameter; otherwise
  the candidate's ``recipe.blocked`` says which parameter or precondition stopped it.
- ``fused_linear_ce`` judges a fused linear cross-entropy as what it is: the lm_head GEMM plus
  the loss, in the weights' dtype, with its chunked recomputation.
- ``combine_overlaps`` counts once the savings of candidates one fix replaces together.
"""

from __future__ import annotations

import functools
import math
import re
import string
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictStr, ValidationError

from kerneltriage.analysis.estimate import dtype_bytes, tensor_inputs
from kerneltriage.errors import RulesError
from kerneltriage.patterns import Pattern, compile_user_pattern
from kerneltriage.resources import data_path, load_yaml
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
#: Apply kind -> its fields (contract: recipes-contract.md, "Apply kinds").
APPLY_KINDS: dict[str, tuple[str, ...]] = {
    "norm-swap": ("classes",),
    "liger": ("arch", "kernel"),
    "compile-module": ("classes", "mode"),
    "compile-model": ("mode",),
    "compile-mode": ("mode", "options"),
    "sdpa-backend": ("backend",),
    "hf-attention": ("causal", "softcap", "scale", "sliding_window", "gqa"),
    "autocast": ("dtype",),
    "tf32": (),
    "channels-last": (),
    "cudnn-benchmark": (),
    "fused-optimizer": (),
    "ddp": ("gradient_as_bucket_view", "static_graph", "bucket_cap_mb"),
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
#: Liger-Kernel's boolean kernel switches of ``apply_liger_kernel_to_<arch>`` (liger-kernel
#: 0.8.5, transformers/monkey_patch.py), so a fix switches on the candidate's kernel only.
LIGER_SWITCHES: dict[str, tuple[str, ...]] = {
    **dict.fromkeys(
        ("llama", "mistral", "mixtral", "qwen2", "qwen3", "qwen3_moe", "phi3", "olmo2"),
        ("rope", "cross_entropy", "fused_linear_cross_entropy", "rms_norm", "swiglu"),
    ),
    "granite": ("rope", "cross_entropy", "fused_linear_cross_entropy", "rms_norm", "swiglu"),
    **dict.fromkeys(
        ("gemma", "gemma2", "gemma3_text"),
        ("rope", "cross_entropy", "fused_linear_cross_entropy", "rms_norm", "geglu"),
    ),
    "gemma3": ("rope", "cross_entropy", "fused_linear_cross_entropy", "layer_norm", "rms_norm", "geglu"),
}
_HF_ARCH = re.compile(r"^(Llama|Mistral|Mixtral|Qwen3Moe|Qwen3|Qwen2|Phi3|Granite|Olmo2|Gemma3|Gemma2|Gemma)")
_ARCH_KEY = {"Gemma3": "gemma3_text", "Qwen3Moe": "qwen3_moe"}
_VERSION = re.compile(r"^\s*(>=|<=|==|<|>)\s*(\d+(?:\.\d+)*)\s*$")


class Requires(BaseModel):
    model_config = ConfigDict(extra="forbid")
    torch: StrictStr | None = None
    capability: StrictStr | None = None
    packages: list[StrictStr] = []
    bf16: StrictBool | None = None
    # A fused linear cross-entropy is offered only where its model predicts a gain.
    fused_linear_ce_gain: StrictBool | None = None


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
        when: dict[str, Pattern] = {}
        for k, v in m.when.items():
            if user:
                when[k] = compile_user_pattern(v, f"{where}: recipe {m.id}: when.{k}", RulesError)
                continue
            try:
                when[k] = re.compile(v)
            except re.error as exc:
                raise RulesError(
                    f"recipe {m.id}: when.{k}: bad regular expression {v!r} ({exc})", path=where
                ) from None
        for name in ("carries", "cannot_carry"):
            unknown = sorted(set(getattr(m, name)) - set(PARAMS))
            if unknown:
                raise RulesError(
                    f"recipe {m.id}: {name}: unknown parameter(s) {', '.join(unknown)}; known: {', '.join(PARAMS)}",
                    path=where,
                )
        for what, value in (("torch", m.requires.torch), ("capability", m.requires.capability)):
            if value is not None and not _VERSION.match(value):
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


# --- the trace's environment -------------------------------------------------------------


@dataclass(frozen=True)
class Environment:
    """What a recipe's preconditions are checked against: the trace's PyTorch version and GPU."""

    torch: str | None = None  # "2.11.0+cu130"; None: unknown
    torch_source: str = "unknown"  # "manifest", "legacy Kineto categories (PyTorch < 1.10)" …
    torch_below: str | None = None  # an upper bound known without the version ("1.10")
    capability: tuple[int, int] | None = None
    bf16: bool | None = None  # bf16 tensor cores
    gpu: str | None = None
    vendor: str | None = None
    sms: int | None = None
    bandwidth: float | None = None  # B/s
    rates: dict[str, float] = field(default_factory=dict)  # precision -> FLOP/s


def environment(gpu: Any, source: dict[str, Any] | None, meta: dict[str, Any] | None) -> Environment:
    """The environment of a trace: PyTorch from the run's manifest, else bounded by the
    trace's format (Kineto's capitalized categories end with PyTorch 1.9); the GPU from its
    spec (capability, bf16 units, SMs, ceilings)."""
    versions = (source or {}).get("versions") or {}
    torch, how, below = None, "unknown", None
    if versions.get("torch"):
        torch, how = str(versions["torch"]), "manifest"
    elif (meta or {}).get("kineto_legacy_categories"):
        how, below = "legacy Kineto categories (PyTorch < 1.10)", "1.10"
    if gpu is None:
        return Environment(torch=torch, torch_source=how, torch_below=below)
    rates = {}
    for p in ("fp32", "tf32", "bf16", "fp16"):
        if p in gpu.peak_tflops or p in gpu.measured_tflops:
            rates[p] = gpu.ceiling_tflop(p) * 1e12
    bf16 = "bf16" in gpu.peak_tflops and "bf16" not in gpu.emulated
    return Environment(
        torch=torch,
        torch_source=how,
        torch_below=below,
        capability=gpu.compute,
        bf16=bf16,
        gpu=gpu.name,
        vendor=gpu.vendor,
        sms=gpu.sms,
        bandwidth=gpu.bandwidth,
        rates=rates,
    )


def _requirement(text: str) -> tuple[str, str]:
    """The operator and version of a ``requires`` entry (``parse_recipes`` checked its form)."""
    m = _VERSION.match(text)
    if m is None:
        raise RulesError(f"requirement {text!r} is not like '>=2.0'")
    return m.group(1), m.group(2)


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", text.split("+")[0])[:3])


def _compare(have: tuple[int, ...], op: str, want: tuple[int, ...]) -> bool:
    n = max(len(have), len(want))
    have, want = have + (0,) * (n - len(have)), want + (0,) * (n - len(want))
    return {">=": have >= want, "<=": have <= want, "==": have == want, "<": have < want, ">": have > want}[
        op
    ]


def unmet(recipe: Recipe, env: Environment, params: dict[str, Any]) -> str | None:
    """Why ``recipe``'s preconditions fail on ``env`` (None: met or unknown)."""
    req = recipe.requires
    if req.torch:
        op, want = _requirement(req.torch)
        if env.torch:
            if not _compare(_version(env.torch), op, _version(want)):
                return f"PyTorch {env.torch} (needs {req.torch})"
        elif (
            env.torch_below
            and op in (">=", ">", "==")
            and _compare(_version(want), ">=", _version(env.torch_below))
        ):
            return f"{env.torch_source} (needs {req.torch})"
    if req.capability and env.capability and env.vendor in (None, "nvidia"):
        op, want = _requirement(req.capability)
        if not _compare(env.capability, op, _version(want)):
            major, minor = env.capability
            return f"{env.gpu or 'the GPU'} is compute capability {major}.{minor} (needs {req.capability})"
    if req.bf16 and env.bf16 is False:
        return f"{env.gpu or 'the GPU'} has no bf16 tensor cores"
    if req.fused_linear_ce_gain:
        judged = params.get("fused_linear_ce")
        if not judged:
            return "no lm_head GEMM of this loss in the trace to judge a fused linear CE against"
        if judged["gain_ms"] <= 0:
            return judged["why"]
        if judged["saving_share"] < judged.get("loss_only_share", 0.0):
            return (
                f"{judged['why']}: {judged['saving_share']:.1%} of the step, below the "
                f"{judged['loss_only_share']:.1%} the loss-only kernel saves"
            )
    return None


# --- parameters read from the trace ---------------------------------------------------------


def _scalar(value: Any) -> float | None:
    try:
        x = float(str(value).strip())
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def _op_scalar(op: dict[str, Any]) -> float | None:
    """The scalar operand of a binary op (``aten::mul(x, 0.088)``): a concrete value recorded
    where the dims are empty."""
    dims, concrete = op.get("dims") or [], op.get("concrete") or []
    for i, d in enumerate(dims[:2]):
        if d == [] and i < len(concrete):
            x = _scalar(concrete[i])
            if x is not None:
                return x
    return None


def _attention_params(c: Any, by_module: dict[str, Any]) -> dict[str, Any]:
    a, ops = c.attrs, c.example or []
    names = [o.get("name", "") for o in ops]
    params: dict[str, Any] = {}
    mask = a.get("mask")
    head_dim = a.get("head_dim")
    q = c.q or []
    seq = q[-2] if len(q) >= 2 else None
    mask_shape = None
    for o in ops:
        if o.get("name") in ("aten::add", "aten::add_", "aten::masked_fill", "aten::where"):
            tensors = tensor_inputs(o.get("dims"), o.get("types"))
            if len(tensors) >= 2:
                mask_shape = tensors[1][0]
    cls = _module_class(c)
    if mask == "causal":
        params["causal"] = True
    elif mask == "custom-mask":
        # An HF decoder's eager attention adds the model's S×S mask (causal, and the sliding
        # window where the config has one): use_flash_attention rebuilds it from the config.
        if (
            mask_shape
            and len(mask_shape) >= 2
            and mask_shape[-1] == mask_shape[-2] == seq
            and _HF_ARCH.match(cls)
        ):
            params["causal"] = True
            params["mask_from"] = "the model's S×S causal mask"
        else:
            params["custom-mask"] = "x".join(map(str, mask_shape)) if mask_shape else True
    else:
        params["causal"] = False
    # Scale: the first scalar mul/div after the scores matmul, before softmax and any tanh.
    scale = None
    for o, n in zip(ops[1:], names[1:]):
        if n in ("aten::mul", "aten::div") and scale is None:
            x = _op_scalar(o)
            if x:
                scale = x if n == "aten::mul" else 1.0 / x
            break
        if n in ("aten::tanh", "aten::_softmax", "aten::softmax"):
            break
    if a.get("softcap"):
        cap = None
        for i, n in enumerate(names):
            if n == "aten::tanh":
                for o, m in zip(reversed(ops[:i]), reversed(names[:i])):
                    if m in ("aten::div", "aten::mul"):
                        x = _op_scalar(o)
                        if x:
                            cap = x if m == "aten::div" else 1.0 / x
                        break
                break
        params["softcap"] = round(cap, 6) if cap else True
    if scale is not None and head_dim and abs(scale * math.sqrt(head_dim) - 1.0) > 1e-3:
        params["scale"] = round(scale, 6)
    if a.get("dropout"):
        p = None
        for o, n in zip(ops, names):
            if "dropout" in n:
                conc = o.get("concrete") or []
                p = next((x for x in map(_scalar, conc[1:2]) if x is not None), None)
        if p != 0.0:
            params["dropout"] = p if p is not None else True
    gqa = _gqa(c, by_module)
    if gqa and gqa > 1:
        params["gqa"] = gqa
    return params


def _gqa(c: Any, by_module: dict[str, Any]) -> int | None:
    """Query heads per key head, from the attention module's q and k projections' weights."""
    path = (c.module or "").partition(" (")[0]
    q = k = None
    for qn, kn in (("q_proj", "k_proj"), ("query", "key"), ("wq", "wk")):
        q, k = by_module.get(f"{path}.{qn}"), by_module.get(f"{path}.{kn}")
        if q and k:
            break
    if not (q and k):
        return None
    if q % k == 0:
        return q // k
    return None


def _loss_params(c: Any, gemm: Any | None) -> dict[str, Any]:
    params: dict[str, Any] = {}
    ops, names = c.example or [], [o.get("name", "") for o in c.example or []]
    for o, n in zip(ops, names):
        if n in ("aten::cross_entropy_loss", "aten::nll_loss", "aten::nll_loss_nd", "aten::nll_loss_forward"):
            conc = o.get("concrete") or []
            # cross_entropy_loss(self, target, weight, reduction, ignore_index, label_smoothing)
            if n == "aten::cross_entropy_loss" and len(conc) >= 6:
                ls = _scalar(conc[5])
                if ls:
                    params["label-smoothing"] = ls
            ii = _scalar(conc[4]) if len(conc) >= 5 else None
            if ii is not None:
                params["ignore-index"] = int(ii)
    if "aten::tanh" in names:
        i = names.index("aten::tanh")
        cap = None
        for o, m in zip(reversed(ops[:i]), reversed(names[:i])):
            if m in ("aten::div", "aten::mul"):
                x = _op_scalar(o)
                if x:
                    cap = x if m == "aten::div" else 1.0 / x
                break
        params["softcap"] = round(cap, 6) if cap else True
    if gemm is not None:
        op = (gemm.example or [{}])[0]
        tensors = tensor_inputs(op.get("dims"), op.get("types"))
        if op.get("name") in ("aten::linear", "aten::addmm") and len(tensors) >= 3:
            params["bias"] = True
    return params


#: A Hugging Face causal LM: its loss is transformers' own (``ForCausalLMLoss``).
_HF_LM = re.compile(r".+ForCausalLM$")
#: The share of the step a loss-only patch leaves in place (``params``, not a template field).
UPCAST_KEPT = "upcast_kept_share"


def kept_upcast_ms(c: Any, env: Environment) -> float:
    """The fp32 upcast of 16-bit logits in a loss region (``aten::to`` to float), at the memory
    ceiling: forward reads 2 bytes and writes 4 an element, backward the reverse. transformers'
    ``ForCausalLMLoss`` upcasts before ``cross_entropy``, so Liger's loss-only patch, which
    replaces ``cross_entropy``, leaves it."""
    if not env.bandwidth:
        return 0.0
    for o in c.example or []:
        if o.get("name") not in ("aten::to", "aten::_to_copy"):
            continue
        tensors = tensor_inputs(o.get("dims"), o.get("types"))
        conc = o.get("concrete") or []
        # aten::to(self, dtype, …): ScalarType 6 is float32.
        if tensors and dtype_bytes(tensors[0][1]) == 2 and len(conc) > 1 and str(conc[1]).strip() == "6":
            elements = math.prod(tensors[0][0])
            return 12.0 * elements / env.bandwidth * 1e3 * (c.instances_per_step or 1.0)
    return 0.0


def _module_class(c: Any) -> str:
    return (c.module or "").partition(" (")[2].rstrip(")")


def _logits_dims(c: Any) -> tuple[int, int] | None:
    """(tokens, vocabulary) of a loss candidate's logits: its largest 2-D+ float tensor."""
    best = None
    for o in c.example or []:
        for d, t in tensor_inputs(o.get("dims"), o.get("types")):
            if len(d) >= 2 and t in ("float", "c10::BFloat16", "c10::Half"):
                n = math.prod(d)
                if best is None or n > math.prod(best):
                    best = d
    if not best:
        return None
    return math.prod(best[:-1]), best[-1]


def gemm_dims(c: Any) -> tuple[int, int, int, str] | None:
    """(M, N, K, dtype) of a GEMM candidate's recorded op (linear, mm, addmm, matmul, bmm)."""
    op = (c.example or [{}])[0]
    tensors = tensor_inputs(op.get("dims"), op.get("types"))
    name = op.get("name", "")
    if len(tensors) < 2:
        return None
    if name == "aten::addmm" and len(tensors) >= 3:
        tensors = tensors[1:]
    (a, at), (b, _) = tensors[:2]
    if len(a) < 2 or len(b) < 1:
        return None
    if name == "aten::linear":
        return math.prod(a[:-1]), b[0], a[-1], at
    if len(b) >= 2:
        return math.prod(a[:-1]), b[-1], a[-1], at
    return None


def lm_head_for(loss: Any, candidates: list[Any]) -> Any | None:
    """The GEMM candidate producing a loss candidate's logits: N is the vocabulary and M the
    tokens (the lm_head, BERT's decoder)."""
    dims = _logits_dims(loss)
    if not dims:
        return None
    tokens, vocab = dims
    best = None
    for g in candidates:
        if g.kind != "gemm":
            continue
        d = gemm_dims(g)
        if d and d[1] == vocab and d[0] == tokens and (best is None or g.time_share > best.time_share):
            best = g
    return best


# --- fused linear cross-entropy, judged as what it runs --------------------------------------


def fused_linear_ce(loss: Any, gemm: Any | None, env: Environment, step_ms: float) -> dict[str, Any] | None:
    """Liger's fused linear cross-entropy replaces the lm_head GEMM (forward and both backward
    GEMMs) and the loss. It runs every GEMM in the weights' dtype (fp32 weights under autocast:
    fp32 GEMMs), in chunks of ``next_pow2(BT / ceil(V / H))`` rows, and accumulates the weight
    gradient into a V×H buffer once per chunk. Its time: the GEMMs' FLOPs at the dtype's
    ceiling, plus the per-chunk logits passes and weight-gradient read-modify-writes at the
    memory ceiling. Against today's GEMM + loss time (measured)."""
    if gemm is None or not env.rates or not env.bandwidth:
        return None
    d = gemm_dims(gemm)
    if not d:
        return None
    bt, vocab, hidden, act_type = d
    op = (gemm.example or [{}])[0]
    tensors = tensor_inputs(op.get("dims"), op.get("types"))
    weight_type = tensors[1][1] if len(tensors) >= 2 else act_type
    precision = {"float": "fp32", "c10::BFloat16": "bf16", "c10::Half": "fp16"}.get(weight_type, "fp32")
    rate = env.rates.get(precision) or env.rates.get("fp32")
    if not rate:
        return None
    inc = math.ceil(vocab / hidden)
    chunk = min(bt, 1 << max(0, math.ceil(math.log2(max(1, math.ceil(bt / inc))))))
    chunks = math.ceil(bt / chunk)
    es = dtype_bytes(weight_type)
    flops = 3 * 2.0 * bt * hidden * vocab
    grad_weight = chunks * 2 * vocab * hidden * es  # addmm into the V×H gradient, per chunk
    logits = 4 * bt * vocab * es  # logits chunk written, read, gradient written and read
    fused_ms = (flops / rate + (grad_weight + logits) / env.bandwidth) * 1e3
    today_ms = gemm.time_ms_per_step + loss.time_ms_per_step
    gain = today_ms - fused_ms
    why = (
        f"fused linear CE predicted at {fused_ms:.3g} ms against {today_ms:.3g} ms today "
        f"(lm_head GEMM {gemm.time_ms_per_step:.3g} + loss {loss.time_ms_per_step:.3g}): "
        f"{flops / 1e12:.3g} TFLOP in {precision} (the weights' dtype), {chunks} chunks of {chunk} rows "
        f"re-reading the {vocab}x{hidden} weight gradient"
    )
    return {
        "fused_ms": fused_ms,
        "today_ms": today_ms,
        "gain_ms": gain,
        "saving_share": max(0.0, gain) / step_ms if step_ms else 0.0,
        "precision": precision,
        "chunks": chunks,
        "chunk_rows": chunk,
        "gemm": gemm.id,
        "why": why,
    }


# --- choosing and rendering ----------------------------------------------------------------


class _Strict(dict):
    def __missing__(self, key: str) -> str:
        raise KeyError(key)


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


def candidate_fields(c: Any, params: dict[str, Any]) -> dict[str, Any]:
    """The template fields of a candidate and its detected parameters."""
    path, _, cls = (c.module or "").partition(" (")
    cls = cls.rstrip(")")
    arch_m = _HF_ARCH.match(cls)
    arch = _ARCH_KEY.get(arch_m[1], arch_m[1].lower()) if arch_m else ""
    head, _, leaf = path.partition(".*.")
    enclosing = [m.partition(":")[2] for m in c.attrs.get("enclosing_modules") or []]
    classes = sorted({x for x in enclosing if x}) or ([cls] if cls and c.kind == "norm" else [])
    backend = re.search(r"SDPBackend\.(\w+)", c.builtin or "")
    norm_class = _norm_class(cls)
    norm_function = "layer_norm" if "layer_norm" in (c.builtin or "") else "rms_norm"
    causal = bool(params.get("causal"))
    ce = []
    if "ignore-index" in params and params["ignore-index"] != -100:
        ce.append(f"ignore_index={params['ignore-index']}")
    if params.get("label-smoothing"):
        ce.append(f"label_smoothing={_fmt(params['label-smoothing'])}")
    if isinstance(params.get("softcap"), float) and c.kind == "cross-entropy":
        ce.append(f"softcap={_fmt(params['softcap'])}")
    softcap = params.get("softcap") if isinstance(params.get("softcap"), float) else None
    return {
        "candidate_id": getattr(c, "id", None) or "ID",  # what `verify --by-hand` takes
        "verdict": c.verdict,
        "reason": c.reason or "",
        "builtin": c.builtin or "",
        "kind": c.kind,
        "written": str(c.attrs.get("written") or ""),
        "module_class": cls or "matching",
        "in_module": f" in {path}" if path else "",
        "module_path": path or "?",
        "module_list": head or "?",
        "module_leaf": leaf or "?",
        "variant": c.variant or "",
        "compiled": str(bool(c.inductor or c.compiled)),
        "classes": classes,
        # The candidate's own module class: what a norm swap replaces (``classes`` holds the
        # modules around a region, a residual add's Block among them).
        "module_classes": [cls] if cls else [],
        # A set literal spelled in sorted order: the same text on every run (set order is not).
        "classes_repr": "{" + ", ".join(repr(c) for c in sorted(set(classes))) + "}" if classes else "set()",
        "arch": arch,
        "causal": str(causal),
        "causal_value": causal,
        "scale": params.get("scale"),
        "scale_arg": f", scale={_fmt(params['scale'])}" if "scale" in params else "",
        "softcap": softcap,
        "softcap_arg": f", softcap={_fmt(softcap)}" if softcap else "",
        "sliding_window": None,  # read from the model's config by use_flash_attention
        "gqa": params.get("gqa") or 1,
        "gqa_arg": ", enable_gqa=True" if (params.get("gqa") or 1) > 1 else "",
        "dropout_arg": f", dropout_p={_fmt(params['dropout'])}"
        if isinstance(params.get("dropout"), float)
        else "",
        "ce_args": ", ".join(ce),
        "bias_arg": ", bias=lm_head.bias" if params.get("bias") else "",
        "backend": backend[1] if backend else "",
        "kernels": f"{c.roofline.launches_per_step:.0f}",
        "fused_path_edit": str(c.attrs.get("fused_path_edit") or ""),
        "pad_edit": str(c.attrs.get("pad_edit") or ""),
        "norm_class": norm_class,
        "norm_check": (
            f"; {cls} is not a listed class: patch checks its math on a tiny CPU copy first and, if it differs, "
            "leaves it and says why"
            if norm_class == "checkable"
            else ""
        ),
        "norm_function": norm_function,
        "norm_call": (
            f"{norm_function}(x, norm.weight, norm.bias, norm.eps)"
            if norm_function == "layer_norm"
            else f"{norm_function}(x, norm.weight, norm.eps)  # cast_before_weight= / weight_offset= as the norm's math"
        ),
        "server": str(bool(c.attrs.get("server"))),
        "op_name": str((getattr(c, "ops", None) or [getattr(c, "name", "") or "the op"])[0]).partition("(")[
            0
        ],
    }


#: Norm classes patch() swaps by name: torch.nn's own.
_TORCH_NORMS = frozenset({"RMSNorm", "LayerNorm"})


def _norm_class(cls: str) -> str:
    """How ``patch()`` treats a norm module class: ``listed`` (torch's, or hf_norms.yaml's),
    ``checkable`` (a *RMSNorm / *LayerNorm it swaps where its math checks out on a tiny CPU
    copy), ``unknown`` (none of those: the fix is applied by hand)."""
    if not cls:
        return "unknown"
    if cls in _TORCH_NORMS or cls in hf_norm_classes():
        return "listed"
    if cls.endswith(("RMSNorm", "LayerNorm")):
        return "checkable"
    return "unknown"


@functools.cache
def hf_norm_classes() -> frozenset[str]:
    """The Hugging Face norm classes ``hf_norms.yaml`` lists with the math a drop-in matches."""
    return frozenset((load_yaml("hf_norms.yaml") or {}).get("classes") or {})


def _liger_switches(arch: str, kernel: str) -> str:
    switches = LIGER_SWITCHES.get(arch)
    if not switches:
        return f"{kernel}=True"
    return ", ".join(f"{s}={s == kernel}" for s in switches)


def render(recipe: Recipe, fields: dict[str, Any]) -> tuple[str, dict[str, Any] | None, str | None]:
    """(text, apply mapping, apply_why_not) of ``recipe`` on a candidate's fields."""
    values = dict(fields, id=recipe.id)
    kernel = (recipe.apply or {}).get("kernel")
    if recipe.apply and recipe.apply.get("kind") == "liger" and isinstance(kernel, str):
        values["liger_switches"] = _liger_switches(str(fields.get("arch", "")), kernel)
    else:
        values.setdefault("liger_switches", "")
    strict = _Strict({k: _fmt(v) if not isinstance(v, str) else v for k, v in values.items()})
    text = recipe.text.format_map(strict)
    apply = None
    if recipe.apply is not None:
        apply = {}
        for k, v in recipe.apply.items():
            m = re.fullmatch(r"\{(\w+)\}", v) if isinstance(v, str) else None
            apply[k] = values[m[1]] if m else (v.format_map(strict) if isinstance(v, str) else v)
    why = recipe.apply_why_not.format_map(strict) if recipe.apply_why_not else None
    return text, apply, why


def detect_params(c: Any, candidates: list[Any], env: Environment, step_ms: float) -> dict[str, Any]:
    """The parameters a fix of ``c`` must carry, read from its recorded ops (and, for a
    loss, from the lm_head GEMM that feeds it)."""
    by_module = {}
    for g in candidates:
        d = gemm_dims(g) if g.kind == "gemm" else None
        if d:
            by_module[(g.module or "").partition(" (")[0]] = d[1]
    if c.kind == "attention" and c.attrs.get("written") == "naive":
        return _attention_params(c, by_module)
    if c.kind == "cross-entropy":
        gemm = lm_head_for(c, candidates)
        params = _loss_params(c, gemm)
        kept = kept_upcast_ms(c, env) / step_ms if step_ms and _HF_LM.match(_module_class(c)) else 0.0
        if kept:
            params[UPCAST_KEPT] = kept
        if "FusedLinear" in (c.builtin or ""):
            judged = fused_linear_ce(c, gemm, env, step_ms)
            if judged:
                # What the loss-only kernel saves (the candidate's own prediction, less the
                # upcast it leaves): a fused linear CE that saves less is declined for it.
                judged["loss_only_share"] = max(0.0, c.expected_saving_share - kept)
                params["fused_linear_ce"] = judged
        return params
    if c.kind == "norm" and c.attrs.get("residual_add"):
        return {"residual-add": True}
    return {}


def _blocking(recipe: Recipe, params: dict[str, Any]) -> str | None:
    for p in recipe.cannot_carry:
        if params.get(p) not in (None, False):
            value = params[p]
            shown = "" if value is True else f" {_fmt(value)}"
            return f"{p}{shown}: {recipe.title} cannot carry it"
    return None


def choose(
    c: Any, recipes: tuple[Recipe, ...], env: Environment, params: dict[str, Any]
) -> dict[str, Any] | None:
    """The recipe of a candidate (the contract's ``recipe`` mapping, with ``text``), or None
    when no recipe matches it. ``blocked`` is set when every matching recipe was stopped."""
    fields = candidate_fields(c, params)
    matched = [r for r in recipes if r.matches(fields)]
    if not matched:
        return None
    first_block: tuple[Recipe, str] | None = None
    chosen = None
    declined: dict[str, str] = {}
    for r in matched:
        why = _blocking(r, params) or unmet(r, env, params)
        if why is None:
            chosen = r
            break
        declined[r.id] = why
        if first_block is None:
            first_block = (r, why)
    shown = {k: v for k, v in params.items() if k not in ("fused_linear_ce", UPCAST_KEPT)}
    if chosen is None:
        assert first_block is not None  # some recipe matched, and each one declined
        r, why = first_block
        return {
            "id": r.id,
            "params": shown,
            "scope": r.scope,
            "covers": None,
            "blocked": why,
            "apply": None,
            "apply_why_not": None,
            "text": None,
        }
    text, apply, why_not = render(chosen, fields)
    by_id = {r.id: r for r in recipes}
    for alt in chosen.alternatives:
        other = by_id.get(alt)
        if other and other.matches(fields) and not (_blocking(other, params) or unmet(other, env, params)):
            alt_text = render(other, fields)[0]
            text += "\n# or: " + alt_text.replace("\n", "\n#     ")
    notes = []
    if chosen.requires.packages:
        notes.append(f"needs {', '.join(p.replace('_', '-') for p in chosen.requires.packages)}")
    if chosen.requires.torch and env.torch is None and env.torch_below is None:
        notes.append(f"assumes PyTorch {chosen.requires.torch} (the trace does not say its version)")
    return {
        "id": chosen.id,
        "params": shown,
        "scope": chosen.scope,
        "covers": {"instances_per_step": c.instances_per_step, "of_candidate": c.instances_per_step},
        "blocked": None,
        "apply": apply,
        "apply_why_not": why_not,
        "text": text,
        "declined": declined,
        "needs": notes,
        "fuses_residual_add": chosen.fuses_residual_add,
    }


def combine_overlaps(candidates: list[Any]) -> None:
    """Candidates one fix replaces together (fused linear CE replaces the lm_head GEMM and the
    loss) are one saving: the loss's recipe carries the combined figure, and the GEMM keeps only
    what its own fix adds beyond it, so their sum is the combined figure."""
    by_id = {c.id: c for c in candidates}
    for c in candidates:
        r = c.recipe or {}
        judged = c.attrs.get("fused_linear_ce")
        if not r.get("id", "").startswith("liger-fused-linear-ce") or r.get("blocked") or not judged:
            continue
        gemm = by_id.get(judged["gemm"])
        if gemm is None:
            continue
        combined = max(c.expected_saving_share, gemm.expected_saving_share)
        gemm_alone = gemm.expected_saving_share
        gemm.expected_saving_share = max(0.0, combined - c.expected_saving_share)
        if gemm_alone:
            gemm.attrs["saving_alone"] = gemm_alone
            gemm.attrs["saving_scoped"] = f"counted once with {c.id}'s fused linear CE"
            gemm.note = "; ".join(
                x
                for x in (
                    gemm.note,
                    f"{c.id}'s fused linear CE replaces this GEMM too: their savings count once "
                    f"({combined:.1%} together)",
                )
                if x
            )
        r["covers"] = dict(r.get("covers") or {}, also=[gemm.id])


# --- GEMM shape diagnostics ------------------------------------------------------------------

_PROJECTIONS = (
    {"q_proj", "k_proj", "v_proj"},
    {"query", "key", "value"},
    {"gate_proj", "up_proj"},
    {"wq", "wk", "wv"},
)
_TILE = 128


def gemm_diagnostics(c: Any, candidates: list[Any], env: Environment) -> list[str]:
    """What a GPU engineer checks first on a library GEMM below its roof: dims that are not
    multiples of 64 (and the padded size), wave quantization, skinny N or K, separate
    projections of one module that one GEMM could run, logits of every position where the loss
    reads a few."""
    if c.kind != "gemm" or not (c.attrs.get("library_op") or c.attrs.get("vendor_share", 0.0) >= 0.5):
        return []
    if not c.headroom or c.headroom < 1.25:
        return []
    d = gemm_dims(c)
    if not d:
        return []
    m, n, k, _ = d
    out = []
    for name, v in (("N", n), ("K", k)):
        if v % 64:
            out.append(
                f"{name}={v} is not a multiple of 64: pad it to {math.ceil(v / 64) * 64} (a vocabulary padded as GPT-2 scripts pad 50257 to 50304)"
            )
    if env.sms:
        tiles = math.ceil(m / _TILE) * math.ceil(n / _TILE)
        waves = tiles / env.sms
        last = waves - math.floor(waves)
        if waves < 4 and 0 < last <= 0.5:
            out.append(
                f"{tiles} output tiles of {_TILE}x{_TILE} fill {waves:.2f} waves of {env.sms} SMs: the last wave runs {last:.0%} full"
            )
    for name, v in (("N", n), ("K", k)):
        if v <= 128:
            out.append(f"skinny {name}={v}: too little work per output tile to keep the tensor cores busy")
    path = (c.module or "").partition(" (")[0]
    parent, _, leaf = path.rpartition(".")
    for group in _PROJECTIONS:
        if leaf in group:
            siblings = {}
            for g in candidates:
                gp = (g.module or "").partition(" (")[0]
                gparent, _, gleaf = gp.rpartition(".")
                gd = gemm_dims(g) if g.kind == "gemm" else None
                if gparent == parent and gleaf in group and gd and gd[2] == k:
                    siblings[gleaf] = gd[1]
            if len(siblings) >= 2:
                names = " / ".join(sorted(siblings))
                out.append(
                    f"{names} are {len(siblings)} GEMMs on the same input: one fused projection "
                    f"({sum(siblings.values())}x{k} weight, their weights concatenated) runs one larger GEMM"
                )
    if "predictions" in path or leaf == "decoder":
        out.append(
            f"the MLM logits are computed for all {m} positions, while the loss reads only the masked ones: "
            "run the decoder on the masked positions (hidden[labels != -100])"
        )
    return out
