"""A ``map`` task on a worker: its units' calls, their rows, and its parts.

Task ``i`` returns the rows of its units, in unit order, as its part of the table
``results`` (``<job>/results/part-NNNNNN.aXXXXXXXX.parquet``, which the runner writes) and the
units that raised (after ``retries`` more tries) as its part of ``failures``. A task
run again after some of its units failed calls those units alone, reads the input
of those alone (a dataset's row groups of the others are not read), and keeps the
others' rows.
"""

from __future__ import annotations

import itertools
import time
from typing import Any

import numpy as np
import pyarrow as pa

from ...layout import manifest_key
from ...manifest import entry_parts
from ...storage import Store, read_parquet_object
from ...workload import USER_ERRORS, Task, TaskOutput, UnitFailure
from .usercode import unit_seed

__all__ = ["recorded_failure", "run_map_task"]


def run_map_task(workload, task: Task, store: Store | None) -> TaskOutput:
    """Run ``task`` of ``workload`` (a :class:`.workload.MapWorkload`, which calls this)."""
    t0 = time.perf_counter()
    out = TaskOutput(phases={"compute": 0.0, "writing": 0.0})
    job_id, rows = workload.job_id, workload.rows
    kept, retry = _previous(store, job_id, task)
    pieces: dict[int, Any] = dict(kept)
    failed: list[dict] = []
    fn = workload.function()
    seed = workload.job.seed if workload.seeded else None
    reads = [0, 0, 0.0]  # a dataset's: bytes read, bytes its units hold, seconds
    for unit, args, kwargs in workload.input.calls(task.start, task.stop, retry, reads):
        if seed is not None:
            kwargs["seed"] = unit_seed(seed, unit)
        try:
            piece = rows.from_return(unit, fn(*args, **kwargs))
        except USER_ERRORS as exc:
            piece, failure = _call_again(workload, unit, args, kwargs, exc)
            if failure is not None:
                failed.append(failure)
        if piece is not None:
            pieces[unit] = piece
    # The receipt carries the bytes (a task run again for failed units reads theirs
    # alone); not the seconds, which the planner would take apart from the units' time
    # while the map's layout says nothing of the bytes a task reads.
    out.bytes_read, out.bytes_needed = reads[0], reads[1]
    results = rows.assemble(pieces, failed)
    if results is None:  # every unit returned None, or failed: a part of no rows
        results = rows.empty()
    failed.sort(key=lambda f: f["unit"])
    out.phases["compute"] = time.perf_counter() - t0
    # A part of failures only while units fail: a rerun's, once they succeed, goes
    out.tables = {"results": results, "failures": rows.failures(failed) if failed else None}
    out.recorded_failures = [recorded_failure(f, f["key"]) for f in failed]
    out.busy_seconds = time.perf_counter() - t0
    return out


def _call_again(workload, unit: int, args: tuple, kwargs: dict, error):
    """A unit whose first call raised: called up to ``retries`` more times; its rows,
    or its failure record."""
    attempt = 0
    for attempt in range(1, workload.job.retries + 1):  # noqa: B007 - reported below
        try:
            return workload.rows.from_return(unit, workload.function()(*args, **kwargs)), None
        except USER_ERRORS as exc:
            error = exc
    return None, workload.rows.failure(unit, error, attempt + 1)


def _previous(store: Store | None, job_id: str, task: Task):
    """The round before's rows (a task rerun for its failed units: ``task.round`` > 0),
    as tables of consecutive kept units (by their first unit), and the units it
    recorded as failed; or ({}, None) when there is none (then every unit runs)."""
    if store is None or not task.round:
        return {}, None
    parts = entry_parts(store, manifest_key(job_id, task.index, task.round - 1))
    failures_key = parts.get("failures")
    if failures_key is None:
        return {}, None
    retry = set(read_parquet_object(store, failures_key).column("unit").to_pylist())
    kept: dict[int, pa.Table] = {}
    results_key = parts.get("results")
    if results_key is not None:
        rows = read_parquet_object(store, results_key)
        units = rows.column("unit").to_numpy()  # ascending: a part is in unit order
        # Cut before each unit to run again (and after it): the stretches between
        # are kept whole, each a piece of the task's table in unit order
        cuts = sorted({0, len(units), *np.searchsorted(units, sorted(retry)).tolist(),
                       *np.searchsorted(units, sorted(retry), side="right").tolist()})  # fmt: skip
        for a, b in itertools.pairwise(cuts):
            if b > a and int(units[a]) not in retry:
                kept[int(units[a])] = rows.slice(a, b - a)
    return kept, retry


def recorded_failure(row: dict, key: str) -> UnitFailure:
    """A failures table's row (or the record it is written from) as a UnitFailure."""
    where = f" (at {row['where']})" if row.get("where") else ""
    return UnitFailure(row["unit"], row["error_type"], f"{row['message']}{where}", key)
