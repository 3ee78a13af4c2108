"""The second rung of the ladder: the model again, with the cheap fixes applied.

The method is measure → take the cheap wins (a library op, ``torch.compile``, a built-in
kernel) → measure again → write a kernel only for what still sits below its roof. Two ways up:

- ``kerneltriage profile --apply RUN[:C1,C3]`` (``profile_applied``): RUN's recorded command
  (its manifest's command, working directory and environment) profiled again with the fixes
  installed by verify's runner before the script runs, into a new run directory whose manifest
  records them (``applied_fixes``, ``parent_run``). By default, every fix ``verify`` verified.
- ``kerneltriage.apply(run="runs/exp1")`` (``apply``) in the user's own script, before the model
  is built: every verified fix of the run whose preconditions (PyTorch version, GPU, packages)
  hold here, through the same runner; a handle says what was applied and what was refused, why.

The fixes come from ``verify.json`` (``kerneltriage.verify_record.read``) or, for a candidate
named but not verified, from the report's candidate (``recipe.apply``): the recipes of
``kerneltriage/data/fixes.yaml``, the one piece of data the report's fix text, verify and this
module share.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import os
import re
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kerneltriage import rundir
from kerneltriage.errors import InputError, RunDirError

if TYPE_CHECKING:  # pragma: no cover
    from kerneltriage.profile.context import Options, Reporter
    from kerneltriage.profile.fix_install import Installed
    from kerneltriage.profile.session import Result

_IDS = re.compile(r"^[A-Za-z]?\d+(?:\s*,\s*[A-Za-z]?\d+)*$")
#: Kinds whose change exists only on a CUDA GPU (or needs one to run at all).
_GPU_KINDS = ("liger", "hf-attention", "sdpa-backend", "tf32")


# --- which fixes ------------------------------------------------------------------------------


def parse_spec(spec: str | os.PathLike[str]) -> tuple[Path, list[str] | None]:
    """``runs/exp1`` or ``runs/exp1:C1,C3`` → (run directory, candidate ids or None)."""
    text = os.fspath(spec)
    head, sep, tail = text.rpartition(":")
    if sep and head and _IDS.match(tail.strip()) and not Path(text).exists():
        return Path(head), [i.strip().upper() for i in tail.split(",")]
    return Path(text), None


def _ids(only: str | list[str] | tuple[str, ...] | None) -> list[str] | None:
    if only is None:
        return None
    listed = only.split(",") if isinstance(only, str) else list(only)
    ids = [str(i).strip().upper() for i in listed if str(i).strip()]
    if not ids:
        raise InputError(
            "only= names no candidate; give ids such as ['C1', 'C3'], or None for every verified fix"
        )
    return ids


def fixes_of(run: str | os.PathLike[str], ids: list[str] | None = None) -> list[dict[str, Any]]:
    """The fixes to apply from ``run``, as the manifest's ``applied_fixes`` entries ``{id,
    recipe_id, apply, predicted_saving_share, realized_saving_share, status}``: the candidates
    ``ids`` (their verified recipe, else the report's), else every fix ``verify`` verified.
    An ``InputError`` (one line) when there is none, or a named one cannot be applied."""
    from kerneltriage.verify_record import read

    path = Path(run)
    if not rundir.is_run_dir(path):
        raise RunDirError("not a kerneltriage run directory (no manifest.json)", path=str(path))
    data = read(path)
    entries = {str(e["id"]).upper(): e for e in (data.to_json()["candidates"] if data else [])}
    if ids is None:
        chosen = [
            _entry(e)
            for e in entries.values()
            if e.get("status") == "verified" and isinstance(e.get("apply"), dict)
        ]
        if not chosen:
            why = "has no verify.json" if data is None else "has no fix verified by kerneltriage's runner"
            raise InputError(
                f"{path} {why}: run `kerneltriage verify {path}` first, or name the candidates to apply "
                f"({path}:C1,C3)"
            )
        return chosen
    out: list[dict[str, Any]] = []
    report_candidates: dict[str, Any] | None = None
    for cid in ids:
        entry = entries.get(cid)
        if entry is not None and isinstance(entry.get("apply"), dict):
            out.append(_entry(entry))
            continue
        if report_candidates is None:
            from kerneltriage import api
            from kerneltriage.verify.plan import step_candidates

            report = api.report(path)  # its rows, and a step-level fix (S1) where it has one
            rows: list[Any] = [*report.candidates, *step_candidates(report)]
            report_candidates = {c.id.upper(): c for c in rows}
        c = report_candidates.get(cid)
        if c is None:
            known = ", ".join(list(report_candidates)[:12])
            raise InputError(f"no candidate {cid} in the report of {path} (it has {known}, …)")
        recipe = c.recipe if isinstance(c.recipe, dict) else {}
        apply = recipe.get("apply")
        if not isinstance(apply, dict):
            why = (
                recipe.get("blocked")
                or recipe.get("apply_why_not")
                or "the report gives no fix recipe for it"
            )
            raise InputError(f"{cid} ({c.name}) has no fix kerneltriage's runner can apply: {why}")
        out.append(
            {
                "id": c.id,
                "recipe_id": recipe.get("id"),
                "apply": apply,
                "predicted_saving_share": c.attrs.get("fix_saving_share") or c.expected_saving_share or None,
                "realized_saving_share": None,
                "status": (entry or {}).get("status") or "not verified",
            }
        )
    return out


def _entry(e: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": str(e["id"]),
        "recipe_id": e.get("recipe_id"),
        "apply": dict(e["apply"]),
        "predicted_saving_share": e.get("predicted_saving_share"),
        "realized_saving_share": e.get("realized_saving_share"),
        "status": e.get("status"),
    }


# --- profile --apply ------------------------------------------------------------------------


def profile_applied(spec: str, options: Options, reporter: Reporter | None = None) -> Result:
    """``kerneltriage profile --apply RUN[:C1,C3]``: RUN's recorded command profiled again, in
    its working directory and environment, with the fixes installed before the script runs.
    ``options.out`` defaults to ``RUN-applied``."""
    from kerneltriage.profile.session import run_profile

    run, ids = parse_spec(spec)
    manifest = rundir.read_manifest(run) if run.is_dir() else None
    if manifest is None:
        raise RunDirError("no such run directory", path=str(run))
    if not manifest.command:
        raise RunDirError("the manifest records no command to profile again", path=str(run))
    cwd = Path(manifest.cwd or ".")
    if not cwd.is_dir():
        raise RunDirError(
            f"the run's working directory {manifest.cwd} does not exist here",
            path=str(run),
            hint="profile --apply runs the recorded command where it was profiled",
        )
    fixes = fixes_of(run, ids)
    parent = run.resolve()
    out = Path(options.out).resolve() if options.out else parent.with_name(f"{parent.name}-applied")
    options = dataclasses.replace(options, out=out, applied_fixes=fixes, parent_run=str(parent))
    with _environment(manifest.env), contextlib.chdir(cwd):
        return run_profile(list(manifest.command), options, reporter)


@contextlib.contextmanager
def _environment(env: dict[str, str]) -> Iterator[None]:
    """The recorded environment variables, for the time of the run."""
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


# --- kerneltriage.apply ------------------------------------------------------------------------


@dataclass
class AppliedFixes:
    """What ``kerneltriage.apply`` did: ``applied`` (one entry per fix installed: ids, recipe,
    kind, whether it took effect yet, details) and ``refused`` ((id, why) for each fix left out).
    Fixes that act at the model's first forward show ``done`` once it ran; one that fails
    there moves to ``refused`` with a warning, and the model runs without it."""

    run: str
    applied: list[dict[str, Any]] = field(default_factory=list)
    refused: list[tuple[str, str]] = field(default_factory=list)
    _installed: list[Installed] = field(default_factory=list, repr=False)

    @property
    def ids(self) -> list[str]:
        """The candidate ids whose fixes are installed (and not refused since)."""
        return [i for a in self.applied for i in a["ids"]]

    def refresh(self) -> AppliedFixes:
        """Bring ``done`` and ``details`` up to date (after the first forward)."""
        for entry, inst in zip(self.applied, self._installed):
            entry["done"] = inst.applied.done
            entry["details"] = dict(inst.applied.details)
        return self

    def remove(self) -> None:
        """Undo what can be undone (patched functions, hooks, flags); modules already swapped or
        compiled stay as they are."""
        from kerneltriage.profile.fix_install import remove_all

        remove_all(self._installed)
        self._installed.clear()
        self.applied.clear()

    def _refuse(self, inst: Installed, why: str) -> None:
        for n, other in enumerate(self._installed):
            if other is inst:
                del self._installed[n]
                del self.applied[n]
                break
        self.refused.extend((i, why) for i in inst.ids)

    def __str__(self) -> str:
        self.refresh()
        lines = [
            f"kerneltriage.apply({self.run!r}): {len(self.applied)} fix(es) applied, {len(self.refused)} refused"
        ]
        for a in self.applied:
            when = "done" if a["done"] else "at the model's first forward"
            lines.append(
                f"  applied  {'+'.join(a['ids'])}  {a['recipe_id'] or a['kind']} ({a['kind']}, {when})"
            )
        lines += [f"  refused  {i}  {why}" for i, why in self.refused]
        return "\n".join(lines)


def apply(
    model: Any = None,
    run: str | os.PathLike[str] | None = None,
    only: str | list[str] | tuple[str, ...] | None = None,
) -> AppliedFixes:
    """Apply the fixes ``kerneltriage verify`` verified on ``run`` (``only``: these candidates)
    in this process, through verify's runner. Call it before the model is built and run: class
    swaps, compiles and attention act at the first forward of the first module that runs (the
    model), library patches and flags at once. With ``model``, the fixes that act on a model
    (norm swap, compile, attention, channels-last) are applied to it now.

    Each fix's preconditions are checked here first (its recipe's PyTorch version, GPU compute
    capability, bf16, packages; a GPU for the kinds that need one): a fix that fails them, or
    that the runner cannot apply, is refused with the reason and the others go on.
    """
    if run is None:
        raise InputError("kerneltriage.apply needs run=: the run directory whose verified fixes to apply")
    import torch

    from kerneltriage.profile.fix_install import Installed, grouped
    from kerneltriage.recipes.install import AT_FIRST_FORWARD, ApplyFailed, install

    fixes = fixes_of(run, _ids(only))
    handle = AppliedFixes(str(run))
    hooks = torch.nn.modules.module._global_forward_pre_hooks
    for ids, mapping in grouped(fixes):
        recipe_ids = sorted({str(f.get("recipe_id")) for f in fixes if f["id"] in ids and f.get("recipe_id")})
        why = _refusal(mapping, recipe_ids, torch)
        if why is None:
            before = set(hooks)
            try:
                applied = install(mapping)
            except ApplyFailed as exc:
                why = str(exc)
        if why is not None:
            handle.refused.extend((i, why) for i in ids)
            continue
        inst = Installed(ids, mapping, applied)
        handle._installed.append(inst)
        handle.applied.append(
            {
                "ids": ids,
                "recipe_id": ", ".join(recipe_ids) or None,
                "kind": mapping["kind"],
                "apply": mapping,
                "done": applied.done,
                "details": dict(applied.details),
            }
        )
        new = [k for k in hooks if k not in before]
        if mapping["kind"] not in AT_FIRST_FORWARD or not new:
            continue
        if model is not None and mapping["kind"] != "autocast":
            try:
                for k in new:
                    hooks[k](model, ())  # the runner's first-forward action, on this model now
            except ApplyFailed as exc:
                applied.remove()
                handle._refuse(inst, str(exc))
            continue
        for k in new:
            hooks[k] = _refusing(hooks[k], handle, inst)
    return handle.refresh()


def _refusing(hook: Any, handle: AppliedFixes, inst: Installed) -> Any:
    """The runner's first-forward hook, turning its failure into a refusal and a warning: the
    user's model then runs as it was, instead of the script stopping."""
    from kerneltriage.recipes.install import ApplyFailed

    def wrapped(module: Any, args: Any) -> Any:
        try:
            return hook(module, args)
        except ApplyFailed as exc:
            inst.applied.remove()
            handle._refuse(inst, str(exc))
            warnings.warn(f"kerneltriage.apply: fix {inst.label} refused: {exc}", stacklevel=2)
            return None

    return wrapped


