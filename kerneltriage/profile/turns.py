"""Processes of the script started together and given the GPU one at a time (``gate.py``).

``Turns`` starts every child at once, each held at its first CUDA use, and runs them in order:
``next()`` opens the next one's gate and waits for it. For timed processes (``quiet``) a gate
opens only once every later child is at its gate or has exited, so no start-up shares the host
with timed steps; past ``hold_limit`` seconds of waiting for that, it opens anyway (a script
that builds its inputs for minutes before touching the GPU). ``also_wait_for`` adds the turns
of another batch started meanwhile (phase 2's ncu processes, started during the timing ones).

A turn may have a second gate, ``measure``, that its process waits at before the steps it is
there for (a timing process's plain steps, an ncu pass's profiled step), its start-up and
warm-up done. Where the
caller says one turn's GPU work is over before its exit (``next(gpu_done)``), the next turn
with such a gate is started with this one: both warm up at once, each then holds at its
measure gate, and this one's opens only once the next one is waiting there (its warm-up is
GPU work too); the next one's opens when this one's GPU work is done. Where more than two fit
in the GPU's memory (``together``), the ones after the next start with them too, and each
measures once the one before it is done. A timed turn with a measure gate warms up while the
others start up; its measured steps wait for them.

A batch on another GPU (phase 2's ncu processes there) may be warmed up *ahead*
(``warm_ahead``): its first turns go through their first gates at once, warm up while the
timing processes have the script's GPU, and wait at their measure gates; a timed step waits
until they do, and phase 2 then finds them ready to measure.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

from kerneltriage.profile import gate as gates
from kerneltriage.profile.processes import Child

#: Seconds a timed process waits for the later ones to reach their gates.
HOLD_LIMIT_S = 120.0


class Turn(NamedTuple):
    child: Child
    gate: Path
    measure: Path | None = None  # the gate before its measured step (None: none)


class Turns:
    def __init__(
        self, turns: list[Turn], *, quiet: bool, hold_limit: float = HOLD_LIMIT_S, together: int = 2
    ) -> None:
        self.turns, self.quiet, self.hold_limit = turns, quiet, hold_limit
        self.together = together  # processes that may hold the GPU's memory at once
        self.index = 0
        self.mark = time.perf_counter()  # the end of the last turn (or the start of all)
        self.others: list[Turn] = []  # another batch's, held at their gates meanwhile
        for t in turns:
            gates.clear(t.gate)
            if t.measure is not None:
                gates.clear(t.measure)
        try:
            for t in turns:
                t.child.start()
        except BaseException:
            self.cancel()
            raise

    def __len__(self) -> int:
        return len(self.turns)

    def next(self, gpu_done: Callable[[], bool] | None = None) -> tuple[float, int, list[str]]:
        """Run the next child: (the wall seconds its turn added: from the end of the one before,
        or from the start of all for the first; exit code; last stderr lines). ``gpu_done``:
        whether this child's GPU work has ended before it exits (polled meanwhile); the turn
        after it then opens at once, its first steps beside this one's exit (or, where both
        have measure gates, it is started with this one and its measured step opens then)."""
        turn = self.turns[self.index]
        self.index += 1
        after = self.turns[self.index] if self.index < len(self.turns) else None
        if self.quiet and turn.measure is None:
            self._hold_until_later_ones_wait()
        fresh = not gates.is_open(turn.gate)
        gates.open_gate(turn.gate)
        beside: list[Turn] = []
        if gpu_done is not None and fresh and turn.measure is not None:
            for later in self.turns[self.index : self.index + self.together - 1]:
                if later.measure is None:
                    break
                beside.append(later)
        for later in beside:
            gates.open_gate(later.gate)  # its start-up and warm-up beside this one's
        if turn.measure is not None:
            # Nothing else warms up on the GPU while this one measures (those started beside
            # it, or warmed up ahead); a timed one also waits for the others' start-ups.
            self._hold_until_warmed()
            if self.quiet:
                self._hold_until_later_ones_wait()
            gates.open_gate(turn.measure)
        watch = None
        if gpu_done is not None and after is not None:
            target = after.measure if after.measure is not None and gates.is_open(after.gate) else after.gate
            watch = _OpenWhenDone(turn.child, target, gpu_done)
        try:
            _, code, tail = turn.child.wait()
        finally:
            if watch is not None:
                watch.stop()
        end = time.perf_counter()
        seconds, self.mark = end - self.mark, end
        return seconds, code, tail

    def pairs_with_next(self) -> bool:
        """Whether the next turn, given ``gpu_done``, starts with the one after it (both have
        measure gates and neither has been let through yet)."""
        if self.index + 1 >= len(self.turns):
            return False
        turn, after = self.turns[self.index], self.turns[self.index + 1]
        return turn.measure is not None and after.measure is not None and not gates.is_open(turn.gate)

    def skip(self) -> None:
        """Stop the next child without giving it a turn (its run is no longer wanted)."""
        self.turns[self.index].child.stop()
        self.index += 1

    def warm_ahead(self) -> int:
        """Let the first turns warm up now, as many as fit on the GPU at once (``together``),
        each held at its measure gate; those without one are left at their gates. How many."""
        opened = 0
        for t in self.turns[self.index : self.index + self.together]:
            if t.measure is None:
                break
            gates.open_gate(t.gate)
            opened += 1
        return opened

    def also_wait_for(self, others: list[Turn]) -> None:
        """Let a timed turn measure only once ``others`` (another batch's) wait too."""
        self.others = list(others)

    def resume(self) -> None:
        """The next turn's seconds count from now (a batch started early, then left waiting)."""
        self.mark = time.perf_counter()

    def _hold_until_later_ones_wait(self) -> None:
        self._hold_until([*self.turns[self.index :], *self.others])

    def _hold_until_warmed(self) -> None:
        """Until every later turn let through its first gate waits at its measure gate."""
        self._hold_until([t for t in self.turns[self.index :] if gates.is_open(t.gate)])

    def _hold_until(self, turns: list[Turn]) -> None:
        """Until each of ``turns`` waits (``_waiting``), ``hold_limit`` at most."""
        deadline = time.monotonic() + self.hold_limit
        while time.monotonic() < deadline:
            if all(_waiting(t) for t in turns):
                return
            time.sleep(gates.POLL_S)

    def cancel(self) -> None:
        """Stop every child not yet run (a failed turn makes the later ones pointless)."""
        for t in self.turns[self.index :]:
            t.child.stop()
        self.index = len(self.turns)

    def close(self) -> None:
        self.cancel()
        for t in self.turns:
            gates.clear(t.gate)
            if t.measure is not None:
                gates.clear(t.measure)


def _waiting(turn: Turn) -> bool:
    """Whether ``turn``'s process does nothing now: it has exited, or waits at its first gate,
    or, let through that one, at its measure gate (its start-up and warm-up done)."""
    if turn.child.exited():
        return True
    if turn.measure is not None and gates.is_open(turn.gate):
        return gates.at_gate(turn.measure)
    return gates.at_gate(turn.gate)


class _OpenWhenDone:
    """Opens ``gate`` once ``done()`` says so, while ``child`` is still running (a thread, so that
    the child's own timeout still holds the turn)."""

    def __init__(self, child: Child, gate: Path, done: Callable[[], bool]) -> None:
        self.child, self.gate, self.done = child, gate, done
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stopped.is_set() and not self.child.exited():
            try:
                done = self.done()
            except Exception:  # cannot tell: the next turn waits for the exit, as without this
                return
            if done:
                gates.open_gate(self.gate)
                return
            self.stopped.wait(gates.POLL_S)

    def stop(self) -> None:
        self.stopped.set()
        self.thread.join(timeout=5)
