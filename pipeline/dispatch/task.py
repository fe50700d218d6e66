"""The task a worker runs: one :class:`~pipeline.workload.Task` of a workload, its
outputs checked and written (:mod:`.outputs`), its manifest entry committed last
(:mod:`.commit`: the first attempt of the task to commit wins), and its receipt
published.

A task never raises: what its units raise is recorded as their failures, so nothing a
unit does ends the run; only the worker process dying (or the cluster failing under
it) fails a task at the Dask level.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import time

from ..contract import check_entry, check_output
from ..layout import manifest_key
from ..manifest import CodeStamp, stamp_entry
from ..storage import open_store
from ..workload import USER_ERRORS, Task, TaskOutput, UnitFailure, Workload
from . import shipping
from .commit import commit_entry, discard, new_attempt, objects_of
from .outputs import write_outputs
from .profiling import run_queue_seconds
from .receipts import TaskReceipt, encode
from .recovery import keep_failed_receipt

__all__ = [
    "TaskCall",
    "execute_task",
    "run_task",
]


class TaskCall:
    """What the tasks of one submission share: the workload (or the name of its copy
    shipped to every worker), the store's URL, whether to profile, where the receipt
    goes (the topic, and the run's token), and ``skip_complete`` for tasks submitted
    again after the driver's connection came back, which may have completed
    meanwhile: a stored entry is then the receipt. An opaque object to Dask, passed
    beside each task (Dask makes a large keyword argument a graph key named after the
    argument, which the next submission's collides with). ``code``: the code version
    the tasks record in their entries (:class:`~pipeline.manifest.CodeStamp`)."""

    __slots__ = ("code", "profile", "skip_complete", "store_url", "token", "topic", "workload")

    def __init__(self, workload, store_url, profile, topic, token, skip_complete=False, code=None):
        self.workload, self.store_url, self.profile = workload, store_url, profile
        self.topic, self.token, self.skip_complete = topic, token, skip_complete
        self.code = code

    def __reduce__(self):
        return (TaskCall, (self.workload, self.store_url, self.profile, self.topic,
                           self.token, self.skip_complete, self.code))  # fmt: skip


def run_task(task: Task, call: TaskCall) -> None:
    """Worker: run ``task`` and publish its receipt on the call's topic."""
    from distributed import get_worker

    workload = shipping.resolve(call.workload)
    receipt = execute_task(
        workload, call.store_url, task, call.profile, call.skip_complete, code=call.code
    )
    worker = get_worker()
    receipt = dataclasses.replace(receipt, worker_address=worker.address)
    if receipt.failures and call.store_url:
        # No entry says it ran: its receipt is kept where the driver finds it should
        # the event be lost (the scheduler keeps a topic's last events only).
        keep_failed_receipt(open_store(call.store_url), workload.job_id, call.token, receipt)
    worker.log_event(call.topic, encode(receipt, call.token))


def execute_task(
    workload: Workload,
    store_url: str | None,
    task: Task,
    profile: bool = False,
    skip_complete: bool = False,
    code: CodeStamp | None = None,
) -> TaskReceipt:
    """Worker: run one task; never raises. With ``profile``, the receipt carries the
    task's cProfile statistics; ``code``: the version its entry records."""
    if profile:
        from .profiling import profiled

        receipt, stats = profiled(
            execute_task, workload, store_url, task, False, skip_complete, code
        )
        return dataclasses.replace(receipt, profile=stats)
    started, t0, cpu0 = time.time(), time.perf_counter(), time.process_time()
    queued0 = run_queue_seconds()
    task = dataclasses.replace(task, attempt=new_attempt())
    lost = False
    try:
        store = open_store(store_url) if store_url else None
        entry = manifest_key(workload.job_id, task.index, task.round)
        if skip_complete and store is not None and store.exists(entry):
            # Complete already: what it wrote is what it would write again.
            host = socket.gethostname()
            return TaskReceipt(task.index, len(task.units), (), 0, 0.0, 0.0, host,
                               started=started, pid=os.getpid())  # fmt: skip
        out = workload.run_task(task, store)
        check_output(workload, task, out, writes=store is not None)
        if store is not None:
            lost = _store_outputs(workload, task, out, store, code)
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
        value=out.value,
        lost=lost,
    )


def _store_outputs(
    workload: Workload, task: Task, out: TaskOutput, store, code: CodeStamp | None
) -> bool:
    """Write the task's objects and commit its entry (:mod:`.commit`); whether another
    attempt had committed first (this one's objects then removed, and its output
    made that of a complete task whose units the winner's entry holds)."""
    t_write = time.perf_counter()
    written = write_outputs(workload, task, out, store)
    lost = False
    if out.failures:
        # No entry lists them: what it wrote goes (a rerun writes its own).
        discard(store, {*written, *objects_of(workload, out.manifest)})
    else:
        check_entry(workload, task, out.manifest)
        out.manifest = stamp_entry(code, workload.job_id, store, task, out.manifest)
        committed = commit_entry(store, workload, task, out.manifest)
        out.bytes_written += committed
        if not committed:
            discard(store, {*written, *objects_of(workload, out.manifest)})
            lost = True
            # The winner's entry is the task's: its recorded failures are read there.
            out.recorded_failures, out.fingerprint = None, None
    seconds = time.perf_counter() - t_write
    out.phases["writing"] = out.phases.get("writing", 0.0) + seconds
    if out.busy_seconds is not None:  # its phases are all the task's busy time
        out.busy_seconds += seconds
    return lost
