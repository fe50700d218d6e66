"""The input dataset: discovery, chunk planning on the driver, and reading a task's rows.

The driver lists the parquet files and reads their footers, then, for
``chunk_by``, only the chunk-by column(s) (or, where a row group's statistics
say it holds one key, not even those) to build a :class:`ChunkIndex`: the chunks
in key order and, per chunk, the global ids of the row groups holding its rows
(CSR arrays: a few bytes per chunk). For ``chunk_rows`` the footers suffice.

A worker reads only the row groups of its task's chunks, only the columns the
model needs, then keeps the rows of its chunks, sorted by chunk (rows keep
their file order within a chunk, which HAC covariances rely on).
"""

from __future__ import annotations

import functools
import sys
import time
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from .errors import InputError
from .partitions import Partitions, parse_partitions
from .storage import Store, open_store, per_object

__all__ = [
    "READS",
    "ChunkIndex",
    "Dataset",
    "TaskRows",
    "chunk_boundaries",
    "discover",
    "plan_chunks",
    "read_task_rows",
]


@dataclass(frozen=True)
class Dataset:
    url: str  # the store root the keys are relative to
    keys: tuple[str, ...]
    versions: tuple[str, ...]
    schema: pa.Schema
    rg_rows: np.ndarray  # rows of each row group, all files, in order (global row group ids)
    rg_file: np.ndarray  # file index of each global row group
    rg_local: np.ndarray  # row-group index within its file
    #: Compressed bytes of each row group's columns: (row groups, schema fields).
    rg_col_bytes: np.ndarray | None = None
    #: Columns of ``key=value`` folders (the schema's last fields), not in the files.
    partitions: Partitions | None = None
    #: Column -> a file without it (columns some files lack: usable by no job).
    absent: dict[str, str] = field(default_factory=dict)
    #: Column -> why its files' types cannot be read as one.
    conflicts: dict[str, str] = field(default_factory=dict)
    #: Columns some files store narrower (int32, float32, integers among floats):
    #: read as the schema's type, so a chunk's types do not depend on its file.
    widened: frozenset[str] = frozenset()

    def in_files(self, columns) -> list[str]:
        """``columns`` less the partition columns: those the files hold."""
        names = self.partitions.names if self.partitions else ()
        return [c for c in columns if c not in names]

    def rg_bytes(self, columns) -> np.ndarray:
        """Compressed bytes of ``columns`` in each row group (what reading them fetches)."""
        if self.rg_col_bytes is None:
            return np.zeros(len(self.rg_rows), dtype=np.int64)
        idx = [self.schema.get_field_index(c) for c in dict.fromkeys(columns)]
        return self.rg_col_bytes[:, [i for i in idx if i >= 0]].sum(axis=1)

    @property
    def num_rows(self) -> int:
        return int(self.rg_rows.sum())

    def file_size(self, f: int) -> int:
        return _version_size(self.versions[f])

    def describe(self) -> str:
        return open_store(self.url).describe(self.keys[0] if len(self.keys) == 1 else "")


def _version_size(version: str) -> int:
    """A file's bytes: its version starts with them (see ``Store.version``)."""
    head = version.split("-", 1)[0]
    return int(head) if head.isdigit() else sys.maxsize


def _is_data_key(key: str) -> bool:
    name = key.rsplit("/", 1)[-1]
    return name.endswith(".parquet") and not name.startswith(("_", "."))


