"""``pipeline results OUTPUT [--job NAME] [--table T] [--out FILE.parquet]``: any
workload's per-task tables, concatenated in unit order.

The tables of a job are the kinds its manifest entries list (``object``, ``kind``
and a unit range per object): only completed tasks' parts, so a partial run shows
what it has. A workload may assemble a table further (``TableResults.assemble_table``)
and summarize it for the terminal (``TableResults.summarize_table``); a table no
workload assembles is written to a file and summarized a part at a time
(:mod:`pipeline.table_parts`), its memory that of a part, not of the job.
"""

from __future__ import annotations

import io
import json
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import PurePosixPath

import pyarrow as pa
import pyarrow.parquet as pq

from . import registry
from .errors import ConfigError, InputError, UnreadableObject
from .layout import (
    completed_tasks,
    consolidated_manifest_key,
    current_entries,
    job_folder,
    job_record_key,
    job_records,
    read_job_record,
)
from .manifest import UNIT_RANGE, made_by
from .storage import Store, join, open_store, read_parquet_object
from .table_parts import (
    Collected,
    differing_units,
    parquet_chunks,
    part_footers,
    read_aligned,
    table_schema,
)
from .workload import TableResults

__all__ = [
    "IncompleteJob",
    "differing_units",
    "find_job",
    "incomplete_note",
    "job_tables",
    "results_table",
    "summarize",
    "write_results",
]


def find_job(output: str, job: str | None = None) -> tuple[str, dict]:
    """The job under ``output`` (``job``, or the only one there) and its record."""
    store = open_store(output)
    if job is not None and store.exists(job_record_key(job)):
        # Named and there: no listing of the whole output (thousands of parts on S3).
        return job, read_job_record(store, job_record_key(job))
    jobs = job_records(store)
    if job is not None:
        if job not in jobs:
            raise InputError(
                f"{store.url}: no job {job!r} (found: {', '.join(sorted(jobs)) or 'none'})"
            )
        name = job
    elif len(jobs) == 1:
        name = next(iter(jobs))
    elif not jobs:
        # The same words as `pipeline verify`'s.
        raise InputError(f"{store.url}: no job output here (no <job>/job.json)")
    else:
        raise InputError(
            f"{store.url}: several jobs ({', '.join(sorted(jobs))}); name one with --job "
            "(job= from Python)"
        )
    return name, read_job_record(store, jobs[name])


def job_tables(
    store: Store, job_id: str, columns: Sequence[str | None] = UNIT_RANGE, code: str | None = None
) -> dict[str, list[tuple[int, str]]]:
    """Table name -> (first unit, part key) of every completed task, in unit order. A
    table's parts are the parquet objects its entries list by its kind; other objects
    (a figure, an array: ``TaskOutput.files``) are no table. With ``code``, only the
    tasks whose entry names that code version (:mod:`pipeline.manifest`)."""
    by_kind: dict[str, list[tuple[int, str]]] = {}
    for entry in sorted(current_entries(store.list(join(job_id, "manifest"))).values()):
        manifest = read_parquet_object(store, entry)
        names = manifest.column_names
        objects, start = columns[0], columns[1]
        if "kind" not in names or objects not in names or start not in names:
            continue
        if code is not None and not made_by(manifest, code):
            continue
        for key, kind, first in zip(
            manifest.column(objects).to_pylist(),
            manifest.column("kind").to_pylist(),
            manifest.column(start).to_pylist(),
            strict=True,
        ):
            if key.endswith(".parquet"):
                by_kind.setdefault(kind, []).append((first, key))
    return {kind: sorted(parts) for kind, parts in by_kind.items()}


def results_table(
    output: str, table: str | None = None, job: str | None = None, code: str | None = None
) -> pa.Table:
    """One table of every completed task's rows of ``table``, in unit order (with
    ``code``, of the tasks that code version made)."""
    found = _JobTable.read(output, table, job, code)
    result = found.result
    if found.note:
        warnings.warn(f"{found.where}: {found.note}", IncompleteJob, stacklevel=2)
    return result


