"""The time budget of ``rankopt fit``: one line per stage with its elapsed time and what remains.

Every stage reports when it ends (``[mm:ss] stage: what it did (took s; about N s of work left, budget
M:SS)``); a long stage also prints a plain line every :data:`HEARTBEAT_S` seconds, so a log file written
without a terminal shows progress too.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

HEARTBEAT_S = 10.0
"""Seconds between two progress lines of a long stage."""


def clock_text(seconds: float) -> str:
    """``m:ss`` of a duration."""
    seconds = max(0, int(round(seconds)))
    return f"{seconds // 60}:{seconds % 60:02d}"


@dataclass
class Clock:
    """Wall-clock budget of a fit (``budget_s``), the seconds spent per stage and the planned seconds of
    the stages still to come (:meth:`plan`)."""

    budget_s: float
    say: Callable[[str], None] = print
    started: float = field(default_factory=time.monotonic)
    seconds: dict[str, float] = field(default_factory=dict)
    planned: dict[str, float] = field(default_factory=dict)
    on_stage: Callable[[str], None] | None = None
    """Called with a stage's name as it begins (``rankopt fit`` records it in the run folder's unfinished mark)."""
    _last_line: float = 0.0

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def left(self) -> float:
        """Seconds of the budget not yet spent (negative once over)."""
        return self.budget_s - self.elapsed()

    def minutes_for(self, seconds: float) -> int:
        """The ``--minutes`` that would hold ``seconds`` more work after what has been spent."""
        return math.ceil((self.elapsed() + seconds) / 60)

    def minutes_leaving(self, share: float, work_s: float) -> int:
        """The ``--minutes`` whose budget holds what has been spent and ``work_s`` more seconds of work, and leaves
        ``share`` of it free."""
        return math.ceil((self.elapsed() + work_s) / (1 - share) / 60)

    def plan(self, stage: str, seconds: float) -> None:
        """Expect ``stage`` to take ``seconds`` (shown in the remaining-work estimate until it is done)."""
        self.planned[stage] = max(0.0, float(seconds))

    def line(self, text: str) -> None:
        """Print ``[mm:ss] text``."""
        self._last_line = time.monotonic()
        self.say(f"[{clock_text(self.elapsed())}] {text}")

    def heartbeat(self, text: Callable[[], str]) -> None:
        """Print ``text()`` when the last line is :data:`HEARTBEAT_S` seconds old."""
        if time.monotonic() - self._last_line >= HEARTBEAT_S:
            self.line(text())

    @contextlib.contextmanager
    def stage(self, name: str) -> Iterator[dict[str, str]]:
        """Time the ``with`` block as stage ``name``; the block sets ``["done"]`` to what it did."""
        if self.on_stage is not None:
            self.on_stage(name)
        start = time.monotonic()
        report: dict[str, str] = {"done": ""}
        self._last_line = start
        yield report
        took = time.monotonic() - start
        self.seconds[name] = self.seconds.get(name, 0.0) + took
        self.planned.pop(name, None)
        work = sum(self.planned.values())
        ahead = f"about {clock_text(work)} of work left" if self.planned else "done"
        self.line(f"{name}: {report['done']} ({took:.1f} s; {ahead}; budget {clock_text(self.budget_s)})")
