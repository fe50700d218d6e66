"""A task's outputs committed once, whatever runs it twice.

A task can run more than once at the same time or one after another: a copy of a
task overdue (its original still running: a Dask task's thread cannot be stopped), a
rerun after its worker or its driver was lost while the first still runs, a
function that is not deterministic. So each run of a task (an *attempt*) names the
objects it writes with an id of its own
(:func:`pipeline.layout.attempt_key`; the runner names tables' parts so, a workload
that writes objects itself names them so too: cube shards): no attempt writes over
another's. Its manifest
entry, which lists them, is then created once (:meth:`Store.create_once`: an
exclusive link on a local disk, ``If-None-Match: *`` on S3), so of the attempts
that complete, the first to commit wins: its entry names objects all written by
it, and nothing another attempt does afterwards touches them. An attempt that
loses (or fails units, so commits
nothing) removes what it wrote; its receipt says it lost.

An attempt killed between writing and committing leaves objects no entry lists;
:func:`sweep_leftovers` removes them once the job is complete, and ``pipeline
verify`` names them as leftovers, not as damage.

A complete task rerun for its units recorded as failed (``Task.round`` > 0) commits
its entry of the next round, created once too, and then supersedes the round
before: that entry first, then the objects it listed that the new one does not.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import secrets
from collections.abc import Iterable

from ..errors import UnreadableObject
from ..layout import (
    attempt_of,
    consolidated_manifest_key,
    entry_round,
    manifest_key,
    written_by_attempt,
)
from ..storage import Store, read_parquet_object
from ..workload import Task, Workload

__all__ = [
    "commit_entry",
    "discard",
    "entry_objects",
    "leftovers",
    "new_attempt",
    "next_rounds",
    "objects_of",
    "supersede",
    "sweep_leftovers",
    "with_rounds",
]


def new_attempt() -> str:
    """A fresh attempt id: 8 hex digits (32 random bits; a task runs a few times)."""
    return secrets.token_hex(4)


def objects_of(workload: Workload, manifest) -> list[str]:
    """The keys an entry (a ``pyarrow.Table``) lists, in its object column."""
    column = workload.results.manifest_columns[0]
    if manifest is None or column not in manifest.column_names:
        return []
    return sorted({k for k in manifest.column(column).to_pylist() if k})


def commit_entry(store: Store, workload: Workload, task: Task, manifest) -> int:
    """Create the task's entry (of its round) listing ``manifest``'s objects, unless
    another attempt's is there: its size in bytes when this attempt won, else 0. A
    winner of a round > 0 then supersedes the round before."""
    import pyarrow.parquet as pq

    sink = io.BytesIO()
    pq.write_table(manifest, sink)
    data = sink.getvalue()
    if not store.create_once(manifest_key(workload.job_id, task.index, task.round), data):
        return 0
    if task.round:
        supersede(store, workload, task, set(objects_of(workload, manifest)))
    return len(data)


def next_rounds(store: Store, job_id: str, indices) -> dict[int, int]:
    """Task index -> the round its rerun commits (one past its current entry's), for
    the complete tasks ``indices`` that run again for their units recorded as failed."""
    from ..manifest import entry_keys

    if not indices:
        return {}
    current = entry_keys(store, job_id)
    return {i: entry_round(current[i]) + 1 for i in indices if i in current}


def with_rounds(tasks, rounds: dict[int, int]) -> list[Task]:
    """``tasks``, each in the round ``rounds`` gives its index (0 where none does): the
    entry round it commits, a complete task rerun for its units recorded as failed."""
    return [dataclasses.replace(t, round=rounds[t.index]) if t.index in rounds else t
            for t in tasks]  # fmt: skip


def entry_objects(store: Store, workload: Workload, task: Task, round: int) -> list[str] | None:
    """The objects the task's entry of ``round`` lists; None when there is none."""
    try:
        entry = read_parquet_object(store, manifest_key(workload.job_id, task.index, round))
    except FileNotFoundError:
        return None
    return objects_of(workload, entry)


def supersede(store: Store, workload: Workload, task: Task, keep: set[str]) -> None:
    """Remove the task's entries of the rounds before its own, each before the objects
    it listed (but those in ``keep``): no entry is left listing a removed object."""
    for round in range(task.round):
        listed = entry_objects(store, workload, task, round)
        if listed is None:
            continue
        store.delete_prefix(manifest_key(workload.job_id, task.index, round))
        job = workload.job_id
        _delete(store, (k for k in listed if k not in keep and written_by_attempt(job, k)))


def discard(store: Store, keys: Iterable[str]) -> None:
    """Delete those of ``keys`` named by an attempt (an attempt's own objects, which no
    entry lists), as far as it can: one it cannot delete is a leftover the next
    complete run sweeps. An object not named by an attempt (0.2.0's names) may be
    listed by another attempt's entry, so it stays."""
    _delete(store, (k for k in keys if attempt_of(k) is not None))


def _delete(store: Store, keys: Iterable[str]) -> None:
    for key in keys:
        with contextlib.suppress(OSError):
            store.delete_prefix(key)


def leftovers(store: Store, job_id: str, listed: set[str]) -> list[str]:
    """The objects under the job written by task attempts (:func:`written_by_attempt`)
    that no entry lists (``listed``: the keys the job's entries list): those of
    attempts that lost or failed and ended before removing them (or, from an output
    0.2.0 wrote, of a task that never committed)."""
    return [k for k in store.list(job_id) if k not in listed and written_by_attempt(job_id, k)]


def sweep_leftovers(store: Store, workload: Workload) -> int:
    """Delete a complete job's :func:`leftovers`, the keys its consolidated manifest
    lists kept; how many. Only once every task is complete: an attempt still running
    then can only lose, and removes what it writes itself."""
    column = workload.results.manifest_columns[0]
    try:
        manifest = read_parquet_object(store, consolidated_manifest_key(workload.job_id), [column])
    except (FileNotFoundError, UnreadableObject):
        return 0
    listed = set(objects_of(workload, manifest))
    found = leftovers(store, workload.job_id, listed)
    _delete(store, found)
    return len(found)
