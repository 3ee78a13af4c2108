"""What a forward top-level op's kernels say of its kind (``grouping`` reads it per op).

An op's class comes from its name, but kinds follow kernels: an op whose kernel time is mostly
GEMM, convolution, attention or communication is of that kind and a boundary of fused
regions, whatever its name; an op whose GPU work is only copies and memsets is a memcpy; ops of
extension namespaces (fbgemm::, vllm::, …) are candidates of their own, classed by their
kernels.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from kerneltriage.analysis.rules import Rules
from kerneltriage.analysis.timeline.attribution import Attribution, factorize_text


@dataclass
class RootKinds:
    """What a forward top-level op's kernels say of its kind: the first kernel (name and
    activity), whether it launches only copies and memsets, and which kinds hold its kernel
    time (``kernel_majority``)."""

    names: Any
    rules: Rules
    first_kernel: dict[int, str]
    first_activity: dict[int, str]
    copy_only: dict[int, bool]
    majority: dict[int, tuple[str | None, str | None, bool]]
    known: dict[tuple, tuple[str, bool]] = field(default_factory=dict)  # ``kind``'s, by what it reads

    @classmethod
    def of(cls, fwd: Any, rules: Rules, names: Any, attr: Attribution) -> RootKinds:
        """From ``fwd``: the forward kernels (rows of ``attr.kernels``)."""
        roots = fwd["fwd_root"].to_numpy()
        held, first = np.unique(roots, return_index=True)
        kernel_names, activities = fwd["name"].to_numpy(), fwd["kind"].to_numpy()
        # An op whose GPU work is only copies and memsets is a memcpy, whatever its name says.
        is_kernel = pd.Series((fwd["kind"] == "kernel").to_numpy())
        copy_only = (~is_kernel.groupby(roots).any()).to_dict()
        # Kinds follow kernels: an op whose kernel time is mostly GEMM, convolution, attention
        # or communication is of that kind and a boundary, whatever its name; ops of extension
        # namespaces (fbgemm::, vllm::, …) are candidates of their own, classed by their kernels.
        name_codes, name_uniques = attr.kernel_name_codes[fwd.index.to_numpy()], attr.kernel_name_uniques
        kind_codes, kind_uniques = factorize_text(fwd["kind"])
        pair_codes, pairs = pd.factorize(name_codes * (len(kind_uniques) + 1) + kind_codes)
        kinds = [
            rules.kernel_kind(
                name_uniques[p // (len(kind_uniques) + 1)], kind_uniques[p % (len(kind_uniques) + 1)]
            )
            for p in pairs.tolist()
        ]
        # Numbered in name order: of kinds holding the same time, the first by name leads.
        labels = sorted(set(kinds))
        rank = np.array([labels.index(kk) for kk in kinds], dtype=np.int64)
        time = pd.Series(fwd["dur"].to_numpy()).groupby([roots, rank[pair_codes]]).sum()
        return cls(
            names,
            rules,
            dict(zip(held.tolist(), kernel_names[first].tolist())),
            dict(zip(held.tolist(), activities[first].tolist())),
            copy_only,
            _majority(time, labels, rules),
        )

    def kernel_majority(self, r: int) -> tuple[str | None, str | None, bool]:
        """(most time's kind, the unabsorbed kind holding ≥ half the time or None, whether any
        unabsorbed kernel runs in it at all)."""
        return self.majority.get(r, (None, None, False))

    def kind(self, r: int) -> tuple[str, bool]:
        """(kind, boundary) of forward top-level op ``r``. An op's class comes from the op;
        copies or memsets inside it are part of it. A region never absorbs GEMM, convolution,
        attention or communication kernels (a boundary)."""
        rules, name = self.rules, self.names[r]
        top, strong, boundary = self.kernel_majority(r)
        copy_only = self.copy_only.get(r)
        first = (self.first_kernel.get(r), self.first_activity.get(r, "kernel"))
        reads = (name, copy_only, top, strong, boundary, first)
        known = self.known.get(reads)
        if known is not None:
            return known
        if copy_only:
            kind = "memcpy"
        elif rules.is_extension_op(name):
            kind, boundary = strong or top or "other", True
        elif strong and rules.classify_op(name) not in rules.unabsorbed_kinds:
            kind = strong
        else:
            kind = rules.classify_op(name) or rules.classify(None, *first)
        self.known[reads] = (kind, boundary)
        return kind, boundary


def _majority(
    time: pd.Series, labels: list[str], rules: Rules
) -> dict[int, tuple[str | None, str | None, bool]]:
    """``_RootKinds.kernel_majority`` of every op, from its kernel time by (op, kind number)."""
    by_op = time.groupby(level=0)
    total = by_op.sum()
    top = by_op.idxmax()  # the first of equal times: kinds are numbered in name order
    unabsorbed = [i for i, label in enumerate(labels) if label in rules.unabsorbed_kinds]
    some = time[np.isin(time.index.get_level_values(1), unabsorbed)].groupby(level=0)
    strongest, strong_time = some.idxmax().to_dict(), some.max().to_dict()
    out: dict[int, tuple[str | None, str | None, bool]] = {}
    for r, (_, kk), whole in zip(top.index.tolist(), top.tolist(), total.tolist()):
        strong = strongest.get(r)
        held = strong is not None and float(strong_time[r]) >= 0.5 * (float(whole) or 1.0)
        out[int(r)] = (labels[kk], labels[strong[1]] if held else None, strong is not None)
    return out
