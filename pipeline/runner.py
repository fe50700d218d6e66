"""The runner: plan a job's tasks, skip the complete ones, run the rest as joblib
tasks on the Dask backend, stream receipts back unordered, and summarize."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import os
import socket
import sys
import time
from dataclasses import asdict, dataclass
from typing import Any

from .config import RunOptions
from .cost import add_run_cost
from .errors import ClusterError, Interrupted
from .layout import consolidated_manifest_key, manifest_key
from .planning import (
    LARGE_PROBE_FACTOR,
    PROBE_SECONDS,
    Plan,
    is_small_job,
    load_plan,
    next_large_probe,
    probe_limit,
    probe_round,
    save_plan,
    unit_layout,
)
from .prices import worker_price
from .report import task_timings
from .sizing import MIN_TASKS_PER_WORKER, CostModel, ProbeSample, cut_tasks, fit_costs
from .storage import Store, join, open_store, write_parquet
from .summary import RunSummary
from .workload import Task, TaskOutput, TaskReceipt, UnitFailure, Workload

__all__ = ["completed_job", "open_output", "run_job"]

log = logging.getLogger(__name__)


def execute_task(
    workload: Workload, store_url: str | None, task: Task, profile: bool = False
) -> TaskReceipt:
    """Worker: run one task; never raises, so joblib never aborts the run. With
    ``profile``, the receipt carries the task's cProfile statistics."""
    if profile:
        from .profiling import profiled

        receipt, stats = profiled(execute_task, workload, store_url, task)
        return dataclasses.replace(receipt, profile=stats)
    started, t0 = time.time(), time.perf_counter()
    try:
        store = open_store(store_url) if store_url else None
        out = workload.run_task(task, store)
        if not out.failures and store is not None and out.manifest is not None:
            # Last, so that an entry exists only for a task whose data is all written.
            t_write = time.perf_counter()
            out.bytes_written += write_parquet(
                store, manifest_key(workload.job_id, task.index), out.manifest
            )
            out.phases["writing"] = out.phases.get("writing", 0.0) + (time.perf_counter() - t_write)
    except Exception as exc:
        out = TaskOutput(failures=[UnitFailure.from_exception(u, exc) for u in task.units])
    seconds = time.perf_counter() - t0
    return TaskReceipt(
        index=task.index,
        units=len(task.units),
        failures=tuple(out.failures),
        bytes_written=out.bytes_written,
        seconds=seconds,
        busy_seconds=out.busy_seconds if out.busy_seconds is not None else seconds,
        worker=socket.gethostname(),
        fingerprint=out.fingerprint,
        phases=dict(out.phases),
        bytes_read=out.bytes_read,
        bytes_needed=out.bytes_needed,
        read_seconds=out.read_seconds,
        started=started,
        pid=os.getpid(),
    )


def _n_workers(client) -> int:
    return max(1, sum(client.ncores().values()))


def _completed(store: Store | None, job_id: str) -> set[int]:
    if store is None:
        return set()
    done = set()
    for key in store.list(join(job_id, "manifest")):
        name = key.rsplit("/", 1)[-1]
        if name.startswith("part-") and name.endswith(".parquet"):
            done.add(int(name[5:-8]))
    return done


def open_output(workload: Workload, options: RunOptions, echo=print) -> Store | None:
    """The job's store, checked writable; emptied of the job first with --overwrite."""
    if not workload.writes_output:
        return None
    store = open_store(options.output)
    store.preflight()
    if options.overwrite:
        removed = store.delete_prefix(workload.job_id)
        removed += store.discard_incomplete(workload.job_id)
        if removed:
            echo(f"--overwrite: removed {removed} objects of {store.describe(workload.job_id)}")
    return store


def completed_job(workload: Workload, options: RunOptions) -> RunSummary | None:
    """The summary of a job whose output is already complete, else None. Needs no
    cluster; refuses (``ConfigError``) an output that holds the job with other settings."""
    if not workload.writes_output or options.overwrite:
        return None
    store = open_store(options.output)
    if not store.exists(consolidated_manifest_key(workload.job_id)):
        return None
    plan = load_plan(workload, options.units_per_task, store)
    return _finished(workload, store, plan, _completed(store, workload.job_id))


def _finished(workload: Workload, store: Store, plan: Plan, done: set[int]) -> RunSummary | None:
    """The summary of a job whose every task is ``done`` with nothing to retry, else None."""
    tasks = plan.tasks(workload.n_units)
    if not plan.sized or any(t.index not in done for t in tasks):
        return None
    if workload.tasks_to_retry(store, tasks):
        return None
    summary = _summary(workload, store, plan, tasks, done, workers=0)
    summary.complete = True
    _add_recorded(summary, workload.recorded_failures(store, tasks), in_run=False)
    return summary


