"""Chunk planning on the driver: the chunks of a dataset in key order and the row
groups holding each (:class:`ChunkIndex`), and where tasks may be cut cleanly.

For ``chunk_by`` the driver reads only the chunk-by column(s) (or, where a row
group's statistics say it holds one key, not even those) to build the index: CSR
arrays, a few bytes per chunk. For ``chunk_rows`` the footers suffice.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ..errors import InputError
from ..storage import Store, open_store, per_object
from .dataset import PREFETCHED, Dataset, cached_footer

__all__ = ["ChunkIndex", "as_dataset_type", "chunk_boundaries", "decoded", "plan_chunks"]


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
        bounds = ds.rg_row_bounds
        first_row = start * self.chunk_rows
        last_row = min(stop * self.chunk_rows, self.total_rows) - 1
        lo = np.searchsorted(bounds, first_row, side="right") - 1
        hi = np.searchsorted(bounds, last_row, side="right") - 1
        return np.arange(lo, hi + 1)

    def bytes_reader(self, ds: Dataset, rg_bytes: np.ndarray):
        """``read(start, stop)``: the sum of ``rg_bytes`` over the row groups holding
        chunks ``start..stop-1``, each counted once. The planner asks this of every
        task it weighs (a thousand times on 50,000 chunks), so where chunks' row groups
        come in file order it is two lookups in prefix sums, not a ``np.unique``."""

        def by_row_groups(start: int, stop: int) -> int:
            return int(rg_bytes[self.row_groups(start, stop, ds)].sum())

        if self.keys is None:  # chunks by row count: a range of row groups already
            return by_row_groups
        offsets = self.rg_offsets
        owner = np.repeat(np.arange(self.n_chunks), np.diff(offsets))
        ids = self.rg_ids[np.lexsort((self.rg_ids, owner))]  # each chunk's, ascending
        if len(ids) > 1 and bool((ids[1:] < ids[:-1]).any()):
            return by_row_groups
        # Sorted: a row group's bytes count where it first appears; a range's first
        # entry counts too, whichever chunk before it shared its row group.
        first = np.concatenate([[True], ids[1:] != ids[:-1]])
        cum = np.concatenate([[0], np.cumsum(np.where(first, rg_bytes[ids], 0))])

        def by_keys(start: int, stop: int) -> int:
            a, b = int(offsets[start]), int(offsets[stop])
            return int(cum[b] - cum[a + 1] + rg_bytes[ids[a]]) if b > a else 0

        return by_keys

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
    meta, table = PREFETCHED.pop((ds.url, key, ds.versions[i]), (None, None))
    meta = meta or cached_footer(ds.url, key, ds.versions[i])
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
            as_dataset_type(c, _plain(ds.schema.field(b).type), b, store.describe(key))
            for c, b in zip(columns, by, strict=True)
        ]

    if all(s is not None for s in stats) and meta.num_row_groups:
        found = {b: _stats_column([s[j] for s in stats], _plain(ds.schema.field(b).type), b,
                                  store.describe(key)) for j, b in enumerate(read)}  # fmt: skip
        return pa.table(
            [*by_columns(found, len(stats)), rgs, pa.array(counts, pa.int64())],
            names=[*by, "__rg", "count_all"],
        )
    if table is None or not set(read) <= set(table.column_names):
        with store.open_input(key) as f:
            table = pq.ParquetFile(f, metadata=meta).read(columns=read, use_threads=False)
    found = {b: table.column(b) for b in read}
    table = pa.table(by_columns(found, table.num_rows), names=list(by))
    if table.num_rows > RUNS_TOGETHER_ROWS:
        return _runs(table, rgs, counts)
    # A small file's rows are run-length encoded with the other small files' at once:
    # a call per file costs more than its few rows.
    return table.append_column("__rg", pa.array(np.repeat(rgs, counts)))


#: Files of at most this many rows have their rows' runs found together.
RUNS_TOGETHER_ROWS = 65_536


def _stats_column(values: list, t: pa.DataType, name: str, where: str) -> pa.Array:
    try:
        return pa.array(values, type=t)
    except (pa.ArrowInvalid, OverflowError):  # an int beyond 2**53 as a float, say
        return as_dataset_type(pa.array(values), t, name, where)


def as_dataset_type(column, t: pa.DataType, name: str, where: str):
    """``column`` (of the file ``where``) at the dataset's type ``t`` for it, which
    another file's type widened; an error naming both when its values do not fit (an
    int64 beyond 2**53 as a float: two ids would become one)."""
    if column.type == t:
        return column
    try:
        return column.cast(t)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise InputError(
            f"{where}: column {name!r} is {column.type} here, {t} in other files of the "
            f"dataset, and its values do not fit that ({exc}); make the files agree on it"
        ) from None


def _plain(t: pa.DataType) -> pa.DataType:
    return t.value_type if pa.types.is_dictionary(t) else t


def decoded(column):
    """A chunk key column as the chunk index holds it: a dictionary column (a pandas
    categorical as parquet stores it) as its values, since keys are compared, grouped
    and sorted as values; and floats with -0.0 as 0.0, which it equals (grouped by
    their bits, the rows of one of the two were in no chunk, silently)."""
    if pa.types.is_dictionary(column.type):
        column = column.cast(column.type.value_type)
    if pa.types.is_float32(column.type) or pa.types.is_float64(column.type):
        column = pc.add(column, pa.scalar(0.0, column.type))  # -0.0 + 0.0 is 0.0
    return column


def _runs(table: pa.Table, rgs: np.ndarray | None = None, counts=None) -> pa.Table:
    """``table``'s runs of equal rows, one row each with its length (``__rows``): a
    file's rows come sorted by chunk far more often than not, and grouping its runs
    costs a few milliseconds where grouping its rows cost tens (2.5 M rows: 50 ms).
    With ``rgs`` (global row-group ids) and ``counts`` (their rows), a run also ends
    where a row group does, and has its group's id (``__rg``): cheaper than a column
    of every row's group compared with the rest (a millisecond a million rows)."""
    n = table.num_rows
    if n < 2:  # (a file's rows only when there are many: never this)
        return table.append_column("__rows", pa.array(np.ones(n, dtype=np.int64)))
    change = np.zeros(n - 1, dtype=bool)
    if rgs is not None:
        ends = np.cumsum(counts)
        inner = ends[:-1]
        change[inner[(inner > 0) & (inner < n)] - 1] = True
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
    runs = table.take(pa.array(starts))
    if rgs is not None:
        runs = runs.append_column("__rg", pa.array(rgs[np.searchsorted(ends, starts, "right")]))
    return runs.append_column("__rows", pa.array(np.diff(np.append(starts, n))))


