"""Manifests: what a job's output holds, listed with checksums.

Each task writes its entry (``<job>/manifest/part-NNNNNN.parquet``) last, once its
objects are written; a complete job's entries are consolidated into
``<job>/manifest.parquet``. An entry lists objects (``object``, ``kind``), the units
each holds (a range: ``unit_start``, ``unit_stop``, or columns a workload names in
``Workload.manifest_columns``) and the :func:`checksum` of its bytes, which
``pipeline verify`` compares with what it reads back.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from .coverage import unit_coverage, units_text
from .layout import (
    consolidated_manifest_key,
    current_entries,
    manifest_key,
    manifest_prefix,
    task_index,
)
from .storage import Store, join, read_parquet_tables, write_parquet

if TYPE_CHECKING:
    from .workload import Task

__all__ = [
    "READ_BYTES",
    "UNIT_RANGE",
    "check_listed_objects",
    "checksum",
    "consolidate_manifest",
    "entry_keys",
    "entry_parts",
    "listed_parts",
    "manifest_entries",
    "stored_checksum",
    "summed_fingerprint",
    "task_entry",
]

#: The columns of an entry's object and its units' range, unless a workload names others.
UNIT_RANGE = ("object", "unit_start", "unit_stop")


def checksum(data) -> str:
    """The checksum a manifest entry lists for an object (its ``checksum`` column): the
    xxh3_64 of its bytes (or of any buffer), 16 hex digits. ``pipeline verify``
    compares it with the bytes it reads back; the runner refuses an entry whose
    checksums are not of this form."""
    import xxhash

    return xxhash.xxh3_64_hexdigest(data)


def summed_fingerprint(values: Iterable[int]) -> str:
    """A fingerprint of units, or of tasks' fingerprints: the sum of 64-bit values
    modulo 2**64, in hex, whatever their order or grouping."""
    return f"{sum(values) & 0xFFFF_FFFF_FFFF_FFFF:016x}"


def task_entry(columns: Sequence[str | None], objects: Sequence[tuple]):
    """A task's manifest entry listing ``objects``, each ``(key, kind, first unit, the
    unit past its last, size, checksum)``, in that order: the entry the runner writes
    for the tables and files a task returns. ``columns``: the workload's
    ``manifest_columns``, naming the object's column and the range's."""
    import pyarrow as pa

    key, start, stop = columns
    return pa.table(
        {
            key: pa.array([o[0] for o in objects], pa.string()),
            "kind": pa.array([o[1] for o in objects], pa.string()),
            start: pa.array([o[2] for o in objects], pa.int64()),
            stop: pa.array([o[3] for o in objects], pa.int64()),
            "size": pa.array([o[4] for o in objects], pa.int64()),
            "checksum": pa.array([o[5] for o in objects], pa.string()),
        }
    )


def stored_checksum(store: Store, key: str) -> tuple[int, str]:
    """The size and :func:`checksum` of a stored object, read :data:`READ_BYTES` at a
    time."""
    import xxhash

    digest, size = xxhash.xxh3_64(), 0
    with store.open_input(key) as f:
        while block := f.read(READ_BYTES):
            digest.update(block)
            size += len(block)
    return size, digest.hexdigest()


def entry_keys(store: Store, job_id: str) -> dict[int, str]:
    """Task index -> the key of its current entry (its latest round), from one listing."""
    return current_entries(store.list(manifest_prefix(job_id)))


def listed_parts(store: Store, job_id: str, kind: str, indices) -> dict[int, str]:
    """Task index -> the part of table ``kind`` its current entry lists, for the tasks
    ``indices`` that have one. Parts are named by the attempt that wrote them, and a
    leftover of an attempt that lost may lie beside one: the entry says which. Only
    the entries of tasks with a part of that table are read."""
    wanted = set(indices)
    candidates = {task_index(k) for k in store.list(join(job_id, kind))} & wanted
    if not candidates:
        return {}
    entries = entry_keys(store, job_id)
    found: dict[int, str] = {}
    have = sorted(i for i in candidates if i in entries)
    tables = read_parquet_tables(store, [entries[i] for i in have])
    for index, entry in zip(have, tables, strict=True):
        obj = _parts_of(entry).get(kind)
        if obj is not None:
            found[index] = obj
    return found


def entry_parts(store: Store, key: str) -> dict[str, str]:
    """Kind -> object, of the entry at ``key`` (generic entries: ``object``, ``kind``);
    empty when there is no entry there."""
    from .storage import read_parquet_object

    try:
        return _parts_of(read_parquet_object(store, key))
    except FileNotFoundError:
        return {}


def _parts_of(entry) -> dict[str, str]:
    if "kind" not in entry.column_names or "object" not in entry.column_names:
        return {}
    kinds, objects = entry.column("kind").to_pylist(), entry.column("object").to_pylist()
    return dict(zip(kinds, objects, strict=True))


def manifest_entries(store: Store, job_id: str, tasks: list[Task], order: str = UNIT_RANGE[1]):
    """Every task's current manifest entry as one table, in the order of its ``order``
    column (an entry's first unit) when it has one."""
    import pyarrow as pa

    current = entry_keys(store, job_id)
    keys = [current.get(t.index, manifest_key(job_id, t.index)) for t in tasks]
    parts = read_parquet_tables(store, keys)
    manifest = pa.concat_tables(parts, promote_options="permissive")
    if order in manifest.column_names:
        return manifest.sort_by([(order, "ascending")])
    return manifest


def consolidate_manifest(
    store: Store, job_id: str, tasks: list[Task], check=None, order: str = UNIT_RANGE[1]
):
    """Every task's manifest entry as one ``<job>/manifest.parquet``; returns the table.
    ``check(manifest)`` first, if given: what it raises leaves the job unfinished."""
    manifest = manifest_entries(store, job_id, tasks, order)
    if check is not None:
        check(manifest)
    write_parquet(store, consolidated_manifest_key(job_id), manifest)
    return manifest


def check_listed_objects(
    store: Store,
    manifest,
    check,
    on_object=None,
    *,
    coverage: bool = True,
    columns: Sequence[str] = UNIT_RANGE,
) -> set[str]:
    """Every object the manifest (a pandas DataFrame, None if absent) lists exists with
    its checksum; every unit lies in exactly one entry's range (``columns``: the
    object's column, the range's first unit and the one past its last). Problems go
    into ``check`` (a :class:`pipeline.verify.JobCheck`); ``on_object(row, data)`` may
    check an object's content further (it is then read whole; else
    :data:`READ_BYTES` at a time). Returns the objects listed. Units are worked out
    as ranges (:mod:`pipeline.coverage`), never one by one."""
    listed: set[str] = set()
    if manifest is None:
        if check.units_expected:
            check.missing.append(units_text(0, check.units_expected))
        return listed
    key, start, stop = columns
    data = None
    for row in manifest.itertuples():
        obj = getattr(row, key)
        listed.add(obj)
        where = store.describe(obj)
        units = range(int(getattr(row, start)), int(getattr(row, stop)))
        try:
            if on_object is not None:
                data = store.read_bytes(obj)
                actual = checksum(data)
            else:
                actual = _streamed_checksum(store, obj, getattr(row, "size", None))
        except FileNotFoundError:
            check.missing.append(where)
            check.damaged_units.add(units.start)
            check.unverified.update(units)
            continue
        check.objects_checked += 1
        if actual != row.checksum:
            check.corrupt.append(f"{where}: checksum {actual} != manifest {row.checksum}")
            check.damaged_units.add(units.start)
            check.unverified.update(units)
        elif on_object is not None:
            on_object(row, data)
        data = None  # (one object's bytes held at a time)
    if not coverage:
        return listed
    ranges = manifest[[start, stop]].drop_duplicates().to_numpy(dtype="int64")
    missing, duplicated, once = unit_coverage(ranges, check.units_expected)
    check.duplicated += [units_text(a, b) for a, b in duplicated]
    check.missing += [units_text(a, b) for a, b in missing]
    check.units_ok = sum(b - a - check.unverified.overlap(a, b) for a, b in once)
    return listed


#: Bytes of an object read at a time to checksum it: what verify holds of a part,
#: whatever its size (an internal knob; a part no larger is read in one request).
READ_BYTES = 8 << 20


def _streamed_checksum(store: Store, key: str, size) -> str:
    """:func:`checksum` of an object, read :data:`READ_BYTES` at a time (in one request
    when its manifest size says it is no larger)."""
    if size is not None and 0 <= size <= READ_BYTES:
        return checksum(store.read_bytes(key))
    return stored_checksum(store, key)[1]
