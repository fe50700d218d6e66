"""The ``pipeline`` joblib backend: ``Parallel`` on the cluster the project's settings
name, with the runner's guarantees (docs/joblib.md).

::

    with joblib.parallel_config(backend="pipeline"):            # the embedded cluster
        results = Parallel(n_jobs=-1, verbose=10)(delayed(fit)(c) for c in chunks)

    with joblib.parallel_config(backend="pipeline", workers=4):  # settings as keywords
    with joblib.parallel_config(backend="pipeline", scheduler="tls://lb:8786",
                                tls_ca_file=..., tls_cert=..., tls_key=...):

Keywords are :func:`pipeline.connect`'s (``scheduler``, ``workers``, the ``tls_*``
files, ...) over the ``PIPELINE_*`` variables, and ``output=`` (a folder or
``s3://bucket/prefix``) to keep each call's result there and resume a rerun from it.
"""

from __future__ import annotations

import threading
from secrets import token_hex
from typing import Any

from joblib.parallel import AutoBatchingMixin, ParallelBackendBase

from ..config import connection_options
from ..planning.sizing import SCHEDULER_SECONDS_PER_TASK, SCHEDULER_SHARE
from .calls import CallBatch
from .planned import planned_task
from .session import CallJob, Session, session_for
from .shared_args import SharedArgs
from .values import SPILL_FOLDER

__all__ = ["PipelineBackend"]


