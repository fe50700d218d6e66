"""The driver's runner of a job's planned tasks: joblib calls on the ``pipeline``
backend (docs/architecture.md: "joblib tasks on a Dask scheduler").

:meth:`JobRunner.launch` hands its tasks to ``joblib.Parallel`` on a
:class:`~.backend.PipelineBackend` bound to this runner's :class:`~.session.Session`,
one ``delayed(run_planned)(task)`` call each; the backend sends each task through the
session's thread to this runner (the dispatch runner: receipts as events, the lease,
lost and killed tasks run again, overdue ones copied, backups), the same path as
joblib users' calls. Each call's result is its task's final receipt (after the
runner's retries; a task given up on, its killed receipt).

Launches may overlap (the probes start the rest while a round still runs): each is a
:class:`~pipeline.dispatch.launch.Launch` of its own, known whole from the start (its
size counts for backups), its tasks added as joblib hands them over. Only the
session's thread touches the runner's state between :meth:`launch` and :meth:`close`
(:meth:`add`, :meth:`poll`, :meth:`cancel`); the thread that reads the receipts
records the launches it is done with, for the session's thread to let go of.
"""

from __future__ import annotations

import collections
import warnings
from collections.abc import Iterator, Sequence

from joblib import Parallel, delayed

from ..dispatch import task_runner
from ..dispatch.commit import with_rounds
from ..dispatch.launch import Launch
from ..dispatch.receipts import TaskReceipt, encode
from ..dispatch.session import INTERRUPTED
from ..dispatch.task_runner import IN_FLIGHT_PER_WORKER, SUBMIT_BATCH, TaskRunner
from ..workload import Task
from .backend import PipelineBackend
from .planned import run_planned
from .session import Session

__all__ = ["JobRunner"]

#: The index of the no-op receipt that ends a wait for receipts (no task has it).
_WAKE_INDEX = -1


class JobRunner(TaskRunner):
    """Runs lists of a workload's tasks as joblib calls; their receipts as they come."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self._opened: dict[int, Launch] = {}  # tasks launched not yet added: their launch
        self._ended: collections.deque[Launch] = collections.deque()  # read to the end
        self._woken = False  # a wake message in the inbox, not yet read
        self._reading: list = []  # joblib's generators of the launches not read to the end
        self._wake_message = encode(TaskReceipt(_WAKE_INDEX, 0, (), 0, 0.0, 0.0, ""), self._token)
        self.session = Session(runner=self)

    def close(self) -> None:
        """Submit nothing more (the session's thread may still be in a poll); stop the
        launches not read to the end (a run interrupted), the session's thread, then
        the runner (tasks not heard from cancelled, with their copies)."""
        self._stop_submitting()
        while self._reading:
            _stop(self._reading.pop())
        self.session.close()
        self._end_launches()
        super().close()

    def __call__(self, tasks: Sequence[Task]) -> list[TaskReceipt]:
        """Run ``tasks``; receipts in completion order, one per task."""
        return list(self.launch(tasks))

    def launch(self, tasks: Sequence[Task]) -> Iterator[TaskReceipt]:
        """Submit ``tasks`` now, as joblib calls; their receipts as they complete, one per
        task. The tasks run whether or not the receipts are being read.

        A task Dask gives up on (``KilledWorker``) runs again alone after the others,
        then its receipt says it was killed; one that fails at the Dask level otherwise
        is submitted again, then failed (:class:`~pipeline.dispatch.TaskRunner`). A lost
        connection to the scheduler is waited out within the client's connect timeout,
        then is a ``ClusterError`` raised here."""
        tasks = with_rounds(tasks, self.rounds)
        self._threads = self._workerless.wait(task_runner.WORKERLESS_SECONDS)
        run = Launch({}, size=len(tasks))
        run.window = max(SUBMIT_BATCH, IN_FLIGHT_PER_WORKER * self._threads)
        for task in tasks:
            self._opened[task.index] = run
        # Every call dispatched now: the runner submits them as its window allows, and
        # its backups know the launch whole. joblib's own settings in effect
        # (``parallel_config(verbose=...)``) apply; the backend and batches are the job's.
        parallel = Parallel(
            n_jobs=max(2, self._threads),
            backend=PipelineBackend(session=self.session),
            batch_size=1,
            pre_dispatch="all",
            return_as="generator_unordered",
        )
        results = parallel(delayed(run_planned)(task) for task in tasks)
        self._reading.append(results)
        return self._receipts(run, results)

    def _receipts(self, run: Launch, results) -> Iterator[TaskReceipt]:
        try:
            for receipt in results:
                if INTERRUPTED.is_set():  # a Ctrl-C that a callback swallowed: raised here
                    raise KeyboardInterrupt
                failed = len(receipt.failures) + len(receipt.recorded or ())
                self.bar.update(receipt.units, failed=failed)
                if self.on_receipt is not None:
                    self.on_receipt(receipt)
                yield receipt
        finally:
            if any(r is results for r in self._reading):
                self._reading = [r for r in self._reading if r is not results]
                _stop(results)
            self._ended.append(run)

    # -- the session's thread ------------------------------------------------------------

    @property
    def pending(self) -> int:
        """Tasks added and not heard from."""
        return sum(len(run.pending) for run in self._launches)

    def add(self, tasks: Sequence[Task]) -> None:
        """Submit ``tasks`` (launched: each to its launch, as its window allows)."""
        self._end_launches()
        touched: dict[int, Launch] = {}
        for task in tasks:
            run = self._opened.pop(task.index)
            if id(run) not in touched and not any(r is run for r in self._launches):
                run.generation = self._generation
                self._launches.append(run)
            touched[id(run)] = run
            run.pending[task.index] = task
            self._owner[task.index] = run
            run.waiting.append(task)
        for run in touched.values():
            self._refill(run)

    def poll(self) -> list[TaskReceipt]:
        """The receipts that came, waiting for one at most a second (or until
        :meth:`wake`); look at the tasks' futures (workers lost, the connection)."""
        self._woken = False
        self._end_launches()
        if not any(run.ready for run in self._launches):
            for run in list(self._launches):
                self._suspect_alone(run)
            self._pump()
        receipts: list[TaskReceipt] = []
        for run in self._launches:
            receipts += run.ready
            run.ready.clear()
        return receipts

    def wake(self) -> None:
        """Any thread: end :meth:`poll`'s wait now. One message until a poll starts: a
        launch hands over thousands of tasks at once, and each message in the inbox
        is read before the receipts behind it."""
        if not self._woken:
            self._woken = True
            self._inbox.put(self._wake_message)

    def cancel(self, indices: Sequence[int]) -> None:
        """Stop the tasks ``indices`` not heard from: cancelled on the cluster, their
        receipts, if any come, dropped."""
        dropped = set(indices)
        for index in dropped:
            self._opened.pop(index, None)
        for run in self._launches:
            self._drop(run, dropped)
        self._let_go()

    def _end_launches(self) -> None:
        """Let go of the launches whose receipts were read to the end (or no more)."""
        while self._ended:
            run = self._ended.popleft()
            if any(r is run for r in self._launches):
                self._finish(run)


def _stop(results) -> None:
    """Close a launch's joblib generator: joblib cancels its calls not heard from. In
    this thread, the one that dispatched them (closed by the garbage collector, it
    would be in any), and without joblib's advice to stop iterating sooner: stopping
    is the point (an interrupted run)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*tasks which were still being processed")
        results.close()
