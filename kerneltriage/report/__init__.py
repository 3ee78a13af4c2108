"""Renderers for a ``Report``: terminal (rich), Markdown, JSON and HTML. Rendering only: every
number shown was computed in ``analysis``."""

from __future__ import annotations

from kerneltriage.report.render import FORMATS, render

__all__ = ["FORMATS", "render"]
