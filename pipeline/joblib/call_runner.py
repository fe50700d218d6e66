"""The runner of joblib batches: the dispatch runner (:class:`~pipeline.dispatch.TaskRunner`:
receipts as events, tasks held through a lost connection, workers' deaths retried,
overdue tasks copied) fed one batch at a time, as joblib hands them over, instead of
a list known up front.

All its tasks form one open-ended run; :meth:`CallRunner.add` extends it and
:meth:`CallRunner.poll` waits for the next receipts. Not thread-safe: one thread (the
session's) calls it; :meth:`wake` is the one method other threads call, to end a wait
early when they have handed over a batch.
"""

from __future__ import annotations

import queue
from collections.abc import Sequence

from ..dispatch.launch import Launch
from ..dispatch.receipts import TaskReceipt, decode, encode
from ..dispatch.task_runner import IN_FLIGHT_PER_WORKER, SUBMIT_BATCH, TaskRunner
from ..dispatch.workers import WORKERLESS_SECONDS
from ..workload import Task

__all__ = ["CallRunner"]

#: The index of the no-op receipt that ends a wait for receipts (no task has it).
_WAKE_INDEX = -1


class _NoBar:
    def update(self, units: int, failed: int = 0) -> None:
        return None


class CallRunner(TaskRunner):
    """Runs batches of joblib calls as they are added; their receipts as they come."""

    def __init__(self, workload, client, profile: bool = False):
        super().__init__(workload, None, client, _NoBar(), profile)
        self._run = Launch({}, generation=self._generation)
        self._launches.append(self._run)
        self._threads = self._workerless.wait(WORKERLESS_SECONDS)
        self._run.window = max(SUBMIT_BATCH, IN_FLIGHT_PER_WORKER * self._threads)
        self._wake_message = encode(TaskReceipt(_WAKE_INDEX, 0, (), 0, 0.0, 0.0, ""), self._token)

    @property
    def pending(self) -> int:
        """Tasks added and not heard from."""
        return len(self._run.pending)

    def add(self, tasks: Sequence[Task]) -> None:
        """Submit ``tasks`` (as the run's window allows; the rest as room comes)."""
        run = self._run
        for task in tasks:
            run.pending[task.index] = task
            self._owner[task.index] = run
        run.waiting.extend(tasks)
        self._refill(run)

    def poll(self) -> list[TaskReceipt]:
        """The receipts that came, waiting for one at most a second (or until
        :meth:`wake`); look at the tasks' futures (workers lost, the connection).
        Every receipt in the inbox is taken at once: the batches joblib dispatches as
        their callbacks run then go to the scheduler in one message, not one each."""
        run = self._run
        if not run.ready:
            self._suspect_alone(run)
            self._pump()
        while True:
            try:
                message = self._inbox.get_nowait()
            except queue.Empty:
                break
            self._accept(decode(message))
        self._let_go()  # (the holds of all their tasks in one message)
        receipts = list(run.ready)
        run.ready.clear()
        return receipts

    def wake(self) -> None:
        """Any thread: end :meth:`poll`'s wait now (a no-op receipt in its inbox)."""
        self._inbox.put(self._wake_message)

    def cancel(self, indices: Sequence[int]) -> None:
        """Stop the tasks ``indices`` (those not heard from): cancelled on the cluster,
        their receipts, if any come, dropped."""
        self._drop(self._run, set(indices))
        self._let_go()
