"""A task's tables and files, written on its worker and listed in its manifest entry.

A workload returns what its task made (``TaskOutput.tables``, ``TaskOutput.files``);
the runner writes each object, takes its checksum, and builds the entry that lists
them (:func:`pipeline.manifest.task_entry`), which it writes last: every workload's
entries are built one way, and a task is its units' work alone.
"""

from __future__ import annotations

from ..layout import part_key
from ..manifest import checksum, stored_checksum, task_entry
from ..storage import Store
from ..workload import Task, TaskOutput, Workload

__all__ = ["write_outputs"]


def write_outputs(workload: Workload, task: Task, out: TaskOutput, store: Store) -> None:
    """Write ``out``'s tables, each as the part ``<job>/<kind>/part-NNNNNN.parquet``
    (:meth:`Workload.table_bytes`), then its files, in the order given; set
    ``out.manifest`` to the entry that lists them. A table given as None has no part:
    one an earlier attempt of the task wrote is deleted, after the others are written
    (until its entry is rewritten, a task's old entry lists it). An output that gives
    neither tables nor files (a manifest of its own) is left as it is."""
    if not out.tables and not out.files:
        return
    objects = []
    for kind, table in out.tables.items():
        key = part_key(workload.job_id, kind, task.index)
        if table is None:
            store.delete_prefix(key)
            continue
        data = workload.table_bytes(kind, table)
        out.bytes_written += store.write_bytes(key, data)
        objects.append((key, kind, task.start, task.stop, len(data), checksum(data)))
    for file in out.files:
        units = task.units if file.units is None else file.units
        if file.data is None:  # written by the task itself
            size, digest = stored_checksum(store, file.key)
        else:
            out.bytes_written += store.write_bytes(file.key, file.data)
            size, digest = len(file.data), checksum(file.data)
        objects.append((file.key, file.kind, units.start, units.stop, size, digest))
    out.manifest = task_entry(workload.manifest_columns, objects)