def run_job(workload: Workload, options: RunOptions, client, *, echo=print) -> RunSummary:
    """Run (or resume) one job on ``client``'s cluster and return its summary.

    Ctrl-C raises :class:`Interrupted`, which says how much of the job is complete.
    """
    workload.preflight()
    price = worker_price(options)  # a bad price setting fails before any task
    store = open_output(workload, options, echo)
    t_start, t_epoch = time.perf_counter(), time.time()
    plan = load_plan(workload, options.units_per_task, store)
    done = _completed(store, workload.job_id)
    # A complete job needs no cluster: the manifest is listed once, for both uses.
    if store is not None and store.exists(consolidated_manifest_key(workload.job_id)):
        finished = _finished(workload, store, plan, done)
        if finished is not None:
            return finished
    n_workers = _n_workers(client)
    known = plan.tasks(workload.n_units)
    if store is not None and done:
        # Complete tasks with units recorded as failed that a rerun calls again.
        done -= workload.tasks_to_retry(store, [t for t in known if t.index in done])
    if done:
        echo(
            f"resuming: {_units_in(known, done):,} of {workload.n_units:,} "
            f"{workload.unit_name}s already complete"
        )
    workload.prepare_cluster(client)
    try:
        with _progress(workload, options, _units_in(known, done)) as bar:
            run = _TaskRunner(workload, store, client, bar, profile=bool(options.profile_tasks))
            receipts = [] if plan.sized else _probe(run, plan, done, options, n_workers)
            tasks = plan.tasks(workload.n_units)
            ran = done | {r.index for r in receipts}
            receipts += run([t for t in tasks if t.index not in ran])
    except KeyboardInterrupt:
        complete = _units_in(plan.tasks(workload.n_units), _completed(store, workload.job_id))
        raise Interrupted(workload.job_id, complete, workload.n_units, workload.unit_name) from None

    summary = _summary(workload, store, plan, tasks, done, workers=n_workers)
    summary.wall_seconds = time.perf_counter() - t_start
    if options.profile_tasks:
        from .profiling import merge_profiles

        merged = merge_profiles(
            (r.profile for r in receipts), options.profile_tasks, workload.job_id
        )
        if merged:
            summary.details["task_profile"] = merged
    failures = [f for r in receipts for f in r.failures]
    summary.units_run = sum(r.units for r in receipts)
    summary.units_failed = summary.units_retryable = summary.units_failed_in_run = len(failures)
    summary.failures = [asdict(f) for f in failures]
    summary.bytes_written = sum(r.bytes_written for r in receipts)
    summary.busy_seconds = sum(r.busy_seconds for r in receipts)
    for r in receipts:
        for phase, seconds in r.phases.items():
            summary.phases[phase] = summary.phases.get(phase, 0.0) + seconds
    if summary.wall_seconds and receipts:
        summary.parallel_efficiency = summary.busy_seconds / (
            summary.wall_seconds * summary.workers
        )
    _reads(summary, receipts)
    fingerprints = [r.fingerprint for r in sorted(receipts, key=lambda r: r.index) if r.fingerprint]
    if fingerprints:
        summary.details["fingerprint"] = _combine(fingerprints)
    if not failures and len(receipts) + len(done) == len(tasks):
        summary.complete = True
        if store is not None:
            summary.details.update(workload.finalize(store, tasks))
            # Units that failed as data (a chunk whose fit failed is a row in the
            # models table, and its task is complete) count against --max-failures too,
            # including those of tasks skipped on resume.
            ran_now = {r.index for r in receipts}
            in_run = [t for t in tasks if t.index in ran_now]
            _add_recorded(summary, workload.recorded_failures(store, in_run), in_run=True)
            skipped = [t for t in tasks if t.index in done]
            _add_recorded(summary, workload.recorded_failures(store, skipped), in_run=False)
            # Attempts killed mid-write (a lost worker) left partial objects behind;
            # every task is now complete, so none of them is still being written.
            leftovers = store.discard_incomplete(workload.job_id)
            if leftovers:
                log.info("removed %d partial writes left by interrupted task attempts", leftovers)
    ok_units = summary.units_run - summary.units_failed_in_run
    summary.units_per_second = ok_units / summary.wall_seconds if summary.wall_seconds else 0.0
    summary.plan = {"probe_sizes": list(plan.head), "cost_model": plan.model}
    summary.task_timings = task_timings(receipts, t_epoch)
    add_run_cost(summary, price, remote=bool(options.scheduler))
    return summary


