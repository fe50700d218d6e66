"""A grid given as a .csv or .parquet file of points: unit ``u`` is row ``u``, its
columns the call's arguments. The driver reads the file once (:mod:`.points_scan`)
and keeps its size, key types and record; each task reads its own rows from the
copy the driver made, the row groups its units are in, and nothing else.

The job is that of the same points given as a list (:class:`.grid.GridInput`): the
same record (a changed point is another job), key columns and calls.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ...config.settings import RowsFile
from ...errors import ConfigError, PipelineError
from ...storage import open_store
from .inputs import Call, units_of
from .points_scan import scan_points

__all__ = ["PointsFileInput"]


class PointsFileInput:
    """The points of a grid file, read by each task from the driver's copy."""

    kind = "grid"

    def __init__(self, source: RowsFile, output: str | None):
        scanned = scan_points(source, output)
        self.path = source.path
        self.n_units = scanned.n_units
        self.keys = self.key_names = scanned.keys
        self.key_types = scanned.key_types
        self.copy_folder, self.copy_key = scanned.copy_folder, scanned.copy_key
        self.rows_per_group = scanned.rows_per_group
        self._recorded = scanned.recorded
        self._local = threading.local()  # a thread's last rows read, by its task

    def __getstate__(self) -> dict:
        # The record is the driver's (up to a thousand points); a thread's rows its own
        return {**self.__dict__, "_recorded": None, "_local": None}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._local = threading.local()

    @property
    def copy_url(self) -> str:
        return f"{self.copy_folder}/{self.copy_key}"

    def calls(
        self, start: int, stop: int, only: set[int] | None = None, reads: list | None = None
    ) -> Iterator[Call]:
        """The calls of units ``start..stop-1`` (or those of them in ``only``): their
        rows' values as Python values, as a list of the points gives them."""
        rows = self._read(start, stop)
        self._local.rows = (start, stop, rows)  # (their key columns are asked for next)
        units = range(start, stop) if only is None else units_of(start, stop, only)
        if only is not None:
            rows = rows.take(pa.array(np.asarray(units, dtype=np.int64) - start))
        columns = [rows.column(k).to_pylist() for k in self.keys]
        keys = self.keys
        for unit, values in zip(units, zip(*columns, strict=True), strict=True):
            yield unit, (), dict(zip(keys, values, strict=True))

    def key_columns(self, units) -> dict[str, pa.Array]:
        units = np.asarray(units, dtype=np.int64)
        if not units.size:  # (a task whose every unit returned None: its empty part)
            return {k: pa.array([], t or pa.string()) for k, t in self.key_types.items()}
        rows = self._rows_of(units)
        return {k: _key_column(rows.column(k), t) for k, t in self.key_types.items()}

    def _rows_of(self, units: np.ndarray) -> pa.Table:
        """The rows of ``units``, in their order: from the rows this thread read for
        its task when they are there, else from their row groups."""
        held = getattr(self._local, "rows", None)
        if held is not None and held[0] <= units.min() and units.max() < held[1]:
            return held[2].take(pa.array(units - held[0]))
        size = self.rows_per_group
        groups = np.unique(units // size)
        table = self._groups(groups.tolist())
        # (every group but the file's last, which sorts last, is whole)
        at = np.searchsorted(groups, units // size) * size
        return table.take(pa.array(at + units % size))

    def _read(self, start: int, stop: int) -> pa.Table:
        """Rows ``start..stop-1``: those of the row groups they are in."""
        size = self.rows_per_group
        first = start // size
        table = self._groups(list(range(first, (stop - 1) // size + 1)))
        return table.slice(start - first * size, stop - start)

    def _groups(self, groups: list[int]) -> pa.Table:
        store = open_store(self.copy_folder)
        with store.open_input(self.copy_key) as f:
            # (on the calling thread: a pyarrow pool thread alive at exit aborts the process)
            return pq.ParquetFile(f).read_row_groups(groups, use_threads=False)

    def check_readable(self, client) -> None:
        """Refuse a cluster whose workers cannot read the copy (on another machine
        than a copy in this one's temporary folder), before any task."""
        answers = client.run(_why_not_readable, self.copy_folder, self.copy_key)
        failing = {worker: why for worker, why in answers.items() if why}
        if failing:
            worker, why = min(failing.items())
            raise ConfigError(
                f"{len(failing)} of {len(answers)} workers cannot read the copy of grid file "
                f"{self.path} at {self.copy_url} ({worker}: {why}); the copy goes under the "
                "job's output, where every worker reads: give the workload its output "
                "(MapWorkload(..., output=...), as pipeline run and pipeline.map do)"
            )

    def fingerprint(self) -> dict:
        return {"grid": self._recorded}

    def describe(self) -> str:
        return f"{self.n_units:,} grid points (from {self.path}: {', '.join(self.keys)})"


def _why_not_readable(folder: str, key: str) -> str | None:
    """Worker: why the copy cannot be read here, or None."""
    try:
        if not open_store(folder).exists(key):
            return "no such file"
    except (OSError, PipelineError) as exc:
        return str(exc)
    return None


#: Columns of these types are their key column as they are, cast (a value cast is
#: the one the Python value gives).
_CAST = {
    pa.int64(): pa.types.is_integer,
    pa.float64(): lambda t: pa.types.is_float32(t) or pa.types.is_float64(t),
    pa.string(): lambda t: pa.types.is_string(t) or pa.types.is_large_string(t),
}


def _key_column(column: pa.ChunkedArray, t: pa.DataType | None) -> pa.Array:
    """A key's column in the results, as of the same values listed: of the key's type
    (:func:`.inputs.key_type`), from the Python values where not a plain cast; or
    their repr text."""
    column = column.combine_chunks()
    if t is None:
        return pa.array([repr(v) for v in column.to_pylist()], pa.string())
    if column.type == t:
        return column
    if t in _CAST and _CAST[t](column.type):
        return column.cast(t)
    return pa.array(column.to_pylist(), type=t)
