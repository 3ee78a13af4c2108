"""FSDP2's overlap settings as runner kinds: ``fsdp-prefetch`` (explicit all-gather prefetch of
the next layers in forward and of the previous layer in backward) and ``fsdp-reshard`` (the last
layers' parameters kept gathered from their forward to their backward).

Both act at the first forward (``install._at_first_forward``): by then the script has called
``fully_shard`` on its layers and its root. The layers are the ``FSDPModule`` instances inside
the outermost one, in the order ``modules()`` lists them, which is the forward order of the
usual ``for layer in model.layers: fully_shard(layer)``. Neither setting changes what is
computed: the same all-gathers run earlier, or one all-gather does not run again.

A model with no ``FSDPModule`` is refused; one wrapped in FSDP1's ``FullyShardedDataParallel`` is
refused with FSDP1's own constructor arguments for the same effect.
"""

from __future__ import annotations

import importlib
from typing import Any


class Refused(Exception):
    """The model is not one these settings apply to; the runner stops the script with the reason
    (``apply.ApplyFailed``)."""


#: What FSDP1 takes at construction for what ``fsdp-prefetch`` and ``fsdp-reshard`` set on FSDP2.
FSDP1_PREFETCH = (
    "FullyShardedDataParallel(model, forward_prefetch=True, backward_prefetch=BackwardPrefetch.BACKWARD_PRE, "
    "limit_all_gathers=True)"
)
FSDP1_RESHARD = "FullyShardedDataParallel(model, sharding_strategy=ShardingStrategy.SHARD_GRAD_OP)"
#: Fields of each kind and the least value each takes.
FIELDS: dict[str, dict[str, int]] = {
    "fsdp-prefetch": {"forward": 1, "backward": 0},
    "fsdp-reshard": {"last": 1},
}


def check(apply: dict[str, Any]) -> str | None:
    """Why an ``fsdp-prefetch`` / ``fsdp-reshard`` mapping cannot be applied, or None."""
    kind = apply["kind"]
    wanted = FIELDS[kind]
    unknown = sorted(set(apply) - {"kind", *wanted})
    if unknown:
        return f"apply kind {kind!r} takes {', '.join(wanted)}, not {', '.join(unknown)}"
    for name, least in wanted.items():
        value = apply.get(name)
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            return f"apply kind {kind!r}: {name} must be a whole number of layers, at least {least}, not {value!r}"
    return None


def layers(torch: Any, root: Any, kind: str) -> list[tuple[str, Any]]:
    """The sharded layers under ``root`` as (qualified name, module), in forward order; a
    ``Refused`` saying why when the model is not one FSDP2 root over several layers."""
    try:
        fsdp = importlib.import_module("torch.distributed.fsdp")
    except ImportError as exc:  # a torch built without distributed
        raise Refused(
            f"{kind} needs torch.distributed.fsdp, which this PyTorch cannot import: {exc}"
        ) from exc
    named = list(root.named_modules())
    fsdp1 = getattr(fsdp, "FullyShardedDataParallel", None)
    if fsdp1 is not None and any(isinstance(m, fsdp1) for _, m in named):
        same = FSDP1_PREFETCH if kind == "fsdp-prefetch" else FSDP1_RESHARD
        raise Refused(
            f"{kind} sets FSDP2 (fully_shard) modules; this model is wrapped in FSDP1's FullyShardedDataParallel, "
            f"whose equivalent is set where the script builds it: {same}"
        )
    module_type = getattr(fsdp, "FSDPModule", None)
    if module_type is None:
        raise Refused(f"{kind} needs torch.distributed.fsdp.FSDPModule (PyTorch 2.6 or later)")
    sharded = [(name, m) for name, m in named if isinstance(m, module_type)]
    if not sharded:
        raise Refused(
            f"{kind} found no FSDPModule under {type(root).__name__}: the model is not sharded with FSDP2's "
            "fully_shard (a DistributedDataParallel job takes the ddp settings instead)"
        )
    outer = [name for name, _ in sharded if not any(_inside(name, other) for other, _ in sharded)]
    inner = [(name, m) for name, m in sharded if name not in outer]
    if not inner:
        raise Refused(
            f"{kind}: {type(root).__name__} has a single FSDPModule, the root: fully_shard each layer before "
            "the root so that there are layers to prefetch or keep"
        )
    return inner


def _inside(name: str, other: str) -> bool:
    """Whether module ``name`` lies under module ``other`` (qualified names; "" is the root)."""
    return name != other and (other == "" or name.startswith(other + "."))


def prefetch(torch: Any, root: Any, fields: dict[str, Any]) -> dict[str, Any]:
    """Each layer prefetches the next ``forward`` layers' all-gathers when its forward starts, and
    the previous ``backward`` layers' when its backward starts (nearest first)."""
    found = layers(torch, root, "fsdp-prefetch")
    ahead, behind = int(fields["forward"]), int(fields["backward"])
    modules = [m for _, m in found]
    for i, layer in enumerate(modules):
        nxt = modules[i + 1 : i + 1 + ahead]
        if nxt:
            layer.set_modules_to_forward_prefetch(nxt)
        previous = modules[max(0, i - behind) : i][::-1]
        if previous:
            layer.set_modules_to_backward_prefetch(previous)
    return {
        "layers": len(found),
        "first": found[0][0],
        "last": found[-1][0],
        "forward": ahead,
        "backward": behind,
    }


def keep_last(torch: Any, root: Any, fields: dict[str, Any]) -> dict[str, Any]:
    """The last ``last`` layers keep their gathered parameters after their forward: the backward
    starts with them, so their all-gather does not run again; each costs its full parameters'
    memory (this rank's shard aside) until its backward."""
    found = layers(torch, root, "fsdp-reshard")
    kept = found[-int(fields["last"]) :]
    held = 0
    for _, layer in kept:
        layer.set_reshard_after_forward(False, recurse=False)
        held += _gathered_bytes(torch, layer, importlib.import_module("torch.distributed.fsdp").FSDPModule)
    return {"kept": [name for name, _ in kept], "gathered_bytes": held}


def _gathered_bytes(torch: Any, layer: Any, sharded: type) -> int:
    """The bytes a layer's own parameters take gathered (those of FSDP modules inside it are
    theirs): their full size in the dtype FSDP2 gathers them in, its mixed-precision
    ``param_dtype``, else the parameters' own."""
    state = layer._get_fsdp_state() if hasattr(layer, "_get_fsdp_state") else None
    dtype = getattr(getattr(state, "_mp_policy", None), "param_dtype", None)
    size = torch.tensor([], dtype=dtype).element_size() if dtype is not None else None
    nested = [name for name, m in layer.named_modules() if name and isinstance(m, sharded)]
    total = 0
    for name, p in layer.named_parameters():
        if not any(name.startswith(n + ".") for n in nested):
            total += p.numel() * (size or p.element_size())
    return int(total)
