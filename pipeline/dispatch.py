"""Running tasks on the cluster: the task wrapper a worker runs, and the runner of
lists of tasks as joblib tasks on the Dask backend, receipts back unordered."""

from __future__ import annotations

import collections
import dataclasses
import logging
import os
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from .contract import check_output
from .errors import ClusterError
from .layout import manifest_key
from .storage import Store, open_store, write_parquet
from .workload import USER_ERRORS, Task, TaskOutput, TaskReceipt, UnitFailure, Workload

__all__ = ["DASK_LEVEL_RETRIES", "INLINE_BYTES", "TaskRunner", "count_workers", "execute_task"]

log = logging.getLogger("pipeline.runner")


def execute_task(
    workload: Workload, store_url: str | None, task: Task, profile: bool = False
) -> TaskReceipt:
    """Worker: run one task; never raises, so joblib never aborts the run. With
    ``profile``, the receipt carries the task's cProfile statistics."""
    if profile:
        from .profiling import profiled

        receipt, stats = profiled(execute_task, workload, store_url, task)
        return dataclasses.replace(receipt, profile=stats)
    started, t0, cpu0 = time.time(), time.perf_counter(), time.process_time()
    queued0 = run_queue_seconds()
    try:
        store = open_store(store_url) if store_url else None
        out = workload.run_task(task, store)
        check_output(workload, task, out, writes=store is not None)
        if not out.failures and store is not None:
            # Last, so that an entry exists only for a task whose data is all written.
            t_write = time.perf_counter()
            out.bytes_written += write_parquet(
                store, manifest_key(workload.job_id, task.index), out.manifest
            )
            out.phases["writing"] = out.phases.get("writing", 0.0) + (time.perf_counter() - t_write)
    except USER_ERRORS as exc:
        out = TaskOutput(failures=[UnitFailure.from_exception(u, exc) for u in task.units])
    seconds = time.perf_counter() - t0
    queued = run_queue_seconds()
    return TaskReceipt(
        index=task.index,
        units=len(task.units),
        failures=tuple(out.failures),
        bytes_written=out.bytes_written,
        seconds=seconds,
        busy_seconds=out.busy_seconds if out.busy_seconds is not None else seconds,
        cpu_seconds=time.process_time() - cpu0,
        runq_seconds=None if queued is None or queued0 is None else queued - queued0,
        worker=socket.gethostname(),
        fingerprint=out.fingerprint,
        phases=dict(out.phases),
        bytes_read=out.bytes_read,
        bytes_needed=out.bytes_needed,
        read_seconds=out.read_seconds,
        started=started,
        pid=os.getpid(),
        recorded=None if out.recorded_failures is None else tuple(out.recorded_failures),
    )


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


def _task_of(exc: BaseException) -> Task | None:
    """The task a Dask-level error ended, when the backend says (one call a batch)."""
    calls = getattr(exc, "joblib_calls", None) or []
    tasks = [args[2] for args in calls if len(args) > 2 and isinstance(args[2], Task)]
    return tasks[0] if len(tasks) == 1 else None


def _killed_workers(error: Exception, task: Task) -> TaskReceipt:
    """The receipt of a task Dask gave up on, its message saying what that means."""
    if type(error).__name__ != "KilledWorker":
        return _failed(task, error)
    tries = getattr(error, "allowed_failures", 3) + 1
    message = (
        f"the worker process running this task died each of the {tries} times it ran it "
        f"(units {task.start}..{task.stop - 1}): killed (out of memory?) or ended by the "
        "code it ran (a crash in compiled code, os._exit); the other tasks ran on"
    )
    return _failed(task, error, UnitFailure(0, "KilledWorker", message))


def _failed(task: Task, error: Exception, failure: UnitFailure | None = None) -> TaskReceipt:
    """The receipt of a task that did not run: each unit failed with ``error`` (or
    with ``failure``'s type and message)."""
    one = failure or UnitFailure.from_exception(0, error)
    failures = tuple(dataclasses.replace(one, unit=u) for u in task.units)
    return TaskReceipt(task.index, len(task.units), failures, 0, 0.0, 0.0, "")


def count_workers(client) -> int:
    return max(1, sum(client.ncores().values()))


