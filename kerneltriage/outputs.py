"""Files the commands write (``-o``, ``--plot``, ``--export``, ``scaffold --out``): checked before
any work, written whole or not at all.

- ``check_outputs``: every output path is checked before the analysis starts (its folder
  exists and is a folder, it is not a directory itself, no two outputs are the same file),
  and none is a file the same command reads: ``-o trace.json.gz`` or ``-o manifest.json``
  would replace an input with the report.
- ``write_atomic`` / ``atomic_path``: a file is written beside its target under a temporary
  name, then renamed over it (``os.replace``), so an interrupted or failing write (Ctrl-C, a
  full disk) leaves the previous file, or none, never half a report. A read-only file (no
  owner write bit, or not writable by this user) is never replaced: ``OutputError``. Special files
  (``/dev/stdout``, a pipe) are written in place.
- ``atomic_dir``: the same for a folder of files (``scaffold --out``): they are written into a
  temporary folder on the same filesystem, then moved into place together.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import shutil
import stat
from collections.abc import Iterable, Iterator
from pathlib import Path

from kerneltriage import rundir
from kerneltriage.errors import OutputError

# Files of a folder of traces that a command reads (a run directory: its own names, ``rundir``).
_INPUT_SUFFIXES = (".json", ".json.gz")


def _resolved(path: str | os.PathLike[str]) -> Path:
    return Path(os.path.abspath(os.path.expanduser(path)))


def check_outputs(
    files: dict[str, str | os.PathLike[str] | None],
    inputs: Iterable[str | os.PathLike[str] | None],
    folders: dict[str, str | os.PathLike[str] | None] | None = None,
) -> None:
    """Raise ``OutputError`` unless every output can be written and none is an input.

    ``files``: flag -> a file to write (None: not asked for); ``folders``: flag -> a folder
    to write files into (created with its parents); ``inputs``: the paths the command reads
    (files, run directories, folders of traces)."""
    sources = [_resolved(p) for p in inputs if p is not None and "://" not in str(p)]
    seen: dict[Path, str] = {}
    for flag, given in files.items():
        if given is None:
            continue
        path = _resolved(given)
        where = str(given)
        if path in seen:
            raise OutputError(f"{flag} and {seen[path]} name the same file twice", path=where)
        seen[path] = flag
        if not _is_special(path):
            if path.is_dir():
                raise OutputError(f"{flag} is a directory; give a file name", path=where)
            parent = path.parent
            if not parent.exists():
                raise OutputError(f"cannot write {flag}: no such directory {parent}", path=where)
            if not parent.is_dir():
                raise OutputError(
                    f"cannot write {flag}: {_first_file(parent)} is not a directory", path=where
                )
            if not os.access(parent, os.W_OK | os.X_OK):
                raise OutputError(f"cannot write {flag}: the directory {parent} is not writable", path=where)
            refuse_read_only(path, flag)
        _refuse_inputs(flag, path, where, sources)
    for flag, given in (folders or {}).items():
        if given is None:
            continue
        path = _resolved(given)
        where = str(given)
        if path.exists() and not path.is_dir():
            raise OutputError(f"{flag} names a folder, and this is not a directory", path=where)
        existing = next((p for p in (path, *path.parents) if p.exists()), None)
        if existing is not None and not existing.is_dir():
            raise OutputError(f"cannot write {flag}: {existing} is not a directory", path=where)
        if existing is not None and not os.access(existing, os.W_OK | os.X_OK):
            raise OutputError(f"cannot write {flag}: the directory {existing} is not writable", path=where)
        if path in sources:
            raise OutputError(f"{flag} is an input of this command; write elsewhere", path=where)


def read_only(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is an existing regular file the user marked not to be written: one
    without its owner's write bit (``chmod 444``; root could write it, and is refused too), or
    one this process may not write (``os.access``)."""
    try:
        info = os.stat(path)
    except OSError:
        return False
    if not stat.S_ISREG(info.st_mode):
        return False
    return not info.st_mode & stat.S_IWUSR or not os.access(path, os.W_OK)


def refuse_read_only(path: str | os.PathLike[str], flag: str = "the output") -> None:
    """``OutputError`` when ``path`` is a read-only file (``read_only``): it is never replaced."""
    if read_only(path):
        raise OutputError(
            f"{flag} names a read-only file, which is never replaced",
            path=str(path),
            hint="make it writable (chmod u+w) or remove it, or write elsewhere",
        )


def _first_file(path: Path) -> Path:
    """The first component of ``path`` that exists and is not a directory."""
    for p in reversed((path, *path.parents)):
        if p.exists() and not p.is_dir():
            return p
    return path


def _read_from(folder: Path, path: Path) -> bool:
    """Would reading ``folder`` (a run directory, or a folder of traces) read ``path``?"""
    if path.parent != folder:
        return False
    if rundir.is_run_dir(folder):
        run_files = (
            rundir.MANIFEST,
            rundir.TRACE,
            rundir.TRACE_NSYS,
            rundir.NCU_CSV,
            rundir.NCU_LAUNCHES_CSV,
        )
        return path.name in (*run_files, rundir.NCU_REP, rundir.REGIONS) or path.match(rundir.TRACE_RANK_GLOB)
    return path.name.endswith(_INPUT_SUFFIXES)


