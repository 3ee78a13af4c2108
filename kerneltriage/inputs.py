"""Input files, checked before they are read: each problem is one ``InputError`` naming the file
and what to do, never an ``OSError``, ``UnicodeDecodeError`` or ``RecursionError`` (or a read
that blocks forever on a named pipe).

A path must name a regular file: a directory, a named pipe or a device (``/dev/zero`` never
ends) is refused before anything is opened.
"""

from __future__ import annotations

import errno
import os
import re
import stat
from pathlib import Path

from kerneltriage.errors import InputError

_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


def is_url(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` names a protocol (``s3://…``, ``file://…``): read through fsspec."""
    return bool(_URL.match(str(path)))


def check_file(path: str | os.PathLike[str], what: str, error: type[InputError] = InputError) -> Path:
    """``path`` if it names a regular file; else ``error`` (exit code 2) saying why."""
    file = Path(path)
    try:
        info = file.stat()
    except FileNotFoundError:
        raise error(f"no such {what}", path=str(file)) from None
    except OSError as exc:
        raise error(f"cannot read the {what} ({os_reason(exc)})", path=_short(file)) from None
    if stat.S_ISDIR(info.st_mode):
        raise error(f"the {what} is a directory", path=str(file), hint="give the file itself")
    if not stat.S_ISREG(info.st_mode):
        raise error(
            f"the {what} is not a regular file (a named pipe or a device)",
            path=str(file),
            hint="save it to a file first",
        )
    return file


def is_directory(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a directory; a path the OS cannot look up (a name too long) is not."""
    try:
        return stat.S_ISDIR(os.stat(path).st_mode)
    except (OSError, ValueError):
        return False


def read_bytes(path: str | os.PathLike[str], what: str, error: type[InputError] = InputError) -> bytes:
    file = check_file(path, what, error)
    try:
        return file.read_bytes()
    except OSError as exc:
        raise error(f"cannot read the {what} ({os_reason(exc)})", path=str(file)) from None


def read_text(path: str | os.PathLike[str], what: str, error: type[InputError] = InputError) -> str:
    """The file as UTF-8 text; a file in another encoding (or binary) is refused by name."""
    data = read_bytes(path, what, error)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise error(
            f"the {what} is not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start})",
            path=str(path),
            hint="save it as UTF-8",
        ) from None


def os_reason(exc: OSError) -> str:
    """An ``OSError`` in words, with what to do for the usual ones."""
    if exc.errno == errno.ENAMETOOLONG:
        return "file name too long"
    if exc.errno == errno.ENOSPC:
        return "no space left on the device; free some space"
    if exc.errno in (errno.EACCES, errno.EPERM):
        return "permission denied; check the file's permissions"
    if exc.errno == errno.EROFS:
        return "read-only file system; choose a writable place"
    return exc.strerror or str(exc)


def _short(path: Path) -> str:
    """A path short enough for one line (a name too long for the OS is cut)."""
    text = str(path)
    return text if len(text) <= 120 else text[:60] + "…" + text[-40:]
