"""A fix recipe's ``apply`` mapping, applied in the user's process with no edit to the script.

The kinds and what each does are the contract's table (``design``: fix recipes). Two moments:

- *before the script runs*: ``liger``, ``compile-mode``, ``sdpa-backend``, ``sdpa-mask``,
  ``tf32``, ``cudnn-benchmark``, ``inductor-config``, ``fused-optimizer`` change a library or
  torch's global state;
- *at the first forward*: a global module forward pre-hook treats the first module that runs
  as the root, changes ``root.modules()`` and removes itself. Children run after the root's
  pre-hook, so they already take the new forward (``norm-swap``, ``compile-module``,
  ``compile-model``, ``hf-attention``, ``autocast``, ``channels-last``; ``fsdp-prefetch`` and
  ``fsdp-reshard`` set FSDP2's layers, ``recipes/fsdp.py``; ``gemm-pad`` pads named layers'
  GEMMs, ``recipes/gemm_pad.py``).

``install`` returns an ``Applied`` that says what was done (``details``), whether it happened at
all (``problem``), and undoes it (``remove``, for tests that apply fixes in-process).
"""

from __future__ import annotations

import functools
import importlib
import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

KINDS = (
    "norm-swap",
    "liger",
    "compile-module",
    "compile-model",
    "compile-mode",
    "sdpa-backend",
    "sdpa-mask",
    "hf-attention",
    "autocast",
    "tf32",
    "channels-last",
    "cudnn-benchmark",
    "inductor-config",
    "fused-optimizer",
    "ddp",
    "fsdp-prefetch",
    "fsdp-reshard",
    "gemm-pad",
)
#: DistributedDataParallel's constructor settings a ``ddp`` fix may set (where the report finds
#: its communication exposed): every DDP the script builds gets them.
DDP_SETTINGS = ("gradient_as_bucket_view", "static_graph", "bucket_cap_mb")
#: Kinds that act at the first forward (the others act before the script runs).
AT_FIRST_FORWARD = (
    "norm-swap",
    "compile-module",
    "compile-model",
    "hf-attention",
    "autocast",
    "channels-last",
    "fsdp-prefetch",
    "fsdp-reshard",
    "gemm-pad",
)
_FIELDS: dict[str, tuple[str, ...]] = {
    "norm-swap": ("classes",),
    "liger": ("arch", "kernel"),
    "compile-module": ("classes",),
    "sdpa-backend": ("backend",),
    "autocast": ("dtype",),
    "inductor-config": ("settings",),
}
_OPTIMIZERS = ("Adam", "AdamW", "SGD")


class ApplyFailed(BaseException):
    """The fix cannot be applied to this script. A BaseException, so that a script's
    ``except Exception`` does not swallow it: the run ends and says why."""


@dataclass
class Applied:
    kind: str
    fields: dict[str, Any]
    details: dict[str, Any] = field(default_factory=dict)
    #: Set once the change took place (at once for the kinds that act before the script).
    done: bool = False
    #: fp16 autocast: the GradScaler that scales each loss before its backward.
    scale_loss: Callable[[Any], Any] | None = None
    _undo: list[Callable[[], object]] = field(default_factory=list)  # results ignored

    @property
    def problem(self) -> str | None:
        """Why the fix never took effect in the run that ended, or None."""
        if self.done:
            return None
        if self.kind in AT_FIRST_FORWARD:
            return "no module ran a forward: the fix had nothing to apply to"
        if self.kind == "compile-mode":
            return "the script never called torch.compile, so there was no mode to change"
        if self.kind == "fused-optimizer":
            return f"the script built no torch.optim {'/'.join(_OPTIMIZERS)} optimizer"
        if self.kind == "ddp":
            return "the script built no torch.nn.parallel.DistributedDataParallel"
        if self.kind == "sdpa-mask":
            return (
                "no scaled_dot_product_attention call had a floating mask of another dtype than q "
                "or one whose last dimension was not contiguous"
            )
        return "the fix was not applied"

    def remove(self) -> None:
        """Undo what can be undone (patched functions, hooks, global flags); modules already
        swapped or compiled stay as they are."""
        while self._undo:
            self._undo.pop()()


