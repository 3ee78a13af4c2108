"""``profile --apply``'s runs in the report: the line that names the fixes a run was profiled
with and the run before them (terminal, Markdown and HTML headers alike)."""

from __future__ import annotations

from typing import Any


def applied_fixes_line(source: dict[str, Any]) -> str:
    """``profile --apply``: the fixes the run was profiled with, and the run before them."""
    fixes = ", ".join(
        f"{f['id']} ({f.get('recipe_id') or (f.get('apply') or {}).get('kind')})"
        for f in source["applied_fixes"]
    )
    parent = source.get("parent_run") or "the run before"
    return (
        f"Fixes applied: profiled with {fixes} (kerneltriage profile --apply); the run before them: {parent} "
        f"(kerneltriage diff {parent} {source.get('path', 'RUN')})"
    )
