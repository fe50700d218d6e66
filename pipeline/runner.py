"""The runner: plan a job's tasks, skip the complete ones, run the rest as joblib
tasks on the Dask backend, stream receipts back unordered, and summarize."""

from __future__ import annotations

import json
import logging
import math
import socket
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from .config import RunOptions
from .errors import ConfigError
from .storage import Store, join, open_store, write_parquet
from .workload import Task, TaskOutput, TaskReceipt, UnitFailure, Workload, plan_tasks

__all__ = ["RunSummary", "run_job"]

log = logging.getLogger(__name__)

#: A calibration trial stops growing once it has run this long.
_CALIBRATION_SECONDS = 0.1
#: At least this many tasks per worker, so the last tasks do not leave workers idle.
_MIN_TASKS_PER_WORKER = 4


@dataclass
class RunSummary:
    job_id: str
    workload: str
    output: str | None
    units: int
    tasks: int
    units_per_task: int
    tasks_skipped: int
    units_run: int = 0
    units_failed: int = 0
    failures: list[dict] = field(default_factory=list)
    wall_seconds: float = 0.0
    units_per_second: float = 0.0
    bytes_written: int = 0
    busy_seconds: float = 0.0
    workers: int = 0
    parallel_efficiency: float | None = None
    complete: bool = False
    details: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True)


def manifest_key(job_id: str, index: int) -> str:
    return join(job_id, "manifest", f"part-{index:06d}.parquet")


def job_record_key(job_id: str) -> str:
    return join(job_id, "job.json")


def execute_task(workload: Workload, store_url: str | None, task: Task) -> TaskReceipt:
    """Worker: run one task; never raises, so joblib never aborts the run."""
    t0 = time.perf_counter()
    try:
        store = open_store(store_url) if store_url else None
        out = workload.run_task(task, store)
        if not out.failures and store is not None and out.manifest is not None:
            # Last, so that an entry exists only for a task whose data is all written.
            out.bytes_written += write_parquet(
                store, manifest_key(workload.job_id, task.index), out.manifest
            )
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
    )


def _calibrate(workload: Workload, store_url: str | None) -> float:
    """Worker: seconds per unit, from trials of growing size after a warm-up."""
    store = open_store(store_url) if store_url else None
    # Whole multiples of the granularity, so trials use the buffers tasks will use.
    step = workload.granularity
    n = min(workload.n_units, step)
    workload.trial(n, store)  # warm-up: loads inputs and libraries into this process
    while True:
        t0 = time.perf_counter()
        workload.trial(n, store)
        elapsed = time.perf_counter() - t0
        if elapsed >= _CALIBRATION_SECONDS or n >= workload.n_units:
            return elapsed / n
        # Aim the next trial just past the threshold: growing by a fixed factor would
        # overshoot it by up to that factor, and calibration is time no task runs.
        grow = min(100.0, 1.5 * _CALIBRATION_SECONDS / max(elapsed, 1e-6))
        n = min(workload.n_units, _round_up(max(n + 1, math.ceil(n * grow)), step))


def _seconds_per_unit(workload: Workload, store: Store | None, client) -> float:
    """Calibrate on every worker at once, side by side as the tasks will run: each
    worker's warm-up (loading inputs) then overlaps the others' instead of delaying
    its first task, and the rate is measured under the same contention."""
    store_url = store.url if store is not None else None
    workers = list(client.scheduler_info(n_workers=-1)["workers"])
    futures = [
        client.submit(
            _calibrate, workload, store_url, pure=False, workers=[w], allow_other_workers=True
        )
        for w in workers
    ] or [client.submit(_calibrate, workload, store_url, pure=False)]
    return statistics.median(client.gather(futures))