def check(apply: Any) -> str | None:
    """Why ``apply`` is not a mapping this runner can apply, or None."""
    if not isinstance(apply, dict):
        return "no apply mapping"
    kind = apply.get("kind")
    if kind not in KINDS:
        return f"unknown apply kind {kind!r}"
    missing = [f for f in _FIELDS.get(kind, ()) if apply.get(f) in (None, "", [])]
    if missing:
        return f"apply kind {kind!r} lacks {', '.join(missing)}"
    if kind == "autocast" and str(apply["dtype"]).replace("torch.", "") not in ("bfloat16", "float16"):
        return f"autocast dtype {apply['dtype']!r} is neither bfloat16 nor float16"
    if kind == "ddp":
        return _check_ddp(apply)
    if kind == "inductor-config" and not (
        isinstance(apply["settings"], dict) and all(isinstance(k, str) for k in apply["settings"])
    ):
        return (
            "apply kind 'inductor-config' takes settings, a mapping of torch._inductor.config names to values"
        )
    if kind in ("fsdp-prefetch", "fsdp-reshard"):
        from kerneltriage.recipes import fsdp

        return fsdp.check(apply)
    if kind == "gemm-pad":
        from kerneltriage.recipes import gemm_pad

        return gemm_pad.check(apply)
    return None


def _check_ddp(apply: dict[str, Any]) -> str | None:
    settings = {k: v for k, v in apply.items() if k != "kind"}
    unknown = [k for k in settings if k not in DDP_SETTINGS]
    if unknown or not any(v is not None for v in settings.values()):
        return f"apply kind 'ddp' takes {', '.join(DDP_SETTINGS)}" + (
            f", not {', '.join(unknown)}" if unknown else ""
        )
    cap = settings.get("bucket_cap_mb")
    if cap is not None and (isinstance(cap, bool) or not isinstance(cap, (int, float)) or cap <= 0):
        return f"apply kind 'ddp': bucket_cap_mb must be a number of MB above 0, not {cap!r}"
    return None


def _ddp(torch, applied: Applied, fields: dict[str, Any]) -> None:
    """Every ``DistributedDataParallel`` the script builds gets ``fields`` as constructor
    arguments (over the script's own): its buckets as views of the gradients, a static graph,
    another bucket size. A field set to None (null) leaves the script's own value."""
    cls = torch.nn.parallel.DistributedDataParallel
    original = cls.__dict__["__init__"]
    settings = {k: v for k, v in fields.items() if v is not None}
    applied.details["wrapped"] = 0
    applied.details["settings"] = settings

    def init(self, *args, **kwargs):
        kwargs.update(settings)
        applied.details["wrapped"] += 1
        applied.done = True
        original(self, *args, **kwargs)

    cls.__init__ = init
    applied._undo.append(functools.partial(setattr, cls, "__init__", original))


def _fsdp(torch, applied: Applied, fields: dict[str, Any]) -> None:
    """FSDP2's prefetch or reshard settings on the layers of the first module that runs
    (``recipes/fsdp.py``), which must be sharded with ``fully_shard``."""
    from kerneltriage.recipes import fsdp

    action = fsdp.prefetch if applied.kind == "fsdp-prefetch" else fsdp.keep_last

    def at_root(root, _args):
        try:
            return action(torch, root, fields)
        except fsdp.Refused as exc:
            raise ApplyFailed(str(exc)) from None

    _at_first_forward(torch, applied, at_root)


def _gemm_pad(torch, applied: Applied, fields: dict[str, Any]) -> None:
    """The named ``nn.Linear`` layers' GEMMs on padded dimensions (``recipes/gemm_pad.py``)."""
    from kerneltriage.recipes import gemm_pad

    def at_root(root, _args):
        try:
            return gemm_pad.pad_layers(torch, root, fields)
        except gemm_pad.NothingToPad as exc:
            raise ApplyFailed(str(exc)) from None

    _at_first_forward(torch, applied, at_root)


_INSTALLERS_DDP = {"ddp": _ddp, "fsdp-prefetch": _fsdp, "fsdp-reshard": _fsdp, "gemm-pad": _gemm_pad}


def install(apply: dict[str, Any]) -> Applied:
    """Apply ``apply`` (the contract's mapping: ``kind`` and its fields) to this process."""
    problem = check(apply)
    if problem:
        raise ApplyFailed(problem)
    import torch

    kind = apply["kind"]
    fields = {k: v for k, v in apply.items() if k != "kind"}
    applied = Applied(kind, fields)
    {**_INSTALLERS, **_INSTALLERS_DDP}[kind](torch, applied, fields)
    return applied


