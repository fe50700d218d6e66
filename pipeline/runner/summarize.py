"""A run's summary from what it knows: the job and its plan (:func:`plan_summary`), the
tasks' receipts (:func:`add_receipts`), the failures recorded as data
(:func:`add_recorded`); and the summary of a job found complete (:func:`finished_summary`)."""

from __future__ import annotations

import logging
from dataclasses import asdict, replace

from ..dispatch.receipts import TaskReceipt
from ..manifest import summed_fingerprint
from ..planning.plan import Plan
from ..storage import Store, is_remote
from ..summary import RunSummary, TaskTime
from ..workload import Task, UnitFailure, Workload
from .output import units_to_rerun

log = logging.getLogger(__name__)


def plan_summary(
    workload: Workload, store: Store | None, plan: Plan, tasks: list[Task], done: set[int],
    *, units_skipped: int, workers: int,
) -> RunSummary:  # fmt: skip
    """The summary's job and plan: what it is, where it goes, its tasks and those done
    (``units_skipped``: the units complete before the run)."""
    return RunSummary(
        job_id=workload.job_id,
        workload=workload.kind,
        work_name=workload.work_name,
        unit_name=workload.unit_name,
        output=store.describe(workload.job_id) if store else None,
        units=workload.n_units,
        tasks=len(tasks),
        units_per_task=plan.units_per_task or plan.typical_size,
        probe_tasks=len(plan.head),
        tasks_skipped=len(done),
        units_skipped=units_skipped,
        workers=workers,
        reruns_failed_units=workload.reruns_failed_units,
    )


def finished_summary(
    workload: Workload, store: Store, plan: Plan, done: set[int]
) -> RunSummary | None:
    """The summary of a job whose every task is ``done`` with nothing to retry, else None."""
    tasks = plan.tasks
    if not plan.sized or any(t.index not in done for t in tasks):
        return None
    if units_to_rerun(workload, store, tasks):
        return None
    summary = plan_summary(
        workload, store, plan, tasks, done, units_skipped=workload.n_units, workers=0
    )
    summary.complete = True
    add_recorded(summary, workload.recorded_failures(store, tasks), workload, in_run=False)
    return summary


def add_receipts(
    summary: RunSummary, receipts: list[TaskReceipt], kept: dict[int, int], workload: Workload,
    *, output: str, remote: bool,
) -> list[UnitFailure]:  # fmt: skip
    """What the tasks' receipts say: units run and failed, time, bytes, the job's
    fingerprint; the units that failed in them (keyed), returned."""
    failures = [keyed(workload, f) for r in receipts for f in r.failures]
    # (a task rerun for its failed units keeps its others: they did not run again)
    summary.units_run = sum(r.units - kept.get(r.index, 0) for r in receipts)
    summary.units_failed = summary.units_retryable = summary.units_failed_in_run = len(failures)
    # A task with failed units writes no entry: its other units are not stored either
    summary.units_not_kept = sum(
        max(0, r.units - kept.get(r.index, 0) - len(r.failures)) for r in receipts if r.failures
    )
    summary.failures = [asdict(f) for f in failures]
    spent = TaskTime.of(receipts, s3=is_remote(output))
    summary.bytes_written, summary.busy_seconds = spent.bytes_written, spent.seconds
    summary.cpu_seconds, summary.phases = spent.cpu, spent.phases
    summary.runq_seconds, summary.remote = spent.runq, remote
    _reads(summary, receipts)
    fingerprints = [r.fingerprint for r in sorted(receipts, key=lambda r: r.index) if r.fingerprint]
    if fingerprints:
        summary.details["fingerprint"] = summed_fingerprint(int(f, 16) for f in fingerprints)
    return failures


def recorded_in(
    workload: Workload, store: Store | None, tasks: list[Task], receipts: list[TaskReceipt]
) -> list[UnitFailure]:
    """The units recorded as failed (as data) in the tasks of ``receipts``, in task
    order: as each receipt tells, or, where a complete task's receipt says nothing (a
    workload that does not say; an attempt that found another's entry committed
    first, whose receipt its worker, dying, may never have sent), read from its entry."""
    told = {r.index: r.recorded for r in receipts if r.recorded is not None}
    unsaid = {r.index for r in receipts if r.recorded is None and r.complete}
    recorded = [f for t in tasks if t.index in told for f in told[t.index]]
    if unsaid and store is not None:
        recorded += workload.recorded_failures(store, [t for t in tasks if t.index in unsaid])
    return recorded


def keyed(workload: Workload, failure: UnitFailure) -> UnitFailure:
    """``failure`` with its unit's key, where the task did not give one (a task that did
    not run, a workload that records failures by number)."""
    if failure.key or not isinstance(failure.unit, int):
        return failure
    return replace(failure, key=workload.unit_key(failure.unit))


def add_recorded(
    summary: RunSummary, recorded: list[UnitFailure], workload: Workload, *, in_run: bool
) -> None:
    """Units recorded as failed (as data, or beside a task that failed whole), keyed:
    counted against the job, and against this run where ``in_run``."""
    recorded = [keyed(workload, f) for f in recorded]
    summary.units_failed += len(recorded)
    if summary.reruns_failed_units:
        summary.units_retryable += len(recorded)
    if in_run:
        summary.units_failed_in_run += len(recorded)
    summary.failures.extend(asdict(f) for f in recorded)


def _reads(summary: RunSummary, receipts: list[TaskReceipt]) -> None:
    """Bytes read against bytes the units hold: the summary's figures and a -v line."""
    read = sum(r.bytes_read for r in receipts)
    needed = sum(r.bytes_needed for r in receipts)
    summary.bytes_read = read
    if not read or not needed:
        return
    summary.bytes_read_ratio = round(read / needed, 3)
    worst = max(r.bytes_read / r.bytes_needed for r in receipts if r.bytes_needed)
    log.info(
        "read %.3g GB for %.3g GB the units hold: %.2fx (worst task %.2fx)",
        read / 1e9,
        needed / 1e9,
        read / needed,
        worst,
    )
