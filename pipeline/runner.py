"""The runner: plan a job's tasks (the probes: :mod:`pipeline.planning.probes`), skip the
complete ones, run the rest (:mod:`pipeline.dispatch`), and summarize."""

from __future__ import annotations

import bisect
import logging
import time
from dataclasses import asdict, replace

from .config import RunOptions
from .contract import preflight
from .costs.prices import worker_price
from .costs.run_cost import add_run_cost
from .dispatch import WORKERLESS_SECONDS, release_left_tasks
from .dispatch.commit import next_rounds, sweep_leftovers
from .dispatch.progress import Progress
from .dispatch.receipts import TaskReceipt
from .dispatch.workers import first_workers
from .errors import Interrupted, StorageError, UnreadableObject
from .job_output import (
    _check_space,
    _completed,
    _consolidated,
    _held,
    _units_in,
    only_finalization_left,
    open_output,
    recorded_plan,
    stored_units,
)
from .joblib.job_runner import JobRunner
from .layout import check_job_id
from .manifest import summed_fingerprint
from .planning.plan import Plan, load_plan, mark_code_version, unit_layout
from .planning.probes import probe
from .planning.sizing import longest_first
from .report import task_timings
from .storage import Store, is_remote, open_store
from .summary import RunSummary, TaskTime
from .workload import Task, UnitFailure, Workload

__all__ = ["completed_job", "open_output", "run_job", "run_validated_job"]

log = logging.getLogger(__name__)


def completed_job(workload: Workload, options: RunOptions) -> RunSummary | None:
    """The summary of a job whose output is already complete, else None. Needs no
    cluster; refuses (``ConfigError``) an output that holds the job with other settings."""
    if not workload.writes_output or options.overwrite:
        return None
    store = open_store(options.output)
    if not _consolidated(store, workload.job_id):
        return _finalized_now(workload, options, store)
    plan = load_plan(workload, options.units_per_task, store, options.keep_done)
    return _finished(workload, store, plan, _completed(store, workload.job_id))


def _finalized_now(workload: Workload, options: RunOptions, store: Store) -> RunSummary | None:
    """A job whose every task is done but not yet finalized (a run stopped between its
    last task and its manifest's consolidation): finalized here, without a cluster, and
    its summary; else None."""
    if not only_finalization_left(workload, options, store):
        return None
    with _held(workload, options):
        t0 = time.perf_counter()
        plan = load_plan(workload, options.units_per_task, store, options.keep_done)
        summary = _finished(workload, store, plan, _completed(store, workload.job_id))
        if summary is None:  # (another run changed it meanwhile)
            return None
        tasks = plan.tasks(workload.n_units)
        summary.details.update(_finalized(workload, store, tasks, options))
        store.discard_incomplete(workload.job_id)
    summary.finalized_now = True
    summary.finalize_seconds = summary.command_seconds = time.perf_counter() - t0
    return summary


#: Seconds a run waits for a first worker to join a scheduler that has none (the
#: same wait as for workers gone mid-run).
WAIT_FOR_WORKERS = WORKERLESS_SECONDS


def _finished(workload: Workload, store: Store, plan: Plan, done: set[int]) -> RunSummary | None:
    """The summary of a job whose every task is ``done`` with nothing to retry, else None."""
    tasks = plan.tasks(workload.n_units)
    if not plan.sized or any(t.index not in done for t in tasks):
        return None
    if workload.tasks_to_retry(store, tasks):
        return None
    summary = _summary(workload, store, plan, tasks, done, workers=0)
    summary.complete = True
    _add_recorded(summary, workload.recorded_failures(store, tasks), workload, in_run=False)
    return summary


def run_job(workload: Workload, options: RunOptions, client, *, echo=print) -> RunSummary:
    """Run (or resume) one job on ``client``'s cluster and return its summary; its name,
    its inputs (``preflight``) and its output store are validated before any task.

    Ctrl-C raises :class:`Interrupted`, which says how much of the job is complete;
    :class:`JobRunning` when another run of the job is writing the same output.
    """
    check_job_id(workload.job_id)
    preflight(workload)
    price = worker_price(options)  # a bad price setting fails before any task
    return run_validated_job(workload, options, client, price, echo=echo)


def run_validated_job(
    workload: Workload, options: RunOptions, client, price, *, echo=print, store_checked=False
) -> RunSummary:
    """:func:`run_job` of a job the driver has validated: its name, its ``preflight``
    and its ``price`` (:func:`worker_price`), and with ``store_checked`` its output
    store's preflight. Each check runs once per job and command, so a workload's
    preflight need not be idempotent."""
    with _held(workload, options):
        try:
            return _run_job(workload, options, client, price, echo, store_checked)
        except Interrupted:
            raise
        except KeyboardInterrupt:
            # Before its tasks (the output opened, the plan loaded) or after them (the
            # summary, the finalization): what is complete, counted from the store.
            store = open_store(options.output) if workload.writes_output else None
            raise _interrupted(workload, store, recorded_plan(workload, store)) from None