def _summary(workload, store, plan: Plan, tasks: list[Task], done: set[int], workers: int):
    return RunSummary(
        job_id=workload.job_id,
        workload=workload.kind,
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


def _units_in(tasks: list[Task], indices: set[int]) -> int:
    return sum(len(t.units) for t in tasks if t.index in indices)


def _add_recorded(summary: RunSummary, recorded: list[UnitFailure], *, in_run: bool) -> None:
    summary.units_failed += len(recorded)
    if summary.reruns_failed_units:
        summary.units_retryable += len(recorded)
    if in_run:
        summary.units_failed_in_run += len(recorded)
    summary.failures.extend(asdict(f) for f in recorded)


def _probe(run: _TaskRunner, plan: Plan, done: set[int], options: RunOptions, n_workers: int):
    """Run probe tasks until they measure the cost model, then cut the rest of ``plan``.

    Each round is one task per worker (a round is waited for: its tasks' durations
    size the next). A worker's first task also loads its inputs, so the first round
    of this run only warms up; the others pair small and large tasks. The scheduling
    cost per task is measured by a burst of no-op tasks (:func:`_task_overhead`).
    Returns the probes' receipts.
    """
    workload, n = run.workload, run.workload.n_units
    g = workload.granularity
    layout = unit_layout(workload)
    if not plan.head and is_small_job(n, n_workers):
        plan.stops = cut_tasks(layout, 0, CostModel(0.0, 1.0), n_workers, 1.0, rounds=1)
        save_plan(workload, run.store, plan)
        log.info("small job: %d %ss in %d tasks, unprobed", n, workload.unit_name, len(plan.stops))
        return []
    limit = max(g, probe_limit(n, n_workers, g))
    large = min(limit, LARGE_PROBE_FACTOR * g)
    # Probes an interrupted run recorded but did not finish come first (a warm-up).
    round_ = [t for t in plan.tasks(n) if t.index not in done]
    receipts: list[TaskReceipt] = []
    samples: list[ProbeSample] = []
    overhead = _task_overhead(run.client, n_workers)
    model, warm, rounds = None, False, 0
    while True:
        left = n - sum(plan.head)
        if not round_:
            if not left:
                break
            sizes = [min(g, left)] * min(n_workers, math.ceil(left / g))
            if warm:
                sizes = probe_round(g, large, n_workers, left)
            round_ = plan.add_probes(sizes)
            save_plan(workload, run.store, plan)
        got = run(round_)
        receipts += got
        timed = [r for r in got if r.complete and r.units]
        if not timed:
            break  # nothing to measure (failed units, or the cluster failing under us)
        if warm:
            ranges = {t.index: (t.start, t.stop) for t in round_}
            samples += [
                ProbeSample(
                    layout.weight(*ranges[r.index]), r.seconds, r.read_seconds, r.bytes_read
                )
                for r in timed
            ]
            model = fit_costs(samples, overhead)
            rounds += 1
            # Measured, not modelled: the largest probe's time beyond reading lasts
            # PROBE_SECONDS and twice the fixed part, so its per-unit part outweighs the
            # fixed one; and two rounds at least, since two points fit any line.
            biggest = max(samples, key=lambda p: p.units)
            work = biggest.seconds - biggest.read_seconds
            if large >= limit or (rounds >= 2 and work >= max(PROBE_SECONDS, 2 * model.fixed)):
                break
            large = next_large_probe(model.per_unit, model.fixed, large, limit, g)
        elif model is None:
            # Cold, so slower than the rest will be: only a fallback should no other
            # round run (the probes used up a small job).
            cold = [ProbeSample(layout.weight(*_span(round_, r)), r.seconds) for r in timed]
            model = fit_costs(cold)
        warm, round_ = True, []
    start = sum(plan.head)
    if model is None:  # nothing measured: several tasks per worker, to be safe
        plan.stops = cut_tasks(
            layout, start, CostModel(0.0, 1.0), n_workers, 1.0, rounds=MIN_TASKS_PER_WORKER
        )
    else:
        plan.stops = cut_tasks(layout, start, model, n_workers, options.task_seconds)
        plan.model = {k: float(f"{v:.4g}") for k, v in asdict(model).items()}
    save_plan(workload, run.store, plan)
    log.info(
        "%d probe tasks: %s; the other %d %ss in %d tasks (typically %d)",
        len(plan.head),
        _describe_model(model, workload.unit_name),
        n - start,
        workload.unit_name,
        len(plan.stops),
        plan.typical_size(n),
    )
    return receipts


def _noop(_i: int) -> None:
    return None


def _task_overhead(client, n_workers: int) -> float:
    """Seconds of scheduling per task on this cluster: a burst of no-op tasks, 4 per
    worker, submitted at once; its wall time over its tasks is what the scheduler,
    the network and the workers' task handling cost per task, the cost the probes'
    round trips hold, without joblib's per-call setup (scattering the workload) that
    a round of probes pays once."""
    count = max(20, 4 * n_workers)
    try:
        t0 = time.perf_counter()
        futures = client.map(_noop, range(count), pure=False)
        client.gather(futures)
        return (time.perf_counter() - t0) / count
    except Exception:  # the cluster failing: the probes will say so
        return 0.0


def _span(tasks: list[Task], receipt: TaskReceipt) -> tuple[int, int]:
    task = next(t for t in tasks if t.index == receipt.index)
    return task.start, task.stop


def _describe_model(model: CostModel | None, unit: str) -> str:
    if model is None:
        return "nothing measured"
    return (
        f"a task takes {model.fixed:.3g} s + {model.per_unit:.3g} s per {unit}"
        + (f" + {model.per_byte * 1e9:.3g} s per GB read" if model.per_byte else "")
        + f", and {model.overhead * 1e3:.3g} ms of scheduling"
    )


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


def _combine(fingerprints: list[str]) -> str:
    import xxhash

    return xxhash.xxh3_64_hexdigest("".join(fingerprints).encode())


@contextlib.contextmanager
def _progress(workload: Workload, options: RunOptions, units_done: int):
    from tqdm import tqdm

    show = options.progress if options.progress is not None else sys.stderr.isatty()
    bar = tqdm(
        total=workload.n_units - units_done,
        unit=workload.unit_name,
        unit_scale=True,
        disable=not show,
        file=sys.stderr,
        smoothing=0.1,
    )
    try:
        yield bar
    finally:
        bar.close()


#: Bytes of workload the tasks of one round may carry inside them (the scheduler
#: holds them until each task runs); beyond, they share one copy on the cluster.
INLINE_BYTES = 128 * 1024 * 1024


@dataclass
class _TaskRunner:
    """Runs lists of tasks as joblib tasks on the Dask backend, receipts unordered."""

    workload: Workload
    store: Store | None
    client: Any
    bar: Any
    profile: bool = False
    _shared: Any = None
    _pickled_bytes: int | None = None

    def _workload_for(self, tasks: list[Task]):
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
        small_round = len(tasks) <= 2 * _n_workers(self.client)
        if small_round or self._pickled_bytes * len(tasks) <= INLINE_BYTES:
            return self.workload
        if self._shared is None:
            self._shared = self.client.scatter(self.workload, hash=False)
        return self._shared

    def __call__(self, tasks: list[Task]) -> list[TaskReceipt]:
        from joblib import Parallel, delayed, parallel_config

        from ._joblib_dask import DaskBackend

        receipts: list[TaskReceipt] = []
        if not tasks:
            return receipts
        store_url = self.store.url if self.store is not None else None
        try:
            backend = DaskBackend(client=self.client, wait_for_workers_timeout=60, pure=False)
            backend.share(self.workload, self._workload_for(tasks))
            with parallel_config(backend=backend):
                results = Parallel(
                    n_jobs=-1,
                    return_as="generator_unordered",
                    batch_size=1,
                    pre_dispatch="3*n_jobs",
                )(delayed(execute_task)(self.workload, store_url, t, self.profile) for t in tasks)
                for receipt in results:
                    receipts.append(receipt)
                    self.bar.update(receipt.units)
        except Exception as exc:
            # The task wrapper never raises: this is the cluster failing under us (a
            # worker killed too often, the scheduler gone).
            if getattr(exc, "reason", None) == "scheduler-connection-lost":
                # Every task in flight is lost with the scheduler; those that completed
                # wrote their manifest entries, which is what a rerun resumes from.
                raise ClusterError(
                    f"lost the connection to the Dask scheduler at "
                    f"{self.client.scheduler.address} in the middle of the run (the scheduler "
                    f"or the way to it failed; {len(receipts)} of {len(tasks)} tasks reported "
                    "back, every completed task is stored): when the scheduler is reachable, "
                    "run the same command again: it resumes where this run stopped"
                ) from None
            # Every task not heard from is failed.
            seen = {r.index for r in receipts}
            receipts.extend(
                TaskReceipt(
                    t.index,
                    len(t.units),
                    tuple(UnitFailure.from_exception(u, exc) for u in t.units),
                    0,
                    0.0,
                    0.0,
                    "",
                )
                for t in tasks
                if t.index not in seen
            )
        return receipts
