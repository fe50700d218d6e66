"""A grid's points given as a .csv or .parquet file, read once by the driver a batch at
a time: their number, each key's column type, the job's record of them, and a copy as
parquet in row groups of :data:`ROWS_PER_GROUP`, from which each task reads its own
rows (:mod:`.points_file`). The driver never holds more than a batch of them.

The copy goes under the output's ``inputs/`` folder (where every worker reads and
writes, on a remote cluster too), named by the points' digest: made once, the same
for every job of the same points, and never changed under a run.

What each point is, is what it was when the file's rows were read whole into Python
values: a CSV's columns typed as ``pyarrow.csv.read_csv`` types them from the whole
file, an empty cell missing in a text column as in a number column; the record (a
list of up to :data:`.inputs.LISTED_RECORDED` points, else their number and the
digest of their JSON text) and the key columns' types are those of the same points
given as a list (:class:`.grid.GridInput`; made by :mod:`.points_record`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import re
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ...config.settings import RowsFile
from ...errors import ConfigError, InputError
from ...storage import checked_output, open_store
from .points_record import PointsRecord

__all__ = ["ROWS_PER_GROUP", "ScannedPoints", "scan_points"]

#: Rows of a row group of the copy: a task reads the groups its units are in.
ROWS_PER_GROUP = 65_536
#: Where the copy goes when the job's output is not known (a workload built from
#: Python without one): this machine's temporary folder, for its own workers only.
LOCAL_COPIES = "pipeline-points"


@dataclasses.dataclass
class ScannedPoints:
    """What the driver keeps of a points file: no point but the first few."""

    n_units: int
    keys: tuple[str, ...]
    #: Each key's column type in the results (None: its values' repr text).
    key_types: dict[str, pa.DataType | None]
    #: The job's record of the points (:func:`.grid._recorded_points`'s).
    recorded: list | dict
    #: The folder (a store's URL) and key of the copy, and the rows of its row groups
    #: (each but the last).
    copy_folder: str
    copy_key: str
    rows_per_group: int


def scan_points(source: RowsFile, output: str | None) -> ScannedPoints:
    """Read ``source`` once; its copy is written under ``output`` (unless there)."""
    where = source.origin or f"grid file {source.path}"
    if source.suffix != ".csv":
        return _scan(source, where, output)
    # A CSV is read again with a column's next type each time a later block holds a
    # value that its type, from the first block, cannot
    names = _open(source, where, {})[0].names
    fixed: dict[str, pa.DataType] = {}
    while True:
        try:
            return _scan(source, where, output, fixed, names)
        except _Retyped as retyped:
            fixed[retyped.name] = retyped.type


#: The types pyarrow's read_csv tries for a CSV column, in its order: a column is
#: the first that holds each of its values (what read_csv does over the whole file,
#: where a streaming reader types from the first block alone).
CSV_TYPES = (pa.null(), pa.int64(), pa.bool_(), pa.float64(), pa.date32(), pa.time32("s"),
             pa.timestamp("s"), pa.timestamp("ns"), pa.timestamp("s", "UTC"),
             pa.timestamp("ns", "UTC"), pa.string(), pa.binary())  # fmt: skip
_CSV_COLUMN = re.compile(r"In CSV column #(\d+): .*conversion error")


class _Retyped(Exception):
    """A CSV column to read again as ``type``."""

    def __init__(self, name: str, type: pa.DataType):
        self.name, self.type = name, type


def _open(source: RowsFile, where: str, fixed: dict) -> tuple[pa.Schema, Iterator]:
    """The file's schema and batches, read on the calling thread (a pyarrow pool
    thread alive at exit aborts the process)."""
    try:
        if source.suffix == ".csv":
            from pyarrow import csv

            reader = csv.open_csv(
                source.path,
                read_options=csv.ReadOptions(use_threads=False),
                convert_options=csv.ConvertOptions(column_types=fixed),
            )
            return reader.schema, iter(reader)
        file = pq.ParquetFile(source.path)
        return file.schema_arrow, file.iter_batches(ROWS_PER_GROUP, use_threads=False)
    except OSError as exc:
        raise InputError(f"{where}: cannot be read: {exc}") from None


def _scan(source: RowsFile, where: str, output: str | None, fixed: dict | None = None,
          names: list[str] | None = None) -> ScannedPoints:  # fmt: skip
    schema = None
    store = _copies(output)
    with tempfile.TemporaryDirectory(prefix="pipeline-points-") as tmp:
        try:
            schema, batches = _open(source, where, fixed or {})
            points = PointsRecord(_check_names(schema.names, where))
            # (without dictionaries: of points mostly distinct, building them took most
            # of the writing's time)
            with pq.ParquetWriter(Path(tmp) / "points.parquet", schema, use_dictionary=False,
                                  write_statistics=False) as copy:  # fmt: skip
                for batch in _regrouped(batches):
                    if source.suffix == ".csv":
                        batch = _empty_text_as_null(batch)
                    copy.write_batch(batch, row_group_size=ROWS_PER_GROUP)
                    points.add(batch)
        except pa.ArrowInvalid as exc:
            _retype(exc, names, fixed, schema)
            raise InputError(f"{where}: {exc}") from None
        except pa.ArrowException as exc:
            raise InputError(f"{where}: cannot be read: {exc}") from None
        if points.n == 0:
            raise InputError(f"{where}: no rows; expected a row per call")
        # Named by the points and their columns' types: the same rows, the same copy
        name = hashlib.sha256(f"{points.hexdigest()} {schema} {ROWS_PER_GROUP}".encode())
        key = f"points-{name.hexdigest()[:32]}.parquet"
        if not store.exists(key):
            store.write(key, _chunks(Path(tmp) / "points.parquet"))
    # (a local folder as an absolute path, for the workers)
    return ScannedPoints(points.n, points.keys, points.key_types(), points.recorded(),
                         store.url, key, ROWS_PER_GROUP)  # fmt: skip


def _retype(exc: pa.ArrowInvalid, names: list[str] | None, fixed: dict | None,
            schema: pa.Schema | None) -> None:  # fmt: skip
    """Raise :class:`_Retyped` for a CSV column that a value of a later block does not
    fit (``exc`` says which): its next type in :data:`CSV_TYPES`."""
    found = _CSV_COLUMN.search(str(exc))
    if names is None or fixed is None or found is None:
        return
    name = names[int(found[1])]
    # (a type fixed before fails as the reader opens, before it has a schema)
    current = fixed.get(name) or (schema.field(name).type if schema is not None else None)
    later = CSV_TYPES[CSV_TYPES.index(current) + 1 :] if current in CSV_TYPES else ()
    if later:
        raise _Retyped(name, later[0])


def _regrouped(batches) -> Iterator[pa.RecordBatch]:
    """``batches`` as batches of :data:`ROWS_PER_GROUP` rows (but the last): the
    copy's row groups, whatever the sizes of a reader's blocks."""
    held: list[pa.RecordBatch] = []
    count = 0
    for batch in batches:
        held.append(batch)
        count += batch.num_rows
        while count >= ROWS_PER_GROUP:
            table = pa.Table.from_batches(held)
            yield table.slice(0, ROWS_PER_GROUP).combine_chunks().to_batches()[0]
            rest = table.slice(ROWS_PER_GROUP)
            held, count = rest.to_batches(), rest.num_rows
    if count:
        yield pa.Table.from_batches(held).combine_chunks().to_batches()[0]


def _check_names(names: list[str], where: str) -> tuple[str, ...]:
    """The file's columns, each a parameter of the function: once each, a name."""
    for name in names:
        if names.count(name) > 1:
            raise ConfigError(f"{where}: column {name!r} appears {names.count(name)} times; "
                              "each column is a parameter of the function, named once")  # fmt: skip
        if not name.isidentifier():
            raise ConfigError(f"{where}: column {name!r} is not a valid parameter name; each "
                              "column is a parameter of the function")  # fmt: skip
    if not names:
        raise ConfigError(f"{where}: no columns; each column is a parameter of the function")
    return tuple(names)


def _empty_text_as_null(batch: pa.RecordBatch) -> pa.RecordBatch:
    """An empty CSV cell as missing (None) in a text column, as pyarrow reads it in a
    number column: a point's ``b=''`` beside ``c=None`` for the same empty cell. (Not
    through pyarrow's ``strings_can_be_null``: it would take text such as "NA" or
    "null" for missing too.)"""
    columns = []
    for column in batch.columns:
        if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
            column = pc.if_else(pc.equal(column, ""), pa.scalar(None, column.type), column)
        columns.append(column)
    return pa.RecordBatch.from_arrays(columns, schema=batch.schema)


def _chunks(path: Path, size: int = 8 << 20) -> Iterator[bytes]:
    with open(path, "rb") as f:
        while chunk := f.read(size):
            yield chunk


def _copies(output: str | None):
    """The store the copy goes to: ``<output>/inputs``, the output checked first."""
    if not output:
        return open_store(_local_copies())
    return open_store(f"{checked_output(output).url}/inputs")


def _local_copies() -> str:
    return os.path.join(tempfile.gettempdir(), LOCAL_COPIES)
