"""The run object: one job's run on the driver, phase by phase. It holds the job's
workload, its store, its plan and what the run learns (the tasks done, the units
kept, the tasks' receipts); each phase is a method: :meth:`JobRun.resume` (the
output opened, the plan loaded, the tasks done found), :meth:`JobRun.prepare` (a
worker, the tasks to retry, the space), :meth:`JobRun.dispatch` (the plan's probes
(:mod:`pipeline.planning.probes`) and the rest, on the cluster), :meth:`JobRun.finalize`
and :meth:`JobRun.summary`, built from the receipts."""

from __future__ import annotations

import contextlib
import logging
import time

from ..config import RunOptions
from ..costs.run_cost import add_run_cost
from ..dispatch import WORKERLESS_SECONDS, release_left_tasks
from ..dispatch.commit import next_rounds, sweep_leftovers
from ..dispatch.profiling import merge_profiles
from ..dispatch.progress import Progress
from ..dispatch.receipts import TaskReceipt
from ..dispatch.workers import first_workers
from ..errors import StorageError, UnreadableObject
from ..joblib.job_runner import JobRunner
from ..layout import is_consolidated, tasks_done
from ..manifest import entries_read
from ..planning.plan import Plan, load_plan, mark_code_version
from ..planning.probes import probe
from ..planning.sizing import longest_first, unit_layout
from ..report import task_timings
from ..storage import Store, open_store
from ..summary import RunSummary
from ..workload import Task, UnitFailure, Workload
from .entries import EntriesReadAhead
from .output import check_space, open_output, units_in, units_to_rerun
from .summarize import add_receipts, add_recorded, finished_summary, plan_summary, recorded_in

__all__ = ["WAIT_FOR_WORKERS", "JobRun", "finalized_output"]

log = logging.getLogger(__name__)

#: Seconds a run waits for a first worker to join a scheduler that has none (the
#: same wait as for workers gone mid-run).
WAIT_FOR_WORKERS = WORKERLESS_SECONDS


