"""A JSON list too big to parse at once, read in pieces by worker processes.

``read_list`` finds the list a top-level key of a JSON object holds, wherever the key is and
in any layout (one element per line, one line, any whitespace), and cuts it into pieces of
whole elements. Worker processes parse each piece with orjson and hand its elements to a sink
(or let the sink read the JSON itself: ``parse_elements``), so that only what the sink keeps
comes back; the results are merged in file order. Peak memory is a few pieces plus what the
sinks keep. The keys around the list are returned for a parse of their own.

How the cuts hold: "The list, cut into pieces" below. The module knows nothing of what the
elements are (``kineto.py`` reads trace events with it).
"""

from __future__ import annotations

import collections
import functools
import os
import re
from collections.abc import Callable
from typing import Any, BinaryIO, NamedTuple, Protocol

import numpy as np
import orjson

from kerneltriage.errors import TraceFormatError
from kerneltriage.gc_pause import gc_paused
from kerneltriage.worker_pool import stop, worker_pool

# A likely element boundary: "}" "," "{" with JSON whitespace around the comma. Only a guess (it
# can sit inside a string or a nested list of objects); the parse of the piece it ends proves it.
_CANDIDATE = re.compile(rb"\}[ \t\r\n]*,[ \t\r\n]*\{")
_WS = b" \t\r\n"


class Sink(Protocol):
    """What a worker hands a piece's elements to (made fresh for each piece). A sink may also
    have ``add_json(run: bytes) -> int``, to read the JSON of a run of elements itself
    (``parse_elements``)."""

    def add(self, elements: list[Any]) -> None: ...

    def result(self) -> Any: ...


def read_list(
    stream: BinaryIO,
    key: str,
    new_sink: Callable[[], Sink],
    merge: Callable[[Any], None],
    *,
    chunk_bytes: int,
    workers: int,
    path: str | None = None,
    guess: bool = True,
) -> tuple[bytes, bool]:
    """Read the list of the top-level ``key``: each piece's elements go to a ``new_sink()`` (in
    a worker process when ``workers`` > 1) and its ``result()`` to ``merge``, in file order.

    ``path``: the stream is this plain file (not compressed), so workers read their pieces by
    offset. ``guess``: cut at guessed boundaries first (else exactly from the start).

    Returns (document, read): the document with the list emptied (``[]``) and True, or, when it
    holds no such list, the whole document and False (for the caller to parse and explain).
    """
    found = _find_list(stream, orjson.dumps(key), chunk_bytes)
    if isinstance(found, bytes):
        return found, False
    header, rest = found
    parse = functools.partial(parse_elements, new_sink=new_sink)
    if workers > 1:
        with worker_pool(workers) as pool:
            tail = _read_pieces(
                stream, header, rest, chunk_bytes, parse, merge, pool, workers, path, key, guess
            )
    else:
        tail = _read_pieces(stream, header, rest, chunk_bytes, parse, merge, None, workers, path, key, guess)
    return header + b"[]" + tail, True


def _read_pieces(stream, header, rest, chunk_bytes, parse, merge, pool, workers, path, key, guess) -> bytes:
    pieces = _Pieces(stream, rest, len(header) + 1, chunk_bytes, parse, merge, pool, workers, path, key)
    try:
        return pieces.read(guess)
    except BaseException:
        if pool is not None:
            stop(pool)  # a Ctrl-C (or an error) stops the workers at once, silently
        raise


# --- Exact JSON structure, vectorized -------------------------------------------------------

# The bytes that make JSON's structure; the scan looks at nothing else.
_QUOTE, _BACKSLASH, _COMMA = ord('"'), ord("\\"), ord(",")
_STRUCTURAL = bytes(int(chr(b) in '"\\{}[],') for b in range(256))  # a translate table to 0/1
_RUN_BYTES = 1 << 20  # what a worker parses at once
_SCAN_BYTES = 2 << 20  # one scan step: its temporary arrays (~8x) stay in the heap, not page faults


