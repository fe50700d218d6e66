"""Reading a task's rows on a worker: only the row groups of its chunks, only the
columns the job needs, then the rows of its chunks, sorted by chunk (rows keep
their file order within a chunk, which HAC covariances rely on).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ..storage import open_store
from .chunks import ChunkIndex, as_dataset_type, decoded
from .dataset import WHOLE_FILE_BYTES, Dataset, cached_footer, read_whole_file

__all__ = ["READS", "TaskRows", "read_task_rows"]


@dataclass
class TaskRows:
    """The rows of a task's chunks: ``table`` sorted by chunk, chunk i at rows
    ``offsets[i]:offsets[i+1]`` (local chunk i is job chunk ``start + i``)."""

    table: pa.Table
    offsets: np.ndarray
    start: int
    #: Compressed bytes of the row groups and columns read, and the part of them
    #: holding the task's rows (the rest belongs to other tasks' chunks).
    bytes_read: int = 0
    bytes_needed: int = 0


@dataclass
class ReadTally:
    """What this process's :func:`read_task_rows` calls read (workers run one task at
    a time, so a task's share is the difference across it)."""

    bytes_read: int = 0
    bytes_needed: int = 0
    seconds: float = 0.0

    def since(self, before: ReadTally) -> tuple[int, int, float]:
        return (
            self.bytes_read - before.bytes_read,
            self.bytes_needed - before.bytes_needed,
            self.seconds - before.seconds,
        )


READS = ReadTally()


def read_task_rows(
    ds: Dataset,
    index: ChunkIndex,
    start: int,
    stop: int,
    columns: list[str],
    dictionary: tuple[str, ...] = (),
) -> TaskRows:
    """Worker: read the row groups and columns chunks ``start..stop-1`` need; the
    ``dictionary`` columns (strings) as dictionary arrays, as parquet stores them
    (decoding them to strings costs more than the rest of the read)."""
    t0 = time.perf_counter()
    store = open_store(ds.url)
    rgs = index.row_groups(start, stop, ds)
    wanted = list(dict.fromkeys([*columns, *index.by]))
    as_dictionary = [c for c in dictionary if c in columns and c not in index.by]
    read = ds.in_files(wanted)  # the others are each file's partition values
    from_paths = [c for c in wanted if c not in read]
    read_dictionary = [c for c in as_dictionary if c in read] or None
    tables, reused, last = [], [], None
    files = ds.rg_file[rgs]  # ascending: global row-group ids run file by file
    firsts = _run_starts(files)
    # Lists, not arrays, in the loop: it turns once per file, and on thousands of small
    # files numpy's indexing and the group kept below (its size asked each time) cost
    # a tenth of the read.
    local_groups, groups, file_ids = ds.rg_local[rgs].tolist(), rgs.tolist(), files.tolist()
    same = (tuple(read), tuple(read_dictionary or ()))
    kept = _LAST_GROUP.get("ident")
    for a, b in zip(firsts.tolist(), [*firsts[1:].tolist(), len(rgs)], strict=True):
        f = file_ids[a]
        key = ds.keys[f]
        ident = (ds.url, key, ds.versions[f], *same)
        parts, first = [], a
        if kept == (*ident, groups[a]):
            parts.append(_LAST_GROUP["table"])  # the group the last read ended with
            reused.append(a)
            first += 1
        local = local_groups[first:b]
        if local and ds.file_size(f) <= WHOLE_FILE_BYTES:
            # One read for footer and data: most of a small file is what a task needs.
            pf = read_whole_file(store, key, read_dictionary)
            parts.append(pf.read_row_groups(local, columns=read, use_threads=False))
        elif local:
            meta = cached_footer(ds.url, key, ds.versions[f])
            with store.open_ranges(key, _column_spans(meta, local, read)) as fh:
                pf = pq.ParquetFile(fh, metadata=meta, read_dictionary=read_dictionary)
                parts.append(pf.read_row_groups(local, columns=read, use_threads=False))
        if local:  # the task's last read, kept after the loop (a group read alone only)
            last = (parts[-1] if len(local) == 1 else None, (*ident, groups[b - 1]))
        tables.append(pa.concat_tables(parts) if len(parts) > 1 else parts[0])
        if ds.widened:
            tables[-1] = _as_schema(tables[-1], ds, store.describe(key))
        for c in from_paths:
            part = ds.partitions.column(f, c, tables[-1].num_rows, c in as_dictionary)
            tables[-1] = tables[-1].append_column(c, part)
    if last is not None:
        _keep(*last)
    table = _concatenated(tables, as_dictionary)
    READS.seconds += time.perf_counter() - t0
    n = stop - start
    rg_bytes = ds.rg_bytes(wanted)[rgs]
    if not index.by:
        bounds = ds.rg_row_bounds
        first = start * index.chunk_rows - bounds[rgs[0]]
        last = min(stop * index.chunk_rows, index.total_rows) - bounds[rgs[0]]
        kept = np.arange(first, last)
        table = table.slice(first, last - first)
        offsets = np.minimum(np.arange(n + 1) * index.chunk_rows, last - first)
        rows = TaskRows(table.select(columns), offsets.astype(np.int64), start)
    else:
        for b in index.by:  # as the chunk index holds them
            table = table.set_column(table.schema.get_field_index(b), b, decoded(table.column(b)))
        pos = _chunk_positions(table, index, start, stop)
        kept = keep = np.flatnonzero(pos >= 0)
        pos_kept = pos[keep]
        if len(keep) and keep[-1] - keep[0] == len(keep) - 1 and _ascending(pos_kept):
            # the task's rows in one stretch, in chunk order (as data written by chunk
            # is): a slice, without a sort or a copy
            table = table.select(columns).slice(int(keep[0]), len(keep))
        else:
            order = np.argsort(pos_kept, kind="stable")
            keep, pos_kept = keep[order], pos_kept[order]
            table = table.select(columns).take(pa.array(keep))
        offsets = np.searchsorted(pos_kept, np.arange(n + 1), side="left").astype(np.int64)
        rows = TaskRows(table, offsets, start)
    rows.bytes_read = int(rg_bytes.sum() - rg_bytes[reused].sum())  # reused: not read
    rows.bytes_needed = _bytes_held(rg_bytes, ds.rg_rows[rgs], kept)
    READS.bytes_read += rows.bytes_read
    READS.bytes_needed += rows.bytes_needed
    return rows


