"""``pipeline verify``: check a job's output against its manifest.

Every object the manifest lists must exist, every checksum must match the bytes
read back, every unit must be listed exactly once, and nothing else may sit under
the job's prefix but its own bookkeeping. The checks of a manifest that lists
objects with checksums and unit ranges are generic
(:func:`pipeline.manifest.check_listed_objects`); a workload with a manifest of its
own kind overrides ``TableResults.verify_job``.

Verify holds per-task state, never per-unit: the units' coverage is worked out from
the manifest's ranges (units missing or listed twice are reported as ranges), and
each object is read and checksummed ``pipeline.manifest.READ_BYTES`` at a time, so
its memory does not grow with the job's units nor with the size of its parts.
"""

from __future__ import annotations

import bisect
import os
import re
import socket
from collections.abc import Sequence
from dataclasses import dataclass, field

from . import registry
from .coverage import UnitRanges
from .errors import InputError, UnreadableObject
from .layout import (
    consolidated_manifest_key,
    current_entries,
    job_folder,
    job_records,
    lock_key,
    manifest_key,
    read_job_record,
    task_index,
    task_parts,
    written_by_attempt,
)
from .manifest import UNIT_RANGE, tasks_by_code
from .storage import Store, join, open_store, read_parquet_object
from .workload import Task

__all__ = ["JobCheck", "read_manifest", "repair_job", "verify_output"]


@dataclass
class JobCheck:
    job_id: str
    workload: str
    units_expected: int = 0
    units_ok: int = 0
    objects_checked: int = 0
    missing: list[str] = field(default_factory=list)
    extra: list[str] = field(default_factory=list)
    corrupt: list[str] = field(default_factory=list)
    duplicated: list[str] = field(default_factory=list)
    incomplete: str | None = None
    #: The first unit of each manifest entry whose objects are missing or corrupt:
    #: their tasks are what ``repair`` marks to run again.
    damaged_units: set[int] = field(default_factory=set)
    #: Every unit of those entries: not counted in ``units_ok``.
    unverified: UnitRanges = field(default_factory=UnitRanges)
    #: The consolidated manifest is there but unreadable (``repair`` removes it).
    damaged_manifest: bool = False
    #: Tasks' manifest entries that are not readable tables: ``repair`` removes them,
    #: so that their tasks run again.
    damaged_entries: list[str] = field(default_factory=list)
    #: The tasks ``repair`` marked to run again.
    repaired: list[Task] = field(default_factory=list)
    #: Units the output records as failed as data (not damage: ``ok`` stands), and the
    #: table that lists them (``TableResults.failures_table``).
    failed_units: int = 0
    failures_table: str | None = None
    #: Whether the job's next run calls them again (``Workload.reruns_failed_units``).
    reruns_failed_units: bool = False
    #: Tasks by the code version(s) their entry names (:mod:`pipeline.manifest`).
    code_versions: dict[str, int] = field(default_factory=dict)
    #: Objects named by a task attempt that no entry lists: left by attempts that lost
    #: (or failed) and ended before removing them; not damage (``ok`` stands), and the
    #: next complete run of the job removes them.
    leftovers: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (
            self.missing or self.extra or self.corrupt or self.duplicated or self.incomplete
        )


