"""Progress output on stderr: the live line of a running study (trials done/running/failed, best feasible values,
ETA) and of ``kvtune simulate`` (requests ended, simulated time).

On a terminal the line is tqdm's bar, redrawn in place; elsewhere (CI logs, pipes) it is a plain line printed at
most every ``every_s`` seconds and at the end, so that a log reads as lines rather than one line of carriage
returns.

Why tqdm, and why not for the plain lines: issue 33 asked for a maintained library unless the hand-written code
was clearly better.  On a terminal it was not: the hand-written redraw padded the line with spaces but did not know
the terminal's width, so a line wider than the window (a study with several objectives' best values) wrapped and
every redraw left a stale copy above; a message printed meanwhile had to clear the line by hand; rate and ETA were
our arithmetic.  tqdm sizes the bar to the window as it changes (``dynamic_ncols``), prints messages above the bar
(``tqdm.write``) and computes rate, elapsed and remaining time; it is already installed (optuna depends on it) and
is now a declared dependency.  Off a terminal tqdm still writes carriage-return updates (or nothing, disabled),
which read as one garbled line in a CI log, and the tests and users grep these lines ("trials 6/6 done (3
failed)"), so the plain-line path stays ours: a dozen lines, no terminal handling.  rich was not taken: it is not
installed, and its live display needs more (a Console, a Live region) for the same one line.
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
import time
from typing import Any, Iterator, Sequence, TextIO


def _fmt_duration(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "?"
    seconds = int(round(seconds))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def _fmt_value(value: float) -> str:
    if value is None or not math.isfinite(value):
        return str(value)
    return f"{value:.4g}"


def _is_tty(stream: TextIO) -> bool:
    """A terminal that can show a bar: isatty, and not one of zero columns (a pseudo-terminal nobody sized, as
    under ``script`` or some CI runners: tqdm would draw nothing there, so the plain lines are used)."""
    try:
        if not stream.isatty():
            return False
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False
    try:
        return os.get_terminal_size(stream.fileno()).columns > 0
    except (AttributeError, OSError, ValueError):  # no file descriptor to ask (a test's stream): trust isatty
        return True


class CountProgress:
    """A count towards a total on ``stream``: tqdm's bar on a terminal (redrawn at most every ``redraw_s``), else
    ``plain()``'s line at most every ``every_s`` seconds (and with ``force``)."""

    def __init__(self, total: int, unit: str, *, stream: TextIO | None = None, every_s: float = 5.0,
                 initial: int = 0, redraw_s: float = 0.1, tty: bool | None = None, desc: str | None = None):
        self.stream = stream if stream is not None else sys.stderr
        self.tty = _is_tty(self.stream) if tty is None else tty
        self.every_s = every_s
        self.redraw_s = redraw_s
        self.t0 = time.monotonic()
        self._last = -math.inf if self.tty else 0.0
        self.bar: Any = None
        if self.tty:
            from tqdm import tqdm

            # smoothing=0: the rate (and ETA) is the average since the start, not a moving one
            self.bar = tqdm(total=total, initial=initial, unit=unit, desc=desc, file=self.stream, dynamic_ncols=True,
                            smoothing=0, leave=True, mininterval=redraw_s,
                            bar_format="{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}<{remaining}]{postfix}")

    def show(self, n: int, postfix: str, plain: str | None = None, *, force: bool = False) -> None:
        """Set the count to ``n`` with ``postfix`` beside the bar (terminal), or print ``plain`` (elsewhere)."""
        now = time.monotonic()
        if not force and now - self._last < (self.redraw_s if self.tty else self.every_s):
            return
        self._last = now
        if self.bar is not None:
            self.bar.n = n
            self.bar.set_postfix_str(postfix, refresh=False)
            self.bar.refresh()
        elif plain is not None:
            self.stream.write(plain + "\n")
            self.stream.flush()

    def message(self, text: str) -> None:
        """A line of its own (a failed trial...), above the live bar."""
        if self.bar is not None:
            self.bar.write(text, file=self.stream)
        else:
            self.stream.write(text + "\n")
            self.stream.flush()

    def close(self, *, clear: bool = False) -> None:
        """End the bar (``clear``: erase it; else it stays as the last state)."""
        if self.bar is not None:
            if clear:
                self.bar.leave = False
            self.bar.close()
            self.bar = None


class ProgressLine:
    """Tracks a study's counts and shows them (:class:`CountProgress`)."""

    def __init__(self, target: int, objective_names: Sequence[str], directions: Sequence[str], *,
                 stream: TextIO | None = None, every_s: float = 5.0, start_done: int = 0):
        self.target = target
        self.names = list(objective_names)
        self.directions = list(directions)
        self.start_done = start_done
        self.done = start_done
        self.failed = 0
        self.running = 0
        self.best: list[float | None] = [None] * len(self.names)
        self.out = CountProgress(target, "trial", stream=stream, every_s=every_s, initial=start_done, desc="trials")
        self.tty = self.out.tty
        self.t0 = self.out.t0

    def observe_feasible(self, values: Sequence[float]) -> None:
        for i, (value, direction) in enumerate(zip(values, self.directions)):
            if value is None or (isinstance(value, float) and math.isnan(value)):
                continue
            best = self.best[i]
            if best is None or (value > best if direction == "maximize" else value < best):
                self.best[i] = value

    def eta_s(self) -> float:
        finished_here = self.done - self.start_done
        if finished_here <= 0:
            return math.inf
        rate = finished_here / max(time.monotonic() - self.t0, 1e-9)
        return max(self.target - self.done, 0) / rate

    def _best_text(self) -> str:
        return ", ".join(f"{n}={_fmt_value(b)}" for n, b in zip(self.names, self.best) if b is not None) or "none yet"

    def line(self) -> str:
        """The plain line (off a terminal)."""
        return (f"trials {self.done}/{self.target} done ({self.failed} failed), {self.running} running | "
                f"best feasible: {self._best_text()} | elapsed {_fmt_duration(time.monotonic() - self.t0)}, "
                f"ETA {_fmt_duration(self.eta_s())}")

    def update(self, *, force: bool = False) -> None:
        postfix = f"{self.failed} failed, {self.running} running | best feasible: {self._best_text()}"
        self.out.show(self.done, postfix, None if self.tty else self.line(), force=force)

    def close(self) -> None:
        self.update(force=True)
        self.out.close()

    def message(self, text: str) -> None:
        """A line of its own (a failed trial...), without breaking the live line."""
        self.out.message(text)


class Phases:
    """Wall seconds a study spent per phase of the driver (``prepare``, ``storage``, ``executor_start``, ``ask``,
    ``submit``, ``wait``, ``tell``, ``shutdown``), summed over every time it entered one: where a study's time
    goes outside its trials (``benchmarks/study_speed.py`` prints them)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextlib.contextmanager
    def time(self, name: str) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - t0
