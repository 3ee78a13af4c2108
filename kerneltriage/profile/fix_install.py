"""Several fixes' ``apply`` mappings installed in one process, by the recipes' applicator
(``kerneltriage/recipes/install.py``): ``profile --apply`` (in ``runner.py``, before the script
runs, as verify's harness does for one fix) and ``kerneltriage.apply`` in a user's script.

- Fixes whose mappings are identical are installed once (verify measures them in one run: one
  ``patch(model)`` swaps the norms of two candidates), under every id that carries them.
- The order is fixed: what acts before the script first (library patches, global flags), then,
  at the first forward, swaps before compiles (a compile must see the swapped modules).
- A fix that cannot be applied raises ``ApplyFailed`` with a message naming it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from kerneltriage.recipes.install import AT_FIRST_FORWARD, Applied, ApplyFailed, install

#: The runner's exit code when a fix could not be applied (``session.py`` turns it into one line).
EXIT_NOT_APPLIED = 87
ORDER = (
    "liger",
    "sdpa-backend",
    "tf32",
    "fused-optimizer",
    "compile-mode",
    "norm-swap",
    "hf-attention",
    "channels-last",
    "autocast",
    "compile-module",
    "compile-model",
)


@dataclass
class Installed:
    """One mapping installed: the fixes (candidate ids) that carry it and what ``install`` did."""

    ids: list[str]
    apply: dict[str, Any]
    applied: Applied

    @property
    def label(self) -> str:
        return label(self.ids, self.apply)


def label(ids: list[str], apply: dict[str, Any]) -> str:
    """``C2+C4 (norm-swap)``: how a fix is named in messages."""
    return f"{'+'.join(ids) or '?'} ({apply.get('kind', 'no kind')})"


def key(apply: dict[str, Any]) -> str:
    return json.dumps(apply, sort_keys=True, default=str)


def grouped(fixes: list[dict[str, Any]]) -> list[tuple[list[str], dict[str, Any]]]:
    """``[{id, apply}, …]`` → ``[(ids, apply), …]``: identical mappings merged, in install order."""
    groups: dict[str, tuple[list[str], dict[str, Any]]] = {}
    for fix in fixes:
        apply = fix.get("apply") or {}
        ids, _ = groups.setdefault(key(apply), ([], apply))
        ids.append(str(fix.get("id", "?")))

    def rank(group: tuple[list[str], dict[str, Any]]) -> float:
        kind = group[1].get("kind")
        if kind in ORDER:
            return ORDER.index(kind)
        # A kind this order does not list: with its moment's kinds, before the compiles.
        return ORDER.index("compile-module" if kind in AT_FIRST_FORWARD else "norm-swap") - 0.5

    return sorted(groups.values(), key=rank)  # stable: the given order within a kind


def install_all(fixes: list[dict[str, Any]]) -> list[Installed]:
    """Install every fix of ``fixes`` (``[{id, apply}, …]``) in this process. ``ApplyFailed``
    names the first that cannot be installed; those installed before it stay installed."""
    done: list[Installed] = []
    for ids, apply in grouped(fixes):
        try:
            applied = install(apply)
        except ApplyFailed as exc:
            raise ApplyFailed(f"fix {label(ids, apply)} could not be applied: {exc}") from None
        done.append(Installed(ids, apply, applied))
    return done


def failure(installed: list[Installed], exc: BaseException) -> str:
    """The one line for an ``ApplyFailed`` raised while the script ran, naming the fix: the
    first-forward hooks run in install order, so the first one not done is the one that failed."""
    message = str(exc)
    if message.startswith("fix "):
        return message
    pending = [i for i in installed if i.apply.get("kind") in AT_FIRST_FORWARD and not i.applied.done]
    name = pending[0].label if pending else "?"
    return f"fix {name} could not be applied: {message}"


def problems(installed: list[Installed]) -> list[str]:
    """Fixes that never took effect in the run that ended (a compile mode for a script that
    never compiles), one line each."""
    return [f"fix {i.label} did not take effect: {i.applied.problem}" for i in installed if i.applied.problem]


def remove_all(installed: list[Installed]) -> None:
    for i in reversed(installed):
        i.applied.remove()
