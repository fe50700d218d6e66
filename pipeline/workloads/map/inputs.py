"""The three inputs a ``map`` job can take: dataset chunks, a parameter grid, files.

Each numbers its units 0..n-1 in a fixed order, gives each unit's key columns (the
first columns of the unit's result rows) and the arguments of the unit's call.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import re
from collections.abc import Iterator
from typing import Any

import pyarrow as pa

from ...contract import as_recorded, json_value
from ...errors import ConfigError, InputError

__all__ = ["DataInput", "FilesInput", "GridInput"]

Call = tuple[int, tuple, dict]


class GridInput:
    """A parameter grid: the cartesian product of a table of lists, keys in the order
    written, or a list of points (tables of one value per key), in the order listed."""

    kind = "grid"

    def __init__(self, grid: dict[str, Any] | list[dict[str, Any]] | tuple):
        if not grid:
            raise ConfigError("grid: empty; expected a table of lists, e.g. {alpha = [0.1, 1]}")
        if isinstance(grid, list | tuple):
            self.listed = True  # points, in order; else every combination
            keys = tuple(grid[0])
            if not keys:
                raise ConfigError("grid: point 0 has no keys; a point gives the call's arguments")
            for i, point in enumerate(grid):
                if set(point) != set(keys):
                    raise ConfigError(
                        f"grid: point {i} has keys {_names(point)} where point 0 has "
                        f"{_names(keys)}; every point of a list of points needs the same keys"
                    )
            self.grid: dict[str, list] = {k: [p[k] for p in grid] for k in keys}
            self.n_units = len(grid)
        else:
            self.listed = False
            self.grid = {key: _grid_values(key, values) for key, values in grid.items()}
            self.n_units = 1
            for values in self.grid.values():
                self.n_units *= len(values)
        for key in self.grid:
            if not key.isidentifier():
                raise ConfigError(f"grid: key {key!r} is not a valid parameter name")
        self.keys = self.key_names = tuple(self.grid)
        # One type per key for the whole grid: typed per task, a task's keys would
        # depend on which values it holds (True among 1 and 2.5 as 1.0, alone as bool)
        self.key_types = {k: _key_type(self.grid[k]) for k in self.keys}
        for key, t in self.key_types.items():
            if t is None:
                _check_stable_text(key, self.grid[key])

    def unit(self, i: int) -> dict[str, Any]:
        if self.listed:
            return {k: self.grid[k][i] for k in self.keys}
        out = {}
        for key in reversed(self.keys):
            values = self.grid[key]
            i, j = divmod(i, len(values))
            out[key] = values[j]
        return {k: out[k] for k in self.keys}

    def calls(self, start: int, stop: int) -> Iterator[Call]:
        if self.listed:
            combos = zip(*(self.grid[k][start:stop] for k in self.keys), strict=True)
        else:
            combos = itertools.islice(itertools.product(*self.grid.values()), start, stop)
        for unit, values in enumerate(combos, start):
            yield unit, (), dict(zip(self.keys, values, strict=True))

    def key_columns(self, units: list[int]) -> dict[str, pa.Array]:
        rows = [self.unit(u) for u in units]
        out = {}
        for k, t in self.key_types.items():
            if t is None:
                out[k] = pa.array([repr(r[k]) for r in rows], pa.string())
            else:
                out[k] = pa.array([r[k] for r in rows], type=t)
        return out

    def fingerprint(self) -> dict:
        # Objects (from Python) as their repr, which says their parameters: checked
        # to hold no memory address (_check_stable_text)
        if not self.listed:
            return {"grid": as_recorded(self.grid)}
        # (the digest of many points from them as they are: their JSON round trip was
        # 2 of a 300,000-point grid's 3 s)
        return {"grid": _recorded([self.unit(i) for i in range(self.n_units)], "points")}

    def describe(self) -> str:
        if self.listed:
            return f"{self.n_units} grid points (listed: {', '.join(self.keys)})"
        return f"{self.n_units} grid points ({' x '.join(self.keys)})"


def _grid_values(key: str, values: Any) -> list:
    """A key's values as a list: from Python a tuple, a range or a 1-D array (numpy,
    pandas) will do too, its elements as Python scalars; a set has no order to keep.
    A single value (``n = 1000``) is held fixed: a list of one."""
    if isinstance(values, list | tuple | range):
        listed = list(values)
    elif getattr(values, "ndim", None) == 1 and hasattr(values, "tolist"):
        listed = values.tolist()
    elif getattr(values, "ndim", None) == 0 and hasattr(values, "item"):
        listed = [values.item()]  # a numpy scalar
    elif values is not None and not isinstance(values, set | frozenset | dict):
        listed = [values]
    else:
        listed = []
    if not listed:
        raise ConfigError(
            f"grid: key {key!r} is {values!r}; expected a value or a non-empty list of values "
            "(a list, tuple, range or 1-D array; or give a list of points: [[grid]] tables "
            "in a job file)"
        )
    return listed


def _names(keys) -> str:
    return "(" + ", ".join(sorted(map(str, keys))) + ")"


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

    def calls(self, start: int, stop: int) -> Iterator[Call]:
        for unit in range(start, stop):
            yield unit, (self.paths[unit],), {}

    def key_columns(self, units: list[int]) -> dict[str, pa.Array]:
        return {"file": pa.array([as_text(self.paths[u]) for u in units], pa.string())}

    def fingerprint(self) -> dict:
        # (the key "versions", as a data input's: a change of them alone is said to be
        # the input files')
        return {"files": _recorded(list(self.paths), "files"),
                "versions": _recorded(list(self.versions), "versions")}  # fmt: skip

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

    def calls(self, start: int, stop: int) -> Iterator[Call]:
        from ...inputs.task_rows import read_task_rows

        rows = read_task_rows(self.dataset, self.index, start, stop, list(self.columns))
        frame = rows.table.to_pandas()
        for i, unit in enumerate(range(start, stop)):
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

    def __sizeof__(self) -> int:
        return object.__sizeof__(self) + self.index.nbytes


#: Listed grid points (or files) a job's record holds as they are; beyond, their digest.
LISTED_RECORDED = 1000


def _recorded(values: list, count: str) -> list | dict:
    """``values`` as a job's record holds them: as JSON holds them, or beyond
    :data:`LISTED_RECORDED` their number (named ``count``) and digest. A record of
    300,000 grid points was 16 MB, written each time the plan was (8 s each)."""
    if len(values) <= LISTED_RECORDED:
        return as_recorded(values)
    text = json.dumps(values, sort_keys=True, default=json_value).encode()
    return {count: len(values), "sha256": hashlib.sha256(text).hexdigest()}


#: Python's default text of an object: its memory address, another in every process.
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+>")


def has_address(text: str) -> bool:
    """Whether ``text`` (a repr) holds a memory address: another in every process."""
    return _ADDRESS.search(text) is not None


def _check_stable_text(key: str, values: list) -> None:
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


def _key_type(values: list) -> pa.DataType | None:
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