@dataclass
class _JobTable:
    """A job's table, found once: its parts, the job's tables' parts, and what is
    missing when its run has not finished (``results_table`` and ``summarize`` both
    need them; reading them twice listed and read every manifest entry twice). Its
    rows are read whole (:attr:`result`) or a part at a time (:meth:`chunks`)."""

    store: Store
    output: str
    job_id: str
    record: dict
    results: type[TableResults]
    name: str
    parts: list[tuple[int, str]]
    tables: dict[str, list[tuple[int, str]]]
    note: str | None
    _result: pa.Table | None = None

    @property
    def where(self) -> str:
        return self.store.describe(self.job_id)

    @classmethod
    def read(cls, output: str, table: str | None, job: str | None, code=None) -> _JobTable:
        output, job = job_folder(output, job)
        store = open_store(output)
        job_id, record = find_job(output, job)
        results = registry.load(record["workload"]).results
        tables = job_tables(store, job_id, results.manifest_columns, code)
        if code is not None and not tables:
            versions = ", ".join(record.get("code_versions") or ()) or "none recorded"
            raise InputError(
                f"{store.describe(job_id)}: no task made by code version {code!r} "
                f"(its versions: {versions}; `pipeline verify` counts each one's tasks)"
            )
        table = table or results.default_table or next(iter(tables), None)
        if not tables:
            raise InputError(
                f"{store.describe(job_id)}: no tables"
                + (" yet (no completed tasks)" if results.manifest_columns[0] == "object" else
                   f"; a {record['workload']} job's index of what it wrote is "
                   f"{store.describe(join(job_id, 'manifest.parquet'))}"
                   + ("" if store.exists(join(job_id, "manifest.parquet")) else
                      ", written when its run completes"))
            )  # fmt: skip
        if table not in tables and table not in results.optional_tables:
            # Those it may have no part of too: `--table failures` is one of a map job's
            named = [*tables, *(t for t in results.optional_tables if t not in tables)]
            raise InputError(
                f"{store.describe(job_id)}: no table {table!r}; its tables: {', '.join(named)}"
            )
        note = incomplete_note(store, job_id, record)
        parts = tables.get(table, [])
        return cls(store, output, job_id, record, results, table, parts, tables, note)

    @property
    def result(self) -> pa.Table:
        """The whole table, as the workload assembles it."""
        if self._result is None:
            if self.parts:
                read = [(first, self._read(key)) for first, key in self.parts]
                result = concat_parts(self.store, read)
            else:
                result = pa.table({})  # none of its units has a row in it
            self._result = self.results.assemble_table(
                self.store, self.job_id, self.name, result, self.tables
            )
        return self._result

    @property
    def by_parts(self) -> bool:
        """Whether the table is its parts as they are (no workload assembles or
        summarizes it): then read a part at a time."""
        return all(
            getattr(self.results, m).__func__ is getattr(TableResults, m).__func__
            for m in ("assemble_table", "summarize_table")
        )

    def _read(self, key: str) -> pa.Table:
        return _read_part(self.store, key, self.output)

    def footers(self) -> tuple[pa.Schema, list[int]]:
        """The table's columns and each part's rows, from the parts' footers."""
        try:
            found = part_footers(self.store, [key for _, key in self.parts])
        except (FileNotFoundError, UnreadableObject):
            for _, key in self.parts:  # the first that fails, said as a read says it
                self._read(key)
            raise
        return table_schema(self.parts, [f[0] for f in found]), [f[1] for f in found]

    def chunks(self, suffix: str) -> tuple[Iterator[bytes], int]:
        """The bytes of the table as a ``suffix`` file, a part read at a time, and its
        rows."""
        if not self.parts:
            schema, rows = pa.schema([]), []
        else:
            schema, rows = self.footers()
        tables = read_aligned(self._read, self.parts, schema)
        if suffix == ".csv":
            return _csv_chunks(tables, schema), sum(rows)
        return parquet_chunks(tables, schema), sum(rows)


def _read_part(store: Store, key: str, output: str) -> pa.Table:
    """A part the job's manifest lists, or an error saying it is missing or damaged."""
    try:
        return read_parquet_object(store, key)
    except FileNotFoundError:
        why = "is missing"
    except UnreadableObject as exc:
        why = f"is not a readable table ({exc.reason})"
    raise InputError(
        f"{store.describe(key)}, listed in its job's manifest, {why}: `pipeline verify "
        f"{output} --repair`, then running the job again, writes it again"
    )


class IncompleteJob(UserWarning):
    """The table is of a job whose run has not finished: its completed tasks' rows."""


def incomplete_note(store: Store, job_id: str, record: dict) -> str | None:
    """What is missing from a job whose run has not finished, or None once it has."""
    from .planning.plan import Plan

    # Counted from the tasks that are there: a run stopped before it had planned
    # every task (while probing) has units in none of those it planned
    tasks = Plan.from_record(record).tasks
    done = completed_tasks(store, job_id)
    if all(t.index in done for t in tasks) and store.exists(consolidated_manifest_key(job_id)):
        return None
    units = sum(t.stop - t.start for t in tasks if t.index in done)
    return (
        f"the job's run has not finished: these are the rows of {units:,} of its "
        f"{record['units']:,} units; run the job again to finish it"
    )


def concat_parts(store: Store, parts: list[tuple[int, pa.Table]]) -> pa.Table:
    """Parts in order, columns reconciled: the union, nulls where a part lacks one,
    numbers widened; else an error naming the first units of two parts that differ."""
    try:
        return pa.concat_tables([t for _, t in parts], promote_options="permissive")
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as exc:
        schemas = [t.schema for _, t in parts]
        message = differing_units(schemas, [f"from {f}" for f, _ in parts], exc)
        raise InputError(message) from None


#: What ``write_results`` writes, by the output's suffix.
RESULT_FORMATS = (".parquet", ".csv")


