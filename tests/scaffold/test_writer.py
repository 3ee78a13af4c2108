"""A scaffold package is written whole or not at all (``writer.write`` → ``outputs.atomic_dir``):
a write that fails or is interrupted halfway leaves no partial package, and with ``--force``
the previous package as it was; no temporary folder is left behind either way."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

import pytest
from click.testing import CliRunner

from kerneltriage.cli import main
from kerneltriage.errors import OutputError
from kerneltriage.scaffold import FILES, plan_kind, render, scaffold_kind, writer


def _files(kind: str, shape: str) -> dict[str, str]:
    template, context, _ = plan_kind(kind, [shape], "fp32")
    return render(template, context)


def _tree(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` (hidden ones included), by relative path."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _entries(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def _fail_after(monkeypatch, count: int, exc: BaseException) -> list[Path]:
    """Make the writer's file write raise ``exc`` once ``count`` files are written."""
    written: list[Path] = []
    real = writer._write_file

    def flaky(path: Path, text: str) -> None:
        if len(written) == count:
            raise exc
        real(path, text)
        written.append(path)

    monkeypatch.setattr(writer, "_write_file", flaky)
    return written


@pytest.mark.parametrize("exc", [OSError(errno.ENOSPC, "No space left on device"), KeyboardInterrupt()])
def test_a_new_package_failing_halfway_leaves_nothing(tmp_path, monkeypatch, exc):
    out = tmp_path / "kernels" / "new" / "pkg"  # two parents to create as well
    written = _fail_after(monkeypatch, 2, exc)
    expected = OutputError if isinstance(exc, OSError) else KeyboardInterrupt
    with pytest.raises(expected) as raised:
        writer.write(out, _files("gelu", "8x8"), force=False)
    assert len(written) == 2  # the failure came after two files were really written
    if expected is OutputError:
        assert "No space left" in str(raised.value) and str(out) in str(raised.value)
    assert _entries(tmp_path) == []  # no package, no temporary folder, no parents made for it


@pytest.mark.parametrize("exc", [OSError(errno.ENOSPC, "No space left on device"), KeyboardInterrupt()])
def test_force_failing_halfway_keeps_the_previous_package(tmp_path, monkeypatch, exc):
    out = tmp_path / "pkg"
    scaffold_kind("gelu", ["8x8"], "fp32", out)
    (out / "notes.txt").write_text("mine")
    before = _tree(tmp_path)
    _fail_after(monkeypatch, 2, exc)
    with pytest.raises(OutputError if isinstance(exc, OSError) else KeyboardInterrupt):
        writer.write(out, _files("rmsnorm", "16x32"), force=True)
    assert _tree(tmp_path) == before  # every old file as it was, nothing new, nothing hidden
    assert _entries(tmp_path) == sorted(["pkg", *(f"pkg/{n}" for n in [*FILES, "notes.txt"])])


@pytest.mark.parametrize("exc", [OSError(errno.EIO, "Input/output error"), KeyboardInterrupt()])
def test_force_failing_while_moving_in_puts_the_previous_files_back(tmp_path, monkeypatch, exc):
    """The files are all written; the third rename into the package fails (or Ctrl-C)."""
    out = tmp_path / "pkg"
    scaffold_kind("gelu", ["8x8"], "fp32", out)
    before = _tree(tmp_path)
    real = os.rename
    moved_in: list[str] = []

    def rename(src, dst):
        # A new file moving in (the previous ones moving back count too: fail only once).
        if Path(dst).parent == out and Path(src).parent != out and len(moved_in) < 3:
            moved_in.append(Path(dst).name)
            if len(moved_in) == 3:
                raise exc
        real(src, dst)

    monkeypatch.setattr(os, "rename", rename)
    with pytest.raises(OutputError if isinstance(exc, OSError) else KeyboardInterrupt):
        writer.write(out, _files("rmsnorm", "16x32"), force=True)
    assert len(moved_in) == 3  # two new files were in place before the failure
    assert _tree(tmp_path) == before
    assert sorted(p.name for p in out.iterdir()) == sorted(FILES)


def test_force_replaces_every_file_and_keeps_the_others(tmp_path):
    out = tmp_path / "pkg"
    scaffold_kind("gelu", ["8x8"], "fp32", out)
    (out / "notes.txt").write_text("mine")
    (out / "bench.py").chmod(0o755)  # a mode the user gave a file survives its replacement
    old = _tree(out)
    new = _files("rmsnorm", "16x32")
    paths = writer.write(out, new, force=True)
    assert paths == [out / name for name in new]
    assert _tree(out) == {**{n: t.encode() for n, t in new.items()}, "notes.txt": b"mine"}
    assert all(old[n] != new[n].encode() for n in FILES)  # each file really changed
    assert stat.S_IMODE((out / "bench.py").stat().st_mode) == 0o755
    assert _entries(tmp_path) == sorted(["pkg", *(f"pkg/{n}" for n in [*FILES, "notes.txt"])])


def test_a_new_package_gets_the_usual_permissions(tmp_path):
    out = tmp_path / "a" / "pkg"
    writer.write(out, _files("gelu", "8x8"), force=False)
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(out.stat().st_mode) == 0o777 & ~umask  # not a private temporary folder's
    assert stat.S_IMODE((out / "kernel.py").stat().st_mode) == 0o666 & ~umask
    assert _entries(tmp_path) == sorted(["a", "a/pkg", *(f"a/pkg/{n}" for n in FILES)])


def test_the_cli_says_one_line_and_writes_nothing(tmp_path, monkeypatch):
    out = tmp_path / "pkg"
    _fail_after(monkeypatch, 3, OSError(errno.ENOSPC, "No space left on device"))
    args = ["scaffold", "--kind", "gelu", "--shape", "8x8", "--out", str(out)]
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 2, res.output
    assert res.output.strip() == f"kerneltriage: error: {out}: cannot write (No space left on device)"
    assert _entries(tmp_path) == []
    monkeypatch.undo()
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 0 and res.output.startswith(f"wrote {out}/: kernel.py"), res.output
    assert _entries(tmp_path) == sorted(["pkg", *(f"pkg/{n}" for n in FILES)])


def test_previous_files_that_cannot_be_put_back_are_kept_and_named(tmp_path, monkeypatch):
    """Every rename into the package fails, putting back included: the previous files are
    never removed; the message says where they wait."""
    out = tmp_path / "pkg"
    scaffold_kind("gelu", ["8x8"], "fp32", out)
    before = {n: (out / n).read_bytes() for n in FILES}
    real = os.rename

    def rename(src, dst):
        if Path(dst).parent == out and Path(src).parent != out:
            raise OSError(errno.EIO, "Input/output error")
        real(src, dst)

    monkeypatch.setattr(os, "rename", rename)
    with pytest.raises(OutputError, match="could not all be put back") as raised:
        writer.write(out, _files("rmsnorm", "16x32"), force=True)
    kept = Path(str(raised.value).rpartition("they are in ")[2])
    assert kept.parent == out and {n: (kept / n).read_bytes() for n in FILES} == before


def test_force_never_replaces_a_folder_of_the_same_name(tmp_path):
    out = tmp_path / "pkg"
    (out / "kernel.py").mkdir(parents=True)
    (out / "kernel.py" / "mine.txt").write_text("mine")
    with pytest.raises(OutputError, match="Is a directory"):
        writer.write(out, _files("gelu", "8x8"), force=True)
    assert _entries(tmp_path) == ["pkg", "pkg/kernel.py", "pkg/kernel.py/mine.txt"]