# --- at the first forward -------------------------------------------------------------------


def _at_first_forward(torch, applied: Applied, action: Callable[[Any, tuple], dict[str, Any] | None]) -> None:
    from torch.nn.modules.module import register_module_forward_pre_hook

    handle = None

    def hook(module, args):
        handle.remove()
        try:
            applied.details.update(action(module, args) or {})
        except ApplyFailed:
            raise
        except Exception as exc:
            raise ApplyFailed(f"{applied.kind} failed on {type(module).__name__}: {exc}") from exc
        applied.details.setdefault("root", type(module).__name__)
        applied.done = True

    handle = register_module_forward_pre_hook(hook)
    applied._undo.append(handle.remove)


def _named(module, names) -> bool:
    cls = type(module)
    return cls.__name__ in names or f"{cls.__module__}.{cls.__qualname__}" in names


def _classes(fields: dict[str, Any]) -> list[str]:
    classes = fields["classes"]
    return [classes] if isinstance(classes, str) else list(classes)


def _norm_swap(torch, applied: Applied, fields: dict[str, Any]) -> None:
    classes = _classes(fields)

    def action(root, _args):
        from kerneltriage.kernels.patch import patch

        report = patch(root, only=classes)
        if not report.swapped:
            why = "; ".join(f"{name}: {reason}" for name, reason in report.skipped[:3])
            raise ApplyFailed(
                f"norm-swap found no {'/'.join(classes)} module it could swap" + (f" ({why})" if why else "")
            )
        return {"swapped": len(report.swapped), "skipped": [f"{n}: {r}" for n, r in report.skipped]}

    _at_first_forward(torch, applied, action)


def _compile_module(torch, applied: Applied, fields: dict[str, Any]) -> None:
    classes, mode = _classes(fields), fields.get("mode")

    def action(root, _args):
        found = [m for m in root.modules() if _named(m, classes)]
        if not found:
            raise ApplyFailed(
                f"compile-module found no {'/'.join(classes)} module under {type(root).__name__}"
            )
        for m in found:
            m.compile(mode=mode)
        return {"compiled": len(found), "mode": mode}

    _at_first_forward(torch, applied, action)


def _compile_model(torch, applied: Applied, fields: dict[str, Any]) -> None:
    mode = fields.get("mode")

    def action(root, _args):
        root.compile(mode=mode)  # the first call runs as it was; the next ones compiled
        return {"mode": mode}

    _at_first_forward(torch, applied, action)


def _hf_attention(torch, applied: Applied, fields: dict[str, Any]) -> None:
    def action(root, _args):
        try:
            from kerneltriage.kernels.hf_attention import use_flash_attention
        except ImportError as exc:
            raise ApplyFailed(
                f"the built-in attention for Hugging Face models cannot be imported: {exc}"
            ) from exc
        result = use_flash_attention(root)
        return {"hf_attention": result if isinstance(result, dict) else str(result)}

    _at_first_forward(torch, applied, action)


def _autocast(torch, applied: Applied, fields: dict[str, Any]) -> None:
    dtype_name = str(fields["dtype"]).replace("torch.", "")
    dtype = getattr(torch, dtype_name)

    def action(root: Any, args: Any) -> dict[str, Any]:
        param = next(root.parameters(), None)
        device = param.device.type if param is not None else "cuda"
        contexts: list[Any] = []

        def enter(_module, _args):
            ctx = torch.autocast(device, dtype=dtype)
            ctx.__enter__()
            contexts.append(ctx)

        def leave(_module, _args, _output):
            if contexts:
                contexts.pop().__exit__(None, None, None)

        # Hooks registered now: the post-hook already runs for this call, the pre-hook from
        # the next one; this call enters its autocast here.
        handles = [root.register_forward_pre_hook(enter), root.register_forward_hook(leave)]
        applied._undo.extend(h.remove for h in handles)
        enter(root, args)
        details = {"device": device, "dtype": dtype_name}
        if dtype_name == "float16":
            _grad_scaler(torch, applied, device)
            details["grad_scaler"] = True
        return details

    _at_first_forward(torch, applied, action)