def discover(url: str, chunk_by: tuple[str, ...] = ()) -> Dataset:
    """One parquet file, a folder of them, or an s3:// prefix; footers only, and for
    small files (at most :data:`WHOLE_FILE_BYTES`) also their ``chunk_by`` columns,
    from the same read, for :func:`plan_chunks` (one read of each file, not two)."""
    if not url:
        raise InputError("no dataset given: set data (--data PATH or s3://bucket/prefix)")
    store = open_store(url)
    url = store.url  # a local path made absolute: "data.parquet" has a parent folder too
    try:
        keys = [k for k in store.list() if k and _is_data_key(k)]
        if not keys:
            parent, _, base = url.rstrip("/").rpartition("/")
            if parent and base:
                pstore = open_store(parent)
                listed = pstore.list(base) if base.endswith(".parquet") else []
                keys = [k for k in listed if k == base] or [
                    k
                    for k in pstore.list()
                    if k.startswith(base) and "/" not in k[len(base) :] and _is_data_key(k)
                ]
                if keys:
                    store = pstore
    except OSError as exc:
        raise InputError(f"dataset {url}: cannot list it: {exc}") from exc
    if not keys:
        if url.rstrip("/").lower().endswith((".csv", ".csv.gz", ".tsv", ".json", ".jsonl")):
            raise InputError(
                f"dataset {url}: only parquet is read (chunks are planned from its row "
                "groups); convert it once, e.g. with pandas: "
                f"pd.read_csv({url.rstrip('/')!r}).to_parquet('data.parquet', "
                "row_group_size=100_000)"
            )
        raise InputError(
            f"dataset {url}: no .parquet files there (make a demo dataset with "
            "`pipeline data regressions`)"
        )
    partitions = parse_partitions(keys, url)
    first = top_same = None
    unified = _Unified()
    rg_rows, rg_file, rg_local, versions, col_bytes = [], [], [], [], []
    footers = _footers(store, keys, tuple(chunk_by))
    for i, (key, footer) in enumerate(zip(keys, footers, strict=True)):
        where = store.describe(key)
        try:
            if isinstance(footer, Exception):
                raise footer
            version, meta = footer
            file_schema = meta.schema.to_arrow_schema()
        except (OSError, pa.ArrowException) as exc:
            raise InputError(f"dataset file {where}: not a readable parquet file ({exc})") from exc
        # Thousands of files share one schema: the reconciling is for those that don't.
        same = first is None or file_schema.equals(first)
        if first is None:
            first = file_schema
        if not same or i == 0:
            unified.add(file_schema, where)
        top = top_same if same and top_same is not None else None
        if top is None:  # each of the file's columns' field in the schema
            top = [_top_field(unified.index, meta.schema.column(j).path)
                   for j in range(meta.num_columns)]  # fmt: skip
            if same:
                top_same = top
        for g in range(meta.num_row_groups):
            rg = meta.row_group(g)
            rg_rows.append(rg.num_rows)
            rg_file.append(i)
            rg_local.append(g)
            sizes = np.zeros(len(unified.index), dtype=np.int64)
            for j, t in enumerate(top):
                if t >= 0:
                    sizes[t] += rg.column(j).total_compressed_size
            col_bytes.append(sizes)
        versions.append(version)
    schema = unified.schema()
    col_bytes = [np.pad(b, (0, len(schema) - len(b))) for b in col_bytes]
    col_bytes = np.asarray(col_bytes, dtype=np.int64).reshape(len(rg_rows), len(schema))
    if partitions is not None:
        clash = [n for n in partitions.names if n in schema.names]
        if clash:
            raise InputError(
                f"dataset {url}: column {clash[0]!r} is both a partition folder "
                f"({clash[0]}=...) and a column of the files; rename one of them"
            )
        schema = pa.schema([*schema, *partitions.fields])
        col_bytes = np.pad(col_bytes, ((0, 0), (0, len(partitions.fields))))
    return Dataset(
        url=store.url,
        keys=tuple(keys),
        versions=tuple(versions),
        schema=schema,
        rg_rows=np.asarray(rg_rows, dtype=np.int64),
        rg_file=np.asarray(rg_file, dtype=np.int32),
        rg_local=np.asarray(rg_local, dtype=np.int32),
        rg_col_bytes=col_bytes,
        partitions=partitions,
        absent=unified.absent,
        conflicts=unified.conflicts,
        widened=frozenset(unified.widened),
    )


