"""Regular expressions given by the user (``--rules`` files, ``--step-marker``), matched in
linear time.

Python's ``re`` backtracks: ``^(\\w|\\w)*!$`` on a long kernel name runs for hours. A user's
pattern is compiled with RE2 (``google-re2``), whose matching time is linear in the text; RE2
has no backreferences or lookaround, and a pattern that needs them is refused by name. The
shipped rules are compiled with ``re`` by ``rules.py`` (they are reviewed, and one uses a
lookahead).
"""

from __future__ import annotations

import re
from typing import Any, Protocol

from kerneltriage.errors import InputError


class Pattern(Protocol):
    @property
    def pattern(self) -> Any: ...

    def search(self, text: str, *args: Any) -> Any: ...


def compile_user_pattern(pattern: Any, where: str, error: type[InputError] = InputError) -> Pattern:
    """``pattern`` compiled for linear-time matching; ``error`` (exit code 2) naming ``where``
    when it is not a string, not a regular expression, or needs backtracking."""
    if not isinstance(pattern, str):
        raise error(f"{where}: pattern {pattern!r} is not a string")
    try:
        re.compile(pattern)
    except re.error as exc:
        raise error(f"{where}: bad regular expression {pattern!r} ({exc})") from None
    import re2

    options = re2.Options()
    options.log_errors = False  # the reason goes into the one-line message, not to stderr
    try:
        return re2.compile(pattern, options)
    except re2.error as exc:
        reason = exc.args[0].decode() if exc.args and isinstance(exc.args[0], bytes) else str(exc)
        raise error(
            f"{where}: pattern {pattern!r} needs backtracking ({reason}), which can take hours on a "
            "long name; backreferences and lookaround are not supported in user patterns",
            hint="rewrite it without them",
        ) from None