def _refuse_inputs(flag: str, path: Path, where: str, sources: list[Path]) -> None:
    for source in sources:
        clash = path == source or (source.is_dir() and _read_from(source, path))
        if clash:
            raise OutputError(
                f"{flag} would overwrite an input of this command"
                + ("" if path == source else f" (a file of {source})")
                + "; write the output elsewhere",
                path=where,
            )


def _is_special(path: Path) -> bool:
    """A device, pipe or socket (``/dev/stdout``, ``/dev/full``): written in place."""
    try:
        mode = path.stat().st_mode
    except OSError:
        return False
    return not stat.S_ISREG(mode) and not stat.S_ISDIR(mode)


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[Path]:
    """A temporary path beside ``path`` (same suffix) to write; renamed over ``path`` when the
    block succeeds, removed when it fails or is interrupted. A write error is an
    ``OutputError`` naming ``path``."""
    target = Path(path)
    if _is_special(target):
        try:
            yield target
        except OSError as exc:
            raise OutputError(f"cannot write ({exc.strerror or exc})", path=str(target)) from None
        return
    refuse_read_only(target)
    tmp = target.with_name(f".{target.stem}.{os.getpid()}.tmp{target.suffix}")
    try:
        yield tmp
        if target.exists():
            with contextlib.suppress(OSError):
                os.chmod(tmp, stat.S_IMODE(target.stat().st_mode))
        os.replace(tmp, target)
    except OSError as exc:
        raise OutputError(f"cannot write ({exc.strerror or exc})", path=str(target)) from None
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink()


def write_atomic(path: str | os.PathLike[str], data: str | bytes) -> None:
    """Write ``data`` to ``path`` whole or not at all (``atomic_path``)."""
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        f.write(data.encode("utf-8") if isinstance(data, str) else data)
        f.flush()
        os.fsync(f.fileno())


@contextlib.contextmanager
def atomic_dir(path: str | os.PathLike[str]) -> Iterator[Path]:
    """A temporary folder to fill with the files of the folder ``path``; moved into place when
    the block succeeds, removed when it fails or is interrupted, so ``path`` gets every file
    or none. A write error is an ``OutputError`` naming ``path``.

    A new folder is staged beside ``path`` and renamed to it (one rename; the parents it had
    to create are removed again on failure). Into an existing folder, each staged file
    replaces its namesake: the previous ones are moved aside until all the new ones are in,
    and put back when a move fails. Its other files are kept, and nothing above it needs to
    be writable, so this works for ``--out .`` as well."""
    target = Path(path)
    if os.path.lexists(target) and not target.is_dir():
        raise OutputError("exists and is not a directory", path=str(target))
    existing = target.is_dir()
    created: list[Path] = []  # parents made here, deepest last
    stage: Path | None = None
    done = False
    try:
        if not existing:
            for parent in reversed(target.parents):
                if not parent.exists():
                    parent.mkdir()
                    created.append(parent)
        stage = _fresh_dir(target if existing else target.parent)
        yield stage
        for entry in stage.iterdir():  # on disk before they are renamed into place
            _fsync(entry)
        if existing:
            _move_in(stage, target)
        else:
            os.rename(stage, target)  # fails when a non-empty folder appeared there meanwhile
        done = True
    except OSError as exc:
        raise OutputError(f"cannot write ({exc.strerror or exc})", path=str(target)) from None
    finally:
        if stage is not None:
            shutil.rmtree(stage, ignore_errors=True)
        if not done:
            for parent in reversed(created):
                with contextlib.suppress(OSError):
                    parent.rmdir()


def _fresh_dir(parent: Path) -> Path:
    """A new, hidden, uniquely named folder in ``parent`` (the umask's permissions)."""
    while True:
        candidate = parent / f".kerneltriage-{os.getpid()}-{secrets.token_hex(4)}.tmp"
        try:
            candidate.mkdir()
            return candidate
        except FileExistsError:
            continue


def _fsync(path: Path) -> None:
    if path.is_file() and not path.is_symlink():
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _move_in(stage: Path, target: Path) -> None:
    """Rename ``stage``'s entries over their namesakes in ``target``, all or none: the
    previous ones wait in a hidden folder of ``target`` until every new one is in."""
    names = sorted(os.listdir(stage))
    for name in names:  # a folder of the user's is never replaced by a file (nor removed)
        if (target / name).is_dir():
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(target / name))
        refuse_read_only(target / name, "a file to write")
    aside = _fresh_dir(target)
    moved_aside: list[str] = []
    moved_in: list[str] = []
    try:
        for name in names:
            if os.path.lexists(target / name):
                if (target / name).is_file():  # the replacement keeps the file's permissions
                    with contextlib.suppress(OSError):
                        os.chmod(stage / name, stat.S_IMODE((target / name).stat().st_mode))
                os.rename(target / name, aside / name)
                moved_aside.append(name)
        for name in names:
            os.rename(stage / name, target / name)
            moved_in.append(name)
    except BaseException:  # a failed rename or Ctrl-C: put the previous files back
        try:
            for name in reversed(moved_in):
                os.rename(target / name, stage / name)
            for name in reversed(moved_aside):
                os.rename(aside / name, target / name)
        except OSError as exc:  # never remove them: say where they are
            raise OutputError(
                f"cannot write, and the previous files could not all be put back "
                f"({exc.strerror or exc}); they are in {aside}",
                path=str(target),
            ) from None
        with contextlib.suppress(OSError):
            aside.rmdir()
        raise
    shutil.rmtree(aside, ignore_errors=True)
