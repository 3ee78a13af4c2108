"""Render a scaffold's files from the Jinja2 templates and write them under ``--out`` only, all
of them or none (``outputs.atomic_dir``)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from kerneltriage.errors import InputError
from kerneltriage.outputs import atomic_dir
from kerneltriage.resources import data_path
from kerneltriage.scaffold.families import FAMILIES, FILES
from kerneltriage.scaffold.identifiers import literal

__all__ = ["FILES", "check_out", "render", "safe_target", "templates_dir", "write"]


def templates_dir() -> Path:
    return data_path("templates")


def _environment():
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(templates_dir())),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        autoescape=False,
    )
    env.filters["pyrepr"] = literal
    return env


def _tidy(text: str, python: bool) -> str:
    """Trailing spaces off; at most two blank lines in a row (one inside indented code)."""
    lines = [line.rstrip() for line in text.splitlines()]
    out: list[str] = []
    blanks = 0
    for line in lines:
        if not line:
            blanks += 1
            continue
        if out:
            limit = 2 if (not python or not line[:1].isspace()) else 1
            out.extend([""] * min(blanks, limit))
        blanks = 0
        out.append(line)
    return "\n".join(out) + "\n"


def render(template: str, context: dict[str, Any]) -> dict[str, str]:
    """{file name: text} for one scaffold of the family named ``template`` (``FAMILIES``)."""
    import jinja2

    env = _environment()
    root = templates_dir()
    files = {}
    for name, source in FAMILIES[template].templates.items():
        if not (root / source).is_file():
            raise InputError(f"template {source} is missing from {root}")
        try:
            text = env.get_template(source).render(**context)
        except jinja2.TemplateError as exc:  # a bug in a template, not a user error
            raise RuntimeError(f"rendering {source}: {exc}") from exc
        files[name] = _tidy(text, python=name.endswith(".py"))
    return files


def check_out(out: Path, force: bool) -> Path:
    """The output folder, refused when it exists and is not empty (unless ``force``)."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise InputError(f"--out {out} exists and is not a directory")
    if out.is_dir() and any(out.iterdir()) and not force:
        raise InputError(f"--out {out} exists and is not empty (--force writes the scaffold's files over it)")
    return out


def safe_target(out: Path, name: str) -> Path:
    """``out/name``, refused when it would land outside ``out`` (``..``, absolute names,
    symlinks)."""
    if not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]*", name) or ".." in name:
        raise InputError(f"refusing to write {name!r}: not a plain file name")
    root = out.resolve()
    target = out / name
    if target.is_symlink():
        raise InputError(f"refusing to write {target}: it is a symlink")
    if target.resolve().parent != root:
        raise InputError(f"refusing to write {target}: it resolves outside {out}")
    return target


def write(out: Path, files: dict[str, str], force: bool) -> list[Path]:
    """Write ``files`` under ``out``, all of them or none (``outputs.atomic_dir``): an error
    or Ctrl-C halfway leaves no half package, and with ``force`` the previous files."""
    out = check_out(out, force)
    targets = {name: safe_target(out, name) for name in files}  # all checked before any write
    with atomic_dir(out) as stage:
        for name, text in files.items():
            _write_file(stage / name, text)
    return [targets[name] for name in files]


def _write_file(path: Path, text: str) -> None:
    path.write_text(text, encoding="utf-8")
