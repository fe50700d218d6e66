"""Profiles of what the workers run: each task under cProfile, merged on the driver.

With ``profile_tasks = FILE`` (``--profile-tasks FILE``), each worker runs every task
of the job under :mod:`cProfile` and sends the statistics back with the task's receipt
(marshalled: some tens of kB); the driver merges them into one :mod:`pstats` file,
the sum over all tasks and workers. View it with ``python -m pstats FILE`` or
``snakeviz FILE``. ``{job}`` in FILE is replaced by the job id (several jobs, one file
each).
"""

from __future__ import annotations

import cProfile
import logging
import marshal
import pstats
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

__all__ = ["merge_profiles", "profiled", "run_queue_seconds"]

log = logging.getLogger(__name__)


def profiled(fn: Callable[..., Any], *args) -> tuple[Any, bytes]:
    """``fn(*args)`` under cProfile: its result and the marshalled statistics."""
    profiler = cProfile.Profile()
    result = profiler.runcall(fn, *args)
    profiler.create_stats()
    return result, marshal.dumps(profiler.stats)


class _Marshalled:
    """What :class:`pstats.Stats` loads statistics from (a profiler's interface)."""

    def __init__(self, data: bytes):
        self.stats = marshal.loads(data)

    def create_stats(self) -> None:
        pass


def merge_profiles(blobs: Iterable[bytes | None], path: str, job_id: str) -> str | None:
    """Merge the tasks' statistics into one pstats file; return its path (None if no
    task sent any, e.g. every task was already complete, or where it could not be
    written: the job's results are written, and it still completes)."""
    blobs = [b for b in blobs if b]
    if not blobs:
        return None
    stats = pstats.Stats(_Marshalled(blobs[0]))
    for blob in blobs[1:]:
        stats.add(_Marshalled(blob))
    out = Path(path.replace("{job}", job_id))
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        stats.dump_stats(out)
    except OSError as exc:
        log.warning("the task profile was not written: %s", exc)
        return None
    return str(out)


def run_queue_seconds() -> float | None:
    """Seconds this thread has spent runnable but waiting for a core (Linux's
    schedstat, its second field), None where the kernel does not say. Beside the
    task's CPU time, it tells tasks that waited for the machine's cores (busy with
    other work) from tasks that waited on I/O or locks: process time alone called
    both "waiting". One read of a small file: a few microseconds."""
    try:
        with open("/proc/thread-self/schedstat", "rb") as f:
            return int(f.read().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return None