#: Times the tasks not heard from run again after a task failed at the Dask level.
DASK_LEVEL_RETRIES = 2
#: Times a task Dask gave up on by name runs again, alone, after the others.
SUSPECT_RETRIES = 1

#: Bytes of workload the tasks of one round may carry inside them (the scheduler
#: holds them until each task runs); beyond, they share one copy on the cluster.
INLINE_BYTES = 128 * 1024 * 1024

#: Seconds a run waits, with tasks left, on a cluster that has no worker.
WORKERLESS_SECONDS = 60

#: Seconds between the client's batches of messages to the scheduler (Dask's: 10 ms).
SEND_INTERVAL = 0.001


def send_promptly(client) -> None:
    """Have ``client`` send its messages to the scheduler at most 1 ms apart. Dask's
    client batches them 10 ms apart, and a probe round is submitted just after the
    last round's results were released, so its tasks waited for the next batch:
    from a round's dispatch to its first task running took 11-14 ms (median), 5.5
    ms after this (embedded cluster, 2 workers). A reconnected client is back at
    Dask's interval."""
    stream = getattr(client, "scheduler_comm", None)
    if isinstance(getattr(stream, "interval", None), float):
        stream.interval = min(stream.interval, SEND_INTERVAL)


@dataclass
class TaskRunner:
    """Runs lists of tasks as joblib tasks on the Dask backend, receipts unordered."""

    workload: Workload
    store: Store | None
    client: Any
    bar: Any
    profile: bool = False
    _shared: Any = None
    _pickled_bytes: int | None = None
    _workerless_since: float | None = None

    def __post_init__(self) -> None:
        send_promptly(self.client)

    def _workload_for(self, tasks: list[Task], n_workers: int):
        """What the tasks get as their workload argument: the object itself, pickled
        into each task, unless that makes the round's tasks hold more than
        :data:`INLINE_BYTES`; then one copy on the cluster, sent once per run.

        A copy on the cluster lives on one worker, which every other worker then
        fetches it from: at 1,000 simulated workers those fetches swamped that
        worker's connections and the run stalled. And the scheduler keeps a round of
        a few short tasks where their data is, so the probe rounds ran on that one
        worker while the others idled. A probe round (at most two tasks per worker)
        is always given the object itself."""
        if self._pickled_bytes is None:
            import cloudpickle

            self._pickled_bytes = len(cloudpickle.dumps(self.workload))
        small_round = len(tasks) <= 2 * n_workers
        if small_round or self._pickled_bytes * len(tasks) <= INLINE_BYTES:
            return self.workload
        if self._shared is None:
            self._shared = self.client.scatter(self.workload, hash=False)
        return self._shared

    def __call__(self, tasks: list[Task]) -> list[TaskReceipt]:
        """Run ``tasks``; receipts in completion order, one per task."""
        return list(self.launch(tasks))

    def launch(self, tasks: list[Task]) -> Iterator[TaskReceipt]:
        """Dispatch ``tasks`` now; their receipts as they complete, one per task. The
        tasks run whether or not the receipts are being read (another call's may be
        read first).

        A task that fails at the Dask level (``KilledWorker``: the workers running it
        died, as when a machine of many workers is lost at once) makes joblib give up
        on every task in flight. The tasks not heard from then run again, up to
        :data:`DASK_LEVEL_RETRIES` times (a task that completed is not rerun, and
        rerunning one writes the same bytes); after that they are failed. A task the
        error names runs again alone after the others (:data:`SUSPECT_RETRIES`
        times), then is failed, without costing the others a retry."""
        return self._receipts(tasks, *self._dispatch(tasks))

    def _receipts(self, tasks: list[Task], results, error) -> Iterator[TaskReceipt]:
        pending, retries = list(tasks), DASK_LEVEL_RETRIES
        # Tasks Dask gave up on by name: they run again after the others, one at a
        # time, so that one whose code ends its process does not take the rest along.
        suspects: list[Task] = []
        named: collections.Counter[int] = collections.Counter()
        while True:
            seen, culprit = set(), None
            if results is not None:
                try:
                    for receipt in results:
                        seen.add(receipt.index)
                        self.bar.update(receipt.units)
                        yield receipt
                except Exception as exc:
                    error = self._cluster_error(exc)
                    culprit = _task_of(exc)
            pending = [t for t in pending if t.index not in seen]
            if error is not None:
                if culprit is not None and culprit.index in {t.index for t in pending}:
                    pending = [t for t in pending if t.index != culprit.index]
                    named[culprit.index] += 1
                    given_up = named[culprit.index] > SUSPECT_RETRIES
                    if given_up:
                        yield _killed_workers(error, culprit)
                    else:
                        suspects.append(culprit)
                    log.warning(
                        "task %d (units %d..%d) failed on the cluster (%s); %s",
                        culprit.index, culprit.start, culprit.stop - 1, type(error).__name__,
                        "its units are failed in this run, and the next tries it again" if given_up
                        else "it runs again alone after the others",
                    )  # fmt: skip
                elif retries == 0:
                    break
                else:
                    retries -= 1
                    log.warning(
                        "a task failed on the cluster (%s: %s); running the %d tasks not heard "
                        "from again", type(error).__name__, error, len(pending),
                    )  # fmt: skip
            if not pending:
                if not suspects:
                    return
                pending = [suspects.pop(0)]
            results, error = self._dispatch(pending)
        for t in pending + suspects:
            yield _failed(t, error)

    def _dispatch(self, tasks: list[Task]):
        """(joblib's generator of receipts, None), or (None, the Dask-level error that
        stopped the dispatch)."""
        from joblib import Parallel, delayed, parallel_config

        from .cluster._joblib_dask import DaskBackend, read_as_they_arrive

        if not tasks:
            return iter(()), None
        store_url = self.store.url if self.store is not None else None
        try:
            # Counted once per call: joblib asks again for each call otherwise, a round
            # trip to the scheduler each time, before any task of a probe round leaves.
            workers = sum(self.client.ncores().values())
            while not workers and self.client.status == "running":
                self._stalled()  # raises after a while (joblib: 60 s, then every task fails)
                time.sleep(1.0)
                workers = sum(self.client.ncores().values())
            backend = DaskBackend(
                client=self.client, wait_for_workers_timeout=60, pure=False, workers=workers
            )
            backend.share(self.workload, self._workload_for(tasks, max(1, workers)))
            with parallel_config(backend=backend):
                results = Parallel(
                    n_jobs=-1,
                    return_as="generator_unordered",
                    batch_size=1,
                    pre_dispatch="3*n_jobs",
                )(delayed(execute_task)(self.workload, store_url, t, self.profile) for t in tasks)
            return read_as_they_arrive(results, backend.arrived, len(tasks), self._stalled), None
        except ClusterError:
            raise
        except Exception as exc:
            return None, self._cluster_error(exc)

    def _stalled(self) -> None:
        """Called while no result comes: a cluster that has had no worker for
        :data:`WORKERLESS_SECONDS` ends the run (every worker gone, none restarted: the
        driver waited, silent, for ever)."""
        if self.client.status != "running":
            return  # the scheduler lost: joblib reports that, and the run says so
        try:
            workers = sum(self.client.ncores().values())
        except Exception:  # (the same, caught between the two)
            return
        if workers:
            self._workerless_since = None
            return
        now = time.monotonic()
        if self._workerless_since is None:
            self._workerless_since = now
            log.warning("the cluster has no worker left; waiting up to %d s for one",
                        WORKERLESS_SECONDS)  # fmt: skip
        elif now - self._workerless_since > WORKERLESS_SECONDS:
            raise ClusterError(
                f"the cluster at {self.client.scheduler.address} has had no worker for "
                f"{WORKERLESS_SECONDS} s, in the middle of the run; every task that completed "
                "is stored: start workers, then run the same command again to resume"
            )

    def _cluster_error(self, exc: Exception) -> Exception:
        """The task wrapper never raises: ``exc`` is the cluster failing under us (a
        worker killed too often, the scheduler gone). Returned to retry on, or raised
        as a ClusterError when the scheduler is lost."""
        if getattr(exc, "reason", None) == "scheduler-connection-lost":
            # Every task in flight is lost with the scheduler; those that completed
            # wrote their manifest entries, which is what a rerun resumes from.
            raise ClusterError(
                f"lost the connection to the Dask scheduler at "
                f"{self.client.scheduler.address} in the middle of the run (the scheduler "
                "or the way to it failed; every task that completed is stored): when the "
                "scheduler is "
                "reachable, run the same command again: it resumes where this run stopped"
            ) from None
        return exc