def _grad_scaler(torch, applied: Applied, device: str) -> None:
    """fp16: each loss is scaled before its backward and every optimizer step goes through a
    GradScaler (it skips steps whose gradients overflowed)."""
    scaler = torch.amp.GradScaler(device)
    applied.scale_loss = scaler.scale
    wrapped: set[int] = set()
    first: set[int] = set()  # optimizers whose first step is running (unscaled by hand)
    from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

    def on_step(optimizer, _args, _kwargs):
        if id(optimizer) in wrapped:
            return
        wrapped.add(id(optimizer))
        original = optimizer.step
        inside = [False]

        def step(*args, **kwargs):
            if inside[0]:
                return original(*args, **kwargs)
            inside[0] = True
            try:
                out = scaler.step(optimizer, *args, **kwargs)
                scaler.update()
                return out
            finally:
                inside[0] = False

        optimizer.step = step  # from the next step on; this one is unscaled here
        scaler.unscale_(optimizer)
        first.add(id(optimizer))

    def after_step(optimizer, _args, _kwargs):
        if id(optimizer) in first:
            first.discard(id(optimizer))
            scaler.update()

    handles = [register_optimizer_step_pre_hook(on_step), register_optimizer_step_post_hook(after_step)]
    applied._undo.extend(h.remove for h in handles)


def _channels_last(torch, applied: Applied, fields: dict[str, Any]) -> None:
    def action(root, _args):
        root.to(memory_format=torch.channels_last)
        return {}

    _at_first_forward(torch, applied, action)


# --- before the script runs -----------------------------------------------------------------


def _liger(torch, applied: Applied, fields: dict[str, Any]) -> None:
    arch, kernel = str(fields["arch"]), str(fields["kernel"])
    try:
        module = importlib.import_module("liger_kernel.transformers")
    except ImportError as exc:
        raise ApplyFailed(f"liger_kernel is not importable in the script's Python ({exc})") from exc
    name = f"apply_liger_kernel_to_{arch}"
    function = getattr(module, name, None)
    if function is None:
        raise ApplyFailed(f"liger_kernel.transformers has no {name}")
    switches = [
        p.name for p in inspect.signature(function).parameters.values() if isinstance(p.default, bool)
    ]
    if kernel not in switches:
        raise ApplyFailed(f"{name} has no switch {kernel!r} (it has {', '.join(switches)})")
    chosen = {k: k == kernel for k in switches}  # only the candidate's kernel on
    function(**chosen)
    applied.details.update(function=name, switches=chosen)
    applied.done = True


def _compile_mode(torch, applied: Applied, fields: dict[str, Any]) -> None:
    mode = fields.get("mode") or "default"
    options = dict(fields.get("options") or {})
    original = torch.compile
    applied.details["compile_calls"] = 0

    def compile(model=None, **kwargs):
        given = kwargs.pop("options", None) or {}
        kwargs.pop("mode", None)
        if options or given:
            # torch.compile takes a mode or options, not both: the mode's options, then ours.
            from torch._inductor import list_mode_options

            kwargs["options"] = {**list_mode_options(mode), **given, **options}
        else:
            kwargs["mode"] = mode
        applied.details["compile_calls"] += 1
        applied.done = True
        return original(model, **kwargs) if model is not None else original(**kwargs)

    torch.compile = compile
    applied.details["mode"] = mode

    def undo():
        torch.compile = original

    applied._undo.append(undo)


def _sdpa_backend(torch, applied: Applied, fields: dict[str, Any]) -> None:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    name = str(fields["backend"]).rpartition(".")[2].upper()
    member = getattr(SDPBackend, name, None)
    if member is None:
        known = ", ".join(n for n in SDPBackend.__members__ if n != "ERROR")
        raise ApplyFailed(f"unknown SDPA backend {fields['backend']!r} (one of {known})")
    context = sdpa_kernel([member])
    context.__enter__()  # for the whole process
    applied.details["backend"] = member.name
    applied.done = True
    applied._undo.append(lambda: context.__exit__(None, None, None))


