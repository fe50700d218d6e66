"""A job's table read a part at a time: its columns from the parts' footers, and the
parts aligned to them one after another, so that writing or summarizing a table
holds one part (and one row group of the output) whatever the job's size.

The rows, columns and bytes are those of the parts concatenated at once
(``pyarrow.concat_tables`` with permissive promotion, then ``pq.write_table``): the
union of the columns in order of first appearance, nulls where a part lacks one,
integers widened to floats; the output's row groups hold :data:`ROW_GROUP_ROWS`
rows each, as ``pq.write_table`` cuts them, wherever the parts end.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from .errors import InputError, UnreadableObject
from .storage import Store, per_object

__all__ = [
    "ROW_GROUP_ROWS",
    "Collected",
    "aligned",
    "differing_units",
    "parquet_chunks",
    "part_footers",
    "read_aligned",
    "table_schema",
]

#: Rows per row group of a table written whole (pyarrow's default for write_table).
ROW_GROUP_ROWS = 1024 * 1024


def part_footers(store: Store, keys: list[str]) -> list[tuple[pa.Schema, int]]:
    """Each part's schema and rows, from its footer alone (``FileNotFoundError`` for a
    missing one, :class:`UnreadableObject` for one that is no parquet)."""

    def footer(key: str) -> tuple[pa.Schema, int]:
        with store.open_input(key) as f:
            try:
                pf = pq.ParquetFile(f)
                return pf.schema_arrow, pf.metadata.num_rows
            except (pa.ArrowException, OSError, ValueError) as exc:
                raise UnreadableObject(store.describe(key), str(exc)) from None

    return per_object(store, footer, keys)


def table_schema(parts: list[tuple[int, str]], schemas: list[pa.Schema]) -> pa.Schema:
    """The columns of the parts (``(first unit, key)``, in unit order, and their
    ``schemas``) together; an error naming the first units of two parts that differ."""
    try:
        return pa.unify_schemas(schemas, promote_options="permissive")
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as exc:
        raise InputError(differing_units(schemas, [f"from {f}" for f, _ in parts], exc)) from None


def aligned(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """``table`` with ``schema``'s columns, in its order: nulls for those it lacks, and
    its own cast to the type they have together."""
    columns = []
    for field in schema:
        if field.name in table.column_names:
            column = table.column(field.name)
            columns.append(column if column.type == field.type else column.cast(field.type))
        else:
            columns.append(pa.nulls(table.num_rows, field.type))
    return pa.Table.from_arrays(columns, schema=schema)


def parquet_chunks(tables: Iterator[pa.Table], schema: pa.Schema) -> Iterator[bytes]:
    """The bytes of one parquet file of ``tables`` (each of ``schema``), as they are
    written: a row group of :data:`ROW_GROUP_ROWS` rows at a time."""
    rows = ROW_GROUP_ROWS
    sink = Collected()
    writer = pq.ParquetWriter(pa.PythonFile(sink, mode="w"), schema)
    held: list[pa.Table] = []
    count = 0
    for table in tables:
        held.append(table)
        count += table.num_rows
        while count >= rows:
            whole = pa.concat_tables(held)
            writer.write_table(whole.slice(0, rows), row_group_size=rows)
            held, count = [whole.slice(rows)], count - rows
            yield from sink.drain()
    if count or not held:
        writer.write_table(pa.concat_tables(held) if held else schema.empty_table(),
                           row_group_size=rows)  # fmt: skip
    writer.close()
    yield from sink.drain()


class Collected:
    """A write-only file whose bytes are taken as they come (:meth:`drain`)."""

    closed = False

    def __init__(self) -> None:
        self._chunks: list[bytes] = []
        self._position = 0

    def write(self, data) -> int:
        chunk = bytes(data)
        self._chunks.append(chunk)
        self._position += len(chunk)
        return len(chunk)

    def tell(self) -> int:
        return self._position

    def flush(self) -> None:
        return None

    def close(self) -> None:
        self.closed = True

    def drain(self) -> Iterator[bytes]:
        chunks, self._chunks = self._chunks, []
        yield from chunks


def read_aligned(
    read: Callable[[str], pa.Table], parts: list[tuple[int, str]], schema: pa.Schema
) -> Iterator[pa.Table]:
    """Each part, read by ``read(key)`` when its turn comes, aligned to ``schema``."""
    for _, key in parts:
        yield aligned(read(key), schema)


def differing_units(schemas: list[pa.Schema], units: list, exc: Exception) -> str:
    """A message naming two units whose result columns cannot be combined."""
    seen: dict[str, tuple[Any, pa.DataType]] = {}
    for unit, schema in zip(units, schemas, strict=True):
        for field in schema:
            if field.name in seen:
                other, typ = seen[field.name]
                if typ != field.type and not _widens(typ, field.type):
                    return (
                        f"results of units {other} and {unit} cannot be combined: column "
                        f"{field.name!r} is {typ} in one and {field.type} in the other"
                    )
            else:
                seen[field.name] = (unit, field.type)
    return f"results cannot be combined: {exc}"


def _widens(a: pa.DataType, b: pa.DataType) -> bool:
    numeric = (pa.types.is_integer, pa.types.is_floating)
    return (
        pa.types.is_null(a)
        or pa.types.is_null(b)
        or (any(t(a) for t in numeric) and any(t(b) for t in numeric))
    )
