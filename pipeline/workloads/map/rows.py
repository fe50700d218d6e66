"""What a ``map`` unit's call returned, as rows of the task's tables: one row per
single value, mapping or Series, the rows of a DataFrame, Table or list of
mappings; the unit's key columns first; and the record of a unit that failed.

Column rule across units: the columns are the union, in order of first
appearance; a unit that lacks a column has nulls there; numeric types widen
(int to float) and null-only columns take the other units' type; any other
difference fails the task naming two units that differ.
"""

from __future__ import annotations

import datetime
import numbers
import types
from collections.abc import Mapping
from typing import Any

import numpy as np
import pyarrow as pa

from ...errors import InputError
from ...results import differing_units
from .usercode import failure_frame

__all__ = ["ONE_TYPE_A_COLUMN", "SCALAR_COLUMN", "UnitRows"]


class UnitRows:
    """Rows of the units of ``input`` (a :mod:`.map_inputs` input: it knows each unit's
    key columns)."""

    def __init__(self, input):
        self.input = input
        #: The names a returned column may not have unchecked: the key columns'.
        self._keyed_names = frozenset(("unit", *input.key_names))

    def failure(self, unit: int, error: Exception, attempts: int) -> dict:
        """A failed unit's record: a row of its task's failures table (but ``key``, the
        unit's key as text for the run's list of failures)."""
        return {
            "unit": unit,
            "key": self.key_label(unit),
            "error_type": type(error).__name__,
            "message": str(error) or repr(error),
            "where": failure_frame(error),
            "attempts": attempts,
        }

    def from_return(self, unit: int, returned: Any) -> dict | pa.Table | None:
        """What a unit returned, as one row (a dict) or rows (a table), keys not yet added."""
        if (
            type(returned) is dict
            and all(type(name) is str for name in returned)
            and self._keyed_names.isdisjoint(returned)
        ):
            # The common case first (a function returning {"y": ...}): what the general
            # path below makes of it, at a fraction of its cost per unit
            return dict(returned)
        if returned is None:
            return None
        if isinstance(returned, types.GeneratorType):
            # (before the lists' checks: yielded values were refused as "a list")
            returned = list(returned)
        if isinstance(returned, _SCALARS):
            # One value per unit, as joblib's Parallel collects them: a row of one column.
            returned = {SCALAR_COLUMN: returned}
        elif isinstance(returned, np.ndarray):
            # An array (an embedding, predictions) is one value too: a list cell.
            returned = {SCALAR_COLUMN: returned if returned.ndim == 1 else returned.tolist()}
        elif (
            isinstance(returned, list | tuple)
            and not any(isinstance(r, Mapping) for r in returned)
            and returned
        ):
            # Values, not rows (rows are mappings): one list cell, as `return loss, acc`.
            returned = {SCALAR_COLUMN: list(returned)}
        if type(returned).__name__ == "Series" and hasattr(returned, "index"):
            # One row, its labels naming the columns (as chunk.mean() gives).
            returned = _named_row(returned, "a pandas Series")
        if isinstance(returned, Mapping):
            row = _named_row(returned, "a mapping")
            for name in self._echoed_keys(unit, row, lambda c: [row[c]]):
                del row[name]
            return row
        if isinstance(returned, pa.Table):
            table = returned
        elif isinstance(returned, pa.RecordBatch):
            table = pa.Table.from_batches([returned])
        elif type(returned).__name__ == "DataFrame" and hasattr(returned, "to_numpy"):
            # A named index (what a groupby gives) is data: its levels become columns.
            # An unnamed one is row labels (a filtered chunk's), left out.
            if any(name is not None for name in returned.index.names):
                returned = returned.reset_index()
            if returned.columns.nlevels > 1:
                # agg({"x": ["mean", "std"]}): x_mean, x_std (pyarrow would name them
                # "('x', 'mean')"); a level left empty by reset_index drops out
                returned = returned.set_axis(
                    ["_".join(str(p) for p in c if str(p)) for c in returned.columns], axis=1
                )
            table = pa.Table.from_pandas(returned, preserve_index=False)
        elif isinstance(returned, list | tuple) and all(isinstance(r, Mapping) for r in returned):
            if not returned:
                return None
            table = pa.Table.from_pylist([_named_row(r, "a row") for r in returned])
        elif isinstance(returned, list | tuple):
            raise TypeError(
                f"the function returned a {type(returned).__name__} of rows (mappings) mixed "
                "with other values; expected rows only (each a mapping, one a row) or values "
                "only (stored as one list)"
            )
        else:
            raise TypeError(
                f"the function returned a {type(returned).__module__}.{type(returned).__name__}; "
                "expected a value (number, text, date, array or list), a mapping or a pandas "
                "Series (one row), a pandas DataFrame, a pyarrow Table or a list of mappings "
                "(rows), or None"
            )
        echoed = self._echoed_keys(unit, table.column_names,
                                   lambda c: table.column(c).unique().to_pylist())  # fmt: skip
        return table.drop_columns(echoed) if echoed else table

    def _echoed_keys(self, unit: int, names, values_of) -> list[str]:
        """The returned columns named like a key column (which the results begin with)
        that hold the unit's own key (``{"g": chunk.g.iloc[0], ...}``, a groupby's
        index): the same data, left out. One holding anything else fails the unit."""
        clash = [c for c in names if c == "unit" or c in self.input.key_names]
        if not clash:
            return []
        keys = {"unit": unit}
        keys.update({k: v[0].as_py() for k, v in self.input.key_columns([unit]).items()})
        for name in clash:
            other = [v for v in values_of(name) if not _same(v, keys[name])]
            if other:
                raise ValueError(
                    f"the function returned a column {name!r} holding {_plain(other[0])!r}, but "
                    f"{name!r} is a key column the results begin with, and this unit's "
                    f"{name} is {keys[name]!r}; rename the column"
                )
        return clash

    def assemble(self, pieces: dict[int, Any], failed: list[dict]) -> pa.Table | None:
        """The task's rows in unit order, key columns first. Runs of one-row units are
        built as one table (a table per unit costs more than most functions); a unit
        whose row holds a value no table column can hold goes to ``failed``."""
        units = sorted(pieces)
        tables: list[pa.Table] = []
        owners: list[Any] = []
        run: list[int] = []

        def flush() -> None:
            if run:
                table = self._row_table(run, [pieces[u] for u in run], failed)
                if table is not None:
                    tables.append(table)
                    owners.append(f"{run[0]}" if len(run) == 1 else f"{run[0]}-{run[-1]}")
                run.clear()

        for unit in units:
            piece = pieces[unit]
            if isinstance(piece, dict):
                run.append(unit)
                continue
            flush()
            if "unit" not in piece.column_names:  # kept from an earlier attempt: keyed
                piece = self._keyed(unit, piece)
            tables.append(piece)
            owners.append(unit)
        flush()
        return _combine(tables, owners)

    def key_label(self, unit: int) -> str:
        """``ticker='AAA'``: which unit ``unit`` is."""
        return self.row_label({k: v[0].as_py() for k, v in self.input.key_columns([unit]).items()})

    def row_label(self, row: Mapping) -> str:
        """:meth:`key_label` of a row of the unit's results or failures (which begin
        with its key columns): from the row, not the input's."""
        return ", ".join(f"{k}={row[k]!r}" for k in self.input.key_names)

    def empty(self) -> pa.Table:
        """A task's results when every unit returned None: no rows, but its part, so
        that the manifest lists the task's units."""
        return pa.table(self._keys([]))

    def _keys(self, units: list[int]) -> dict[str, pa.Array]:
        return {"unit": pa.array(units, pa.int64()), **self.input.key_columns(units)}

    def _keyed(self, unit: int, table: pa.Table) -> pa.Table:
        n = table.num_rows
        columns = {k: pa.repeat(v[0], n) for k, v in self._keys([unit]).items()}
        for name in table.column_names:
            columns[name] = table.column(name)
        return pa.table(columns)

    def _row_table(self, units: list[int], rows: list[dict], failed: list[dict]) -> pa.Table | None:
        names = list(dict.fromkeys(k for row in rows for k in row))
        columns = dict(self._keys(units))
        try:
            for name in names:
                columns[name] = pa.array([row.get(name) for row in rows])
        except _UNCONVERTIBLE:
            # One table per unit: a unit with a value no column can hold fails alone,
            # and units whose values do not share a type are named by the combination.
            per_unit, owners = [], []
            for unit, row in zip(units, rows, strict=True):
                try:
                    per_unit.append(self._keyed(unit, _one_row(row)))
                    owners.append(unit)
                except _UNCONVERTIBLE as exc:
                    failed.append(self.failure(unit, exc, 1))
            return _combine(per_unit, owners)
        return pa.table(columns)

    def failures(self, failed: list[dict]) -> pa.Table:
        """The failures table of ``failed`` (records from :meth:`failure`)."""
        units = [f["unit"] for f in failed]
        keys = {"unit": pa.array(units, pa.int64()), **self.input.key_columns(units)}
        return pa.table(
            {
                **keys,
                "error_type": pa.array([f["error_type"] for f in failed], pa.string()),
                "message": pa.array([f["message"] for f in failed], pa.string()),
                "where": pa.array([f["where"] for f in failed], pa.string()),
                "attempts": pa.array([f["attempts"] for f in failed], pa.int64()),
            }
        )


