"""The input dataset: its parquet files found, their footers read and their schemas
unified into one (:func:`discover`), and its columns checked against what a job needs.

How chunks are planned over it is :mod:`.chunks`; how a task reads its rows,
:mod:`.task_rows`.
"""

from __future__ import annotations

import functools
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ..errors import InputError
from ..storage import Store, open_store, per_object
from .partitions import Partitions, parse_partitions

__all__ = ["WHOLE_FILE_BYTES", "Dataset", "check_columns", "discover"]


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

    @functools.cached_property
    def rg_row_bounds(self) -> np.ndarray:
        """Row group ``g`` holds the dataset's rows ``bounds[g]`` to ``bounds[g + 1] - 1``
        (computed once: the planner asks for a task's row groups a thousand times)."""
        bounds = np.concatenate([[0], np.cumsum(self.rg_rows)])
        bounds.flags.writeable = False  # shared by every caller
        return bounds

    def file_size(self, f: int) -> int:
        return _version_size(self.versions[f])

    def describe(self) -> str:
        return open_store(self.url).describe(self.keys[0] if len(self.keys) == 1 else "")


#: Files up to this size are read whole by a task (one request, footer included).
WHOLE_FILE_BYTES = 1024 * 1024


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
        under = store.list()
        keys = [k for k in under if k and _is_data_key(k)]
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
                elif not under and not store.remote and not Path(url).exists():
                    raise InputError(f"dataset {url}: no such folder or file")
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
        if not under and store.remote:
            raise InputError(f"dataset {url}: no objects there (nothing under {url}/)")
        raise InputError(
            f"dataset {url}: no .parquet files there (make a demo dataset with "
            "`pipeline data regressions`)"
        )
    partitions = parse_partitions(keys, url)
    first = top_same = None
    unified = _Unified()
    rg_rows, rg_file, rg_local, versions, col_bytes = [], [], [], [], []
    footers = _footers(store, keys, tuple(chunk_by))
    first_parquet = None
    for i, (key, footer) in enumerate(zip(keys, footers, strict=True)):
        try:
            if isinstance(footer, Exception):
                raise footer
            version, meta = footer
            # Thousands of files share one schema: the same parquet schema is the same
            # arrow schema, without converting each (the reconciling is for the others).
            same = first_parquet is not None and meta.schema.equals(first_parquet)
            file_schema = first if same else meta.schema.to_arrow_schema()
        except (OSError, pa.ArrowException) as exc:
            where = store.describe(key)
            raise InputError(f"dataset file {where}: not a readable parquet file ({exc})") from exc
        same = same or first is None or file_schema.equals(first)
        if first is None:
            first, first_parquet = file_schema, meta.schema
        if not same or i == 0:
            unified.add(file_schema, store.describe(key))
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
    by_column = np.zeros((len(rg_rows), len(schema)), dtype=np.int64)
    for g, b in enumerate(col_bytes):  # (a file that lacks later columns: zeros there)
        by_column[g, : len(b)] = b
    col_bytes = by_column
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
        #: column -> a file that has it and the column's type there, for messages (the
        #: field's type may be wider: another file's)
        self.seen_in: dict[str, tuple[str, pa.DataType]] = {}
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
                self.seen_in[fld.name] = (where, fld.type)
            elif have.type != fld.type:
                wider = _wider(have.type, fld.type)
                if wider is None:
                    first, its_type = self.seen_in[fld.name]
                    self.conflicts.setdefault(
                        fld.name,
                        f"column {fld.name!r} is {fld.type} in dataset file {where} and "
                        f"{its_type} in {first}",
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
                pf = read_whole_file(store, key)
                names = pf.metadata.schema.names  # not schema_arrow: it converts the schema
                columns = [c for c in chunk_by if c in names]
                table = pf.read(columns=columns, use_threads=False) if columns else None
                PREFETCHED[(store.url, key, version)] = (pf.metadata, table)
                return version, pf.metadata
            return version, cached_footer(store.url, key, version)
        except Exception as exc:  # raised in order by the caller, naming the file
            return exc

    return per_object(store, one, keys)


#: (url, key, version) -> (footer, chunk-by columns) of small files read whole by
#: :func:`discover`, taken by :func:`plan_chunks`.
PREFETCHED: dict[tuple[str, str, str], tuple] = {}


# Enough for datasets of thousands of small files: a task of many files would
# otherwise read each footer again.
@functools.lru_cache(maxsize=8192)
def cached_footer(url: str, key: str, version: str):
    with open_store(url).open_input(key) as f:
        return pq.ParquetFile(f).metadata


def read_whole_file(store: Store, key: str, read_dictionary=None) -> pq.ParquetFile:
    """A small file read in one request, footer and data."""
    whole = pa.BufferReader(pa.py_buffer(store.read_bytes(key)))
    return pq.ParquetFile(whole, read_dictionary=read_dictionary)


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
