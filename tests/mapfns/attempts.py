"""Map functions that a task's attempts call in an order the test sets with gate files
(tests/test_commit_once.py): the first call of unit ``gated`` waits for the gate;
every later call (a copy of its task, a rerun) goes straight through."""

from __future__ import annotations

import os
import time
from pathlib import Path


def _first(log: Path, x: int) -> bool:
    """Whether this is unit ``x``'s first call (an exclusive create: one caller wins)."""
    try:
        os.close(os.open(log / f"first-{x}", os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    return True


def _append(path: Path, text: str) -> None:
    with open(path, "a") as f:
        f.write(text + "\n")


def gated(x, gate, log, gated=2, mode="same"):
    """``{"v": x * x}``; the first call of unit ``gated`` waits (at most 120 s) for the
    file ``gate``, then with ``mode="fails"`` raises, with ``mode="clock"`` returns the
    clock (as every call does in that mode: the function is not deterministic)."""
    log = Path(log)
    first = _first(log, x)
    _append(log / f"started-{x}", str(os.getpid()))
    if first and x == gated:
        deadline = time.monotonic() + 120
        while not os.path.exists(gate) and time.monotonic() < deadline:
            time.sleep(0.02)
        if mode == "fails":
            _append(log / f"ended-{x}", "raised")
            raise ValueError(f"unit {x}: the slow attempt fails it")
    value = time.time_ns() if mode == "clock" else x * x
    _append(log / f"ended-{x}", str(value))
    return {"v": value}
