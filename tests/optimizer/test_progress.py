"""Progress output (optimizer/_progress.py): tqdm's bar on a terminal, plain throttled lines in a log."""

from __future__ import annotations

import io
import time

from optimizer._progress import CountProgress, ProgressLine


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def _study(stream, every_s=0.0) -> ProgressLine:
    return ProgressLine(5, ["tput", "p99"], ["maximize", "minimize"], stream=stream, every_s=every_s)


def test_a_log_gets_plain_lines_at_most_every_every_s():
    log = io.StringIO()
    p = _study(log, every_s=60.0)
    p.update()  # the first one is shown
    p.done, p.running = 2, 1
    p.observe_feasible([10.5, 2.0])
    p.update()  # within every_s: not shown
    p.message("kvtune: trial 3 failed (error): boom")
    p.done = 5
    p.close()  # the last state always is
    text = log.getvalue()
    assert "\r" not in text and "\x1b" not in text
    lines = text.splitlines()
    assert lines[0].startswith("trials 0/5 done (0 failed), 0 running | best feasible: none yet")
    assert lines[1] == "kvtune: trial 3 failed (error): boom"
    assert lines[2].startswith("trials 5/5 done (0 failed), 1 running | best feasible: tput=10.5, p99=2 |")
    assert len(lines) == 3


def test_a_terminal_gets_a_bar_with_messages_above_it():
    term = Terminal()
    p = _study(term)
    p.done, p.running = 2, 1
    p.observe_feasible([10.5, 2.0])
    p.observe_feasible([9.0, 1.5])
    time.sleep(0.15)  # past the redraw interval
    p.update()
    p.message("kvtune: trial 3 failed (error): boom")
    p.done = 5
    p.close()
    text = term.getvalue()
    assert "\r" in text  # redrawn in place
    assert "trials:  40%" in text and "2/5" in text and "1 running | best feasible: tput=10.5, p99=1.5" in text
    assert "\rkvtune: trial 3 failed (error): boom\n" in text  # the bar is cleared first, then drawn again below
    last = text.rstrip("\n").split("\r")[-1]
    assert last.startswith("trials: 100%") and "5/5" in last and text.endswith("\n")  # the final state stays


def test_a_cleared_bar_leaves_nothing_on_the_line():
    term = Terminal()
    bar = CountProgress(100, "req", stream=term, desc="  simulating")
    bar.show(40, "simulated 12.0 s", "plain line", force=True)
    assert "40/100" in term.getvalue() and "plain line" not in term.getvalue()
    bar.close(clear=True)
    assert term.getvalue().endswith("\r") and not term.getvalue().endswith("\n")
    log = io.StringIO()
    bar = CountProgress(100, "req", stream=log, every_s=60.0)
    bar.show(1, "x", "first")
    bar.show(2, "x", "second")  # throttled
    bar.show(3, "x", "third", force=True)
    bar.close(clear=True)
    assert log.getvalue() == "first\nthird\n"


def test_a_terminal_of_zero_columns_gets_the_plain_lines():
    """A pseudo-terminal nobody sized (``script``, some CI runners): tqdm would draw nothing there."""
    import os

    master, slave = os.openpty()
    try:
        with os.fdopen(slave, "w") as stream:
            assert stream.isatty() and os.get_terminal_size(stream.fileno()).columns == 0
            bar = CountProgress(10, "req", stream=stream)
            assert not bar.tty and bar.bar is None
            bar.show(3, "x", "plain line", force=True)
            bar.close()
        assert os.read(master, 1000).replace(b"\r", b"") == b"plain line\n"
    finally:
        os.close(master)
