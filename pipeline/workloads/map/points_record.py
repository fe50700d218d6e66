"""The job's record of a grid file's points and their key columns' types, made from its
batches in order (:mod:`.points_scan`): what :class:`.grid.GridInput` makes of the
same points listed, without holding them.

The record lists up to :data:`.inputs.LISTED_RECORDED` points; beyond, their number
and the SHA-256 of the JSON text of their list (``json.dumps(points,
sort_keys=True)``), made a part at a time. A part of integers, booleans and plain
ASCII text, which JSON writes as Arrow does, is written by Arrow, one column at a
time; others through their Python values (numbers as Python writes them, text
escaped).
"""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ...contract import as_recorded, json_value
from .inputs import LISTED_RECORDED, key_type

__all__ = ["PointsRecord"]

#: Points made into text at a time.
PART_ROWS = 10_000
#: Text JSON writes as it is: printable ASCII but the quote and the backslash.
_PLAIN_TEXT = r"^[\x20\x21\x23-\x5b\x5d-\x7e]*$"
#: A part all of whose values are missing takes the type of the others.
_MISSING = "missing"


class PointsRecord:
    """The record and key types of points given a batch at a time, in order."""

    def __init__(self, keys: tuple[str, ...]):
        self.keys = keys
        self.n = 0
        self._digest = hashlib.sha256(b"[")
        self._first: list[dict] = []  # for a record that lists them
        self._types: dict[str, set] = {k: set() for k in keys}
        # Each key's label in a point's JSON text, in the order JSON writes them
        self._labels = {k: json.dumps(k) + ": " for k in sorted(keys)}

    def add(self, batch: pa.RecordBatch) -> None:
        for start in range(0, batch.num_rows, PART_ROWS):
            part = batch.slice(start, PART_ROWS)
            for key, column in zip(self.keys, part.columns, strict=True):
                self._types[key].add(_part_type(column))
            if len(self._first) <= LISTED_RECORDED:
                self._first += part.slice(0, LISTED_RECORDED + 1 - len(self._first)).to_pylist()
            text = self._arrow_text(part)
            if text is None:
                # (the JSON text of the list of all, a part at a time: brackets left out)
                points = part.to_pylist()
                text = json.dumps(points, sort_keys=True, default=json_value)[1:-1].encode()
            self._digest.update((b", " if self.n else b"") + text)
            self.n += part.num_rows

    def _arrow_text(self, part: pa.RecordBatch) -> bytes | None:
        """The points' JSON text (as ``json.dumps`` of their list writes it, brackets
        left out) made by Arrow, or None where a column is not one it writes alike."""
        pieces: list = []
        for i, (key, label) in enumerate(self._labels.items()):
            text = _json_column(part.column(self.keys.index(key)))
            if text is None:
                return None
            pieces += [(", {" if i == 0 else ", ") + label, text]
        # Each point's text after ", ": their concatenation, less the first ", "
        rows = pc.binary_join_element_wise(*pieces, "}", "")
        offsets = np.frombuffer(rows.buffers()[1], np.int32)[rows.offset :]
        return memoryview(rows.buffers()[2])[offsets[0] + 2 : offsets[len(rows)]].tobytes()

    def recorded(self) -> list | dict:
        """The job's record of the points (:func:`.grid._recorded_points`'s)."""
        if self.n <= LISTED_RECORDED:
            return as_recorded(self._first)
        return {"points": self.n, "sha256": self.hexdigest()}

    def hexdigest(self) -> str:
        """The digest of the points' JSON text (the list's: the points added so far)."""
        digest = self._digest.copy()
        digest.update(b"]")
        return digest.hexdigest()

    def key_types(self) -> dict[str, pa.DataType | None]:
        """Each key's column type in the results (None: its values' repr text)."""
        return {k: _one_type(self._types[k]) for k in self.keys}


def _json_column(column: pa.Array) -> pa.Array | None:
    """Each value's JSON text, where Arrow writes it as JSON does: integers (of 64 bits
    or fewer, signed), booleans, text of :data:`_PLAIN_TEXT`; missing as ``null``."""
    t = column.type
    if pa.types.is_null(t):
        return pa.array(["null"] * len(column), pa.string())
    if (pa.types.is_integer(t) and t != pa.uint64()) or pa.types.is_boolean(t):
        text = pc.cast(column, pa.string())
    elif pa.types.is_string(t) or pa.types.is_large_string(t):
        column = column.cast(pa.string())
        if pc.all(pc.match_substring_regex(column, _PLAIN_TEXT)).as_py() is False:
            return None
        text = pc.binary_join_element_wise('"', column, '"', "")
    else:
        return None
    return pc.fill_null(text, "null") if text.null_count else text


def _part_type(column: pa.Array) -> pa.DataType | str | None:
    """The type :func:`.inputs.key_type` gives the Python values of ``column``: from
    its own type where that says, else from the values; :data:`_MISSING` for none but
    missing values."""
    if column.null_count == len(column):
        return _MISSING
    t = column.type
    if pa.types.is_integer(t) and t != pa.uint64():
        return pa.int64()
    if pa.types.is_float32(t) or pa.types.is_float64(t):
        return pa.float64()
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return pa.string()
    if pa.types.is_boolean(t):
        return pa.bool_()
    return key_type(column.to_pylist())


def _one_type(types: set) -> pa.DataType | None:
    """A key's type from its parts' (:func:`_part_type`): theirs when they agree; else
    the type that holds each (an integer column of some parts beyond int64), or None
    (its values' repr text) as for values of mixed kinds."""
    types = types - {_MISSING}
    if not types:
        return pa.null()
    if None in types:
        return None
    if len(types) == 1:
        return next(iter(types))
    try:
        unified = pa.unify_schemas([pa.schema([("k", t)]) for t in sorted(types, key=str)],
                                   promote_options="permissive")  # fmt: skip
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
        return None
    return unified.field("k").type
