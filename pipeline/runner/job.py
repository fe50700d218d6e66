"""One job, run or found complete: :func:`run_job` (validated here), :func:`run_validated_job`
(validated by the driver) and :func:`completed_job` (needs no cluster)."""

from __future__ import annotations

import time

from ..config import RunOptions
from ..contract import preflight
from ..costs.prices import worker_price
from ..errors import Interrupted
from ..layout import is_consolidated, tasks_done
from ..planning.plan import load_plan, mark_code_version
from ..storage import Store, open_store
from ..summary import RunSummary
from ..workload import Workload
from .output import (
    held,
    interrupted,
    only_finalization_left,
)
from .run import JobRun, finalized_output
from .summarize import finished_summary

__all__ = ["completed_job", "run_job", "run_validated_job"]


def completed_job(workload: Workload, options: RunOptions) -> RunSummary | None:
    """The summary of a job whose output is already complete, else None. Needs no
    cluster; refuses (``ConfigError``) an output that holds the job with other settings."""
    if not workload.writes_output or options.overwrite:
        return None
    store = open_store(options.output)
    if not is_consolidated(store, workload.job_id):
        return _finalized_now(workload, options, store)
    plan = load_plan(workload, options.units_per_task, store, options.keep_done)
    summary = finished_summary(workload, store, plan, tasks_done(store, workload.job_id))
    if summary is not None and plan.code_changed:
        # --keep-done with the job complete: its new code recorded, as a run records it
        # before its tasks, so that the same command without the option says complete
        # (it was refused again, the new code never recorded)
        with held(store, workload.job_id):
            plan = load_plan(workload, options.units_per_task, store, options.keep_done)
            mark_code_version(workload, store, plan)
    return summary


def _finalized_now(workload: Workload, options: RunOptions, store: Store) -> RunSummary | None:
    """A job whose every task is done but not yet finalized (a run stopped between its
    last task and its manifest's consolidation): finalized here, without a cluster, and
    its summary; else None."""
    if not only_finalization_left(workload, options, store):
        return None
    with held(open_store(options.output), workload.job_id):
        t0 = time.perf_counter()
        plan = load_plan(workload, options.units_per_task, store, options.keep_done)
        done = tasks_done(store, workload.job_id)
        summary = finished_summary(workload, store, plan, done)
        if summary is None:  # (another run changed it meanwhile)
            return None
        tasks = plan.tasks
        summary.details.update(finalized_output(workload, store, tasks, options))
        store.discard_incomplete(workload.job_id)
    summary.finalized_now = True
    summary.finalize_seconds = summary.command_seconds = time.perf_counter() - t0
    return summary


def run_job(workload: Workload, options: RunOptions, client, *, echo=print) -> RunSummary:
    """Run (or resume) one job on ``client``'s cluster and return its summary; its name,
    its inputs (``preflight``) and its output store are validated before any task.

    Ctrl-C raises :class:`Interrupted`, which says how much of the job is complete;
    :class:`JobRunning` when another run of the job is writing the same output.
    """
    preflight(workload)
    price = worker_price(options)  # a bad price setting fails before any task
    return run_validated_job(workload, options, client, price, echo=echo)


def run_validated_job(
    workload: Workload,
    options: RunOptions,
    client,
    price,
    *,
    echo=print,
    store_checked=False,
    cluster_ready=False,
) -> RunSummary:
    """:func:`run_job` of a job the driver has validated: its name, its ``preflight``
    and its ``price`` (:func:`worker_price`), with ``store_checked`` its output store's
    preflight, and with ``cluster_ready`` its ``prepare_cluster`` (its code shipped
    while the driver checked the inputs). Each check runs once per job and command, so
    a workload's preflight need not be idempotent."""
    lock = open_store(options.output) if workload.writes_output else None
    with held(lock, workload.job_id):
        try:
            return JobRun(workload, options, client, price, echo).run(store_checked, cluster_ready)
        except Interrupted:
            raise
        except KeyboardInterrupt:
            # Before, while or after its tasks run: what is complete, counted from the
            # store by the plan its record holds (each task's recorded before it runs).
            store = open_store(options.output) if workload.writes_output else None
            raise interrupted(workload, store) from None