class _Structure:
    """The structural bytes of ``buf[start:stop]`` (quotes, backslashes, brackets, commas),
    each with the JSON state after it.

    ``pos``: their offsets from ``start``; ``kind``: the byte (0 for a quote escaped by an odd run
    of backslashes); ``in_string``: 1 inside a string after it; ``depth``: open brackets after
    it. The state on entry is ``in_string``, ``depth``; callers never end a range inside a run
    of backslashes, so escapes never straddle ranges.
    """

    def __init__(self, buf: bytes, start: int, stop: int, in_string: int, depth: int):
        mask = np.frombuffer(buf[start:stop].translate(_STRUCTURAL), dtype=np.bool_)
        offsets = np.flatnonzero(mask)
        kind = np.frombuffer(buf, dtype=np.uint8, count=stop - start, offset=start)[offsets]
        quote = kind == _QUOTE
        backslash = np.flatnonzero(kind == _BACKSLASH)
        if len(backslash):
            # A quote is escaped when the run of backslashes just before it has odd length.
            slashes = offsets[backslash]
            run_start = np.where(np.r_[True, slashes[1:] != slashes[:-1] + 1], slashes, 0)
            run_start = np.maximum.accumulate(run_start)
            quotes = np.flatnonzero(quote)
            before = np.minimum(np.searchsorted(slashes, offsets[quotes] - 1), len(slashes) - 1)
            odd_run = (slashes[before] - run_start[before]) % 2 == 0
            escaped = quotes[(slashes[before] == offsets[quotes] - 1) & odd_run]
            quote[escaped] = False
            kind[escaped] = 0
        self.start = start
        self.pos = offsets  # from start
        self.kind = kind
        in_str = np.cumsum(quote, dtype=np.int32)
        in_str += in_string
        in_str &= 1
        self.in_string = in_str
        # Brackets count only outside strings (a bracket never changes the string state, so
        # the state after it is the state at it).
        outside = in_str == 0
        opening = ((kind == ord("{")) | (kind == ord("["))) & outside
        closing = ((kind == ord("}")) | (kind == ord("]"))) & outside
        self.depth = np.cumsum(opening.view(np.int8) - closing.view(np.int8), dtype=np.int32)
        self.depth += depth
        self.end_state = (int(in_str[-1]), int(self.depth[-1])) if len(kind) else (in_string, depth)


def _scan_stop(buf: bytes, start: int, stop: int, final: bool) -> int:
    """``stop``, moved back before a trailing run of backslashes (its escape is undecided)."""
    if final:
        return stop
    while stop > start and buf[stop - 1] == 0x5C:
        stop -= 1
    return stop


def _skip_ws(buf: bytes, i: int) -> int:
    while i < len(buf) and buf[i] in _WS:
        i += 1
    return i


class _Undecided(Exception):
    """More bytes are needed to decide."""


def _find_list(stream: BinaryIO, key: bytes, chunk_bytes: int) -> tuple[bytes, bytes] | bytes:
    """Read up to the ``[`` that opens the top-level list of ``key`` (quoted), wherever the key is.

    Returns (header, rest): the document before the ``[`` and the bytes read after it. A
    document without such a list is returned whole (bytes), for the whole-document parse to
    explain what it is instead.
    """
    buf = stream.read(chunk_bytes)
    start = _skip_ws(buf, 0)
    if start == len(buf) or buf[start] != ord("{"):
        return buf + stream.read()
    scanned, state, final, step = start, (0, 0), False, 64 << 10
    while True:
        stop = _scan_stop(buf, scanned, min(len(buf), scanned + step), final)
        step = min(step * 4, _SCAN_BYTES)
        undecided = False
        if stop > scanned:
            s = _Structure(buf, scanned, stop, *state)
            state = s.end_state
            # Top-level keys are among the strings that open at depth 1.
            for i in np.flatnonzero((s.kind == _QUOTE) & (s.in_string == 1) & (s.depth == 1)):
                p = s.start + int(s.pos[i])
                try:
                    value = _key_value(buf, p, final, key)
                except _Undecided:  # rescan from just before this opening quote, at depth 1
                    stop, state, undecided = p, (0, 1), True
                    break
                if value is None:
                    continue
                if buf[value] != ord("["):  # the key's value is not a list: the parse says so
                    return buf + stream.read()
                return buf[:value], buf[value + 1 :]
            scanned = stop
        if not undecided and scanned < _scan_stop(buf, scanned, len(buf), final):
            continue
        if final:
            return buf  # no such list at the top level
        chunk = stream.read(chunk_bytes)
        final = not chunk
        buf += chunk