def _as_csv_cells(table: pa.Table) -> pa.Table:
    """Lists, structs and maps as JSON text, which a CSV cell can hold (a grid's list
    parameters, a function's dict values), and bytes as base64 text (a CSV is text:
    arrow refuses bytes that are not UTF-8); nulls stay empty cells."""
    import base64

    for i, column in enumerate(table.schema):
        t = column.type
        if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t):
            text = [None if v is None else base64.b64encode(v).decode("ascii")
                    for v in table.column(i).to_pylist()]  # fmt: skip
            table = table.set_column(i, column.name, pa.array(text, pa.string()))
        elif pa.types.is_nested(column.type):
            text = [None if v is None else json.dumps(v, default=str)
                    for v in table.column(i).to_pylist()]  # fmt: skip
            table = table.set_column(i, column.name, pa.array(text, pa.string()))
    return table


def write_results(
    output: str, table: str | None, out: str, job: str | None = None, code: str | None = None
) -> int:
    """Write the concatenated table to ``out`` (a local path or s3:// URL), parquet or
    CSV by its suffix; return rows. A table no workload assembles is written a part at
    a time (the same bytes)."""
    suffix = PurePosixPath(out).suffix.lower()
    if suffix not in RESULT_FORMATS:
        raise ConfigError(
            f"--out {out}: write to a {' or '.join(RESULT_FORMATS)} file "
            f"(the suffix chooses the format)"
        )
    parent, _, name = out.rstrip("/").rpartition("/")
    found = _JobTable.read(output, table, job, code)
    store = open_store(parent or ".")
    if found.by_parts:
        chunks, rows = found.chunks(suffix)
        store.write(name, chunks)
    else:
        result = found.result
        sink = io.BytesIO()
        if suffix == ".csv":
            import pyarrow.csv as pcsv

            pcsv.write_csv(_as_csv_cells(result), sink)
        else:
            pq.write_table(result, sink)
        store.write_bytes(name, sink.getbuffer())
        rows = result.num_rows
    if found.note:
        warnings.warn(f"{found.where}: {found.note}", IncompleteJob, stacklevel=2)
    return rows


def _csv_chunks(tables: Iterator[pa.Table], schema: pa.Schema) -> Iterator[bytes]:
    """The bytes of one CSV file of ``tables`` (each of ``schema``), a table at a time."""
    import pyarrow.csv as pcsv

    sink = Collected()
    writer = pcsv.CSVWriter(
        pa.PythonFile(sink, mode="w"), _as_csv_cells(schema.empty_table()).schema
    )
    for table in tables:
        writer.write_table(_as_csv_cells(table))
        yield from sink.drain()
    writer.close()
    yield from sink.drain()


def summarize(
    output: str, table: str | None = None, job: str | None = None, code: str | None = None
) -> str:
    """A few lines about a job's table, for the terminal (of a table no workload
    assembles: its rows counted from the parts' footers, and the parts holding the
    first ten read)."""
    found = _JobTable.read(output, table, job, code)
    note = found.note
    if found.by_parts:
        schema, counts = found.footers() if found.parts else (pa.schema([]), [])
        rows, head = sum(counts), _head(found, schema, counts)
    else:
        result = found.result
        custom = found.results.summarize_table(found.name, result)
        if custom:
            return custom + (f"\nincomplete: {note}" if note else "")
        rows, schema, head = result.num_rows, result.schema, result.slice(0, SHOWN_ROWS)
    if rows:
        lines = [f"{found.where}: table {found.name!r}, {rows:,} rows"]
    else:
        # Said in words: pandas' text of an empty table (and of a table of no columns) is
        # noise that reads as a failure.
        columns = f" (its columns: {', '.join(schema.names)})" if schema.names else ""
        lines = [f"{found.where}: table {found.name!r} is empty: no rows{columns}"]
    if note:
        lines.append(f"incomplete: {note}")
    failures = found.tables.get("failures", []) if found.name != "failures" else []
    failed = sum(f[1] for f in part_footers(found.store, [key for _, key in failures]))
    if failed:
        units = "unit" if failed == 1 else "units"
        lines.append(f"failed: {failed:,} {units}, not in this table (--table failures)")
    if rows:
        lines.append(head.to_pandas(use_threads=False).to_string(max_cols=12))
    return "\n".join(lines)


#: Rows a summary shows.
SHOWN_ROWS = 10


def _head(found: _JobTable, schema: pa.Schema, counts: list[int]) -> pa.Table:
    """The table's first :data:`SHOWN_ROWS` rows, from the parts that hold them."""
    shown, left = [], SHOWN_ROWS
    for (first, key), rows in zip(found.parts, counts, strict=True):
        if left <= 0:
            break
        if rows:
            shown.append(next(read_aligned(found._read, [(first, key)], schema)).slice(0, left))
            left -= rows
    return pa.concat_tables(shown) if shown else schema.empty_table()