def size_tasks(
    seconds_per_unit: float,
    n_units: int,
    n_workers: int,
    task_seconds: float,
    granularity: int = 1,
) -> int:
    """Units per task (a multiple of ``granularity``) so a task lasts about
    ``task_seconds``, with enough tasks to keep every worker busy, and the tasks
    falling into whole rounds of ``n_workers`` so no worker idles at the end."""
    by_time = max(1, round(task_seconds / max(seconds_per_unit, 1e-9)))
    by_balance = max(1, math.ceil(n_units / (n_workers * _MIN_TASKS_PER_WORKER)))
    longest = _round_up(min(by_time, by_balance), granularity)

    def finish(units_per_task: int) -> int:
        # Units done by the busiest worker when tasks of equal speed are handed out in
        # rounds: the run's wall time, in units.
        rounds = math.ceil(math.ceil(n_units / units_per_task) / n_workers)
        return rounds * units_per_task

    # Shorter tasks cost scheduler overhead, so look no lower than half the longest.
    candidates = range(longest, max(granularity, longest // 2) - 1, -granularity)
    best = min(finish(u) for u in candidates)
    # Of the near-best, the longest: fewer tasks for the same finish.
    return next(u for u in candidates if finish(u) <= best * 1.01)


def _round_up(n: int, multiple: int) -> int:
    return math.ceil(n / multiple) * multiple


def _n_workers(client) -> int:
    return max(1, sum(client.ncores().values()))


def _resolve_plan(workload: Workload, options: RunOptions, store: Store | None, client) -> int:
    """Units per task: the recorded plan when resuming, else the flag or a calibration."""
    record = None
    if store is not None and store.exists(job_record_key(workload.job_id)):
        record = json.loads(store.read_bytes(job_record_key(workload.job_id)))
        if record.get("fingerprint") != workload.fingerprint():
            changed = sorted(
                k
                for k in set(record.get("fingerprint", {})) | set(workload.fingerprint())
                if record.get("fingerprint", {}).get(k) != workload.fingerprint().get(k)
            )
            raise ConfigError(
                f"{store.describe(workload.job_id)} holds job {workload.job_id!r} with other "
                f"settings ({', '.join(changed)}); use --overwrite to replace it, or another "
                "--output or name"
            )
        recorded = record["units_per_task"]
        if (
            options.units_per_task
            and _round_up(options.units_per_task, workload.granularity) != recorded
        ):
            raise ConfigError(
                f"--units-per-task {options.units_per_task}: the output at "
                f"{store.describe(workload.job_id)} was planned with {recorded} units per "
                "task; resume with that, or use --overwrite"
            )
        return recorded
    if options.units_per_task:
        units_per_task = _round_up(options.units_per_task, workload.granularity)
    else:
        spu = _seconds_per_unit(workload, store, client)
        units_per_task = size_tasks(
            spu, workload.n_units, _n_workers(client), options.task_seconds, workload.granularity
        )
        log.info("calibration: %.3g s per %s, %d per task", spu, workload.unit_name, units_per_task)
    if store is not None:
        record = {
            "workload": workload.kind,
            "job_id": workload.job_id,
            "fingerprint": workload.fingerprint(),
            "units_per_task": units_per_task,
            "units": workload.n_units,
        }
        store.write_bytes(
            job_record_key(workload.job_id), json.dumps(record, indent=2, sort_keys=True).encode()
        )
    return units_per_task


def _completed(store: Store | None, job_id: str) -> set[int]:
    if store is None:
        return set()
    done = set()
    for key in store.list(join(job_id, "manifest")):
        name = key.rsplit("/", 1)[-1]
        if name.startswith("part-") and name.endswith(".parquet"):
            done.add(int(name[5:-8]))
    return done


def run_job(workload: Workload, options: RunOptions, client, *, echo=print) -> RunSummary:
    """Run (or resume) one job on ``client``'s cluster and return its summary."""
    workload.preflight()
    store = None
    if workload.writes_output:
        store = open_store(options.output)
        store.preflight()
        if options.overwrite:
            removed = store.delete_prefix(workload.job_id)
            removed += store.discard_incomplete(workload.job_id)
            if removed:
                echo(f"--overwrite: removed {removed} objects of {store.describe(workload.job_id)}")
    t_start = time.perf_counter()
    units_per_task = _resolve_plan(workload, options, store, client)
    tasks = plan_tasks(workload.n_units, units_per_task)
    done = _completed(store, workload.job_id)
    pending = [t for t in tasks if t.index not in done]
    summary = RunSummary(
        job_id=workload.job_id,
        workload=workload.kind,
        output=store.describe(workload.job_id) if store else None,
        units=workload.n_units,
        tasks=len(tasks),
        units_per_task=units_per_task,
        tasks_skipped=len(tasks) - len(pending),
        workers=_n_workers(client),
    )
    if summary.tasks_skipped:
        echo(f"resuming: {summary.tasks_skipped} of {len(tasks)} tasks already complete, skipped")

    receipts = _run_tasks(workload, store, pending, options, client)
    summary.wall_seconds = time.perf_counter() - t_start
    failures = [f for r in receipts for f in r.failures]
    summary.units_run = sum(r.units for r in receipts)
    summary.units_failed = len(failures)
    summary.failures = [asdict(f) for f in failures]
    summary.bytes_written = sum(r.bytes_written for r in receipts)
    summary.busy_seconds = sum(r.busy_seconds for r in receipts)
    ok_units = summary.units_run - summary.units_failed
    summary.units_per_second = ok_units / summary.wall_seconds if summary.wall_seconds else 0.0
    if summary.wall_seconds and receipts:
        summary.parallel_efficiency = summary.busy_seconds / (
            summary.wall_seconds * summary.workers
        )
    fingerprints = [r.fingerprint for r in sorted(receipts, key=lambda r: r.index) if r.fingerprint]
    if fingerprints:
        summary.details["fingerprint"] = _combine(fingerprints)
    if not failures and len(receipts) == len(pending):
        summary.complete = True
        if store is not None:
            details = workload.finalize(store, tasks)
            # Units that failed as data (a chunk whose fit failed is a row in the
            # models table, and its task is complete) count against --max-failures too,
            # including those of tasks skipped on resume.
            recorded = details.pop("recorded_failures", [])
            summary.units_failed += len(recorded)
            summary.failures.extend(asdict(f) for f in recorded)
            summary.details.update(details)
            # Attempts killed mid-write (a lost worker) left partial objects behind;
            # every task is now complete, so none of them is still being written.
            leftovers = store.discard_incomplete(workload.job_id)
            if leftovers:
                echo(f"removed {leftovers} partial writes left by interrupted task attempts")
    return summary


def _combine(fingerprints: list[str]) -> str:
    import xxhash

    return xxhash.xxh3_64_hexdigest("".join(fingerprints).encode())


def _run_tasks(
    workload: Workload, store: Store | None, pending: list[Task], options: RunOptions, client
) -> list[TaskReceipt]:
    from joblib import Parallel, delayed, parallel_config

    from ._joblib_dask import DaskBackend

    receipts: list[TaskReceipt] = []
    if not pending:
        return receipts
    show = options.progress if options.progress is not None else sys.stderr.isatty()
    from tqdm import tqdm

    bar = tqdm(
        total=sum(len(t.units) for t in pending),
        unit=workload.unit_name,
        unit_scale=True,
        disable=not show,
        file=sys.stderr,
        smoothing=0.1,
    )
    store_url = store.url if store is not None else None
    try:
        backend = DaskBackend(client=client, wait_for_workers_timeout=60, pure=False)
        with parallel_config(backend=backend):
            results = Parallel(
                n_jobs=-1, return_as="generator_unordered", batch_size=1, pre_dispatch="3*n_jobs"
            )(delayed(execute_task)(workload, store_url, t) for t in pending)
            for receipt in results:
                receipts.append(receipt)
                bar.update(receipt.units)
    except Exception as exc:
        # The task wrapper never raises: this is the cluster failing under us (a worker
        # killed too often, the scheduler gone). Every task not heard from is failed.
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
            for t in pending
            if t.index not in seen
        )
    finally:
        bar.close()
    return receipts