def _key_value(buf: bytes, p: int, final: bool, key: bytes) -> int | None:
    """For a string starting at ``p``: the offset of its value if it is ``key`` (quoted)."""
    if len(buf) < p + len(key) and not final:
        raise _Undecided
    if buf[p : p + len(key)] != key:
        return None
    colon = _skip_ws(buf, p + len(key))
    value = _skip_ws(buf, colon + 1)
    if value >= len(buf):
        if final:
            return None
        raise _Undecided
    return value if buf[colon] == ord(":") else None


# --- The list, cut into pieces -------------------------------------------------------
#
# Pieces of about ``chunk_bytes`` are parsed in worker processes. Two ways to cut them:
#
# - The guess: the ``}`` ``,`` ``{`` nearest a cut point, found by a regular expression at
#   almost no cost. A parse proves it: a piece that begins at a true boundary (outside strings,
#   in the list, before an element) and parses as the contents of a list ends at one, since a
#   parser meets the same bytes in the same state. The first piece begins after the list's
#   ``[``, so the pieces prove each other in file order.
# - The exact cut, from the first piece that did not parse (the guess fell inside a string or a
#   nested list of objects) to the end: ``_Structure`` tracks strings, escapes and brackets,
#   cuts at the list's own commas and finds its closing ``]``.
#
# The end of the list is always found exactly. For a plain file the workers read their pieces
# themselves and the guesses need only a small window of the file, so the reading process
# touches a few KiB per piece.


class _Splitter:
    """Exact cuts of the list, from a true boundary on (all offsets in the document).

    ``buf`` holds the document from ``base``: from the start of the next piece when pieces are
    kept as bytes, else only what is still to be scanned (workers read their pieces from the
    file, so the scan keeps memory to one read).
    """

    def __init__(self, buf: bytes, offset: int, chunk_bytes: int, cuts: int, keep: bool):
        self.buf = buf
        self.base = offset  # of buf[0]
        self.start = offset  # of the next piece
        self.scanned = offset
        self.state = (0, 2)  # outside strings, inside the top-level object and the list
        self.cut = -1  # the last comma of the list seen by the scan
        self.end = -1  # the list's closing bracket
        self.cuts = cuts  # commas of the list consumed so far: no empty element after one
        self.keep = keep
        self.chunk_bytes = chunk_bytes
        self.final = False  # buf holds the rest of the document

    def feed(self, data: bytes) -> None:
        if not self.keep:  # drop what is scanned
            self.buf, self.base = self.buf[self.scanned - self.base :], self.scanned
        self.buf += data

    def rejoin(self, pieces: list[bytes], offset: int) -> None:
        """Start again from pieces cut by guesses (their commas put back)."""
        self.buf = b",".join([*pieces, self.buf])
        self.base = self.start = self.scanned = offset
        self.state, self.cut = (0, 2), -1
        self.cuts -= len(pieces)

    def take(self, cut: int) -> tuple[bytes | None, int, int]:
        """Cut at the comma ``cut``: (the piece as bytes or None, its offset, its end)."""
        start = self.start
        piece = self.buf[start - self.base : cut - self.base] if self.keep else None
        if self.keep:
            self.buf, self.base = self.buf[cut + 1 - self.base :], cut + 1
        self.start = cut + 1
        self.scanned = max(self.scanned, self.start)
        self.cut = -1
        self.cuts += 1
        return piece, start, cut

    def next_piece(self) -> tuple[bytes | None, int, int] | None:
        """The next piece (the last ends at the list's ``]``), or None: read more."""
        buf, base = self.buf, self.base
        stop = _scan_stop(buf, self.scanned - base, len(buf), self.final)
        while self.scanned - base < stop:
            lo = self.scanned - base
            hi = _scan_stop(buf, lo, min(stop, lo + _SCAN_BYTES), self.final)
            hi = hi if hi > lo else stop
            s = _Structure(buf, lo, hi, *self.state)
            closes = np.flatnonzero(s.depth < 2)
            limit = int(closes[0]) if len(closes) else len(s.kind)
            kind, depth, in_string = s.kind[:limit], s.depth[:limit], s.in_string[:limit]
            commas = np.flatnonzero((kind == _COMMA) & (in_string == 0) & (depth == 2))
            if len(commas):
                self.cut = base + lo + int(s.pos[commas[-1]])
            if len(closes):
                self.end = base + lo + int(s.pos[limit])
                if s.kind[limit] != ord("]"):
                    raise TraceFormatError(f"not valid JSON (mismatched bracket at byte {self.end})")
                piece = buf[self.start - base : self.end - base] if self.keep else None
                return piece, self.start, self.end
            self.scanned, self.state = base + hi, s.end_state
            if self.cut - self.start >= self.chunk_bytes:
                break
        return None if self.cut < 0 else self.take(self.cut)

    def tail(self) -> bytes:
        return self.buf[self.end + 1 - self.base :]


