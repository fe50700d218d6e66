"""Manifests: what a job's output holds, listed with checksums.

Each task writes its entry (``<job>/manifest/part-NNNNNN.parquet``) last, once its
objects are written; a complete job's entries are consolidated into
``<job>/manifest.parquet``. An entry lists objects (``object``, ``kind``), the units
each holds (a range: ``unit_start``, ``unit_stop``, or columns a workload names in
``TableResults.manifest_columns``) and the :func:`checksum` of its bytes, which
``pipeline verify`` compares with what it reads back.

Each entry may also name the *code version* that made its task (``code``): a
workload names the settings of its fingerprint that are its code, not its units'
meaning (``Workload.code_settings``: a map's function source and shipped code, the
regressions' engine, a plug-in's own version). A resume whose code settings changed
is refused unless the run is given ``keep_done`` (``--keep-done``): then the tasks
done are kept, and only the failed and missing units run, with the new code. A code
version is the :func:`checksum` of those settings' values (16 hex digits); a task run
again for its failed units keeps the rows the earlier code made, and its entry names
both versions (``a+b``, sorted). The job's record (``job.json``) keeps each version's
settings (``code_versions``); ``pipeline verify`` counts the tasks of each and
``pipeline results --code`` keeps the rows one made.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from .coverage import unit_coverage, units_text
from .layout import (
    consolidated_manifest_key,
    current_entries,
    manifest_key,
    manifest_prefix,
    task_index,
)
from .storage import Store, join, read_parquet_object, read_parquet_tables, write_parquet


class Task(Protocol):
    """What the manifest needs of a task: its number, which names its entry."""

    index: int


__all__ = [
    "CODE_COLUMN",
    "CodeStamp",
    "READ_BYTES",
    "UNIT_RANGE",
    "check_listed_objects",
    "checksum",
    "code_changes",
    "code_version",
    "consolidate_manifest",
    "entry_codes",
    "entries_read",
    "made_by",
    "entry_keys",
    "entry_parts",
    "listed_parts",
    "manifest_entries",
    "stamp_entry",
    "stored_checksum",
    "summed_fingerprint",
    "task_entry",
    "tasks_by_code",
    "versions_record",
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
    try:
        return _parts_of(read_parquet_object(store, key))
    except FileNotFoundError:
        return {}


def _parts_of(entry) -> dict[str, str]:
    if "kind" not in entry.column_names or "object" not in entry.column_names:
        return {}
    kinds, objects = entry.column("kind").to_pylist(), entry.column("object").to_pylist()
    return dict(zip(kinds, objects, strict=True))


#: Entries read already (key -> table), which :func:`manifest_entries` takes rather than
#: reading them again: a run's, read as its tasks reported (:mod:`pipeline.runner.entries`).
_READ: contextvars.ContextVar[Mapping[str, object] | None] = contextvars.ContextVar(
    "pipeline_entries_read", default=None
)


@contextlib.contextmanager
def entries_read(tables: Mapping[str, object]):
    """Within the block, :func:`manifest_entries` takes the entries in ``tables`` (key ->
    ``pyarrow.Table``) as read. Entries are never overwritten, so one read earlier is
    the one a read now would give."""
    token = _READ.set(tables)
    try:
        yield
    finally:
        _READ.reset(token)


def manifest_entries(store: Store, job_id: str, tasks: list[Task], order: str = UNIT_RANGE[1]):
    """Every task's current manifest entry as one table, in the order of its ``order``
    column (an entry's first unit) when it has one."""
    import pyarrow as pa

    current = entry_keys(store, job_id)
    keys = [current.get(t.index, manifest_key(job_id, t.index)) for t in tasks]
    read = _READ.get() or {}
    left = [k for k in keys if k not in read]
    fresh = dict(zip(left, read_parquet_tables(store, left), strict=True))
    parts = [read[k] if k in read else fresh[k] for k in keys]
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


# -- code versions: which code made each task --------------------------------------

#: The manifest entry's column naming the code version(s) that made the task.
CODE_COLUMN = "code"


def code_version(fingerprint: dict | None, settings: Iterable[str]) -> str | None:
    """The code version of a job with ``fingerprint`` (as recorded), None for a
    workload without code settings."""
    settings = tuple(settings)
    if not settings or fingerprint is None:
        return None
    picked = {k: fingerprint.get(k) for k in settings}
    return checksum(json.dumps(picked, sort_keys=True).encode())


def code_changes(changed: list[str], settings: Iterable[str]) -> tuple[list[str], list[str]]:
    """Of the fingerprint's ``changed`` keys, those that are code settings and those
    that are not (the latter still change what the finished units mean)."""
    code = set(settings)
    return [k for k in changed if k in code], [k for k in changed if k not in code]


def versions_record(
    recorded: dict | None, before: dict | None, current: dict, settings: Iterable[str]
) -> dict[str, dict]:
    """The record's ``code_versions`` (version -> its settings' values) with the
    version of the ``before`` fingerprint (a record that predates them) and the
    ``current`` one added; empty for a workload without code settings."""
    settings = tuple(settings)
    if not settings:
        return {}
    out = dict(recorded or {})
    for fingerprint in (before, current):
        version = code_version(fingerprint, settings)
        if version is not None and version not in out:
            out[version] = {k: fingerprint.get(k) for k in settings}
    return out


@dataclass(frozen=True)
class CodeStamp:
    """What the runner hands the workers with each task (never the workload's to set):
    this run's code version (None: none kept), and whether the job's units were made
    by another version before (a task run again for its failed units then keeps rows
    of both)."""

    version: str | None = None
    changed_before: bool = False


def entry_codes(values: Iterable[str | None]) -> set[str]:
    """The code versions a manifest entry's ``code`` column names."""
    return {c for v in values if v for c in str(v).split("+") if c}


def stamp_entry(code: CodeStamp | None, job_id: str, store: Store | None, task, entry):
    """Worker: ``entry`` with its ``code`` column, the versions that made the task's
    objects: this run's, and for a job whose code changed before, those of the
    task's earlier entry (a task run again for its failed units keeps the others'
    rows). Unchanged for a workload without code settings, or an entry that names
    its own."""
    import pyarrow as pa

    version = code.version if code is not None else None
    if version is None or entry is None or CODE_COLUMN in entry.column_names:
        return entry
    codes = {version}
    rerun = getattr(task, "round", 0)  # a task run again for its failed units
    if code.changed_before and store is not None and rerun:
        key = manifest_key(job_id, task.index, rerun - 1)
        if store.exists(key):
            earlier = read_parquet_object(store, key)
            if CODE_COLUMN in earlier.column_names:
                codes |= entry_codes(earlier.column(CODE_COLUMN).to_pylist())
    value = "+".join(sorted(codes))
    return entry.append_column(CODE_COLUMN, pa.array([value] * entry.num_rows, pa.string()))


def made_by(entry, wanted: str) -> bool:
    """Whether a task's manifest entry (a pyarrow Table) names the code version
    ``wanted``, or one it is the start of (the first digits suffice, as for a git
    commit)."""
    if CODE_COLUMN not in entry.column_names:
        return False
    codes = entry_codes(set(entry.column(CODE_COLUMN).to_pylist()))
    return any(c.startswith(wanted) for c in codes)


def tasks_by_code(manifest, columns) -> dict[str, int]:
    """``pipeline verify``: tasks (distinct unit ranges) by the code value of their
    entry (a pandas DataFrame); empty when no entry records one."""
    if manifest is None or CODE_COLUMN not in manifest.columns:
        return {}
    _, start, stop = columns
    if stop is None or start not in manifest.columns:
        keys = [start] if start in manifest.columns else []
    else:
        keys = [start, stop]
    rows = manifest[[*keys, CODE_COLUMN]].drop_duplicates()
    counts = rows[CODE_COLUMN].fillna("unrecorded").value_counts()
    return {str(k): int(v) for k, v in counts.items()}
