"""Which units a job's tasks cover, from their ranges: held and worked out as ranges,
never unit by unit (a job of ten million units has a few hundred tasks)."""

from __future__ import annotations

import bisect

import numpy as np

__all__ = ["UnitRanges", "unit_coverage", "units_text"]


class UnitRanges:
    """A set of units held as sorted, disjoint ranges (a damaged task's units are a
    range; a set of them held every unit)."""

    def __init__(self) -> None:
        self._starts: list[int] = []
        self._stops: list[int] = []

    def update(self, units: range) -> None:
        """Add the units of ``units`` (a range of step 1)."""
        a, b = units.start, units.stop
        if b <= a:
            return
        i = bisect.bisect_left(self._stops, a)  # the first range that ends at a or after
        j = bisect.bisect_right(self._starts, b)  # past the last that starts at b or before
        if i < j:
            a, b = min(a, self._starts[i]), max(b, self._stops[j - 1])
        self._starts[i:j], self._stops[i:j] = [a], [b]

    def add(self, unit: int) -> None:
        self.update(range(unit, unit + 1))

    def __contains__(self, unit: object) -> bool:
        if not isinstance(unit, int):
            return False
        i = bisect.bisect_right(self._starts, unit) - 1
        return i >= 0 and unit < self._stops[i]

    def overlap(self, start: int, stop: int) -> int:
        """How many of units ``start..stop-1`` are in the set."""
        i = max(0, bisect.bisect_right(self._stops, start))
        count = 0
        while i < len(self._starts) and self._starts[i] < stop:
            count += max(0, min(stop, self._stops[i]) - max(start, self._starts[i]))
            i += 1
        return count

    def __len__(self) -> int:
        return sum(b - a for a, b in zip(self._starts, self._stops, strict=True))

    def __iter__(self):
        for a, b in zip(self._starts, self._stops, strict=True):
            yield from range(a, b)

    def __repr__(self) -> str:
        spans = ", ".join(f"{a}..{b - 1}" for a, b in zip(self._starts, self._stops, strict=True))
        return f"UnitRanges({spans})"


def unit_coverage(ranges, n: int) -> tuple[list, list, list]:
    """Units ``0..n-1`` against ``ranges`` (rows of start, stop): the stretches no
    range covers, those two or more do, and those exactly one does, each a list of
    ``(start, stop)``. Worked out from the ranges' ends, not unit by unit."""
    ranges = np.asarray(ranges, dtype=np.int64).reshape(-1, 2)
    starts = np.sort(np.clip(ranges[:, 0], 0, n))
    stops = np.sort(np.clip(ranges[:, 1], 0, n))
    cuts = np.unique(np.concatenate([[0, n], starts, stops]))
    # Ranges covering the stretch from each cut to the next
    depth = np.searchsorted(starts, cuts[:-1], "right") - np.searchsorted(stops, cuts[:-1], "right")
    out: tuple[list, list, list] = ([], [], [])
    for a, b, d in zip(cuts[:-1].tolist(), cuts[1:].tolist(), depth.tolist(), strict=True):
        kind = out[0 if d == 0 else 1 if d > 1 else 2]
        if kind and kind[-1][1] == a:
            kind[-1] = (kind[-1][0], b)
        else:
            kind.append((a, b))
    return out


def units_text(start: int, stop: int) -> str:
    """``unit 5``, or ``units 5..9`` (both ends included)."""
    return f"unit {start}" if stop - start == 1 else f"units {start}..{stop - 1}"
