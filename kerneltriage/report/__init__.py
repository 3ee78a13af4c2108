"""Renderers for a ``Report``: terminal (rich), Markdown, JSON, CSV and HTML. Rendering only:
every number shown was computed in ``analysis``.

The package is also the API's ``kerneltriage.report(path, **options) -> Report`` (see
``kerneltriage.api.report``): a module cannot share its name with a function of its parent
package, so calling the package runs the analysis.
"""

from __future__ import annotations

import sys
import types
from pathlib import Path
from typing import Any

from kerneltriage.report.render import FORMATS, render

__all__ = ["FORMATS", "render"]


class _CallablePackage(types.ModuleType):
    def __call__(self, path: str | Path, **options: Any) -> Any:
        """``kerneltriage.report(path, *, rank, ncu, rules_file, gpu, min_headroom, min_share,
        max_shapes, step_marker) -> Report``: see ``kerneltriage.api.report``."""
        from kerneltriage.api import report

        return report(path, **options)


sys.modules[__name__].__class__ = _CallablePackage
