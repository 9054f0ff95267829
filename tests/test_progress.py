"""Progress reporting (``ipl_jax.progress``): whole lines at an interval with a correct ETA when the stream is not a
terminal, a tqdm bar on a terminal, nothing when quiet."""

from __future__ import annotations

import io

from ipl_jax import progress as P


class Clock:
    """A fake monotonic clock that advances ``step`` seconds per reading."""

    def __init__(self, step: float):
        self.t, self.step = 0.0, step

    def __call__(self) -> float:
        self.t += self.step
        return self.t


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_log_lines_every_interval_with_eta():
    buf = io.StringIO()
    # the clock advances 10 s per reading: construction reads it once, each update once
    bar = P.LogProgress(range(12), total=12, desc="sampling", unit="batch", file=buf, interval=30, clock=Clock(10.0))
    assert list(bar) == list(range(12))
    lines = buf.getvalue().splitlines()
    assert "\r" not in buf.getvalue()
    # updates at t = 20, 30, ..., 130 (start at 10): lines when 30 s have passed since the last one
    assert lines == [
        "sampling: 3/12 batch (25%) elapsed 00:30, ETA 01:30, 10 s/batch",
        "sampling: 6/12 batch (50%) elapsed 01:00, ETA 01:00, 10 s/batch",
        "sampling: 9/12 batch (75%) elapsed 01:30, ETA 00:30, 10 s/batch",
        "sampling: 12/12 batch (100%) elapsed 02:00, 10 s/batch",
    ]


def test_closing_line_only_for_loops_that_took_a_while():
    quick = io.StringIO()
    for _ in P.LogProgress(range(5), desc="x", file=quick, interval=30, clock=Clock(0.1)):
        pass
    assert quick.getvalue() == ""
    slow = io.StringIO()
    bar = P.LogProgress(total=None, desc="evolution", unit="screen", file=slow, interval=30, clock=Clock(2.0))
    for _ in range(3):
        bar.update(1)
    bar.set_postfix(loss="0.500")
    bar.close()
    bar.close()  # a second close writes nothing
    # no total: a count and a rate (3 screens in 8 s of the clock's readings after the start)
    assert slow.getvalue() == "evolution: 3 screen elapsed 00:08, 2.67 s/screen, loss=0.500\n"


def test_resumed_counts_and_rates_start_at_initial():
    buf = io.StringIO()
    bar = P.LogProgress(total=100, initial=90, desc="SFT", unit="step", file=buf, interval=5, clock=Clock(1.0))
    for _ in range(5):
        bar.update(1)
    bar.close()
    # 5 steps in 5 s since the resume: 1 step/s, 5 to go
    assert buf.getvalue().splitlines()[0] == "SFT: 95/100 step (95%) elapsed 00:05, ETA 00:05, 1 step/s"


def test_terminal_gets_tqdm_and_quiet_gets_nothing(monkeypatch):
    from tqdm.auto import tqdm

    monkeypatch.delenv(P.QUIET_ENV, raising=False)
    term = Terminal()
    bar = P.progress(range(3), desc="t", file=term)
    assert isinstance(bar, tqdm)
    assert list(bar) == [0, 1, 2]
    assert "3/3" in term.getvalue()
    monkeypatch.setenv(P.QUIET_ENV, "1")
    silent = io.StringIO()
    bar = P.progress(total=3, desc="q", file=silent, interval=0)
    bar.update(3)
    bar.close()
    assert silent.getvalue() == ""
    monkeypatch.delenv(P.QUIET_ENV)
    monkeypatch.setenv(P.INTERVAL_ENV, "0")
    logged = io.StringIO()
    for _ in P.progress(range(2), desc="l", file=logged):
        pass
    assert [line.split(" elapsed")[0] for line in logged.getvalue().splitlines()] == [
        "l: 1/2 it (50%)",
        "l: 2/2 it (100%)",
    ]


def test_format_seconds():
    assert [P.format_seconds(s) for s in (0, 59.4, 75, 4000)] == ["00:00", "00:59", "01:15", "1:06:40"]
