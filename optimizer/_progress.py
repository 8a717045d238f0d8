"""The live progress line of a running study (stderr): trials done/running/failed, best feasible values, ETA.

On a terminal the line is redrawn in place; elsewhere (CI logs, pipes) a line is printed at most every
``every_s`` seconds and at the end.
"""

from __future__ import annotations

import contextlib
import math
import sys
import time
from typing import Iterator, Sequence, TextIO


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


class ProgressLine:
    """Tracks a study's counts and writes the line."""

    def __init__(self, target: int, objective_names: Sequence[str], directions: Sequence[str], *,
                 stream: TextIO | None = None, every_s: float = 5.0, start_done: int = 0):
        self.target = target
        self.names = list(objective_names)
        self.directions = list(directions)
        self.stream = stream if stream is not None else sys.stderr
        self.every_s = every_s
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.start_done = start_done
        self.done = start_done
        self.failed = 0
        self.running = 0
        self.best: list[float | None] = [None] * len(self.names)
        self.t0 = time.monotonic()
        self._last = 0.0
        self._width = 0

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

    def line(self) -> str:
        best = ", ".join(f"{n}={_fmt_value(b)}" for n, b in zip(self.names, self.best) if b is not None) or "none yet"
        return (f"trials {self.done}/{self.target} done ({self.failed} failed), {self.running} running | "
                f"best feasible: {best} | elapsed {_fmt_duration(time.monotonic() - self.t0)}, "
                f"ETA {_fmt_duration(self.eta_s())}")

    def update(self, *, force: bool = False) -> None:
        now = time.monotonic()
        if not force and not self.tty and now - self._last < self.every_s:
            return
        self._last = now
        text = self.line()
        if self.tty:
            pad = max(self._width - len(text), 0)
            self.stream.write("\r" + text + " " * pad)
            self._width = len(text)
        else:
            self.stream.write(text + "\n")
        self.stream.flush()

    def close(self) -> None:
        self.update(force=True)
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()

    def message(self, text: str) -> None:
        """A line of its own (a failed trial...), without breaking the live line."""
        if self.tty:
            self.stream.write("\r" + " " * self._width + "\r")
            self._width = 0
        self.stream.write(text + "\n")
        self.stream.flush()


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