#: Average rows per file from which the chunk index reads files in threads.
HEAVY_FILE_ROWS = 100_000


def plan_chunks(ds: Dataset, by: tuple[str, ...], chunk_rows: int | None) -> ChunkIndex:
    """Driver: the chunk index, from the chunk-by columns (or footers for chunk_rows)."""
    if not by:
        return ChunkIndex((), chunk_rows, None, None, None, total_rows=ds.num_rows)
    store = open_store(ds.url)
    first_rg = np.searchsorted(ds.rg_file, np.arange(len(ds.keys)))
    # Files of 100,000 rows or more on average: their keys are decoded and their runs
    # found in threads (numpy and pyarrow release the GIL there; smaller files would
    # spend more on the threads than they save).
    parts = per_object(
        store,
        lambda i: _chunk_rg_pairs(ds, store, i, by, int(first_rg[i])),
        range(len(ds.keys)),
        heavy=ds.num_rows >= HEAVY_FILE_ROWS * len(ds.keys),
    )
    # Runs grouped once for all files: a group-by per small file costs more than its rows.
    # Each part: a file's row groups' keys from statistics (count_all), its runs of rows
    # (__rows), or a small file's rows, whose runs are found with the others' at once
    # (runs never span files: their row groups differ).
    counted, runs, small = [], [], []
    for p in parts:
        names = p.column_names
        if "count_all" in names:
            counted.append(p)
        elif "__rows" in names:
            runs.append(p)
        else:
            small.append(p)
    if small:
        runs.append(_runs(pa.concat_tables(small)))
    parts = counted
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


def chunk_boundaries(ds: Dataset, index: ChunkIndex) -> np.ndarray:
    """Chunks where a task may start without sharing a row group with the chunks
    before it: row-group (and file) starts, for chunks in row-group order."""
    n = index.n_chunks
    if not index.by:
        row_starts = ds.rg_row_bounds[:-1]
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