class PipelineBackend(AutoBatchingMixin, ParallelBackendBase):
    """joblib's ``ParallelBackendBase`` on a pipeline cluster session."""

    supports_retrieve_callback = True
    default_n_jobs = -1
    uses_threads = False
    supports_sharedmem = False
    #: Auto batching aims at batches of 0.2 to 2 s: each is a task of the scheduler's
    #: (about a millisecond of its time) and a receipt's round trip. On many workers,
    #: longer: as the planner's tasks (:func:`_scheduler_floor`).
    MIN_IDEAL_BATCH_DURATION = 0.2
    MAX_IDEAL_BATCH_DURATION = 2.0

    def __init__(
        self,
        nesting_level: int | None = None,
        inner_max_num_threads: int | None = None,
        output: str | None = None,
        session: Session | None = None,
        **settings: Any,
    ):
        """``session``: the session of a job's runner (:class:`~.job_runner.JobRunner`),
        for its planned tasks (:mod:`.planned`); else the settings name the cluster."""
        super().__init__(nesting_level=nesting_level, inner_max_num_threads=inner_max_num_threads)
        connection_options(None, settings)  # its errors now, where the settings are given
        self._settings = settings
        self._output = _output_url(output)
        self._session: Session | None = session
        self._bound = session is not None
        self._jobs: set[CallJob] = set()  # (added and removed from two threads: locked)
        self._jobs_lock = threading.Lock()
        self._kept = None
        self._position = 0  # calls submitted in the running Parallel call
        self._failed = False
        self._shared: SharedArgs | None = None
        #: Seconds the batch whose callback runs now took on its worker (None: unknown).
        self._ran_seconds: float | None = None

    # -- the cluster -------------------------------------------------------------------

    @property
    def session(self) -> Session:
        """The session on this backend's cluster, opened on first use."""
        if not self._bound and (self._session is None or self._session.closed):
            self._session = session_for(self._settings)
        return self._session

    def effective_n_jobs(self, n_jobs: int | None) -> int:
        """``n_jobs`` batches at a time; -1 is every worker thread of the cluster, -2
        all but one, and so on. Never 1 unless ``n_jobs=1`` is asked for: joblib runs
        a call of one job in the driver, not on the cluster (and keeps nothing)."""
        if n_jobs == 0:
            raise ValueError("n_jobs == 0 in Parallel has no meaning")
        if n_jobs is None:
            n_jobs = self.default_n_jobs
        if n_jobs < 0:
            return max(self.session.worker_threads() + 1 + n_jobs, 2)
        return n_jobs

    def configure(self, n_jobs=1, parallel=None, prefer=None, require=None, **backend_kwargs):
        self.parallel = parallel
        n = self.effective_n_jobs(n_jobs)
        floor = _scheduler_floor(n)
        self.MIN_IDEAL_BATCH_DURATION = max(type(self).MIN_IDEAL_BATCH_DURATION, floor)
        self.MAX_IDEAL_BATCH_DURATION = max(type(self).MAX_IDEAL_BATCH_DURATION, 4 * floor)
        if self._output is not None and self._kept is None:
            from .resume import KeptResults

            self._kept = KeptResults(self._output)
        return n

    # -- batches -----------------------------------------------------------------------

    def submit(self, func, callback=None):
        """Send joblib's batch ``func`` (its ``items``: (function, args, kwargs)) to the
        cluster; ``callback`` is called, from the session's thread, with its outcome."""
        session = self.session
        items = list(func.items)
        task = planned_task(items)
        if task is not None:  # a job's own task: through its runner as it is
            job = session.submit_task(task, callback)
            with self._jobs_lock:
                self._jobs.add(job)
            return job
        nested = self.get_nested_backend()
        keys = None
        first, self._position = self._position, self._position + len(items)
        if self._kept is not None:
            keys = self._kept.keys_of(items)
            done = self._kept.stored(keys)
            if done is not None:  # every call of the batch ran before: no task
                values, meta = done
                self._kept.record(first, keys, meta)
                return session.complete(values, len(items), callback)
        spill_url = session.spill_url(self._output)
        sent = items
        if spill_url is not None:  # (large arguments stored once per Parallel call)
            if self._shared is None:
                prefix = f"{SPILL_FOLDER}/{session.runner.workload.job_id}/args-{token_hex(6)}"
                self._shared = SharedArgs(spill_url, prefix)
            sent = self._shared.replace(items)
        batch = CallBatch(
            sent,
            nested,
            spill_url=spill_url,
            output_url=self._output,
            keys=keys,
        )
        job = session.submit(batch, callback)
        job.keep = (first, keys) if keys is not None else None
        with self._jobs_lock:
            self._jobs.add(job)
        return job

    def retrieve_result_callback(self, out: CallJob):
        """The batch's results; its call's exception, re-raised with the worker's
        traceback as its cause."""
        with self._jobs_lock:
            self._jobs.discard(out)
        self._ran_seconds = out.seconds
        outcome, out.outcome = out.outcome, None
        if outcome[0] == "ok":
            if out.keep is not None and len(outcome) == 3:
                self._kept.record(out.keep[0], out.keep[1], outcome[2])
            return outcome[1]
        self._failed = True
        _, exc, text = outcome
        if text:
            from .calls import RemoteTraceback

            exc.__cause__ = RemoteTraceback(text)
        raise exc

    def batch_completed(self, batch_size, duration):
        """joblib's measure of a batch, from its dispatch to its outcome: on many workers
        (the scheduler's floor above joblib's 0.2 s) the batch's own time on its worker
        instead, which the scheduler's share depends on (joblib's includes the wait
        behind the batches dispatched ahead of it, about as long again)."""
        ran, self._ran_seconds = self._ran_seconds, None
        if ran is not None and self.MIN_IDEAL_BATCH_DURATION > type(self).MIN_IDEAL_BATCH_DURATION:
            duration = ran
        super().batch_completed(batch_size, duration)

    def start_call(self) -> None:
        self._position, self._failed = 0, False
        if self._kept is not None:
            self._kept.start_call()

    def stop_call(self) -> None:
        """A ``Parallel`` call ended; one that completed has its kept results listed in
        its output's manifest (``pipeline verify`` checks them)."""
        if self._kept is not None and not self._failed:
            self._kept.finish(self._position)
        shared, self._shared = self._shared, None
        if shared is not None:
            shared.clear()

    def abort_everything(self, ensure_ready: bool = True) -> None:
        """Cancel this backend's batches not heard from (joblib ignores them now)."""
        self._failed = True
        with self._jobs_lock:
            jobs, self._jobs = list(self._jobs), set()
        if jobs and self._session is not None and not self._session.closed:
            self._session.cancel(jobs)

    def get_nested_backend(self):
        """A ``Parallel`` inside a call runs on the worker that runs the call, in
        threads (joblib's default for a first level of nesting), then sequentially:
        never back to the cluster, where it would wait for workers that wait for it."""
        return super().get_nested_backend()

    def terminate(self) -> None:
        """After each ``Parallel`` call: the session stays open for the next."""


def _scheduler_floor(n_jobs: int) -> float:
    """Seconds a batch should run at least so that ``n_jobs`` batches running at once,
    a task each, take at most the planner's share of the scheduler's core
    (:data:`~pipeline.planning.sizing.SCHEDULER_SHARE`; docs/joblib.md): 4 s on
    1,000 workers, 0.2 s (joblib's own) on 50 or fewer."""
    return SCHEDULER_SECONDS_PER_TASK * n_jobs / SCHEDULER_SHARE


def _output_url(output: str | None) -> str | None:
    if output is None:
        return None
    import os

    text = os.fspath(output)
    if not text:
        raise ValueError("output='' names no place; give a folder or s3://bucket/prefix")
    return text if "://" in text else os.path.abspath(text)