#: The row group this process read last, when it read it alone, kept for the next
#: task: tasks of a row group on one worker read it once (a job's first probes all
#: fall in its first group, and on S3 each read is a tenth of a second).
#: A part of a larger read is not kept (its slice would hold the whole read), nor a
#: group larger than this.
LAST_GROUP_BYTES = 64 << 20
_LAST_GROUP: dict = {}


def _keep(table: pa.Table | None, ident: tuple) -> None:
    _LAST_GROUP.clear()
    if table is not None and table.nbytes <= LAST_GROUP_BYTES:
        _LAST_GROUP.update(ident=ident, table=table)


def _concatenated(tables: list[pa.Table], as_dictionary: list[str]) -> pa.Table:
    """The files' tables as one. Text written as a pandas categorical in one file and
    as strings in another is a dictionary there and strings here (or large strings):
    each is then taken as the task reads text, a dictionary where ``as_dictionary``
    asks, else its values. (Their concatenation failed: every task reading both kinds
    of file, on every rerun.)"""
    if len(tables) == 1:
        return tables[0]
    if all(t.schema.equals(tables[0].schema) for t in tables[1:]):
        return pa.concat_tables(tables)
    tables = [_text_as_read(t, as_dictionary) for t in tables]
    return pa.concat_tables(tables, promote_options="permissive")


_DICTIONARY = pa.dictionary(pa.int32(), pa.string())