def _refusal(mapping: dict[str, Any], recipe_ids: list[str], torch: Any) -> str | None:
    """Why the fix cannot be applied in this process (its recipe's ``requires`` checked by
    ``analysis.fix_environment.unmet`` against this PyTorch and GPU), or None."""
    from kerneltriage.analysis.fixes.fix_environment import unmet
    from kerneltriage.analysis.fixes.fix_recipes import load_recipes
    from kerneltriage.recipes.install import check

    problem = check(mapping)
    if problem:
        return f"{problem}: the runner cannot apply it"
    env = _live_environment(torch)
    cuda = env.capability is not None
    kind = mapping["kind"]
    if not cuda and kind in _GPU_KINDS:
        return f"{kind} needs a CUDA GPU; none is visible to this process"
    if not cuda and kind == "norm-swap" and not _interpreter():
        return "the built-in norms need a CUDA GPU (or Triton's interpreter); none is visible to this process"
    recipes = {r.id: r for r in load_recipes()}
    for rid in recipe_ids:
        recipe = recipes.get(rid)
        if recipe is None:
            continue
        req = recipe.requires
        if not cuda and (req.capability or req.bf16 or req.tf32):
            what = req.capability or ("bf16" if req.bf16 else "TF32")
            return f"recipe {rid} needs a CUDA GPU ({what}); none is visible to this process"
        # The fused linear CE's gain was judged from the trace, when the report offered it.
        judged = dataclasses.replace(recipe, requires=req.model_copy(update={"fused_linear_ce_gain": None}))
        why = unmet(judged, env, {})
        if why:
            return f"recipe {rid}: {why}"
        missing = [p for p in req.packages if importlib.util.find_spec(p) is None]
        if missing:
            return f"recipe {rid} needs {', '.join(missing)}, which this Python cannot import"
    return None