def _run_job(
    workload: Workload, options: RunOptions, client, price, echo, store_checked: bool
) -> RunSummary:
    t_command = time.perf_counter()
    if workload.writes_output:
        release_left_tasks(client, workload, open_store(options.output).url)
    store = open_output(workload, options, echo, checked=store_checked)
    t_start, t_epoch = time.perf_counter(), time.time()
    plan = load_plan(workload, options.units_per_task, store, options.keep_done)
    if store is not None:
        # (a changed code is recorded before any task of it runs; the tasks done keep
        # the version their entries name)
        mark_code_version(workload, store, plan)
    done = _completed(store, workload.job_id)
    # A complete job needs no cluster: the manifest is listed once, for both uses.
    if store is not None and _consolidated(store, workload.job_id):
        finished = _finished(workload, store, plan, done)
        if finished is not None:
            return finished
    n_workers = first_workers(client, WAIT_FOR_WORKERS)
    known = plan.tasks(workload.n_units)
    kept: dict[int, int] = {}  # units of a task to retry that it keeps, by task
    rounds: dict[int, int] = {}  # the entry round each task to retry commits
    if store is not None and done:
        # Complete tasks with units recorded as failed that a rerun calls again.
        retry = workload.tasks_to_retry(store, [t for t in known if t.index in done])
        done -= retry
        rounds = next_rounds(store, workload.job_id, retry)
        if retry and workload.reruns_failed_units:  # only those units: the others are kept
            again = sorted((t for t in known if t.index in retry), key=lambda t: t.start)
            kept = {t.index: len(t.units) for t in again}
            starts = [t.start for t in again]
            for failure in workload.recorded_failures(store, again):
                kept[again[bisect.bisect_right(starts, failure.unit) - 1].index] -= 1
    complete = _units_in(known, done) + sum(kept.values())
    if complete:
        echo(
            f"resuming: {complete:,} of {workload.n_units:,} {workload.unit_name}s already complete"
        )
    _check_space(workload, store, workload.n_units - complete)
    workload.prepare_cluster(client)
    try:
        with (
            _progress(workload, options, _units_in(known, done)) as bar,
            JobRunner(
                workload, store, client, bar, profile=bool(options.profile_tasks), rounds=rounds
            ) as run,
        ):
            layout = unit_layout(workload)
            receipts, rest = [], None
            if not plan.sized:
                receipts, rest = probe(run, plan, done, options, n_workers, layout)
            tasks = plan.tasks(workload.n_units)
            if rest is None:
                ran = done | {r.index for r in receipts}
                rest = run.launch(longest_first(layout, [t for t in tasks if t.index not in ran]))
            receipts += rest
    except KeyboardInterrupt:
        raise _interrupted(workload, store, plan) from None

    summary = _summary(workload, store, plan, tasks, done, workers=n_workers)
    summary.units_skipped = complete
    if options.profile_tasks:
        from .dispatch.profiling import merge_profiles

        try:
            merged = merge_profiles(
                (r.profile for r in receipts), options.profile_tasks, workload.job_id
            )
        except OSError as exc:  # the job's results are written: it still completes
            log.warning("the task profile was not written: %s", exc)
            merged = None
        if merged:
            summary.details["task_profile"] = merged
    failures = [_keyed(workload, f) for r in receipts for f in r.failures]
    # (a task rerun for its failed units keeps its others: they did not run again)
    summary.units_run = sum(r.units - kept.get(r.index, 0) for r in receipts)
    summary.units_failed = summary.units_retryable = summary.units_failed_in_run = len(failures)
    # A task with failed units writes no entry: its other units are not stored either
    summary.units_not_kept = sum(
        max(0, r.units - kept.get(r.index, 0) - len(r.failures)) for r in receipts if r.failures
    )
    summary.failures = [asdict(f) for f in failures]
    spent = TaskTime.of(receipts, s3=is_remote(options.output))
    summary.bytes_written, summary.busy_seconds = spent.bytes_written, spent.seconds
    summary.cpu_seconds, summary.phases = spent.cpu, spent.phases
    summary.runq_seconds, summary.remote = spent.runq, bool(options.scheduler)
    _reads(summary, receipts)
    fingerprints = [r.fingerprint for r in sorted(receipts, key=lambda r: r.index) if r.fingerprint]
    if fingerprints:
        summary.details["fingerprint"] = summed_fingerprint(int(f, 16) for f in fingerprints)
    if not failures and len(receipts) + len(done) == len(tasks):
        summary.complete = True
        if store is not None:
            t_final = time.perf_counter()
            summary.details.update(_finalized(workload, store, tasks, options))
            # Units that failed as data (a chunk whose fit failed is a row in the
            # models table, and its task is complete) count against --max-failures too,
            # including those of tasks skipped on resume.
            told = {r.index: r.recorded for r in receipts if r.recorded is not None}
            ran_now = {r.index for r in receipts}
            in_run = [t for t in tasks if t.index in ran_now]
            unsaid = [t for t in in_run if t.index not in told]
            recorded = [f for t in in_run if t.index in told for f in told[t.index]]
            recorded += workload.recorded_failures(store, unsaid) if unsaid else []
            _add_recorded(summary, recorded, workload, in_run=True)
            skipped = [t for t in tasks if t.index in done]
            if skipped:
                _add_recorded(
                    summary, workload.recorded_failures(store, skipped), workload, in_run=False
                )
            # Attempts killed mid-write (a lost worker) left partial objects behind;
            # every task is now complete, so none of them is still being written.
            leftovers = store.discard_incomplete(workload.job_id)
            if leftovers:
                log.info("removed %d partial writes left by interrupted task attempts", leftovers)
            swept = sweep_leftovers(store, workload)
            if swept:
                log.info("removed %d objects of task attempts that lost or failed", swept)
            summary.finalize_seconds = time.perf_counter() - t_final
    else:
        # Not complete (a task failed whole): the units that failed inside this run's
        # completed tasks are failures too (they went unsaid beside a KilledWorker)
        _add_recorded(
            summary, [f for r in receipts for f in r.recorded or ()], workload, in_run=True
        )
    # The job is complete once its tasks' outputs are finalized (the manifest
    # consolidated, partial writes removed): the run's time holds that, as the
    # workers' cost does (they are held meanwhile).
    summary.wall_seconds = time.perf_counter() - t_start
    if summary.wall_seconds and receipts:
        summary.parallel_efficiency = summary.busy_seconds / (
            summary.wall_seconds * summary.workers
        )
    summary.units_per_second = (
        summary.units_ok / summary.wall_seconds if summary.wall_seconds else 0.0
    )
    summary.plan = {"probe_sizes": list(plan.head), "cost_model": plan.model}
    summary.task_timings = task_timings(receipts, t_epoch)
    summary.command_seconds = time.perf_counter() - t_command  # (the batch adds its start-up)
    add_run_cost(summary, price, remote=summary.remote)
    return summary


