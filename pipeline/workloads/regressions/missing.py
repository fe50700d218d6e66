"""Missing values in a task's table that are not NaN: the nulls of text, categorical and
boolean columns (a number's null is a NaN, which the fit reports or drops itself), found
per chunk and dropped as statsmodels' formulas drop them."""

from __future__ import annotations

import numpy as np

__all__ = ["chunks_with_missing_text", "isnull", "missing_by_column", "without_missing_text"]


def _text_nulls(table):
    """(name, row mask of its nulls) of each column with nulls that is not a number (a
    number's null is a NaN, which the fit reports or drops itself)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    for name, column in zip(table.column_names, table.columns, strict=True):
        t = column.type
        if column.null_count == 0 or pa.types.is_integer(t) or pa.types.is_floating(t):
            continue
        yield name, pc.is_null(column).to_numpy(zero_copy_only=False)


def _per_chunk(mask: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """How many of each chunk's rows ``mask`` holds."""
    counts = np.add.reduceat(np.append(mask, False).astype(np.int64), offsets[:-1])
    counts[np.diff(offsets) == 0] = 0  # reduceat takes an empty chunk's next row
    return counts


def without_missing_text(table, offsets: np.ndarray):
    """The table without its rows that have a null in a column that is not a number,
    the chunks' offsets in it, and how many rows each chunk lost (None: no such row)."""
    import pyarrow as pa

    mask = None
    for _name, nulls in _text_nulls(table):
        mask = nulls if mask is None else mask | nulls
    if mask is None or not mask.any():
        return table, offsets, None
    lost = _per_chunk(mask, offsets)
    kept = table.filter(pa.array(~mask))
    return kept, offsets - np.concatenate([[0], np.cumsum(lost)]), lost


def chunks_with_missing_text(table, offsets: np.ndarray) -> dict[int, str]:
    """Chunk -> what it misses ("'cat': 3 of 70 rows"), for chunks with nulls in a
    column that is not a number."""
    found: dict[int, str] = {}
    for name, nulls in _text_nulls(table):
        per_chunk = _per_chunk(nulls, offsets)
        for i in np.flatnonzero(per_chunk).tolist():
            rows = int(offsets[i + 1] - offsets[i])
            said = f"{name!r}: {per_chunk[i]} of {rows} rows"
            found[i] = f"{found[i]}; {said}" if i in found else said
    return found


def isnull(a: np.ndarray) -> np.ndarray:
    if a.dtype.kind == "f":
        return np.isnan(a)
    if a.dtype.kind == "O":
        import pandas as pd

        return np.asarray(pd.isna(a))
    return np.zeros(a.shape, dtype=bool)


def missing_by_column(table, start: int, stop: int) -> str:
    """Which columns of ``table`` hold the missing values (nulls, NaN) of rows
    ``start..stop-1``, and in how many rows: "40 in y" or "20 in x1, 20 in x2" (empty
    where none does: values a formula made NaN, such as np.log(-1))."""
    import pyarrow as pa
    import pyarrow.compute as pc

    rows = table.slice(start, stop - start)
    said = []
    for name, column in zip(rows.column_names, rows.columns, strict=True):
        missing = column.null_count
        if pa.types.is_floating(column.type):
            missing += pc.sum(pc.is_nan(column)).as_py() or 0
        if missing:
            said.append(f"{missing} in {name}")
    return ", ".join(said)