def _text_as_read(table: pa.Table, as_dictionary: list[str]) -> pa.Table:
    for i, field in enumerate(table.schema):
        t = field.type
        values = t.value_type if pa.types.is_dictionary(t) else t
        if not (pa.types.is_string(values) or pa.types.is_large_string(values)):
            continue
        column = table.column(i)
        if field.name in as_dictionary:
            if t != _DICTIONARY:
                if not pa.types.is_dictionary(t):
                    column = pc.dictionary_encode(column.cast(pa.string()))
                column = column.cast(_DICTIONARY)
        elif pa.types.is_dictionary(t):
            column = column.cast(values)
        table = table.set_column(i, field.name, column)
    return table


def _as_schema(table: pa.Table, ds: Dataset, where: str) -> pa.Table:
    """``table``'s widened columns at the dataset's type, where its file's is narrower."""
    for name in ds.widened.intersection(table.column_names):
        want, i = ds.schema.field(name).type, table.schema.get_field_index(name)
        if table.schema.field(i).type != want:
            table = table.set_column(i, name, as_dataset_type(table.column(i), want, name, where))
    return table


def _column_spans(meta, row_groups: list[int], columns: list[str]) -> list[tuple[int, int]]:
    """The byte ranges of ``columns``' chunks in ``row_groups``: what reading them reads."""
    names = meta.schema.names
    wanted = [names.index(c) for c in columns if c in names]
    spans = []
    for g in row_groups:
        rg = meta.row_group(g)
        for j in wanted:
            col = rg.column(j)
            start = col.data_page_offset
            if col.has_dictionary_page and col.dictionary_page_offset is not None:
                start = min(start, col.dictionary_page_offset)
            spans.append((start, start + col.total_compressed_size))
    return spans


def _bytes_held(rg_bytes: np.ndarray, rg_rows: np.ndarray, kept: np.ndarray) -> int:
    """The bytes of the kept rows, each row group's bytes shared evenly by its rows
    (``kept``: the kept rows' ascending positions in the row groups' rows, concatenated
    in order)."""
    if not len(kept):
        return 0
    bounds = np.concatenate([[0], np.cumsum(rg_rows)])
    kept_per_rg = np.diff(np.searchsorted(kept, bounds))
    return round(float((rg_bytes * kept_per_rg / np.maximum(rg_rows, 1)).sum()))


def _run_starts(a: np.ndarray) -> np.ndarray:
    """Where each run of equal values in ``a`` (non-empty) starts."""
    return np.flatnonzero(np.concatenate([[True], a[1:] != a[:-1]]))


def _ascending(a: np.ndarray) -> bool:
    return bool((a[1:] >= a[:-1]).all())


def _chunk_positions(table: pa.Table, index: ChunkIndex, start: int, stop: int) -> np.ndarray:
    """Each row's chunk number within the task, -1 for rows of other chunks."""
    keys = index.keys.slice(start, stop - start)
    if len(index.by) == 1:
        b = index.by[0]
        column, runs = table.column(b), None
        if column.null_count == 0 and pa.types.is_integer(column.type) and len(column):
            # rows come in runs of one chunk: look up each run's value, not each row's
            values = column.to_numpy()
            starts = _run_starts(values)
            column, runs = pa.array(values[starts]), np.diff([*starts, len(values)])
        idx = pc.index_in(column, value_set=keys.column(b).combine_chunks())
        pos = np.asarray(pc.fill_null(idx, -1).to_numpy(zero_copy_only=False), dtype=np.int64)
        return pos if runs is None else np.repeat(pos, runs)
    left = table.select(list(index.by)).append_column(
        "__row", pa.array(np.arange(table.num_rows, dtype=np.int64))
    )
    right = keys.append_column("__pos", pa.array(np.arange(keys.num_rows, dtype=np.int64)))
    joined = left.join(right, keys=list(index.by), join_type="inner", use_threads=False)
    pos = np.full(table.num_rows, -1, dtype=np.int64)
    pos[np.asarray(joined.column("__row"))] = np.asarray(joined.column("__pos"))
    return pos