def verify_output(
    url: str, job_ids: list[str] | None = None, *, repair: bool = False
) -> list[JobCheck]:
    """Check every job under ``url`` (or only ``job_ids``), or the job whose own folder
    ``url`` is. With ``repair``, the tasks whose objects are missing or corrupt are
    marked to run again (:func:`repair_job`)."""
    if not job_ids:
        url, job = job_folder(url)
        job_ids = [job] if job else None
    store = open_store(url)
    found = job_records(store)
    if job_ids:
        absent = sorted(set(job_ids) - set(found))
        if absent:
            raise InputError(
                f"{store.url}: no job {', '.join(absent)} (found: "
                f"{', '.join(sorted(found)) or 'none'})"
            )
        found = {j: found[j] for j in job_ids}
    if not found:
        raise InputError(f"{store.url}: no job output here (no <job>/job.json)")
    checks = []
    for job_id, key in sorted(found.items()):
        record = read_job_record(store, key)
        workload = _workload_class(record["workload"])
        check = JobCheck(job_id, record["workload"], units_expected=record["units"])
        manifest = read_manifest(store, job_id, check)
        if not (check.incomplete or check.damaged_manifest):
            check.incomplete = _entries_missing(store, job_id, record)
        results = workload.results
        listed = results.verify_job(store, job_id, record, manifest, check)
        _count_failures(workload, store, job_id, manifest, check)
        check.code_versions = tasks_by_code(manifest, results.manifest_columns)
        own = results.final_objects
        unlisted = unlisted_objects(store, job_id, listed, own)
        left = [k for k in unlisted if written_by_attempt(job_id, k)]
        check.extra = [store.describe(k) for k in unlisted if k not in left]
        check.leftovers = [store.describe(k) for k in left]
        if repair and (check.damaged_units or check.damaged_manifest or check.damaged_entries):
            check.repaired = repair_job(
                store,
                job_id,
                record,
                manifest,
                check.damaged_units,
                check.damaged_entries,
                columns=results.manifest_columns,
            )
        checks.append(check)
    return checks


def _workload_class(kind: str):
    """The class that checks a job of ``kind``: a registered workload's, or the joblib
    backend's for the results it keeps (docs/joblib.md), which is no job kind."""
    from .joblib.calls import CallsWorkload

    return CallsWorkload if kind == CallsWorkload.kind else registry.load(kind)


def _count_failures(workload, store: Store, job_id: str, manifest, check: JobCheck) -> None:
    """The units that failed as data, from the parts of the workload's failures table
    its manifest lists: verify said "OK: 6 of 6 units verified" of a job whose run
    had exited 1 for 2 of them, and nothing of them."""
    table = workload.results.failures_table
    if not table or manifest is None or not {"kind", "object"} <= set(manifest.columns):
        return
    parts = sorted(set(manifest.loc[manifest["kind"] == table, "object"]))
    if parts:
        check.failed_units = workload.results.count_failures(store, job_id, parts)
        check.failures_table = table
        check.reruns_failed_units = bool(getattr(workload, "reruns_failed_units", False))


def repair_job(
    store: Store,
    job_id: str,
    record: dict,
    manifest,
    damaged: set[int],
    entries=(),
    columns: Sequence[str | None] = UNIT_RANGE,
) -> list[Task]:
    """Mark the tasks holding the ``damaged`` units to run again: their objects (all of
    them, so a task reruns whole: a ``map`` task with recorded failures would
    otherwise rerun only those) and their manifest entries are deleted, and the job's
    consolidated manifest with them, so the next run of the job's command resumes
    with those tasks alone and writes the bytes they wrote before. So are the
    unreadable manifest ``entries`` (keys), whose tasks then run again too. Under the
    job's lock: not while a run of the job is writing it."""
    from .errors import JobRunning
    from .planning.plan import Plan

    plan = Plan.from_record(record)
    tasks = plan.tasks
    starts = [t.start for t in tasks]
    hit: set[Task] = set()
    for u in damaged:
        task = tasks[bisect.bisect_right(starts, u) - 1] if starts else None
        if task is not None and task.start <= u < task.stop:
            hit.add(task)
    keys, unit = columns[0], columns[1]
    if manifest is None or unit not in manifest.columns or keys not in manifest.columns:
        hit = set()  # a manifest of the workload's own kind: not one this can map to tasks
        if not entries:
            return []
    by_index = {t.index: t for t in tasks}
    unread = [by_index[i] for i in map(task_index, entries) if i in by_index]
    owner = f"pipeline verify --repair, pid {os.getpid()} on {socket.gethostname()}"

    def entries_of(index: int) -> list[str]:  # every round's
        return [k for k in store.list(join(job_id, "manifest")) if task_index(k) == index]

    try:
        with store.hold(lock_key(job_id), owner):
            store.delete_prefix(consolidated_manifest_key(job_id))
            for key in entries:
                store.delete_prefix(key)
            # (after their entries) the tasks' parts, which a task run again may keep (a
            # map task keeps the units it did not fail): unverified, none is kept
            for key in task_parts(store, job_id, {task.index for task in unread}):
                store.delete_prefix(key)
            for task in sorted(hit, key=lambda t: t.index):
                # The entry first: a repair stopped midway leaves a task to rerun, never
                # an entry that lists deleted objects.
                for entry in entries_of(task.index):
                    store.delete_prefix(entry)
                mine = manifest[(manifest[unit] >= task.start) & (manifest[unit] < task.stop)]
                for key in sorted(set(mine[keys])):
                    store.delete_prefix(key)
    except BlockingIOError as exc:
        raise JobRunning(
            f"job {job_id!r} in {store.url} is running ({exc.strerror}): repair it once "
            "that run has ended"
        ) from None
    return sorted(hit | set(unread), key=lambda t: t.index)


