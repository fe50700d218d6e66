"""Tasks the cluster lost track of: submitted, never reported, never failed.

A scheduler under load can hold a task as running on a worker that never got it (the
message lost on the way), and then nothing ends the wait: the task neither runs nor
fails. So once a run is down to its last tasks (no more than one per worker thread
and none waiting to be submitted), a task not heard from for :data:`FACTOR` times
the run's median task time (and at least :data:`SECONDS`) is submitted again under a
new key: whichever copy reports first gives its receipt, and the other's is dropped
(a task writes the same bytes however often it runs). A task gets at most
:data:`MAX_COPIES` copies.
"""

from __future__ import annotations

import statistics
import time

from ..workload import Task, TaskReceipt
from .launch import Launch

__all__ = ["Stragglers"]

#: The least time a run's last task may go unheard from before it is run again.
SECONDS = 60.0
#: ... and as many times the run's median task time.
FACTOR = 10.0
#: Copies of one task at most.
MAX_COPIES = 2
#: Task times kept for the median (the latest).
KEPT = 1000


class Stragglers:
    """The run's task times, and which of its last tasks are overdue."""

    def __init__(self) -> None:
        self._seconds: list[float] = []

    def record(self, receipt: TaskReceipt) -> None:
        if receipt.seconds:
            self._seconds.append(receipt.seconds)
            del self._seconds[:-KEPT]

    def limit(self) -> float:
        median = statistics.median(self._seconds) if self._seconds else 0.0
        return max(SECONDS, FACTOR * median)

    def overdue(self, run: Launch, threads: int) -> list[Task]:
        """The tasks of ``run`` to submit again now (each counted as a copy made)."""
        now = time.monotonic()
        if run.waiting or not run.pending or len(run.pending) > max(1, threads):
            run.tail_since = None
            return []
        if run.tail_since is None:
            run.tail_since = now
        if now - run.tail_since < self.limit():
            return []
        run.tail_since = now  # the next copies, if any, after as long again
        late = [
            task
            for index, task in run.pending.items()
            if run.copies[index] < MAX_COPIES
            and index in run.futures
            and run.futures[index].status == "pending"
        ]
        for task in late:
            run.copies[task.index] += 1
        return late
