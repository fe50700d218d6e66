"""Figures as a person reads them: durations, counts, rates, sizes, dollars."""

from __future__ import annotations

import math

__all__ = ["count", "figure", "rate", "seconds", "size", "usd"]


def seconds(value: float) -> str:
    """A duration as a person reads it: 2.5 h, 12.5 min, 1.2 s, 85 ms, 3.4 ms (not
    0.0 s, nor 9,000.0 s)."""
    if value >= 7200:
        return f"{value / 3600:,.1f} h"
    if value >= 600:
        return f"{value / 60:.1f} min"
    if value >= 0.095:
        return f"{value:,.1f} s"
    return f"{value * 1e3:.0f} ms" if value >= 0.0095 else f"{value * 1e3:.1f} ms"


def count(n: int, name: str) -> str:
    """``n`` of ``name``: "1 unit", "2 units", "1,000 files"."""
    return f"{n:,} {name}{'' if n == 1 else 's'}"


def rate(per_second: float) -> str:
    """A rate as a person reads it: 42,274, 35, 2.5, 0.30 (not 0 for slow units)."""
    if per_second >= 100 or per_second == 0:
        return f"{per_second:,.0f}"
    return f"{per_second:.2g}" if per_second < 10 else f"{per_second:.0f}"


def size(nbytes: float) -> str:
    """Bytes as a person reads them: 1.9 kB, 12.3 MB, 8.0 GB, 800.0 TB (not 0.0 GB)."""
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if nbytes >= 0.95 * scale:
            return f"{nbytes / scale:,.1f} {unit}"
    return f"{nbytes:,.0f} bytes"


def usd(amount: float) -> str:
    """Dollars as a person reads them: cents from $1 up, three figures below."""
    if amount >= 1:
        return f"${amount:,.2f}"
    if amount <= 0:
        return "$0"
    # three figures, in decimals ($0.0000753, not $7.53e-05)
    return f"${amount:.{max(2, 2 - math.floor(math.log10(amount)))}f}"


def figure(value: float) -> str:
    """One decimal, or three figures below 10 (0.04, not 0.0)."""
    return f"{value:,.1f}" if value >= 10 or value == 0 else f"{value:.3g}"