def _interrupted(workload: Workload, store: Store | None, plan: Plan | None) -> Interrupted:
    """Ctrl-C: the units complete in the store (none without a recorded plan), and
    whether only the job's finalization is left, counted again once the cluster stopped."""

    def count() -> tuple[int, bool]:
        if store is None or plan is None:
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


def _finalized(workload: Workload, store: Store, tasks: list[Task], options: RunOptions) -> dict:
    """``workload.finalize``, whose reading back of the tasks' objects fails on one
    deleted or damaged since its task completed: said with the way to mend it (a
    traceback before, on this run and every rerun, which could never complete)."""
    try:
        return workload.finalize(store, tasks)
    except (FileNotFoundError, UnreadableObject) as exc:
        raise StorageError(
            f"job {workload.job_id!r}: every task ran, but an object a complete task "
            f"stored is missing or damaged ({exc}); `pipeline verify {options.output} "
            "--repair`, then this command again, runs the damaged tasks again"
        ) from None


def _summary(workload, store, plan: Plan, tasks: list[Task], done: set[int], workers: int):
    return RunSummary(
        job_id=workload.job_id,
        workload=workload.kind,
        work_name=workload.work_name,
        unit_name=workload.unit_name,
        output=store.describe(workload.job_id) if store else None,
        units=workload.n_units,
        tasks=len(tasks),
        units_per_task=plan.units_per_task or plan.typical_size(workload.n_units),
        probe_tasks=len(plan.head),
        tasks_skipped=len(done),
        units_skipped=_units_in(tasks, done),
        workers=workers,
        reruns_failed_units=workload.reruns_failed_units,
    )


def _keyed(workload: Workload, failure: UnitFailure) -> UnitFailure:
    """``failure`` with its unit's key, where the task did not give one (a task that did
    not run, a workload that records failures by number)."""
    if failure.key or not isinstance(failure.unit, int):
        return failure
    return replace(failure, key=workload.unit_key(failure.unit))


def _add_recorded(
    summary: RunSummary, recorded: list[UnitFailure], workload: Workload, *, in_run: bool
) -> None:
    recorded = [_keyed(workload, f) for f in recorded]
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


def _progress(workload: Workload, options: RunOptions, units_done: int) -> Progress:
    """The run's progress on standard error: a bar on a terminal, lines elsewhere."""
    return Progress(
        workload.n_units - units_done,
        unit=workload.unit_name,
        label=f"{workload.kind} job {workload.job_id!r}",
        show=options.progress,
        every=options.progress_seconds,
    )