def _last_candidate(buf: bytes) -> int:
    """The comma of the last guessed boundary in ``buf``, or -1."""
    for window in (64 << 10, 4 << 20, len(buf)):  # an event is far smaller than 64 KiB
        last = None
        for last in _CANDIDATE.finditer(buf, max(0, len(buf) - window)):  # noqa: B007
            pass
        if last is not None:
            return buf.index(b",", last.start())
        if window >= len(buf):
            break
    return -1


class _Pending(NamedTuple):
    piece: bytes | None  # kept while a re-cut may need it
    offset: int
    guessed: bool
    may_be_empty: bool  # the whole list: "[]" is valid, an empty piece after a comma is not
    result: Any  # the parsed piece, or the pool's promise of it


class _Pieces:
    """Reads the list: cuts pieces, has them parsed, hands the results to ``merge`` in file
    order."""

    def __init__(
        self,
        stream: BinaryIO,
        rest: bytes,
        offset: int,
        chunk_bytes: int,
        parse: Callable[[Any], Any],
        merge: Callable[[Any], None],
        pool: Any,
        workers: int,
        path: str | None,
        name: str,
    ):
        self.stream = stream
        self.first = offset  # of the list's first element
        self.chunk_bytes = chunk_bytes
        self.parse = parse
        self.merge = merge
        self.name = name  # the list's key, for messages
        self.pool = pool
        self.workers = workers
        self.path = path  # a plain file: workers read their pieces from it
        self.splitter = self._splitter(rest, offset)
        self.pending: collections.deque[_Pending] = collections.deque()

    def read(self, guess: bool) -> bytes:
        """Returns the document after the list."""
        if guess and self.path is not None:
            self._guess_in_file()
        elif guess:
            self._guess_in_stream()
        splitter = self.splitter
        # Without pieces to keep, read no more than one scan step at a time.
        size = self.chunk_bytes if splitter.keep else min(self.chunk_bytes, _SCAN_BYTES)
        while True:
            got = splitter.next_piece()
            if got is not None:
                self._submit(*got, guessed=False, may_be_empty=splitter.end >= 0 and not splitter.cuts)
                if splitter.end >= 0:
                    break
                self._collect(block=False)
                continue
            if splitter.final:
                raise TraceFormatError(
                    f"not valid JSON (the file ends inside the {self.name} list: truncated?)"
                )
            chunk = self.stream.read(size)
            if chunk:
                splitter.feed(chunk)
            else:
                splitter.final = True
        self._collect(block=True)
        return splitter.tail() + self.stream.read()

    def _splitter(self, buf: bytes, offset: int) -> _Splitter:
        # Pieces are kept as bytes unless workers read them from the file.
        keep = self.path is None or self.pool is None
        return _Splitter(buf, offset, self.chunk_bytes, int(offset > self.first), keep)

    def _guess_in_file(self) -> None:
        size = os.fstat(self.stream.fileno()).st_size
        pos, failed = self.first, -1
        while failed < 0:
            cut = self._candidate_in_file(pos + self.chunk_bytes, size)
            if cut < 0:
                break
            self._submit(None, pos, cut, guessed=True)
            pos = cut + 1
            failed = self._collect(block=False)
        if failed < 0:
            failed = self._collect(block=True)
        if failed >= 0:
            pos = failed
        # The rest (a bad guess's piece on, or the last piece) is cut exactly.
        self.pending.clear()
        self.stream.seek(pos)
        self.splitter = self._splitter(b"", pos)

    def _candidate_in_file(self, target: int, size: int) -> int:
        if target >= size:
            return -1
        self.stream.seek(target)
        window, step = b"", 64 << 10
        while len(window) < self.chunk_bytes:  # else nothing to guess from: cut exactly
            more = self.stream.read(step)
            if not more:
                break
            window += more
            match = _CANDIDATE.search(window)
            if match:
                return target + window.index(b",", match.start())
            step *= 2
        return -1

    def _guess_in_stream(self) -> None:
        splitter = self.splitter
        while True:
            cut = _last_candidate(splitter.buf)
            if cut >= 0:
                self._submit(*splitter.take(splitter.base + cut), guessed=True)
            elif len(splitter.buf) > 2 * self.chunk_bytes:  # nothing to guess from: cut exactly
                failed = self._collect(block=True)
                break
            failed = self._collect(block=False)
            if failed >= 0:
                break
            chunk = self.stream.read(self.chunk_bytes)
            if not chunk:
                splitter.final = True
                failed = self._collect(block=True)
                break
            splitter.feed(chunk)
        if failed >= 0:
            splitter.rejoin([p.piece for p in self.pending], failed)  # type: ignore[misc]
            self.pending.clear()

    def _submit(
        self, piece: bytes | None, offset: int, stop: int, *, guessed: bool, may_be_empty: bool = False
    ) -> None:
        task: bytes | tuple[str, int, int]
        if self.path is not None and (piece is None or self.pool is not None):
            task = (self.path, offset, stop)  # the worker reads it: nothing to send
        else:
            assert piece is not None  # read from a stream, not a file: every piece has its bytes
            task = piece
        result = self.parse(task) if self.pool is None else self.pool.submit(self.parse, task)
        keep = piece if guessed and self.path is None else None
        self.pending.append(_Pending(keep, offset, guessed, may_be_empty, result))

    def _collect(self, block: bool) -> int:
        """Merge parsed pieces in file order; the offset of a guessed piece that did not parse
        (left first in ``pending``), else -1."""
        while self.pending:
            first = self.pending[0]
            result = first.result
            if self.pool is not None:
                if not (block or result.done() or len(self.pending) > 2 * self.workers):
                    break
                result = result.result()
            if isinstance(result, BadPiece):
                if first.guessed:
                    return first.offset
                at = first.offset + result.pos - 1  # the piece was parsed behind a "["
                raise TraceFormatError(f"not valid JSON ({result.message} at byte {at})")
            count, parsed = result
            if not count and not first.may_be_empty:  # only whitespace between commas
                raise TraceFormatError(f"not valid JSON (an empty element at byte {first.offset})")
            self.pending.popleft()
            self.merge(parsed)
        return -1


