"""Progress with ETA for the long loops, on stderr: a tqdm bar on a terminal, else a line every
``IPL_JAX_PROGRESS_INTERVAL`` seconds (default 30); ``IPL_JAX_QUIET=1`` turns it off.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterable
from typing import Any

from tqdm.auto import tqdm

INTERVAL_ENV = "IPL_JAX_PROGRESS_INTERVAL"
QUIET_ENV = "IPL_JAX_QUIET"
DEFAULT_INTERVAL = 30.0
FINAL_AFTER = 5.0  # seconds: a loop shorter than this writes no closing line when it is not on a terminal


def _quiet() -> bool:
    return os.environ.get(QUIET_ENV, "") not in ("", "0")


def _interval() -> float:
    try:
        return max(0.0, float(os.environ.get(INTERVAL_ENV, DEFAULT_INTERVAL)))
    except ValueError:
        return DEFAULT_INTERVAL


def _is_terminal(stream) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


def progress(
    iterable: Iterable | None = None,
    total: int | None = None,
    desc: str = "",
    unit: str = "it",
    initial: int = 0,
    file=None,
    interval: float | None = None,
):
    """A progress reporter over ``iterable`` (or updated by hand): iterates like it, with ``update(n)``,
    ``set_postfix(**values)``, ``close()``, and as a context manager. total: default ``len(iterable)``.
    """
    stream = sys.stderr if file is None else file
    if total is None and iterable is not None and hasattr(iterable, "__len__"):
        total = len(iterable)
    if _quiet() or not _is_terminal(stream):
        return LogProgress(
            iterable,
            total=total,
            desc=desc,
            unit=unit,
            initial=initial,
            file=stream,
            interval=_interval() if interval is None else interval,
            silent=_quiet(),
        )

    return tqdm(
        iterable, total=total, desc=desc, unit=unit, initial=initial, file=stream, dynamic_ncols=True, mininterval=0.5
    )


def format_seconds(seconds: float) -> str:
    """``75`` -> ``01:15``, ``4000`` -> ``1:06:40``."""
    seconds = int(round(max(0.0, seconds)))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m:02d}:{s:02d}"


class LogProgress:
    """Progress as whole lines: at most one per ``interval`` seconds, plus one at the end of a loop of
    ``FINAL_AFTER`` seconds or more."""

    def __init__(
        self,
        iterable=None,
        total: int | None = None,
        desc: str = "",
        unit: str = "it",
        initial: int = 0,
        file=None,
        interval: float = DEFAULT_INTERVAL,
        silent: bool = False,
        clock=time.monotonic,
    ):
        self.iterable, self.total, self.desc, self.unit = iterable, total, desc, unit
        self.n = self.initial = int(initial)
        self.file = sys.stderr if file is None else file
        self.interval, self.silent, self.clock = float(interval), silent, clock
        self.postfix = ""
        self.start = self.last = clock()
        self.shown = self.n  # the count of the last line written
        self.lines = 0
        self.closed = False

    def __iter__(self):
        try:
            for item in self.iterable:
                yield item
                self.update(1)
        finally:
            self.close()

    def __len__(self) -> int:
        return self.total if self.total is not None else len(self.iterable)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def update(self, n: int = 1) -> None:
        self.n += n
        now = self.clock()
        if now - self.last >= self.interval:
            self._emit(now)

    def set_postfix(self, **values: Any) -> None:
        self.postfix = ", ".join(f"{k}={v}" for k, v in values.items())

    def close(self) -> None:
        """The closing line: only for loops that ran ``FINAL_AFTER`` seconds or more (a short loop stays quiet)."""
        if not self.closed:
            self.closed = True
            now = self.clock()
            if self.n != self.shown and (self.lines or now - self.start >= FINAL_AFTER):
                self._emit(now)

    def line(self, now: float | None = None) -> str:
        """The progress line at time ``now``."""
        now = self.clock() if now is None else now
        elapsed = now - self.start
        done = self.n - self.initial
        rate = done / elapsed if elapsed > 0 else 0.0
        head = f"{self.desc}: " if self.desc else ""
        if self.total:
            text = f"{head}{self.n}/{self.total} {self.unit} ({100.0 * self.n / self.total:.0f}%)"
        else:
            text = f"{head}{self.n} {self.unit}"
        extra = []
        if self.total and self.n < self.total:
            extra.append(f"ETA {format_seconds((self.total - self.n) / rate)}" if rate > 0 else "ETA ?")
        if rate > 0:
            extra.append(f"{rate:.3g} {self.unit}/s" if rate >= 1 else f"{1 / rate:.3g} s/{self.unit}")
        if self.postfix:
            extra.append(self.postfix)
        return ", ".join([f"{text} elapsed {format_seconds(elapsed)}"] + extra)

    def _emit(self, now: float) -> None:
        self.last, self.shown = now, self.n
        self.lines += 1
        if self.silent:
            return
        try:
            self.file.write(self.line(now) + "\n")
            self.file.flush()
        except (OSError, ValueError):  # a closed stream must not stop the work
            pass