class JobRun:
    """One job's run on ``client``'s cluster, validated by the caller (its name, its
    inputs, its ``price``) and held by its lock: :meth:`run` takes it through its phases."""

    def __init__(self, workload: Workload, options: RunOptions, client, price, echo=print):
        self.workload = workload
        self.options = options
        self.client = client
        self.price = price
        self.echo = echo
        self.t_command = time.perf_counter()
        self.store: Store | None = None
        self.plan: Plan | None = None
        self.done: set[int] = set()  # tasks complete in the store (less those to retry)
        self.kept: dict[int, int] = {}  # units of a task to retry that it keeps, by task
        self.rounds: dict[int, int] = {}  # the entry round each task to retry commits
        self.units_skipped = 0  # units complete before the run (those kept too)
        self.n_workers = 0
        self.t_start = self.t_epoch = 0.0  # the run's start, once its output is open
        self.tasks: list[Task] = []  # the plan's tasks, once its probes cut them
        self.receipts: list[TaskReceipt] = []
        self.task_profile: str | None = None
        self.finalized: dict = {}  # what the workload's finalize said
        self.recorded: list[UnitFailure] = []  # recorded as failed in the run's tasks
        self.recorded_before: list[UnitFailure] = []  # ... and in the tasks done before it
        self.finalize_seconds: float | None = None
        self.code = None  # the code version this run's tasks record (:class:`CodeStamp`)
        self.entries: dict = {}  # the tasks' entries read as they reported (key -> table)

    def run(self, store_checked: bool = False, cluster_ready: bool = False) -> RunSummary:
        """The job resumed, its tasks run, finalized, and its summary (``cluster_ready``:
        the workload's ``prepare_cluster`` has run on this client)."""
        finished = self.resume(store_checked)
        if finished is not None:
            return finished
        self.prepare(cluster_ready)
        self.dispatch()
        if self.complete:
            self.finalize()
        return self.summary()

    def resume(self, store_checked: bool) -> RunSummary | None:
        """The job's output opened (its tasks left by an earlier driver released), its plan
        loaded and the tasks done found: the summary of a job found complete, else None."""
        workload = self.workload
        options = self.options
        if workload.writes_output:
            release_left_tasks(self.client, workload, open_store(options.output).url)
        self.store = store = open_output(workload, options, self.echo, checked=store_checked)
        self.t_start, self.t_epoch = time.perf_counter(), time.time()
        self.plan = load_plan(workload, options.units_per_task, store, options.keep_done)
        if store is not None:
            # (a changed code is recorded before any task of it runs; the tasks done keep
            # the version their entries name)
            self.code = mark_code_version(workload, store, self.plan)
        # A complete job needs no cluster: the manifest is listed once, for both uses.
        consolidated = store is not None and is_consolidated(store, workload.job_id)
        self.done = tasks_done(store, workload.job_id)
        if consolidated:
            return finished_summary(workload, store, self.plan, self.done)
        return None

    def prepare(self, cluster_ready: bool = False) -> None:
        """A worker to run on; the tasks done that a rerun calls again (and the units of
        them it keeps); the space the rest needs; the workload's cluster set up (unless
        ``cluster_ready``)."""
        workload = self.workload
        store = self.store
        done = self.done
        self.n_workers = first_workers(self.client, WAIT_FOR_WORKERS)
        known = self.plan.tasks
        rerun = {}
        if store is not None and done:
            # Complete tasks with units recorded as failed that a rerun calls again: those
            # units alone, the others' rows kept.
            rerun = units_to_rerun(workload, store, [t for t in known if t.index in done])
            done -= set(rerun)
            self.kept = {t.index: len(t.units) - rerun[t.index] for t in known if t.index in rerun}
        self.units_skipped = complete = units_in(known, done) + sum(self.kept.values())
        if complete:
            self.echo(
                f"resuming: {complete:,} of {workload.n_units:,} "
                f"{workload.unit_name}s already complete"
            )
        check_space(workload, store, workload.n_units - complete)
        if rerun:
            self.rounds = next_rounds(store, workload.job_id, set(rerun))
        if not cluster_ready:
            workload.prepare_cluster(self.client)

    def dispatch(self) -> None:
        """The plan's probes (where it is not sized yet) and the rest of its tasks not
        done, on the cluster, with the run's progress; their receipts kept."""
        workload = self.workload
        options = self.options
        plan = self.plan
        done = self.done
        store = self.store
        with (
            _progress(workload, options, units_in(plan.tasks, done)) as bar,
            contextlib.ExitStack() as stack,
        ):
            ahead = None
            if store is not None:
                ahead = stack.enter_context(EntriesReadAhead(store, workload.job_id, self.rounds))
            run = stack.enter_context(JobRunner(
                workload, store, self.client, bar,
                profile=bool(options.profile_tasks), rounds=self.rounds, code=self.code,
                on_receipt=ahead.add if ahead is not None else None,
            ))  # fmt: skip
            layout = unit_layout(workload)
            receipts, rest = [], None
            if not plan.sized:
                receipts, rest = probe(run, plan, done, options, self.n_workers, layout)
            self.tasks = tasks = plan.tasks
            if rest is None:
                ran = done | {r.index for r in receipts}
                rest = run.launch(longest_first(layout, [t for t in tasks if t.index not in ran]))
            receipts += rest
            self.receipts = receipts
            if ahead is not None:
                self.entries = ahead.close()
        if options.profile_tasks:
            self.task_profile = merge_profiles(
                (r.profile for r in self.receipts), options.profile_tasks, workload.job_id
            )

    @property
    def complete(self) -> bool:
        """Every task done, by this run or before it, none with a failed unit."""
        receipts = self.receipts
        failed = any(r.failures for r in receipts)
        return not failed and len(receipts) + len(self.done) == len(self.tasks)

    def finalize(self) -> None:
        """The workload's finalize; the units recorded as failed (as data) in the job's
        tasks; what attempts of tasks left behind, removed."""
        workload = self.workload
        store = self.store
        tasks = self.tasks
        if store is None:
            return
        t_final = time.perf_counter()
        with entries_read(self.entries):  # (those read while the tasks ran)
            self.finalized = finalized_output(workload, store, tasks, self.options)
        # Units that failed as data (a chunk whose fit failed is a row in the
        # models table, and its task is complete) count against --max-failures too,
        # including those of tasks skipped on resume.
        self.recorded = recorded_in(workload, store, tasks, self.receipts)
        skipped = [t for t in tasks if t.index in self.done]
        if skipped:
            self.recorded_before = workload.recorded_failures(store, skipped)
        # Attempts killed mid-write (a lost worker) left partial objects behind;
        # every task is now complete, so none of them is still being written.
        leftovers = store.discard_incomplete(workload.job_id)
        if leftovers:
            log.info("removed %d partial writes left by interrupted task attempts", leftovers)
        swept = sweep_leftovers(store, workload)
        if swept:
            log.info("removed %d objects of task attempts that lost or failed", swept)
        self.finalize_seconds = time.perf_counter() - t_final

    def summary(self) -> RunSummary:
        """The run's summary, from its plan, its tasks' receipts and its finalize."""
        workload = self.workload
        options = self.options
        receipts = self.receipts
        summary = plan_summary(
            workload, self.store, self.plan, self.tasks, self.done,
            units_skipped=self.units_skipped, workers=self.n_workers,
        )  # fmt: skip
        if self.task_profile:
            summary.details["task_profile"] = self.task_profile
        add_receipts(
            summary, receipts, self.kept, workload,
            output=options.output, remote=bool(options.scheduler),
        )  # fmt: skip
        if self.complete:
            summary.complete = True
            summary.details.update(self.finalized)
            add_recorded(summary, self.recorded, workload, in_run=True)
            if self.recorded_before:
                add_recorded(summary, self.recorded_before, workload, in_run=False)
            if self.finalize_seconds is not None:
                summary.finalize_seconds = self.finalize_seconds
        else:
            # Not complete (a task failed whole): the units that failed inside this run's
            # completed tasks are failures too (they went unsaid beside a KilledWorker)
            recorded = recorded_in(workload, self.store, self.tasks, receipts)
            add_recorded(summary, recorded, workload, in_run=True)
        # The job is complete once its tasks' outputs are finalized (the manifest
        # consolidated, partial writes removed): the run's time holds that, as the
        # workers' cost does (they are held meanwhile).
        summary.wall_seconds = time.perf_counter() - self.t_start
        if summary.wall_seconds and receipts:
            summary.parallel_efficiency = summary.busy_seconds / (
                summary.wall_seconds * summary.workers
            )
        summary.units_per_second = (
            summary.units_ok / summary.wall_seconds if summary.wall_seconds else 0.0
        )
        summary.plan = {"probe_sizes": list(self.plan.head), "cost_model": self.plan.model}
        summary.task_timings = task_timings(receipts, self.t_epoch)
        summary.command_seconds = time.perf_counter() - self.t_command  # (+ the batch's start)
        add_run_cost(summary, self.price, remote=summary.remote)
        return summary


def finalized_output(workload: Workload, store: Store, tasks: list[Task], options: RunOptions):
    """``workload.results.finalize``, whose reading back of the tasks' objects fails on one
    deleted or damaged since its task completed: said with the way to mend it (a
    traceback before, on this run and every rerun, which could never complete)."""
    try:
        return workload.results.finalize(workload, store, tasks)
    except (FileNotFoundError, UnreadableObject) as exc:
        raise StorageError(
            f"job {workload.job_id!r}: every task ran, but an object a complete task "
            f"stored is missing or damaged ({exc}); `pipeline verify {options.output} "
            "--repair`, then this command again, runs the damaged tasks again"
        ) from None


def _progress(workload: Workload, options: RunOptions, units_done: int) -> Progress:
    """The run's progress on standard error: a bar on a terminal, lines elsewhere."""
    return Progress(
        workload.n_units - units_done,
        unit=workload.unit_name,
        label=f"{workload.kind} job {workload.job_id!r}",
        show=options.progress,
        every=options.progress_seconds,
    )
