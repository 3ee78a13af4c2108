"""What a scaffold family is: a template folder and the code that fills its context."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kerneltriage.analysis.gpus import GPUSpec
from kerneltriage.scaffold.common import Origin

# The package every scaffold writes, in this order.
FILES = ("kernel.py", "reference.py", "test_kernel.py", "bench.py", "README.md")
# Files every family renders from the one template at the top of ``templates/``.
SHARED_FILES = ("README.md",)

# (origin, gpu) → the template context, or None when the family cannot model the candidate.
FromCandidate = Callable[[Origin, GPUSpec], dict[str, Any] | None]
# (origin, gpu, --kind value, --shape dims, dtype name) → the template context.
FromKind = Callable[[Origin, GPUSpec, str, list[list[int]], str], dict[str, Any]]


@dataclass(frozen=True)
class TemplateClass:
    """One scaffold family (an op class with a template folder of its own).

    ``report_kinds``: the report's candidate kinds it scaffolds. ``kinds``: the ``--kind``
    values it takes by name; ``kind_chain`` recognizes the ``+``-joined ones (``gemm+bias+gelu``,
    ``mul+silu``), which ``chain_text`` describes for ``--help`` and errors.
    """

    name: str
    from_candidate: FromCandidate
    from_kind: FromKind
    report_kinds: tuple[str, ...] = ()
    kinds: tuple[str, ...] = ()
    kind_chain: Callable[[list[str]], bool] | None = None
    chain_text: str = ""

    @property
    def templates(self) -> dict[str, str]:
        """{file it writes: the Jinja2 template (under ``templates/``) that renders it}."""
        return {f: f"{f}.j2" if f in SHARED_FILES else f"{self.name}/{f}.j2" for f in FILES}

    @property
    def kinds_text(self) -> str:
        """Its ``--kind`` values, in words."""
        return ", ".join([*self.kinds, *([self.chain_text] if self.chain_text else [])])

    def takes_kind(self, kind: str) -> bool:
        """Whether ``--kind kind`` (lower case, ``_`` for ``-``) is one of this family's."""
        if kind in self.kinds:
            return True
        ops = [o for o in kind.split("+") if o]
        return bool(ops) and self.kind_chain is not None and self.kind_chain(ops)
