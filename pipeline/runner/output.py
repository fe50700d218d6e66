"""A job's output: opened (emptied first with --overwrite), held by one run at a time,
checked for the space it needs, and its complete tasks found."""

from __future__ import annotations

import bisect
import contextlib
import logging
import os
import socket
import time

from ..config import RunOptions
from ..errors import Interrupted, JobRunning, StorageError
from ..layout import (
    job_record_key,
    lock_key,
    read_job_record,
    tasks_done,
)
from ..planning.plan import Plan
from ..storage import Store, open_store
from ..summary import size
from ..workload import Task, Workload

log = logging.getLogger(__name__)


def open_output(
    workload: Workload, options: RunOptions, echo=print, *, checked: bool = False
) -> Store | None:
    """The job's store, checked writable (unless ``checked`` already, by the driver);
    emptied of the job first with --overwrite."""
    if not workload.writes_output:
        return None
    store = open_store(options.output)
    if not checked:
        store.preflight()
    if options.overwrite:
        removed = store.delete_prefix(workload.job_id)
        removed += store.discard_incomplete(workload.job_id)
        if removed:
            echo(f"--overwrite: removed {removed} objects of {store.describe(workload.job_id)}")
    return store


@contextlib.contextmanager
def held(store: Store | None, job_id: str):
    """The job's lock in ``store`` (none without an output), for one run at a time:
    two would plan, write and consolidate the same tasks at once (units lost and
    duplicated, and both saying complete)."""
    if store is None:
        yield
        return
    started = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    owner = f"pid {os.getpid()} on {socket.gethostname()}, started {started}"
    with contextlib.ExitStack() as stack:
        try:
            stack.enter_context(store.hold(lock_key(job_id), owner))
        except BlockingIOError as exc:
            raise JobRunning(
                f"job {job_id!r} in {store.url} is already running ({exc.strerror}); "
                "wait for that run to end, or stop it (a stopped run lets go at once on a "
                "local disk, within a minute on S3)"
            ) from None
        yield


def check_batch_space(batch: list[tuple[Workload, RunOptions]]) -> None:
    """Jobs run one after another that together would fill their output's disk fail
    before any of them runs: the second job's check, in its own run, came after the
    first had written (and its summary was never shown)."""
    needed: dict[str, list[tuple[Workload, int]]] = {}
    free: dict[str, int | None] = {}
    for workload, options in batch:
        if not workload.writes_output or not workload.output_bytes(workload.n_units):
            continue
        store = open_store(options.output)
        if store.url not in free:
            free[store.url] = store.free_bytes()  # None where unknown (S3): not checked
        if free[store.url] is not None:
            units = workload.n_units if options.overwrite else _units_left(workload, store)
            needed.setdefault(store.url, []).append((workload, units))
    for url, jobs in needed.items():
        nbytes = sum(w.output_bytes(units) or 0 for w, units in jobs)
        if nbytes > free[url]:
            which = ", ".join(f"{w.job_id!r} {size(w.output_bytes(u) or 0)}" for w, u in jobs)
            raise StorageError(
                f"output {url}: {size(nbytes)} still to write (jobs {which}), {size(free[url])} "
                "free on its disk; free some space or write elsewhere (--output)"
            )


def _units_left(workload: Workload, store: Store) -> int:
    """Units a run of the job would still write, from its record as it is: read only
    (the plan is recorded, and the settings compared, by the run itself)."""
    key = job_record_key(workload.job_id)
    if not store.exists(key):
        return workload.n_units
    plan = Plan.from_record(read_job_record(store, key), workload.n_units)
    return workload.n_units - units_in(plan.tasks, tasks_done(store, workload.job_id))


def units_in(tasks: list[Task], indices: set[int]) -> int:
    """The units of ``tasks`` whose index is in ``indices``."""
    return sum(len(t.units) for t in tasks if t.index in indices)


def check_space(workload: Workload, store: Store | None, units: int) -> None:
    """A job that would fill its disk fails now, not after an hour's tasks."""
    nbytes = workload.output_bytes(units) if store is not None and units else None
    free = store.free_bytes() if nbytes else None
    if free is not None and nbytes > free:
        raise StorageError(
            f"output {store.url}: {size(nbytes)} of {units:,} {workload.unit_name}s still to "
            f"write, {size(free)} free on its disk; free some space or write elsewhere (--output)"
        )


def recorded_plan(workload: Workload, store: Store | None) -> Plan | None:
    """The job's plan as its record holds it, read only (None: no record); the run
    itself compares the settings."""
    key = job_record_key(workload.job_id)
    if store is None or not store.exists(key):
        return None
    return Plan.from_record(read_job_record(store, key), workload.n_units)


def units_to_rerun(workload: Workload, store: Store, tasks: list[Task]) -> dict[int, int]:
    """Of these complete tasks, those the next run calls again, and how many of their
    units: where the workload reruns its failed units (``reruns_failed_units``), the
    units its ``recorded_failures`` lists, by task (those alone run again)."""
    if not workload.reruns_failed_units or not tasks:
        return {}
    ordered = sorted(tasks, key=lambda t: t.start)
    starts = [t.start for t in ordered]
    rerun: dict[int, int] = {}
    for failure in workload.recorded_failures(store, ordered):
        if isinstance(failure.unit, int):
            index = ordered[bisect.bisect_right(starts, failure.unit) - 1].index
            rerun[index] = rerun.get(index, 0) + 1
    return rerun


def stored_units(workload: Workload, store: Store, plan: Plan) -> tuple[int, bool]:
    """The job's units complete in ``store`` by ``plan`` (less those its next run calls
    again), and whether only its finalization is left: every task done, none to retry."""
    tasks = plan.tasks
    done = tasks_done(store, workload.job_id)
    ran = [t for t in tasks if t.index in done]
    rerun = units_to_rerun(workload, store, ran)
    complete = units_in(tasks, done) - sum(rerun.values())
    return complete, bool(plan.sized and tasks and len(ran) == len(tasks) and not rerun)


def only_finalization_left(workload: Workload, options: RunOptions, store: Store) -> bool:
    """Whether the job's every task is done and the job not finalized (a run stopped
    between its last task and its manifest's consolidation): its next run needs no
    cluster. Read only, from the record as it is (the run compares the settings)."""
    plan = recorded_plan(workload, store) if workload.writes_output else None
    if options.overwrite or plan is None or not plan.sized:
        return False
    tasks = plan.tasks
    done = tasks_done(store, workload.job_id)
    if any(t.index not in done for t in tasks):
        return False
    return not units_to_rerun(workload, store, tasks)


def interrupted(workload: Workload, store: Store | None) -> Interrupted:
    """Ctrl-C: the units complete in the store by the job's recorded plan (none without
    one), and whether only the job's finalization is left, counted again once the
    cluster stopped."""

    def count() -> tuple[int, bool]:
        plan = recorded_plan(workload, store)
        if plan is None:
            return 0, False
        return stored_units(workload, store, plan)

    try:
        complete, finalize = count()
    except Exception:  # (the store failing too: counted again when told)
        complete, finalize = 0, False
    return Interrupted(
        workload.job_id,
        complete,
        workload.n_units,
        workload.unit_name,
        recount=count,
        keeps_output=store is not None,
        finalization_left=finalize,
    )