def _live_environment(torch: Any) -> Any:
    """This process's PyTorch and GPU, as the recipes' preconditions read them."""
    from kerneltriage.analysis.fixes.fix_environment import Environment

    if not torch.cuda.is_available():
        return Environment(torch=torch.__version__, torch_source="this process")
    index = torch.cuda.current_device()
    nvidia = bool(torch.version.cuda)
    tf32 = None
    if not nvidia:
        # CDNA3 (gfx942: MI300X, MI325X) has TF32 (xf32) matrix units; CDNA2 (gfx90a) has none.
        arch = str(getattr(torch.cuda.get_device_properties(index), "gcnArchName", "")).split(":")[0]
        tf32 = {"gfx90a": False, "gfx942": True}.get(arch)
    return Environment(
        torch=torch.__version__,
        torch_source="this process",
        capability=tuple(torch.cuda.get_device_capability(index)),
        bf16=bool(torch.cuda.is_bf16_supported()),
        tf32=tf32,  # NVIDIA's follows from the capability the recipes require
        gpu=torch.cuda.get_device_name(index),
        vendor="nvidia" if nvidia else "amd",
    )


def _interpreter() -> bool:
    try:
        from kerneltriage.kernels import config
    except ImportError:
        return False
    return bool(config.current().interpreter)


def snippet(run: str | os.PathLike[str]) -> str:
    """The line to paste at the top of a training script, before the model is built."""
    return f'import kerneltriage; kerneltriage.apply(run="{os.fspath(run)}")  # before building the model'
