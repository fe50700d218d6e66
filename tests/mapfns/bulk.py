"""Functions of the tests of large map jobs (tests/test_map_scale.py)."""

from __future__ import annotations

import numpy as np


def double(i):
    return {"y": 2 * i}


def text(i, size):
    """``size`` characters of text no compression shrinks, the same for the same i."""
    return {"text": np.random.default_rng(i).bytes(size // 2).hex()}


def typed(i, x):
    return {"i": i, "x_type": type(x).__name__, "x": x}


def first_in_chunk(chunk, log=None):
    """The chunk's first ``g`` and its size; ``log``: a file each call appends its g to."""
    g = int(chunk["g"].iloc[0])
    if log:
        with open(log, "a") as f:
            f.write(f"{g}\n")
    return {"g0": g, "n": len(chunk), "y_sum": float(chunk["y"].sum())}


def refuse_while_flagged(chunk, flag, refused, log):
    """first_in_chunk, but chunk ``refused`` raises while the file ``flag`` exists."""
    from pathlib import Path

    row = first_in_chunk(chunk, log)
    if row["g0"] == refused and Path(flag).exists():
        raise ValueError(f"chunk {refused} is refused while the flag is set")
    return row


def uneven(x):
    """Rows whose columns differ between units: some absent, integers and floats,
    nulls, nested values."""
    if x % 3 == 0:
        return {"a": x, "b": None}
    if x % 4 == 0:
        return {"a": x / 2, "c": [x, x]}
    return {"a": x, "b": str(x), "d": {"k": x}}


def double_unless_flagged(i, flag):
    """``double``, but every 997th ``i`` (from 3) raises while the file ``flag`` exists."""
    from pathlib import Path

    if i % 997 == 3 and Path(flag).exists():
        raise ValueError(f"{i} is refused while the flag is set")
    return {"y": 2 * i}
