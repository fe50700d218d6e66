"""The driver's side of the ``pipeline`` joblib backend: one session per cluster.

A session is the connection the project's settings name (:func:`pipeline.connect`:
the embedded cluster, or the scheduler of ``PIPELINE_SCHEDULER`` over TLS), opened on
the first ``Parallel`` call that needs it and kept for the next ones (an embedded
cluster starts once per program, not once per call), and closed when the program
exits (or by :func:`close_sessions`). Its thread feeds joblib's batches to a
:class:`~.runner.CallRunner` and hands each receipt's outcome to joblib's callback
(joblib then dispatches the next batch from that thread, as from a pool's).
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
import logging
import secrets
import shutil
import tempfile
import threading
from typing import Any

from ..config import CONNECTION_SETTINGS, connection_options
from ..dispatch.receipts import TaskReceipt
from ..storage import open_store
from ..workload import Task
from . import values
from .calls import CallBatch, CallsWorkload, CallTask, pickle_batch

__all__ = ["CallJob", "Session", "close_sessions", "session_for"]

log = logging.getLogger(__name__)

_SESSIONS: dict[tuple, Session] = {}
_SESSIONS_LOCK = threading.Lock()


class CallJob:
    """What ``submit`` returns to joblib for one batch: its outcome once it came."""

    __slots__ = ("callback", "index", "keep", "outcome", "planned", "seconds", "size", "spill")

    def __init__(self, index: int, size: int, callback, spill: str | None):
        self.index, self.size, self.callback, self.spill = index, size, callback, spill
        self.outcome: tuple | None = None
        #: Seconds its task took on its worker, once its receipt came (auto batching).
        self.seconds: float | None = None
        #: A workload's own task (:meth:`Session.submit_task`): its outcome is its receipt.
        self.planned = False
        #: The position of its first call in the Parallel call, and its calls' keys,
        #: where results are kept (:mod:`.resume`).
        self.keep: tuple[int, list[str]] | None = None


def session_for(settings: dict[str, Any]) -> Session:
    """The open session on the cluster ``settings`` name (connection settings as
    keywords over the ``PIPELINE_*`` variables), opened now if there is none."""
    options = connection_options(None, settings)
    key = tuple(getattr(options, name) for name in CONNECTION_SETTINGS)
    with _SESSIONS_LOCK:
        session = _SESSIONS.get(key)
        if session is None or session.closed:
            if not _SESSIONS:
                _close_at_exit()
            _SESSIONS.pop(key, None)  # (a new one goes last: closed first)
            session = _SESSIONS[key] = Session(options)
        return session


def close_sessions() -> None:
    """Close every session (their clusters with them); at the program's exit. The last
    opened first: each embedded cluster lowers Dask's log handlers' level as it starts
    and puts back the level it found as it closes, so the first one's close, first,
    let the others' closing print Dask's INFO lines."""
    with _SESSIONS_LOCK:
        sessions = list(_SESSIONS.values())
        _SESSIONS.clear()
    for session in reversed(sessions):
        session.close()


def _close_at_exit() -> None:
    """Close the sessions as the program ends, before the interpreter stops its thread
    pools (the cluster's closing uses them): where ``concurrent.futures`` and loky
    register theirs. Once only."""
    try:
        threading._register_atexit(close_sessions)  # (CPython's hook; loky's too)
    except (AttributeError, RuntimeError):
        atexit.register(close_sessions)


class Session:
    """One cluster's connection, runner and thread for joblib's batches.

    ``Session(options)`` opens the connection the settings name and runs joblib users'
    calls (a :class:`~.call_runner.CallRunner`); ``Session(runner=...)`` serves a job's
    runner (:class:`~.job_runner.JobRunner`) on its connection: the driver's planned
    tasks, which the runner and its connection outlive (the runner closes them)."""

    def __init__(self, options=None, *, runner=None):
        self.options = options
        self.closed = False
        self._released = False
        self._stack = contextlib.ExitStack()
        self._owns_runner = runner is None
        if runner is not None:
            self.client, self.runner = runner.client, runner
            self.remote, self._scratch = False, None
        else:
            self._connect(options)
        self._start_serving()

    def _connect(self, options) -> None:
        from ..cluster.connect import connect

        self.client = self._stack.enter_context(connect(options))
        self.remote = bool(options.scheduler)
        self._scratch = None if self.remote else tempfile.mkdtemp(prefix="pipeline-joblib-")
        try:
            from .call_runner import CallRunner

            workload = CallsWorkload(job_id=f"joblib-{secrets.token_hex(6)}")
            self.runner = CallRunner(workload, self.client)
        except BaseException:
            self._stack.close()
            raise

    def _start_serving(self) -> None:
        self._lock = threading.Condition()
        #: Batches handed over, each with its task, or its outcome when known already.
        self._incoming: list[tuple[CallJob, Task | tuple]] = []
        self._jobs: dict[int, CallJob] = {}
        self._cancelled: list[int] = []
        self._tasks: dict[int, CallTask] = {}  # tasks whose calls are in the spill store
        self._indices = itertools.count()
        self._next_call = 0  # the number of the next batch's first call (its units)
        self._thread = threading.Thread(target=self._serve, name="pipeline-joblib", daemon=True)
        self._thread.start()

    # -- any thread --------------------------------------------------------------------

    def worker_threads(self) -> int:
        from ..cluster.connect import worker_threads

        return worker_threads(self.client)

    def spill_url(self, output_url: str | None) -> str | None:
        """Where results too large for a receipt go (:mod:`.values`)."""
        return output_url if output_url is not None else self._scratch

    def submit(self, batch: CallBatch, callback) -> CallJob:
        """Send ``batch`` to the cluster; ``callback(job)`` once its outcome is in."""
        with self._lock:  # (joblib submits from its thread and from callbacks)
            index, first = next(self._indices), self._next_call
            self._next_call += len(batch.items)
        job = CallJob(index, len(batch.items), callback, batch.spill_url)
        try:
            item: CallTask | tuple = self._task(index, first, batch)
        except Exception as exc:  # a call that does not pickle: its callback says so
            item = ("error", exc, "")
        return self._hand_over(job, item)

    def _task(self, index: int, first: int, batch: CallBatch) -> CallTask:
        """The batch's task: its calls inside it, or, beyond :data:`values.INLINE_ARGS_BYTES`
        where there is a spill store, in the store (the scheduler holds every queued
        task's arguments; the worker reads them from the store)."""
        payload = pickle_batch(batch)
        stop = first + len(batch.items)
        if len(payload) <= values.INLINE_ARGS_BYTES or batch.spill_url is None:
            return CallTask.inline(index, first, stop, payload)
        key = f"{values.SPILL_FOLDER}/{self.runner.workload.job_id}/calls-{index}.pkl"
        open_store(batch.spill_url).write_bytes(key, payload)
        return CallTask(index, first, stop, spilled=key, spill_url=batch.spill_url)

    def submit_task(self, task: Task, callback) -> CallJob:
        """Send one of the runner's workload's own tasks (a job's planned task) to the
        cluster as it is: the worker runs it as any task of the job; ``callback(job)``
        once its receipt is in (its outcome ``("ok", [receipt])``, whether its units
        succeeded or not: a receipt says which)."""
        job = CallJob(task.index, 1, callback, None)
        job.planned = True
        return self._hand_over(job, task)

    def complete(self, results: list, size: int, callback) -> CallJob:
        """A batch whose results are known already (kept by an earlier run): its
        callback called from the session's thread, as for any batch."""
        return self._hand_over(CallJob(next(self._indices), size, callback, None), ("ok", results))

    def _hand_over(self, job: CallJob, item: Task | tuple) -> CallJob:
        with self._lock:
            if self.closed:
                raise RuntimeError("the pipeline joblib session is closed")
            self._incoming.append((job, item))
            self._lock.notify()
        self.runner.wake()
        return job

    def cancel(self, jobs) -> None:
        """Cancel ``jobs`` not heard from (their callbacks are not called)."""
        indices = {job.index for job in jobs}
        with self._lock:
            for index in indices:
                self._jobs.pop(index, None)
            dropped = [t for j, t in self._incoming if j.index in indices]
            self._incoming = [(j, t) for j, t in self._incoming if j.index not in indices]
            self._cancelled.extend(indices)
            self._lock.notify()
        for task in dropped:  # (never submitted: arguments put in the store, removed)
            if isinstance(task, CallTask) and task.spilled is not None:
                with contextlib.suppress(OSError):
                    open_store(task.spill_url).delete_prefix(task.spilled)
        self.runner.wake()

    def close(self) -> None:
        with self._lock:
            if self.closed:
                return
            self.closed = True
            self._lock.notify()
        self.runner.wake()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=30)
        self._release()

    def _release(self) -> None:
        """The runner, the connection (the embedded cluster with it) and the scratch
        folder let go of; once."""
        if self._released:
            return
        self._released = True
        if self._owns_runner:
            with contextlib.suppress(Exception):
                self.runner.close()
        with contextlib.suppress(Exception):
            self._stack.close()
        if self._scratch is not None:
            shutil.rmtree(self._scratch, ignore_errors=True)

    # -- the session's thread ----------------------------------------------------------

    def _serve(self) -> None:
        while True:
            with self._lock:
                while not (self._incoming or self._cancelled or self.runner.pending or self.closed):
                    self._lock.wait()
                if self.closed:
                    return
                incoming, self._incoming = self._incoming, []
                cancelled, self._cancelled = self._cancelled, []
            if cancelled:
                self.runner.cancel(cancelled)
                for index in cancelled:
                    self._forget_spilled(index)
            tasks = []
            for job, item in incoming:
                if isinstance(item, tuple):
                    self._deliver(job, item)
                    continue
                self._jobs[job.index] = job
                if isinstance(item, CallTask) and item.spilled is not None:
                    self._tasks[job.index] = item
                tasks.append(item)
            if tasks:
                self.runner.add(tasks)
            if not self.runner.pending:
                continue
            try:
                receipts = self.runner.poll()
            except BaseException as exc:  # the cluster lost: every call waiting fails
                log.error("the pipeline joblib session failed: %s", exc)
                self._fail_all(exc)
                return
            for receipt in receipts:
                job = self._jobs.pop(receipt.index, None)
                self._forget_spilled(receipt.index)
                if job is not None:
                    job.seconds = receipt.seconds
                    outcome = ("ok", [receipt]) if job.planned else _outcome(receipt, job.spill)
                    self._deliver(job, outcome)

    def _forget_spilled(self, index: int) -> None:
        task = self._tasks.pop(index, None)
        if task is not None:
            with contextlib.suppress(OSError):
                open_store(task.spill_url).delete_prefix(task.spilled)

    def _deliver(self, job: CallJob, outcome: tuple) -> None:
        job.outcome = outcome
        try:
            job.callback(job)
        except BaseException:  # joblib's; this thread serves every call: it goes on
            log.exception("joblib's callback raised")

    def _fail_all(self, exc: BaseException) -> None:
        with self._lock:
            self.closed = True
            jobs = list(self._jobs.values()) + [j for j, _ in self._incoming]
            self._jobs.clear()
            self._incoming = []
        with _SESSIONS_LOCK:
            for key, session in list(_SESSIONS.items()):
                if session is self:
                    del _SESSIONS[key]
        for job in jobs:
            self._deliver(job, ("error", exc, ""))
        self._release()


def _outcome(receipt: TaskReceipt, spill_url: str | None) -> tuple:
    """A receipt's outcome: its value's, or the failure the runner recorded (a task whose
    workers kept dying, one that failed at the Dask level)."""
    if receipt.value is not None:
        try:
            return values.unpack(receipt.value, spill_url)
        except Exception as exc:
            return ("error", exc, "")
    failure = receipt.failures[0] if receipt.failures else None
    message = failure.message if failure else "the task failed on the cluster"
    kind = failure.error_type if failure else "RuntimeError"
    return ("error", RuntimeError(f"{kind}: {message}"), "")
