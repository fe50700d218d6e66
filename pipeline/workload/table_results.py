"""A job's output as ``pipeline results`` and ``pipeline verify`` read it: the hooks a
workload names with one member, ``Workload.results``.

The defaults serve a workload whose tasks return tables and files (the runner writes
and lists them): such a plug-in implements none of them. One whose output is its own
(the cubes' shards, with a manifest the tasks write) subclasses :class:`TableResults`
and overrides what differs. Every hook is a class attribute or classmethod: the
commands that read an output have its workload's class, never an instance.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from ..manifest import UNIT_RANGE, check_listed_objects, consolidate_manifest
from ..storage import Store, per_object

if TYPE_CHECKING:
    from .task import Task

__all__ = ["MOVED_HOOKS", "TableResults"]


class TableResults:
    """The objects of a job, its manifest, and what ``pipeline results``/``verify`` do
    with them. Members marked *worker* run in a worker process."""

    # -- the manifest and the objects ---------------------------------------------------

    #: The manifest's columns of an entry's object, its first unit and the one past its
    #: last (None: each entry holds one unit, in a manifest the workload builds): what
    #: ``pipeline verify`` checks and ``--repair`` maps to tasks, and the order of the
    #: consolidated manifest.
    manifest_columns: ClassVar[tuple[str, str, str | None]] = UNIT_RANGE

    @classmethod
    def table_bytes(cls, kind: str, table) -> bytes:
        """Worker: a table of ``TaskOutput.tables`` as the bytes of its parquet part;
        the default is ``pyarrow.parquet.write_table``'s, with its defaults."""
        import io

        import pyarrow.parquet as pq

        sink = io.BytesIO()
        pq.write_table(table, sink)
        return sink.getvalue()

    @classmethod
    def finalize(cls, workload: Any, store: Store, tasks: list[Task]) -> dict[str, Any]:
        """Once every task of ``workload`` (the ``Workload`` whose results these are)
        is complete, consolidate; return facts for the summary.

        The default writes the tasks' manifest entries as one ``manifest.parquet``, in
        unit order when they have unit ranges."""
        consolidate_manifest(store, workload.job_id, tasks, order=cls.manifest_columns[1])
        return {}

    #: Objects ``finalize`` writes under the job's prefix besides its manifests.
    final_objects: ClassVar[tuple[str, ...]] = ()

    # -- pipeline results ---------------------------------------------------------------

    #: The table ``pipeline results`` shows when none is named.
    default_table: ClassVar[str | None] = None
    #: Tables a job may have no part of (a map job whose units all succeeded has no
    #: failures): ``pipeline results`` shows them as empty, not as unknown.
    optional_tables: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def assemble_table(cls, store: Store, job_id: str, table: str, result, tables: dict):
        """``pipeline results``: the concatenated table, assembled further if need be."""
        return result

    @classmethod
    def summarize_table(cls, table: str, result) -> str | None:
        """``pipeline results`` without ``--out``: a summary, or None for the default."""
        return None

    # -- pipeline verify ----------------------------------------------------------------

    @classmethod
    def verify_job(cls, store: Store, job_id: str, record: dict, manifest, check) -> set[str]:
        """``pipeline verify``: check the job's objects against its manifest (a pandas
        DataFrame, None if absent), recording problems in ``check``; return the
        objects the manifest lists. The default serves manifests that list objects
        with ``object``, ``checksum`` and unit ranges."""
        return check_listed_objects(store, manifest, check, columns=cls.manifest_columns)

    #: The table that lists the units that failed as data (what
    #: ``Workload.recorded_failures`` reads back): ``pipeline verify`` counts them
    #: (``count_failures``) and points there. A job whose units all succeeded may have
    #: no part of it.
    failures_table: ClassVar[str | None] = "failures"

    @classmethod
    def count_failures(cls, store: Store, job_id: str, parts: list[str]) -> int:
        """``pipeline verify``: units that failed as data in ``parts`` (the keys of the
        job's ``failures_table`` that its manifest lists; verify reports a damaged one).
        The default counts their rows, one a unit, reading their footers alone."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        def rows(key: str) -> int:
            try:
                with store.open_input(key) as f:
                    return pq.ParquetFile(f).metadata.num_rows
            except (pa.ArrowException, OSError, ValueError):
                return 0  # missing or damaged: verify says so

        return sum(per_object(store, rows, parts))


#: The hooks that were members of ``Workload`` before they were grouped here: a
#: workload class that still defines one is refused, naming it and its new home.
MOVED_HOOKS = (
    "manifest_columns",
    "table_bytes",
    "finalize",
    "final_objects",
    "default_table",
    "optional_tables",
    "assemble_table",
    "summarize_table",
    "verify_job",
    "failures_table",
    "count_failures",
)