class BadPiece(NamedTuple):
    """A piece that is not the contents of a JSON list: orjson's message and position."""

    message: str
    pos: int


def parse_elements(piece: bytes | tuple[str, int, int], new_sink: Callable[[], Sink]) -> Any:
    """Worker: a run of elements (bytes, or (path, start, stop) of a plain file) → (how many,
    their sink's result), or a ``BadPiece`` when it is not a list's contents."""
    if isinstance(piece, tuple):
        path, start, stop = piece
        with open(path, "rb") as f:
            f.seek(start)
            piece = f.read(stop - start)
    # Millions of fresh containers would trigger the cyclic GC over and over; none of them
    # form cycles, so pause it (it halves the parse).
    with gc_paused():
        sink = new_sink()
        add_json = getattr(sink, "add_json", None)
        count = start = 0
        while start < len(piece):
            # Parse ~1 MiB at a time, cut at guessed boundaries (each proven by its parse, as
            # the pieces are): the memory freed after each run is reused by the next instead of
            # being handed back to the system and faulted in again (a third less CPU time).
            stop = len(piece)
            if stop - start > 2 * _RUN_BYTES:
                match = _CANDIDATE.search(piece, start + _RUN_BYTES)
                stop = piece.index(b",", match.start()) if match else stop
            got = _hand_over(b"[" + piece[start:stop] + b"]", sink, add_json)
            if not isinstance(got, int) and stop < len(piece):
                stop = len(piece)  # a wrong guess: parse the rest of the piece at once
                got = _hand_over(b"[" + piece[start:] + b"]", sink, add_json)
            if not isinstance(got, int):
                return BadPiece(got.msg, start + got.pos)
            count += got
            start = stop + 1
        return count, sink.result()


def _hand_over(
    run: bytes, sink: Sink, add_json: Callable[[bytes], int] | None
) -> int | orjson.JSONDecodeError:
    """The elements of the JSON list ``run`` to the sink: how many, or orjson's error where it
    is not valid JSON. A sink may read the JSON itself (``add_json``: how many, or -1 where it
    declines and takes nothing); else orjson parses it."""
    if add_json is not None:
        count = add_json(run)
        if count >= 0:
            return count
    try:
        elements = orjson.loads(run)
    except orjson.JSONDecodeError as exc:
        return exc
    sink.add(elements)
    return len(elements)