def _entries_missing(store: Store, job_id: str, record: dict) -> str | None:
    """A complete job whose tasks' manifest entries are not all there (one deleted, a
    partial copy of the output): its next run reruns those tasks, and ``results``
    leaves their rows out, so it is not complete whatever its manifest.parquet says."""
    from .planning.plan import missing_tasks

    missing = missing_tasks(store, job_id, record)
    if not missing:
        return None
    where = ", ".join(store.describe(manifest_key(job_id, t.index)) for t in missing[:3])
    more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
    units = sum(t.stop - t.start for t in missing)
    return (
        f"{len(missing)} tasks' manifest entries are missing ({where}{more}): their "
        f"{units:,} units are not part of the job's tables; run the job again to run them"
    )


#: Objects a job writes about itself besides what its manifests list.
_BOOKKEEPING = ("job.json", "manifest.parquet")


def unlisted_objects(store: Store, job_id: str, listed: set[str], own=()) -> list[str]:
    """Every object under the job's prefix that no manifest lists and that is not the
    job's own bookkeeping (its record, its manifests, ``own`` names), sorted."""
    names = {join(job_id, name) for name in (*_BOOKKEEPING, *own)}
    parts = re.compile(re.escape(join(job_id, "manifest")) + r"/part-\d{6}(\.r\d+)?\.parquet")
    return [
        k
        for k in store.list(job_id)
        if k not in listed and k not in names and not parts.fullmatch(k)
    ]


def read_manifest(store: Store, job_id: str, check: JobCheck):
    """The consolidated manifest as a DataFrame, or (for a run that has not completed)
    its task entries, noting that in ``check``; None when there is none."""
    key = consolidated_manifest_key(job_id)
    if store.exists(key):
        try:
            return read_parquet_object(store, key).to_pandas(use_threads=False)
        except UnreadableObject as exc:
            # Damaged after its run: the tasks' entries still say what was written; the
            # next run (after --repair removes it) writes it again from them.
            check.corrupt.append(str(exc))
            check.damaged_manifest = True
    parts = sorted(current_entries(store.list(join(job_id, "manifest"))).values())
    if check.damaged_manifest:
        parts = [p for p in parts if p != key]
    if not check.damaged_manifest:
        check.incomplete = (
            f"no manifest.parquet: the run has not completed "
            f"({len(parts)} task entries present); run the job again to finish it (it says "
            "why, if its last step failed)"
        )
    if not parts:
        return None
    import pandas as pd

    entries = []
    for p in parts:
        try:
            entries.append(read_parquet_object(store, p).to_pandas(use_threads=False))
        except UnreadableObject as exc:
            # (its task's units are then missing: --repair removes it to run the task again)
            check.corrupt.append(str(exc))
            check.damaged_entries.append(p)
    return pd.concat(entries, ignore_index=True) if entries else None