#: The column a function's single value (a number, text, a date) is stored in.
SCALAR_COLUMN = "result"
_SCALARS = (numbers.Number, str, bytes, datetime.date, datetime.timedelta, np.generic)

_UNCONVERTIBLE = (
    pa.ArrowInvalid,
    pa.ArrowTypeError,
    pa.ArrowNotImplementedError,
    TypeError,
    ValueError,
    OverflowError,
)


def _named_row(labelled, what: str) -> dict:
    """A row whose labels name its columns, as text (``{0.5: q}`` gives column "0.5", as
    a Series' labels and a DataFrame's columns do)."""
    row = {label if isinstance(label, str) else str(label): value
           for label, value in labelled.items()}  # fmt: skip
    if len(row) != len(labelled):
        raise ValueError(
            f"the function returned {what} with labels that repeat as text; as a row, its "
            "labels name the columns and must differ"
        )
    return row


def _plain(value):
    """A numpy scalar as the Python value it holds, for messages (numpy 2 shows
    ``np.float64(2.0)``)."""
    return value.item() if hasattr(value, "item") and getattr(value, "ndim", None) == 0 else value


def _one_row(row: dict) -> pa.Table:
    """A returned row as a table, or an error naming the column it cannot hold."""
    for name, value in row.items():
        if isinstance(value, np.ndarray) and value.ndim != 1:
            # As a returned array is: a 0-d one its value, one of more dimensions lists
            value = row[name] = value.tolist()
        try:
            pa.array([value])
        except _UNCONVERTIBLE as exc:
            shown = repr(value)
            shown = shown if len(shown) <= 60 else shown[:57] + "..."
            raise ValueError(
                f"column {name!r}: {shown} ({type(value).__name__}) cannot be stored in a "
                f"table column ({exc}); return numbers, text, dates, lists or mappings of them"
            ) from None
    return pa.Table.from_pylist([row])


def _combine(tables: list[pa.Table], units: list[int]) -> pa.Table | None:
    """The units' rows as one table, by the column rule in the module's docs."""
    if not tables:
        return None
    try:
        return pa.concat_tables(tables, promote_options="permissive")
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as exc:
        raise InputError(f"{differing_units([t.schema for t in tables], units, exc)}: "
                         f"{ONE_TYPE_A_COLUMN}") from None  # fmt: skip


#: What to do about results whose columns differ in type between units (within a
#: task, or between tasks at the job's end): a rerun would fail them the same way.
ONE_TYPE_A_COLUMN = (
    "a column must hold one type in every unit's results (integers and floats may mix); "
    "fix the function, then run the job again with --overwrite"
)


def _same(value: Any, key: Any) -> bool:
    """Whether a returned value is the unit's key (a NaN key is its own NaN)."""
    try:
        return bool(value == key) or (value != value and key != key)
    except (TypeError, ValueError):
        return False
