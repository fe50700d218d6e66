"""The inputs a ``map`` job can take besides a grid (:mod:`.grid`): dataset chunks, files;
and how the job's record holds long lists of values.

Each numbers its units 0..n-1 in a fixed order, gives each unit's key columns (the
first columns of the unit's result rows) and the arguments of the unit's call.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Iterator

import pyarrow as pa

from ...cluster.code_digest import has_address
from ...contract import as_recorded, json_value
from ...errors import ConfigError, InputError

__all__ = [
    "DataInput",
    "FilesInput",
    "check_stable_text",
    "key_type",
    "recorded",
    "unit_runs",
    "units_of",
]

Call = tuple[int, tuple, dict]


class FilesInput:
    """Every file in a folder (recursively), matching a glob, or under an s3:// prefix
    (:mod:`.map_files`), with its version: a resume after one changed is refused."""

    kind = "files"
    key_names = ("file",)

    def __init__(self, where: str):
        from .files import list_files

        self.where = where
        listed = list_files(where)
        self.paths = tuple(path for path, _ in listed)
        self.versions = tuple(version for _, version in listed)
        self.n_units = len(self.paths)

    def __getstate__(self) -> dict:
        # The versions are for the job's record, on the driver: not sent with each task
        return {**self.__dict__, "versions": ()}

    def calls(
        self, start: int, stop: int, only: set[int] | None = None, reads: list | None = None
    ) -> Iterator[Call]:
        for unit in units_of(start, stop, only):
            yield unit, (self.paths[unit],), {}

    def key_columns(self, units: list[int]) -> dict[str, pa.Array]:
        return {"file": pa.array([as_text(self.paths[u]) for u in units], pa.string())}

    def fingerprint(self) -> dict:
        # (the key "versions", as a data input's: a change of them alone is said to be
        # the input files')
        return {"files": recorded(list(self.paths), "files"),
                "versions": recorded(list(self.versions), "versions")}  # fmt: skip

    def describe(self) -> str:
        return f"{self.n_units} files in {self.where}"


def as_text(path: str) -> str:
    """``path`` as the ``file`` column holds it: a name's bytes that are not UTF-8 (which
    Python keeps as lone surrogates, and parquet cannot store) as ``\\xff`` escapes."""
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:
        return path.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    return path


class DataInput:
    """Chunks of a parquet dataset (``chunk_by`` columns or ``chunk_rows``), planned as
    the regressions plan theirs: from footers and the chunk columns only."""

    kind = "data"

    def __init__(self, data: str, chunk_by: tuple[str, ...], chunk_rows: int | None,
                 columns: tuple[str, ...]):  # fmt: skip
        from ...inputs.chunks import plan_chunks
        from ...inputs.dataset import check_columns, discover

        if chunk_by and chunk_rows:
            raise ConfigError("give chunk_by or chunk_rows, not both")
        if not chunk_by and not chunk_rows:
            raise ConfigError("data: no chunks: give chunk_by (column names) or chunk_rows")
        self.dataset = discover(data, tuple(chunk_by))
        if columns:
            needed = {c: "columns" for c in columns}
        else:  # the function gets every column, so every file needs each
            needed = {c: "the function (columns not set)" for c in self.dataset.schema.names}
        needed.update({b: "chunk_by" for b in chunk_by})
        check_columns(self.dataset, needed)
        self.index = plan_chunks(self.dataset, chunk_by, chunk_rows)
        if self.index.n_chunks == 0:
            raise InputError(f"dataset {self.dataset.describe()} has no rows")
        self.columns = tuple(columns) or tuple(self.dataset.schema.names)
        self.key_names = tuple(self.index.by) or ("row_start", "row_stop")
        self.n_units = self.index.n_chunks

    def calls(
        self, start: int, stop: int, only: set[int] | None = None, reads: list | None = None
    ) -> Iterator[Call]:
        """Units ``start..stop-1`` (or those of them in ``only``), each run of
        consecutive units read together: the row groups of the others are not read.
        ``reads`` ([bytes read, bytes the units hold, seconds]) is added to."""
        from ...inputs.task_rows import read_task_rows

        for first, last in unit_runs(units_of(start, stop, only)):
            t0 = time.perf_counter()
            rows = read_task_rows(self.dataset, self.index, first, last, list(self.columns))
            if reads is not None:
                reads[0] += rows.bytes_read
                reads[1] += rows.bytes_needed
                reads[2] += time.perf_counter() - t0
            frame = rows.table.to_pandas(use_threads=False)
            for i, unit in enumerate(range(first, last)):
                a, b = int(rows.offsets[i]), int(rows.offsets[i + 1])
                yield unit, (frame.iloc[a:b].reset_index(drop=True),), {}

    def key_columns(self, units: list[int]) -> dict[str, pa.Array]:
        import numpy as np

        idx = np.asarray(units, dtype=np.int64)
        if self.index.by:
            keys = self.index.keys.take(pa.array(idx))
            return {b: keys.column(b).combine_chunks() for b in self.index.by}
        first = idx * self.index.chunk_rows
        last = np.minimum(first + self.index.chunk_rows, self.index.total_rows)
        return {"row_start": pa.array(first), "row_stop": pa.array(last)}

    def fingerprint(self) -> dict:
        ds = self.dataset
        return {"data": ds.url, "data_files": list(ds.keys), "versions": list(ds.versions)}

    def describe(self) -> str:
        by = ",".join(self.index.by) if self.index.by else f"{self.index.chunk_rows} rows"
        return f"{self.n_units} chunks (by {by}) of {self.dataset.describe()}"


def units_of(start: int, stop: int, only: set[int] | None = None) -> range | list[int]:
    """Units ``start..stop-1``, or those of them in ``only``, ascending."""
    if only is None:
        return range(start, stop)
    return sorted(u for u in only if start <= u < stop)


def unit_runs(units) -> list[tuple[int, int]]:
    """Ascending ``units`` as runs of consecutive ones: ``(first, stop)`` each."""
    runs: list[list[int]] = []
    for u in units:
        if runs and runs[-1][1] == u:
            runs[-1][1] = u + 1
        else:
            runs.append([u, u + 1])
    return [(a, b) for a, b in runs]


#: Listed grid points (or files) a job's record holds as they are; beyond, their digest.
LISTED_RECORDED = 1000


def recorded(values: list, count: str) -> list | dict:
    """``values`` as a job's record holds them: as JSON holds them, or beyond
    :data:`LISTED_RECORDED` their number (named ``count``) and digest. A record of
    300,000 grid points was 16 MB, written each time the plan was (8 s each)."""
    if len(values) <= LISTED_RECORDED:
        return as_recorded(values)
    text = json.dumps(values, sort_keys=True, default=json_value).encode()
    return {count: len(values), "sha256": hashlib.sha256(text).hexdigest()}


#: Python's default text of an object: its memory address, another in every process.
def check_stable_text(key: str, values: list) -> None:
    """Values written as their repr must say the same in every run: the key column,
    the job's record (which a resume compares) and the output's bytes are that text."""
    for v in values:
        if has_address(repr(v)):
            raise ConfigError(
                f"grid {key!r}: a value's text, {repr(v)[:80]}, is its memory address, "
                "another in every run (so results would not be reproducible, and a resume "
                f"is refused); give {type(v).__name__} a __repr__ that says what it is, or "
                "put a plain value (a name, a number) in the grid and build the object in "
                "the function"
            )


def key_type(values: list) -> pa.DataType | None:
    """The column type of a grid key's values, or None to write them as their repr
    text: values that pyarrow cannot type (objects), or of mixed kinds (numbers with
    text, or booleans with numbers, which pyarrow would turn into 1.0 silently).
    Integers with floats are floats."""
    import numbers

    import numpy as np

    def kind(v) -> str:
        if isinstance(v, bool | np.bool_):
            return "bool"
        if isinstance(v, numbers.Number):
            return "number"
        return type(v).__name__

    if len({kind(v) for v in values if v is not None}) > 1:
        return None
    try:
        return pa.array(values).type
    except (pa.ArrowException, TypeError, ValueError, OverflowError):
        return None