class _Unified:
    """The dataset's schema over files that differ: every column any file has, each
    at the type that holds all files' values (integers and floats widen)."""

    def __init__(self):
        self.fields: dict[str, pa.Field] = {}
        self.index: dict[str, int] = {}
        self.seen_in: dict[str, str] = {}  # column -> a file that has it, for messages
        self.absent: dict[str, str] = {}
        self.conflicts: dict[str, str] = {}
        self.widened: set[str] = set()
        self.first_file: str | None = None

    def add(self, file_schema: pa.Schema, where: str) -> None:
        for fld in file_schema:
            have = self.fields.get(fld.name)
            if have is None:
                if self.first_file is not None:  # the files before this one lack it
                    self.absent.setdefault(fld.name, self.first_file)
                self.fields[fld.name] = fld
                self.index[fld.name] = len(self.index)
                self.seen_in[fld.name] = where
            elif have.type != fld.type:
                wider = _wider(have.type, fld.type)
                if wider is None:
                    self.conflicts.setdefault(
                        fld.name,
                        f"column {fld.name!r} is {fld.type} in dataset file {where} and "
                        f"{have.type} in {self.seen_in[fld.name]}",
                    )
                else:
                    self.fields[fld.name] = have.with_type(wider)
                    self.widened.add(fld.name)
        for name in self.fields:
            if name not in file_schema.names:
                self.absent.setdefault(name, where)
        self.first_file = self.first_file or where

    def schema(self) -> pa.Schema:
        return pa.schema(list(self.fields.values()))


def _top_field(index: dict[str, int], path: str) -> int:
    """The field of the schema a parquet leaf column belongs to, from its dotted path:
    its longest prefix that names a field (a column may have dots in its own name,
    ``sales.usd``; a nested one's path goes on, ``s.k`` or ``l.list.element``)."""
    parts = path.split(".")
    for k in range(len(parts), 0, -1):
        found = index.get(".".join(parts[:k]))
        if found is not None:
            return found
    raise KeyError(path)


def _wider(a: pa.DataType, b: pa.DataType) -> pa.DataType | None:
    """The type holding values of both, when both are numbers; else None."""
    numbers = (pa.types.is_integer, pa.types.is_floating)
    if not all(any(is_(t) for is_ in numbers) for t in (a, b)):
        return None
    if pa.types.is_floating(a) or pa.types.is_floating(b):
        return pa.float64()
    if pa.types.is_signed_integer(a) == pa.types.is_signed_integer(b):
        return a if a.bit_width >= b.bit_width else b
    return pa.int64()


def _footers(store: Store, keys: list[str], chunk_by: tuple[str, ...]) -> list:
    """(version, footer) of each key, or the exception reading it raised; in order.
    Footers are cached: planning the chunks and checking the formula read them again.
    A small file is read whole: its ``chunk_by`` columns are kept for planning."""

    def one(key: str):
        try:
            version = store.version(key)
            if chunk_by and _version_size(version) <= WHOLE_FILE_BYTES:
                pf = _whole_file(store, key)
                names = pf.schema_arrow.names
                columns = [c for c in chunk_by if c in names]
                table = pf.read(columns=columns, use_threads=False) if columns else None
                _PREFETCHED[(store.url, key, version)] = (pf.metadata, table)
                return version, pf.metadata
            return version, _footer(store.url, key, version)
        except Exception as exc:  # raised in order by the caller, naming the file
            return exc

    return per_object(store, one, keys)


