"""Module ranges in the profiled process: global forward hooks that put every module call in
a profiler range named ``kerneltriage.module:<path>:<Class>``, and, in the shapes step, take
each module's input and output shapes for ``regions.jsonl``.

Runs inside the user's process (``hooks.py`` installs and removes the hooks). The hooks cost
one C++ call per module call: a name resolved once per module, a range entered through
``_RecordFunctionFast``; and they return at once while Dynamo traces them, so a compiled
program gets the same graphs with or without them.
"""

from __future__ import annotations

import json
import threading
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kerneltriage import annotate
from kerneltriage.profile.process_facts import dynamo_graphs

#: torch.compile(module) warns when global module hooks exist; ours are kerneltriage's, not
#: the user's, and they do nothing inside compiled code.
_OPTIMIZED_MODULE_WARNING = r"Using `torch.compile\(module\)` when there are global hooks"


class ModuleRanges:
    """The global module hooks of one process, the range names they resolved and the module
    signatures (path, class, input and output shapes) they took."""

    def __init__(self) -> None:
        self.handles: list[Any] = []
        self.recording = False  # module ranges are wanted (hooks installed and a profiler on)
        self.describe = False  # module input/output shapes are taken for regions.jsonl
        self.graphs_at_install = 0
        self.calls = 0
        self.signatures: dict[tuple, dict[str, Any]] = {}
        self.names: dict[int, str] = {}
        self._local = threading.local()
        # Both resolved by prepare(), before any hook is installed.
        self._range: Callable[[str], Any] = _no_range
        self._is_compiling: Callable[[], bool] = not_compiling

    def prepare(self, torch: Any) -> None:
        """What the hooks need, resolved once, before they are installed."""
        self._is_compiling = is_compiling_function(torch)
        self._range = _fast_range_type(torch)

    def install(self, *, describe: bool) -> None:
        if self.handles:
            return
        from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook

        warnings.filterwarnings("ignore", message=_OPTIMIZED_MODULE_WARNING)
        self.graphs_at_install = dynamo_graphs()
        self.handles = [
            register_module_forward_pre_hook(self._pre),
            register_module_forward_hook(self._post),
        ]
        self.recording = True
        self.describe = describe

    def remove(self) -> None:
        """Stop the module ranges. The hooks go too unless Dynamo compiled a graph while they
        were installed: it guards on the global hook dicts it read, and removing our hooks
        would recompile that graph. They then stay, returning at once."""
        self.recording = self.describe = False
        if self.handles and dynamo_graphs() == self.graphs_at_install:
            for handle in self.handles:
                handle.remove()
            self.handles = []

    def write_signatures(self, path: Path) -> None:
        """``regions.jsonl``: one line per module signature, with its calls."""
        with open(path, "w") as f:
            for entry in self.signatures.values():
                f.write(json.dumps(entry) + "\n")

    def _name(self, module) -> str:
        """The range name of ``module``, resolved once: the first module seen without a name
        is a root, and its whole tree is named then."""
        root = module
        inner = getattr(module, "_orig_mod", None)  # torch.compile(model)'s OptimizedModule
        if inner is not None and type(module).__name__ == "OptimizedModule":
            root = inner
        root_name = type(root).__name__
        prefix = annotate.MODULE_PREFIX
        self.names.setdefault(id(module), f"{prefix}{root_name}:{root_name}")
        for name, sub in root.named_modules():
            self.names.setdefault(id(sub), f"{prefix}{name or root_name}:{type(sub).__name__}")
        return self.names[id(module)]

    def _pre(self, module, args) -> None:
        if self._is_compiling():
            return  # Dynamo inlines this hook: it must add nothing to the graph
        if not self.recording:
            return
        name = self.names.get(id(module)) or self._name(module)
        rf = self._range(name)
        rf.__enter__()
        stack = getattr(self._local, "stack", None)
        if stack is None:
            stack = self._local.stack = []
        stack.append((module, rf, _describe(args) if self.describe else None))
        self.calls += 1

    def _post(self, module, args, output) -> None:
        if self._is_compiling():
            return
        stack = getattr(self._local, "stack", None)
        if not stack or stack[-1][0] is not module:
            return
        _, rf, inputs = stack.pop()
        rf.__exit__(None, None, None)
        if inputs is not None:
            self._signature(module, inputs, output)

    def _signature(self, module, inputs, output) -> None:
        outputs = _describe(output)
        path, cls = self.names[id(module)][len(annotate.MODULE_PREFIX) :].rsplit(":", 1)
        key = (path, cls, json.dumps(inputs), json.dumps(outputs))
        entry = self.signatures.get(key)
        if entry is None:
            params = sum(p.numel() * p.element_size() for p in module.parameters(recurse=False))
            entry = self.signatures[key] = {
                "path": path,
                "class": cls,
                "inputs": inputs,
                "outputs": outputs,
                "param_bytes": int(params),
                "calls": 0,
            }
        entry["calls"] += 1


def not_compiling() -> bool:
    return False


def is_compiling_function(torch: Any) -> Callable[[], bool]:
    """``torch.compiler.is_compiling``: Dynamo reads it as True while it traces."""
    compiler = getattr(torch, "compiler", None)
    fn = getattr(compiler, "is_compiling", None)
    return fn if fn is not None else not_compiling


def _no_range(name: str) -> Any:
    raise RuntimeError("ModuleRanges.prepare() resolves the profiler range type before any hook runs")


def _fast_range_type(torch) -> Callable[[str], Any]:
    """A profiler range entered from Python at the cost of one C++ call: ``_RecordFunctionFast``
    (torch ≥ 2.2, what Inductor uses around its kernels), else ``record_function``."""
    fast = getattr(getattr(torch._C, "_profiler", None), "_RecordFunctionFast", None)
    return fast if fast is not None else torch.autograd.profiler.record_function


def _describe(value, depth: int = 0) -> list[dict[str, Any]]:
    """Shapes, dtypes and strides of the tensors in a module's inputs or outputs."""
    out: list[dict[str, Any]] = []
    if depth > 2:
        return out
    if hasattr(value, "shape") and hasattr(value, "dtype") and hasattr(value, "stride"):
        out.append(
            {
                "shape": list(value.shape),
                "dtype": str(value.dtype).replace("torch.", ""),
                "stride": list(value.stride()),
            }
        )
    elif isinstance(value, (list, tuple)):
        for v in value[:8]:
            out.extend(_describe(v, depth + 1))
    elif isinstance(value, dict):
        for v in list(value.values())[:8]:
            out.extend(_describe(v, depth + 1))
    return out