def _sdpa_mask(torch, applied: Applied, fields: dict[str, Any]) -> None:
    """A floating ``attn_mask`` (an additive bias: T5's relative position bias, ALiBi) that
    SDPA's fused kernels take: in q's dtype (outside autocast the memory-efficient kernel
    refuses another; under autocast the cast is autocast's own) and with a contiguous last
    dimension (T5's bias is a permuted view, stride 12 there, which every fused kernel
    refuses). The memory-efficient kernel returns the bias's gradient; ``contiguous`` keeps
    its values, the cast rounds them to q's 16 bits."""
    functional = torch.nn.functional
    original = functional.scaled_dot_product_attention

    @functools.wraps(original)
    def sdpa(query, key, value, attn_mask=None, *args, **kwargs):
        if attn_mask is not None and attn_mask.is_floating_point():
            if query.dtype in (torch.float16, torch.bfloat16) and attn_mask.dtype != query.dtype:
                applied.details.setdefault(
                    "mask_dtype", f"{attn_mask.dtype} -> {query.dtype}".replace("torch.", "")
                )
                applied.done = True
                attn_mask = attn_mask.to(query.dtype)
            if attn_mask.dim() and attn_mask.size(-1) > 1 and attn_mask.stride(-1) != 1:
                applied.details.setdefault(
                    "mask_layout", f"last-dimension stride {attn_mask.stride(-1)} -> 1"
                )
                applied.done = True
                attn_mask = attn_mask.contiguous()
        return original(query, key, value, attn_mask, *args, **kwargs)

    functional.scaled_dot_product_attention = sdpa
    applied._undo.append(functools.partial(setattr, functional, "scaled_dot_product_attention", original))


def _tf32(torch, applied: Applied, fields: dict[str, Any]) -> None:
    before = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    applied.done = True

    def undo():
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before

    applied._undo.append(undo)


def _cudnn_benchmark(torch, applied: Applied, fields: dict[str, Any]) -> None:
    before = torch.backends.cudnn.benchmark
    torch.backends.cudnn.benchmark = True
    applied.done = True

    def undo():
        torch.backends.cudnn.benchmark = before

    applied._undo.append(undo)


def _inductor_config(torch, applied: Applied, fields: dict[str, Any]) -> None:
    """``torch._inductor.config`` settings for every compile the script makes, in whatever mode
    (a recipe's ``settings``: names of ``torch._inductor.config`` and their values), undone after."""
    config = importlib.import_module("torch._inductor.config")
    settings = dict(fields["settings"])
    unknown = [name for name in settings if not hasattr(config, name)]
    if unknown:
        raise ApplyFailed(
            f"torch {torch.__version__}'s Inductor has no config {', '.join(map(repr, unknown))}"
        )
    before = {name: getattr(config, name) for name in settings}
    for name, value in settings.items():
        setattr(config, name, value)
    applied.details["settings"] = settings
    applied.done = True

    def undo() -> None:
        for name, value in before.items():
            setattr(config, name, value)

    applied._undo.append(undo)


def _fused_optimizer(torch, applied: Applied, fields: dict[str, Any]) -> None:
    applied.details["optimizers"] = []
    for name in _OPTIMIZERS:
        cls = getattr(torch.optim, name)
        original = cls.__dict__.get("__init__")
        if original is None:  # inherits a wrapped __init__
            continue

        def init(self, params, *args, _original=original, _name=name, **kwargs):
            if not getattr(self, "_kerneltriage_fused", False):
                self._kerneltriage_fused = True
                kwargs["fused"] = True
                kwargs.pop("foreach", None)  # fused and foreach exclude each other
                applied.details["optimizers"].append(type(self).__name__)
                applied.done = True
            _original(self, params, *args, **kwargs)

        cls.__init__ = init
        applied._undo.append(functools.partial(setattr, cls, "__init__", original))


_INSTALLERS: dict[str, Callable[[Any, Applied, dict[str, Any]], None]] = {
    "norm-swap": _norm_swap,
    "liger": _liger,
    "compile-module": _compile_module,
    "compile-model": _compile_model,
    "compile-mode": _compile_mode,
    "sdpa-backend": _sdpa_backend,
    "sdpa-mask": _sdpa_mask,
    "hf-attention": _hf_attention,
    "autocast": _autocast,
    "tf32": _tf32,
    "channels-last": _channels_last,
    "cudnn-benchmark": _cudnn_benchmark,
    "inductor-config": _inductor_config,
    "fused-optimizer": _fused_optimizer,
}
