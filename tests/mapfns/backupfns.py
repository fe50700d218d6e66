"""Functions for the backup-copy tests: units whose first attempt blocks on a gate."""

from __future__ import annotations

import os
import time


def gated(x, slow, log, gate, copy_seconds=0.0, gate_seconds=30.0):
    """Unit ``x``: log each start and end with the worker's address (one line each, in
    order, to ``log``/calls). A unit listed in ``slow`` (comma-separated) blocks on its
    first attempt until the file ``gate`` exists (``gate_seconds`` at most); its later
    attempts take ``copy_seconds``."""
    from distributed import get_worker

    worker = get_worker().address
    first = False
    if str(x) in str(slow).split(","):
        try:
            with open(os.path.join(log, f"first-{x}"), "x"):
                first = True
        except FileExistsError:
            pass
    _note(log, f"start {x} {worker}")
    if first:
        deadline = time.monotonic() + gate_seconds
        while not os.path.exists(gate) and time.monotonic() < deadline:
            time.sleep(0.02)
    elif str(x) in str(slow).split(","):
        time.sleep(copy_seconds)
    _note(log, f"end {x} {worker}")
    return {"y": 2 * x}


def _note(log: str, line: str) -> None:
    with open(os.path.join(log, "calls"), "a") as f:
        f.write(line + "\n")