@dataclass(frozen=True)
class ChunkIndex:
    """Chunks in order: their keys and the row groups holding their rows."""

    by: tuple[str, ...]  # chunk_by columns; () for chunk_rows
    chunk_rows: int | None
    keys: pa.Table | None  # one row per chunk (chunk_by columns)
    rg_offsets: np.ndarray | None  # CSR: chunk c's row groups are rg_ids[off[c]:off[c+1]]
    rg_ids: np.ndarray | None
    total_rows: int = 0
    #: Rows of each chunk, when chunks differ in size (None: all alike).
    rows: np.ndarray | None = None

    @property
    def n_chunks(self) -> int:
        if self.keys is not None:
            return self.keys.num_rows
        return -(-self.total_rows // self.chunk_rows)

    @property
    def nbytes(self) -> int:
        if self.keys is None:
            return 64
        extra = self.rows.nbytes if self.rows is not None else 0
        return self.keys.nbytes + self.rg_offsets.nbytes + self.rg_ids.nbytes + extra

    def row_groups(self, start: int, stop: int, ds: Dataset) -> np.ndarray:
        """Global row-group ids holding chunks ``start..stop-1``, sorted."""
        if self.keys is not None:
            ids = self.rg_ids[self.rg_offsets[start] : self.rg_offsets[stop]]
            return np.unique(ids)
        bounds = np.concatenate([[0], np.cumsum(ds.rg_rows)])
        first_row = start * self.chunk_rows
        last_row = min(stop * self.chunk_rows, self.total_rows) - 1
        lo = np.searchsorted(bounds, first_row, side="right") - 1
        hi = np.searchsorted(bounds, last_row, side="right") - 1
        return np.arange(lo, hi + 1)

    def key_values(self, start: int, stop: int) -> dict[str, list]:
        if self.keys is None:
            return {}
        part = self.keys.slice(start, stop - start)
        return {name: part.column(name).to_pylist() for name in self.by}


def _stats_keys(meta, g: int, cols: list[int]):
    """The single key of row group ``g`` from its statistics, or None."""
    rg = meta.row_group(g)
    values = []
    for c in cols:
        st = rg.column(c).statistics
        if st is None or not st.has_min_max or st.null_count or st.min != st.max:
            return None
        values.append(st.min)
    return values


def _chunk_rg_pairs(ds: Dataset, store: Store, i: int, by: tuple[str, ...], gid: int) -> pa.Table:
    """File ``i``'s (chunk key, global row group, rows) triples from the statistics when
    each row group holds one key, else its rows' (chunk key, global row group) pairs;
    ``gid``: its first row group's global id."""
    key = ds.keys[i]
    meta, table = _PREFETCHED.pop((ds.url, key, ds.versions[i]), (None, None))
    meta = meta or _footer(ds.url, key, ds.versions[i])
    names = [meta.schema.column(j).name for j in range(meta.num_columns)]
    read = ds.in_files(by)  # the others are the file's partition values
    cols = [names.index(b) if b in names else -1 for b in read]
    stats = (
        [_stats_keys(meta, g, cols) for g in range(meta.num_row_groups)]
        if -1 not in cols
        else [None]
    )
    counts = [meta.row_group(g).num_rows for g in range(meta.num_row_groups)]
    rgs = np.arange(gid, gid + meta.num_row_groups, dtype=np.int32)

    def by_columns(found: dict, n: int) -> list:  # chunk keys are compared as values
        columns = [decoded(found[b] if b in found else ds.partitions.column(i, b, n)) for b in by]
        return [
            _as_type(c, _plain(ds.schema.field(b).type)) for c, b in zip(columns, by, strict=True)
        ]

    if all(s is not None for s in stats) and meta.num_row_groups:
        found = {b: pa.array([s[j] for s in stats], type=_plain(ds.schema.field(b).type))
                 for j, b in enumerate(read)}  # fmt: skip
        return pa.table(
            [*by_columns(found, len(stats)), rgs, pa.array(counts, pa.int64())],
            names=[*by, "__rg", "count_all"],
        )
    if table is None or not set(read) <= set(table.column_names):
        with store.open_input(key) as f:
            table = pq.ParquetFile(f, metadata=meta).read(columns=read, use_threads=False)
    found = {b: table.column(b) for b in read}
    table = pa.table(by_columns(found, table.num_rows), names=list(by))
    return _runs(table.append_column("__rg", pa.array(np.repeat(rgs, counts))))


def _as_type(column, t: pa.DataType):
    return column if column.type == t else column.cast(t)


def _plain(t: pa.DataType) -> pa.DataType:
    return t.value_type if pa.types.is_dictionary(t) else t


def decoded(column):
    """A dictionary column (a pandas categorical as parquet stores it) as its values:
    chunk keys are compared, grouped and sorted as values."""
    return column.cast(column.type.value_type) if pa.types.is_dictionary(column.type) else column


def _runs(table: pa.Table) -> pa.Table:
    """``table``'s runs of equal rows, one row each with its length (``__rows``): a
    file's rows come sorted by chunk far more often than not, and grouping its runs
    costs a few milliseconds where grouping its rows cost tens (2.5 M rows: 50 ms)."""
    n = table.num_rows
    if n < 2:
        return table.append_column("__rows", pa.array(np.ones(n, dtype=np.int64)))
    change = np.zeros(n - 1, dtype=bool)
    for column in table.columns:
        t = column.type
        if column.null_count == 0 and (pa.types.is_integer(t) or pa.types.is_floating(t)):
            # numbers compared in numpy: arrow's boolean result, bit-packed, costs more
            # to unpack than the comparison (7 of 20 ms for 2.5 M rows)
            values = column.to_numpy()
            change |= values[1:] != values[:-1]
            continue
        differs = pc.not_equal(column.slice(1), column.slice(0, n - 1))
        change |= np.asarray(pc.fill_null(differs, True).combine_chunks(), dtype=bool)
    starts = np.concatenate([[0], np.flatnonzero(change) + 1])
    counts = np.diff(np.append(starts, n))
    return table.take(pa.array(starts)).append_column("__rows", pa.array(counts))


def plan_chunks(ds: Dataset, by: tuple[str, ...], chunk_rows: int | None) -> ChunkIndex:
    """Driver: the chunk index, from the chunk-by columns (or footers for chunk_rows)."""
    if not by:
        return ChunkIndex((), chunk_rows, None, None, None, total_rows=ds.num_rows)
    store = open_store(ds.url)
    first_rg = np.searchsorted(ds.rg_file, np.arange(len(ds.keys)))
    parts = per_object(
        store, lambda i: _chunk_rg_pairs(ds, store, i, by, int(first_rg[i])), range(len(ds.keys))
    )
    # Runs grouped once for all files: a group-by per small file costs more than its rows.
    runs = [p for p in parts if "count_all" not in p.column_names]
    parts = [p for p in parts if "count_all" in p.column_names]
    if runs:
        grouped_runs = pa.concat_tables(runs).group_by([*by, "__rg"], use_threads=False)
        parts.append(
            grouped_runs.aggregate([("__rows", "sum")]).rename_columns([*by, "__rg", "count_all"])
        )
    pairs = pa.concat_tables(parts)
    for b in by:
        if pairs.column(b).null_count:
            raise InputError(
                f"dataset {ds.describe()}: chunk_by column {b!r} has null values; "
                "every row must belong to a chunk"
            )
    grouped = pairs.group_by(list(by), use_threads=False).aggregate(
        [("__rg", "list"), ("count_all", "sum")]
    )
    grouped = grouped.sort_by([(b, "ascending") for b in by])
    lists = grouped.column("__rg_list").combine_chunks()
    offsets = np.asarray(lists.offsets, dtype=np.int64)
    ids = np.asarray(lists.values, dtype=np.int32)
    keys = grouped.select(list(by)).combine_chunks()
    rows = np.asarray(grouped.column("count_all_sum"), dtype=np.int64)
    uneven = rows.size and rows.min() != rows.max()
    return ChunkIndex(
        tuple(by), None, keys, offsets, ids, ds.num_rows, rows.astype(np.int32) if uneven else None
    )


#: (url, key, version) -> (footer, chunk-by columns) of small files read whole by
#: :func:`discover`, taken by :func:`plan_chunks`.
_PREFETCHED: dict[tuple[str, str, str], tuple] = {}


# Enough for datasets of thousands of small files: a task of many files would
# otherwise read each footer again.
@functools.lru_cache(maxsize=8192)
def _footer(url: str, key: str, version: str):
    with open_store(url).open_input(key) as f:
        return pq.ParquetFile(f).metadata


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


#: Files up to this size are read whole by a task (one request, footer included).
WHOLE_FILE_BYTES = 1024 * 1024


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
    tables = []
    files = ds.rg_file[rgs]  # ascending: global row-group ids run file by file
    firsts = _run_starts(files)
    for a, b in zip(firsts.tolist(), [*firsts[1:].tolist(), len(rgs)], strict=True):
        f = int(files[a])
        key = ds.keys[f]
        local = ds.rg_local[rgs[a:b]].tolist()
        if ds.file_size(f) <= WHOLE_FILE_BYTES:
            # One read for footer and data: most of a small file is what a task needs.
            pf = _whole_file(store, key, read_dictionary)
            tables.append(pf.read_row_groups(local, columns=read, use_threads=False))
        else:
            meta = _footer(ds.url, key, ds.versions[f])
            with store.open_ranges(key, _column_spans(meta, local, read)) as fh:
                pf = pq.ParquetFile(fh, metadata=meta, read_dictionary=read_dictionary)
                tables.append(pf.read_row_groups(local, columns=read, use_threads=False))
        if ds.widened:
            tables[-1] = _as_schema(tables[-1], ds)
        for c in from_paths:
            part = ds.partitions.column(f, c, tables[-1].num_rows, c in as_dictionary)
            tables[-1] = tables[-1].append_column(c, part)
    table = pa.concat_tables(tables) if len(tables) > 1 else tables[0]
    READS.seconds += time.perf_counter() - t0
    n = stop - start
    rg_bytes = ds.rg_bytes(wanted)[rgs]
    if not index.by:
        bounds = np.concatenate([[0], np.cumsum(ds.rg_rows)])
        first = start * index.chunk_rows - bounds[rgs[0]]
        last = min(stop * index.chunk_rows, index.total_rows) - bounds[rgs[0]]
        kept = np.arange(first, last)
        table = table.slice(first, last - first)
        offsets = np.minimum(np.arange(n + 1) * index.chunk_rows, last - first)
        rows = TaskRows(table.select(columns), offsets.astype(np.int64), start)
    else:
        for b in index.by:  # as the chunk index holds them
            if pa.types.is_dictionary(table.schema.field(b).type):
                table = table.set_column(
                    table.schema.get_field_index(b), b, decoded(table.column(b))
                )
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
    rows.bytes_read = int(rg_bytes.sum())
    rows.bytes_needed = _bytes_held(rg_bytes, ds.rg_rows[rgs], kept)
    READS.bytes_read += rows.bytes_read
    READS.bytes_needed += rows.bytes_needed
    return rows


def _as_schema(table: pa.Table, ds: Dataset) -> pa.Table:
    """``table``'s widened columns at the dataset's type, where its file's is narrower."""
    for name in ds.widened.intersection(table.column_names):
        want, i = ds.schema.field(name).type, table.schema.get_field_index(name)
        if table.schema.field(i).type != want:
            table = table.set_column(i, name, table.column(i).cast(want))
    return table


def _whole_file(store: Store, key: str, read_dictionary=None) -> pq.ParquetFile:
    """A small file read in one request, footer and data."""
    whole = pa.BufferReader(pa.py_buffer(store.read_bytes(key)))
    return pq.ParquetFile(whole, read_dictionary=read_dictionary)


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


def chunk_boundaries(ds: Dataset, index: ChunkIndex) -> np.ndarray:
    """Chunks where a task may start without sharing a row group with the chunks
    before it: row-group (and file) starts, for chunks in row-group order."""
    n = index.n_chunks
    if not index.by:
        row_starts = np.concatenate([[0], np.cumsum(ds.rg_rows)[:-1]])
        aligned = row_starts[row_starts % index.chunk_rows == 0] // index.chunk_rows
        return np.unique(np.concatenate([aligned[aligned < n], [0, n]]))
    off, ids = index.rg_offsets, index.rg_ids
    has = off[1:] > off[:-1]
    lo = np.full(n, np.iinfo(np.int64).max)
    hi = np.full(n, -1)
    lo[has] = np.minimum.reduceat(ids, off[:-1][has])
    hi[has] = np.maximum.reduceat(ids, off[:-1][has])
    # A cut before chunk c is clean when every row group of the chunks before it comes
    # before every row group of the chunks from c on.
    before = np.maximum.accumulate(hi)[:-1]
    after = np.minimum.accumulate(lo[::-1])[::-1][1:]
    cuts = np.flatnonzero(before < after) + 1
    return np.concatenate([[0], cuts, [n]])


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


def check_columns(ds: Dataset, needed: dict[str, str]) -> None:
    """``needed`` maps column -> what needs it; raise naming the missing ones."""
    missing = [(c, why) for c, why in needed.items() if c not in ds.schema.names]
    if missing:
        listed = "; ".join(f"{c!r} (needed by {why})" for c, why in missing)
        raise InputError(
            f"dataset {ds.describe()} has no column {listed}; it has: {', '.join(ds.schema.names)}"
        )
    for c, why in needed.items():
        if c in ds.absent:
            raise InputError(
                f"dataset file {ds.absent[c]} has no column {c!r} (needed by {why}), which "
                f"other files of {ds.describe()} have; every file needs the columns a job uses"
            )
        if c in ds.conflicts:
            raise InputError(f"{ds.conflicts[c]} (needed by {why}); files must agree on it")


def open_dataset_store(ds: Dataset) -> Store:
    return open_store(ds.url)
