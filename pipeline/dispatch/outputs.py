"""A task's tables and files, written on its worker and listed in its manifest entry.

A workload returns what its task made (``TaskOutput.tables``, ``TaskOutput.files``);
the runner writes each object, takes its checksum, and builds the entry that lists
them (:func:`pipeline.manifest.task_entry`), which it writes last: every workload's
entries are built one way, and a task is its units' work alone.
"""

from __future__ import annotations

from ..layout import attempt_key, part_key
from ..manifest import checksum, stored_checksum, task_entry
from ..storage import Store
from ..workload import Task, TaskOutput, Workload

__all__ = ["write_outputs"]


def write_outputs(workload: Workload, task: Task, out: TaskOutput, store: Store) -> list[str]:
    """Write ``out``'s tables, each as the part ``<job>/<kind>/part-NNNNNN.aXXXXXXXX.parquet``
    (``Workload.results.table_bytes``; ``XXXXXXXX`` the task's attempt), then its files, in
    the order given, each named with the attempt too; set ``out.manifest`` to the
    entry that lists them; return the keys written. A table given as None has no
    part. An output that gives neither tables nor files (a manifest of its own) is
    left as it is."""
    if not out.tables and not out.files:
        return []
    objects = []
    written: list[str] = []
    for kind, table in out.tables.items():
        if table is None:
            continue
        key = attempt_key(part_key(workload.job_id, kind, task.index), task.attempt)
        data = workload.results.table_bytes(kind, table)
        written.append(key)
        out.bytes_written += store.write_bytes(key, data)
        objects.append((key, kind, task.start, task.stop, len(data), checksum(data)))
    for file in out.files:
        units = task.units if file.units is None else file.units
        key = file.key
        if file.data is None:  # written by the task itself
            size, digest = stored_checksum(store, key)
        else:
            key = attempt_key(key, task.attempt)
            written.append(key)
            out.bytes_written += store.write_bytes(key, file.data)
            size, digest = len(file.data), checksum(file.data)
        objects.append((key, file.kind, units.start, units.stop, size, digest))
    out.manifest = task_entry(workload.results.manifest_columns, objects)
    return written
