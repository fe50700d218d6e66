"""Hive-style partitions: ``key=value`` folders in a dataset's paths are columns of
every row of the files under them, as Spark, pandas' ``partition_cols`` and
pyarrow write them (``year=2024/month=1/part-0.parquet``).

A partition column is an integer when every one of its values is one, else
text (pyarrow's inference, with 64-bit integers); ``__HIVE_DEFAULT_PARTITION__``
is null. Its values are never read from the files: a task makes each file's
constant column itself.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

import pyarrow as pa

from ..errors import InputError

__all__ = ["Partitions", "parse_partitions"]

HIVE_NULL = "__HIVE_DEFAULT_PARTITION__"
_INTEGER = re.compile(r"-?\d{1,18}")


@dataclass(frozen=True)
class Partitions:
    fields: tuple[pa.Field, ...]
    #: Per file, one value per field (None for null).
    values: tuple[tuple[Any, ...], ...]

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(f.name for f in self.fields)

    def value(self, file: int, name: str) -> Any:
        return self.values[file][self.names.index(name)]

    def column(self, file: int, name: str, rows: int, dictionary: bool = False) -> pa.Array:
        """File ``file``'s constant column ``name``, ``rows`` long (text as a dictionary
        array when ``dictionary``, as parquet's text columns are read)."""
        field = self.fields[self.names.index(name)]
        value = self.value(file, name)
        if dictionary and pa.types.is_string(field.type):
            indices = pa.repeat(pa.scalar(None if value is None else 0, pa.int32()), rows)
            return pa.DictionaryArray.from_arrays(indices, pa.array([value or ""]))
        return pa.repeat(pa.scalar(value, type=field.type), rows)


def parse_partitions(keys: Sequence[str], where: str) -> Partitions | None:
    """The partitions of the files ``keys`` (paths relative to the dataset's root;
    ``where`` names it in errors), or None when no folder is ``key=value``."""
    pairs = [[part.split("=", 1) for part in key.split("/")[:-1] if "=" in part] for key in keys]
    names = [tuple(k for k, _ in p) for p in pairs]
    if not any(names):
        return None
    for key, these in zip(keys, names, strict=True):
        if these != names[0]:
            raise InputError(
                f"dataset {where}: its files are partitioned by different folders: "
                f"{keys[0]} by {', '.join(names[0]) or 'none'}, {key} by "
                f"{', '.join(these) or 'none'}; a partitioned dataset names the same "
                "columns in every file's path"
            )
    raw = [[None if v == HIVE_NULL else unquote(v) for _, v in p] for p in pairs]
    fields, columns = [], []
    for j, name in enumerate(names[0]):
        values = [row[j] for row in raw]
        if all(v is None or _INTEGER.fullmatch(v) for v in values):
            fields.append(pa.field(name, pa.int64()))
            columns.append([None if v is None else int(v) for v in values])
        else:
            fields.append(pa.field(name, pa.string()))
            columns.append(values)
    return Partitions(tuple(fields), tuple(zip(*columns, strict=True)))
