"""joblib's Dask backend, with five fixes.

joblib runs a call in the calling process when the backend has one worker: this
backend always says two or more, so tasks run on the cluster however small it is.

An argument shared by every task (the workload) can be given as a future already
on the cluster, or as itself to pickle into each task (:meth:`DaskBackend.share`),
instead of joblib's scatter to one worker per call.

A task that fails at the Dask level: exceptions raised inside a task travel back as
joblib results, but a task that Dask itself gives up on (``KilledWorker`` after its
workers died, a cancelled
future) only sets an exception on joblib's internal future and never calls the
completion callback, so ``Parallel`` with ``return_as="generator_unordered"``
waits forever (joblib 1.4-1.6). Here that case calls the callback too, so
joblib raises the error and the runner can record the affected tasks; and the
error carries the arguments of the calls it ended (``joblib_calls``), so the runner
knows which task killed its workers and which were only aborted with it.

The end of a call does not sleep 10 ms for the result collector to stop: the runner
makes a backend per call, so no later call shares the collector, and the probes'
rounds (each a call) each paid it.

Each result that reaches joblib releases :attr:`DaskBackend.arrived`: a reader that
waits on it before asking ``Parallel``'s generator for the next result gets it at
once, where the generator's own wait polls every 10 ms (half of that lost on
average at each of a run's barriers: the end of a probe round, the last task).
"""

from __future__ import annotations

import asyncio
import threading
import warnings
from collections.abc import Iterator

from joblib._dask import DaskDistributedBackend

# A run that ends on a cluster error leaves its calls' generators unread: joblib then
# advises on the tasks it cancels, an advice about its own input iterators
warnings.filterwarnings(
    "ignore", message=r".*tasks which were still being processed by the workers have been "
    "cancelled", category=UserWarning, module="joblib",
)  # fmt: skip


class _DaskLevelError:
    __slots__ = ("calls", "exc")

    def __init__(self, exc: BaseException, calls: list[tuple] | None):
        self.exc, self.calls = exc, calls


class _Labelled:
    """joblib's completion callback for a batch, with the batch's calls' arguments;
    ``arrived`` is released once joblib has the result (or the error)."""

    __slots__ = ("arrived", "callback", "calls")

    def __init__(self, callback, calls: list[tuple], arrived: threading.Semaphore):
        self.callback, self.calls, self.arrived = callback, calls, arrived

    def __call__(self, out):
        try:
            return self.callback(out)
        finally:
            self.arrived.release()


#: Longest wait for a result's arrival before asking joblib anyway (a safety net: every
#: result is announced, and joblib's generator then waits as it always does).
ARRIVAL_WAIT = 1.0


def read_as_they_arrive(
    results: Iterator, arrived: threading.Semaphore, count: int, stalled=None
) -> Iterator:
    """``results`` (joblib's generator of ``count`` results), each asked for once it
    has arrived, so that the generator never sleeps through its 10 ms poll.
    ``stalled()``, called while no result comes, may raise: when the cluster has no
    worker left to run the tasks, joblib would wait for ever."""
    for _ in range(count):
        while not arrived.acquire(timeout=ARRIVAL_WAIT):
            if stalled is None:
                break
            stalled()
        try:
            yield next(results)
        except StopIteration:
            return
    yield from results  # (ends at once: every result was read)


class DaskBackend(DaskDistributedBackend):
    """``workers``: the cluster's worker threads, if the caller has just counted them
    (joblib would ask the scheduler again, twice per call); 0 to have joblib wait for
    a worker."""

    def __init__(self, *args, workers: int = 0, **kwargs):
        super().__init__(*args, **kwargs)
        self.arrived = threading.Semaphore(0)
        self.workers = workers

    def effective_n_jobs(self, n_jobs):
        # joblib runs a call in the calling process when this is 1: with one worker
        # thread (--workers 1, or a worker of two just lost) every task would run in
        # the driver. Never less than 2: the tasks go to the cluster, however small.
        return max(2, self.workers or super().effective_n_jobs(n_jobs))

    def share(self, arg, future) -> None:
        """Pass ``future`` (on the cluster; or ``arg`` itself, to pickle it into each
        task) wherever a task's argument is ``arg``."""
        self._scatter.append(arg)  # joblib keys on id(arg): keep it alive
        self.data_futures[id(arg)] = future

    def submit(self, func, callback=None):
        # joblib's own submit; the callback now knows which calls the batch holds
        calls = [args for _f, args, _kw in getattr(func, "items", ())]
        return super().submit(func, _Labelled(callback, calls, self.arrived))

    async def _collect(self):
        while self._continue:
            async for future, result in self.waiting_futures:
                cf_future = self._results.pop(future)
                callback = self._callbacks.pop(future)
                if future.status == "error":
                    _typ, exc, _tb = result
                    cf_future.set_exception(exc)
                    callback(_DaskLevelError(exc, callback.calls))  # a _Labelled
                else:
                    cf_future.set_result(result)
                    callback(result)
            await asyncio.sleep(0.002)  # joblib: 10 ms, paid at the start of each call

    def retrieve_result_callback(self, out):
        if isinstance(out, _DaskLevelError):
            out.exc.joblib_calls = out.calls  # which task it was: the runner fails it alone
            raise out.exc
        return super().retrieve_result_callback(out)

    def stop_call(self):
        self._continue = False  # the collector stops at its next turn, on its own
        self.call_data_futures.clear()
