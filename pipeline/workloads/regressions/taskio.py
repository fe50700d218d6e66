"""A task's reading and writing helpers: decimal columns read as floats, the formula's
text columns read as dictionaries, the tables written as parquet bytes, plots' names."""

from __future__ import annotations

import io

import pyarrow as pa
import pyarrow.parquet as pq

__all__ = ["decimals_as_floats", "parquet_bytes", "plot_name", "text_columns"]


def text_columns(spec, dataset, columns: tuple[str, ...]) -> tuple[str, ...]:
    """The formula's string columns (not the cluster groups): read as dictionaries,
    the task's design codes them without decoding a string per row."""
    if spec.formula is None:
        return ()
    schema = dataset.schema
    return tuple(
        c
        for c in columns
        if c != spec.cluster
        and (
            pa.types.is_string(schema.field(c).type)
            or pa.types.is_large_string(schema.field(c).type)
        )
    )


def decimals_as_floats(rows):
    """``rows`` with decimal columns (how databases export amounts and measures) as
    float64: numbers to a model, where patsy would make each distinct Decimal object a
    level of a categorical. Through their text, so each value is the float nearest it,
    as ``float(Decimal)`` gives (arrow's direct cast is an ulp off for ~30 %)."""
    table = rows.table
    for j, field in enumerate(table.schema):
        if pa.types.is_decimal(field.type):
            column = table.column(j).cast(pa.string()).cast(pa.float64())
            table = table.set_column(j, field.name, column)
    rows.table = table
    return rows


def plot_name(chunk: int, label: str) -> str:
    safe = "".join(c if c.isalnum() or c in "-_.=" else "_" for c in label)[:80]
    return f"{chunk:07d}-{safe}"


def parquet_bytes(table: pa.Table) -> bytes:
    """The table as parquet, dictionary-encoding only its text columns (terms, keys,
    errors): the statistics are distinct floats, whose dictionaries parquet builds and
    throws away; writing a task's tables took 4.5 ms instead of 1.2 (2,000 chunks),
    and its files were a fifth larger."""
    text = [
        f.name
        for f in table.schema
        if pa.types.is_string(f.type)
        or pa.types.is_large_string(f.type)
        or pa.types.is_dictionary(f.type)
    ]
    sink = io.BytesIO()
    pq.write_table(table, sink, use_dictionary=text or False)
    return sink.getvalue()
