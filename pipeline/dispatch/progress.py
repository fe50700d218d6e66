"""A run's progress as its units are done: a bar on a terminal, lines elsewhere.

Under nohup, CI, a notebook or a scheduler's log a bar is invisible (or a stream of
carriage returns), so there :class:`Progress` writes a line at each tenth of the
units and every ``every`` seconds between: units done, the rate, the failures and the
time left. Anything that counts units done (the runner's task receipts, a joblib
backend's batches) reports through it::

    with Progress(total, unit="fit", label="map job 'fits'") as progress:
        for batch in batches:
            progress.update(len(batch), failed=failures_in(batch))
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

from ..figures import rate, seconds

__all__ = ["PROGRESS_SECONDS", "STEPS", "Progress"]

#: Seconds between progress lines where the stream is not a terminal.
PROGRESS_SECONDS = 10.0
#: A line also at each 1/STEPS of the units (each 10 %).
STEPS = 10


class Progress:
    """Units done (and failed) of ``total``, told on ``stream`` (standard error).

    ``total`` None: not known (yet: a caller may set :attr:`total` as it learns it);
    the lines then say units done and the rate, every ``every`` seconds.

    ``show``: False tells nothing; True or None tell as a bar when the stream is a
    terminal, else as lines (``bar`` forces one form: True a bar, False lines).
    ``every``: seconds between lines (0: only at each tenth of the units). ``clock``
    gives the time (seconds, monotonic)."""

    def __init__(
        self,
        total: int | None,
        *,
        unit: str = "unit",
        label: str = "",
        show: bool | None = True,
        bar: bool | None = None,
        every: float = PROGRESS_SECONDS,
        stream: TextIO | None = None,
        clock=time.monotonic,
    ):
        self._bar = None
        self.total = total
        self.unit, self.label = unit, label
        self.every, self.clock = every, clock
        self.stream = stream if stream is not None else sys.stderr
        self.done = self.failed = 0
        self._start = self._last = clock()
        self._step = 0  # the last tenth told
        if show is False:
            self.mode = "off"
        elif bar if bar is not None else _is_terminal(self.stream):
            self.mode = "bar"
        else:
            self.mode = "lines"
        if self.mode == "bar":
            from tqdm import tqdm

            self._bar = tqdm(total=self.total, unit=unit, unit_scale=True, file=self.stream,
                             smoothing=0.1, desc=label or None)  # fmt: skip

    @property
    def total(self) -> int | None:
        return self._total

    @total.setter
    def total(self, value: int | None) -> None:
        self._total = None if value is None else max(0, int(value))
        if self._bar is not None:
            self._bar.total = self._total
            self._bar.refresh()

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def update(self, units: int = 1, failed: int = 0) -> None:
        """``units`` more done, ``failed`` of them failed."""
        self.done += units
        self.failed += failed
        if self._bar is not None:
            self._bar.update(units)
            if failed:
                self._bar.set_postfix(failed=self.failed, refresh=False)
        elif self.mode == "lines":
            now = self.clock()
            step = 0 if self.total is None else STEPS * self.done // max(1, self.total)
            timed = self.every > 0 and now - self._last >= self.every
            if step > self._step or timed:
                self._step = max(self._step, step)
                self._last = now
                self._tell(now)

    def line(self, now: float | None = None) -> str:
        """The progress line: units done, the rate, failures, the time left."""
        elapsed = (self.clock() if now is None else now) - self._start
        per_second = self.done / elapsed if elapsed > 0 else 0.0
        if self.total is None:
            text = f"{self.done:,} {self.unit}s in {seconds(elapsed)}"
        else:
            share = f" ({self.done / self.total:.0%})" if self.total else ""
            text = f"{self.done:,} of {self.total:,} {self.unit}s{share} in {seconds(elapsed)}"
        text += f", {rate(per_second)}/s, {self.failed:,} failed"
        left = None if self.total is None else self.total - self.done
        if left is None:
            pass
        elif left <= 0:
            text += ", done"
        elif per_second > 0:
            text += f", about {seconds(left / per_second)} left"
        return f"{self.label}: {text}" if self.label else text

    def _tell(self, now: float) -> None:
        print(self.line(now), file=self.stream, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None


def _is_terminal(stream) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # (a closed or file-less stream)
        return False
