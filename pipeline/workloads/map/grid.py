"""A ``map`` job's grid: the cartesian product of a table of value lists (keys in the
order written), or a list of points (tables of one value per key), in order.

A key's values are held as given: a ``range`` (from Python, or ``{start, stop,
step}`` in a job file) stays a range, so a grid of ten million points costs the
driver, the job's record and every task no more than one of ten. A task's points
are computed from its units' numbers (unit ``u`` of a product is the mixed-radix
digits of ``u``, the last key varying fastest, as in ``itertools.product``), never
by walking the grid from its first point.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import numbers
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import pyarrow as pa

from ...contract import as_recorded, json_value
from ...errors import ConfigError
from . import inputs as listing
from .inputs import Call, check_stable_text, key_type, units_of

__all__ = ["GridInput", "grid_axis"]

#: The most points a grid may have: unit numbers are int64 in the results and in
#: the arithmetic that finds a unit's point.
MAX_POINTS = 2**62
#: Points whose digest is computed from one text at a time (a record of many).
DIGEST_BATCH = 10_000

Axis = range | list | np.ndarray
#: Long lists of numbers or booleans, each of one Python type, are held as numpy
#: arrays of these types: 8 bytes a value, where a list holds 36, and pickled into a
#: task as one buffer.
_NUMPY = {
    int: (pa.int64(), np.int64),
    float: (pa.float64(), np.float64),
    bool: (pa.bool_(), np.bool_),
}
#: Lists at least this long are held as arrays.
ARRAY_VALUES = 1000


class GridInput:
    """A parameter grid: the cartesian product of a table of value lists, keys in the
    order written, or a list of points, in the order listed."""

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
            self.axes: dict[str, Axis] = {k: [p[k] for p in grid] for k in keys}
            self.n_units = len(grid)
        else:
            self.listed = False
            self.axes = {key: grid_axis(key, values) for key, values in grid.items()}
            self.n_units = 1
            for values in self.axes.values():
                self.n_units *= len(values)
        if self.n_units >= MAX_POINTS:
            raise ConfigError(f"grid: {self.n_units:,} points; a grid has fewer than 2**62")
        for key in self.axes:
            if not key.isidentifier():
                raise ConfigError(f"grid: key {key!r} is not a valid parameter name")
        self.keys = self.key_names = tuple(self.axes)
        # One type per key for the whole grid: typed per task, a task's keys would
        # depend on which values it holds (True among 1 and 2.5 as 1.0, alone as bool)
        self.key_types = {k: _axis_type(self.axes[k]) for k in self.keys}
        for key, t in self.key_types.items():
            if t is None and not isinstance(self.axes[key], range):
                check_stable_text(key, self.axes[key])
            self.axes[key] = _as_array(self.axes[key], t)
        # A product's unit u holds value (u // stride) % len of each key
        self._strides, stride = {}, 1
        for key in reversed(self.keys):
            self._strides[key] = stride
            stride *= 1 if self.listed else len(self.axes[key])
        self._columns: dict[str, pa.Array] = {}  # each key's values as a column, made once

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_columns": {}}  # (made again where the task runs)

    def _indices(self, units: np.ndarray) -> dict[str, np.ndarray]:
        """Each key's value index for each of ``units``."""
        if self.listed:
            return dict.fromkeys(self.keys, units)
        return {k: (units // self._strides[k]) % len(self.axes[k]) for k in self.keys}

    def _values(self, key: str, index: np.ndarray) -> list:
        """The Python values of ``key`` at ``index``."""
        axis = self.axes[key]
        if isinstance(axis, range) and self.key_types[key] == pa.int64():
            return (axis.start + index * axis.step).tolist()
        if isinstance(axis, np.ndarray):
            return axis[index].tolist()
        return [axis[i] for i in index.tolist()]

    def unit(self, i: int) -> dict[str, Any]:
        index = self._indices(np.array([i], dtype=np.int64))
        return {k: self._values(k, index[k])[0] for k in self.keys}

    def calls(
        self, start: int, stop: int, only: set[int] | None = None, reads: list | None = None
    ) -> Iterator[Call]:
        """The calls of units ``start..stop-1`` (or those of them in ``only``)."""
        if only is None:
            units = np.arange(start, stop, dtype=np.int64)
        else:
            units = np.asarray(units_of(start, stop, only), dtype=np.int64)
        index = self._indices(units)
        keys = self.keys
        columns = [self._values(k, index[k]) for k in keys]
        for unit, values in zip(units.tolist(), zip(*columns, strict=True), strict=True):
            yield unit, (), dict(zip(keys, values, strict=True))

    def key_columns(self, units) -> dict[str, pa.Array]:
        index = self._indices(np.asarray(units, dtype=np.int64))
        out = {}
        for k, t in self.key_types.items():
            axis = self.axes[k]
            if isinstance(axis, range) and t == pa.int64():
                out[k] = pa.array(axis.start + index[k] * axis.step, pa.int64())
            elif isinstance(axis, np.ndarray):
                out[k] = pa.array(axis[index[k]], t)
            else:
                out[k] = self._column(k).take(pa.array(index[k], pa.int64()))
        return out

    def _column(self, key: str) -> pa.Array:
        """The key's values as a column of its type, or of their repr text."""
        if key not in self._columns:
            axis, t = self.axes[key], self.key_types[key]
            if t is None:
                self._columns[key] = pa.array([repr(v) for v in axis], pa.string())
            else:
                self._columns[key] = pa.array(_listed(axis), type=t)
        return self._columns[key]

    def fingerprint(self) -> dict:
        # Objects (from Python) as their repr, which says their parameters: checked
        # to hold no memory address (check_stable_text)
        if not self.listed:
            return {"grid": {k: _recorded_axis(axis) for k, axis in self.axes.items()}}
        return {"grid": _recorded_points(self)}

    def describe(self) -> str:
        if self.listed:
            return f"{self.n_units:,} grid points (listed: {', '.join(self.keys)})"
        return f"{self.n_units:,} grid points ({' x '.join(self.keys)})"


#: A grid key's range, in a job file: a table of these keys (start and step optional).
RANGE_KEYS = ("start", "stop", "step")


def grid_axis(key: str, values: Any) -> Axis:
    """A key's values: a range as it is; a table ``{start, stop, step}`` (a job file's,
    or JSON's) as that range; from Python a list, a tuple or a 1-D array (numpy,
    pandas), its elements as Python scalars. A single value (``n = 1000``) is held
    fixed: a list of one. A set has no order to keep."""
    if isinstance(values, range):
        listed: Axis = values
    elif isinstance(values, Mapping):
        listed = _range_table(key, values)
    elif isinstance(values, list | tuple):
        listed = list(values)
    elif getattr(values, "ndim", None) == 1 and hasattr(values, "tolist"):
        listed = values.tolist()
    elif getattr(values, "ndim", None) == 0 and hasattr(values, "item"):
        listed = [values.item()]  # a numpy scalar
    elif values is not None and not isinstance(values, set | frozenset):
        listed = [values]
    else:
        listed = []
    if not len(listed):
        raise ConfigError(
            f"grid: key {key!r} is {values!r}; expected a value or a non-empty list of values "
            "(a list, tuple, range or 1-D array, or a range as {start = 0, stop = 1000}; or "
            "give a list of points: [[grid]] tables in a job file)"
        )
    return listed


def _range_table(key: str, table: Mapping) -> range:
    """``{start = 0, stop = 10_000_000, step = 1}``: ``range(start, stop, step)``."""
    example = "{start = 0, stop = 1000000, step = 1} (start 0 and step 1 unless given)"
    odd = sorted(str(k) for k in table if k not in RANGE_KEYS)
    if odd or "stop" not in table:
        why = f"has key(s) {', '.join(odd)}" if odd else "has no stop"
        raise ConfigError(f"grid: key {key!r} is a table that {why}; a table is a range: {example}")
    bounds = {k: table.get(k, d) for k, d in (("start", 0), ("stop", None), ("step", 1))}
    for name, value in bounds.items():
        if not isinstance(value, numbers.Integral) or isinstance(value, bool):
            raise ConfigError(
                f"grid: key {key!r}: {name} = {value!r} is not an integer; a range's start, "
                f"stop and step are integers: {example}"
            )
    if bounds["step"] == 0:
        raise ConfigError(f"grid: key {key!r}: step = 0; a range's step is not zero: {example}")
    axis = range(int(bounds["start"]), int(bounds["stop"]), int(bounds["step"]))
    if not axis:
        raise ConfigError(
            f"grid: key {key!r}: range(start={axis.start}, stop={axis.stop}, step={axis.step}) "
            f"holds no value; {example}"
        )
    return axis


def _as_array(axis: Axis, t: pa.DataType | None) -> Axis:
    """A long list of values of one Python type (int, float or bool) of column type
    ``t`` as a numpy array of it, from which the same Python values come back."""
    if not isinstance(axis, list) or len(axis) < ARRAY_VALUES:
        return axis
    kind = type(axis[0])
    if kind not in _NUMPY or t != _NUMPY[kind][0] or any(type(v) is not kind for v in axis):
        return axis
    return np.asarray(axis, dtype=_NUMPY[kind][1])


def _listed(values) -> list:
    """Values (a list, range or array slice) as a list of Python values."""
    return values.tolist() if isinstance(values, np.ndarray) else list(values)


def _names(keys) -> str:
    return "(" + ", ".join(sorted(map(str, keys))) + ")"


def _axis_type(axis: Axis) -> pa.DataType | None:
    """The column type of a key's values (:func:`.inputs.key_type`): a range's, from
    its ends alone (what pyarrow infers for integers depends on their extremes)."""
    if isinstance(axis, range):
        return key_type([axis[0], axis[-1]])
    return key_type(axis)


def _recorded_axis(axis: Axis) -> list | dict:
    """A key's values as the job's record holds them: as JSON holds them when there
    are at most ``LISTED_RECORDED``; else a range of integers (given as a range or
    listed) as ``{"range": [first, stop, step]}``, and other values by number and
    digest: the record of a grid of ten million points stays a few lines."""
    if len(axis) <= listing.LISTED_RECORDED:
        return as_recorded(_listed(axis))
    progression = _as_range(axis)
    if progression is not None:
        return {"range": [progression.start, progression.stop, progression.step]}
    return listing.recorded(_listed(axis), "values")


def _as_range(axis: Axis) -> range | None:
    """The range of integers ``axis`` holds (normalized: its stop one step past its
    last value), or None when its values are not one."""
    if isinstance(axis, range):
        return range(axis[0], axis[-1] + axis.step, axis.step)
    if isinstance(axis, np.ndarray):
        if axis.dtype != np.int64:
            return None
        steps = np.diff(axis)
        if steps[0] == 0 or (steps != steps[0]).any():
            return None
        first, step = int(axis[0]), int(steps[0])
    else:
        if not all(type(v) is int for v in axis):
            return None
        first, step = axis[0], axis[1] - axis[0]
        if step == 0 or any(b - a != step for a, b in itertools.pairwise(axis)):
            return None
    return range(first, first + step * len(axis), step)


def _recorded_points(grid: GridInput) -> list | dict:
    """A list of points as the job's record holds it (:func:`.inputs.recorded`), its
    digest made from a batch of points' text at a time, not from one text of all."""
    n = grid.n_units
    if n <= listing.LISTED_RECORDED:
        return as_recorded([grid.unit(i) for i in range(n)])
    digest = hashlib.sha256(b"[")
    for first in range(0, n, DIGEST_BATCH):
        columns = [_listed(grid.axes[k][first : first + DIGEST_BATCH]) for k in grid.keys]
        points = [
            dict(zip(grid.keys, values, strict=True)) for values in zip(*columns, strict=True)
        ]
        # (the text of a list of them, brackets left out: the whole list's, a part at a time)
        text = json.dumps(points, sort_keys=True, default=json_value)[1:-1]
        digest.update(((", " if first else "") + text).encode())
    digest.update(b"]")
    return {"points": n, "sha256": digest.hexdigest()}
