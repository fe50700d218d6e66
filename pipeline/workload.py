"""What a workload is to the runner: units grouped into tasks, and the results of a task."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from .manifest import UNIT_RANGE, consolidate_manifest
from .storage import Store

__all__ = [
    "OutputFile",
    "Task",
    "TaskOutput",
    "UnitFailure",
    "Workload",
]


@dataclass(frozen=True)
class Task:
    """Units ``start`` to ``stop - 1`` of a job; its ``index`` names its output keys.

    ``attempt``: on a worker, the id of this run of the task (each run has its own:
    a copy of a slow task, a rerun after a lost worker); the objects it writes are
    named with it (:func:`pipeline.layout.attempt_key`), so that no run writes over
    another's, and the first run to commit its entry wins. A workload that writes
    objects itself names them with it too, or writes the same bytes from every run.
    ``round``: 0, or the how-manieth rerun of a complete task whose units recorded as
    failed are called again (its entry then supersedes the round before's)."""

    index: int
    start: int
    stop: int
    # keywords alone: a subclass's own fields (a joblib batch's payload) come after
    attempt: str = field(default="", kw_only=True)
    round: int = field(default=0, kw_only=True)

    @property
    def units(self) -> range:
        return range(self.start, self.stop)


@dataclass(frozen=True)
class UnitFailure:
    """A unit that raised: recorded as data, it never aborts the run."""

    unit: int | str
    error_type: str
    message: str
    #: The unit's key, when its number alone does not say which it is (``ticker='AAA'``).
    key: str = ""

    @classmethod
    def from_exception(cls, unit: int | str, exc: BaseException) -> UnitFailure:
        return cls(unit, type(exc).__name__, str(exc) or repr(exc))


def unit_label(unit: int | str, key: str = "") -> str:
    """How a run's list of failures names a unit: ``0 (ticker='AAA')``, or ``0``."""
    return f"{unit} ({key})" if key else f"{unit}"


#: What a unit's code may raise, to be recorded as that unit's failure: its errors,
#: and also ``sys.exit()`` and ``KeyboardInterrupt`` raised by the code itself (in a
#: worker's task thread no signal raises them). Let through, they ended the driver
#: as if it had been told to exit, with exit status 0 and no summary, or as a Ctrl-C.
USER_ERRORS = (Exception, SystemExit, KeyboardInterrupt)


@dataclass(frozen=True)
class OutputFile:
    """An object of a task that is no table (a figure, an array): ``data``, which the
    runner writes at ``key`` named with the task's attempt
    (:func:`pipeline.layout.attempt_key`), or None for an object the task wrote there
    itself, named with ``Task.attempt`` likewise (the runner then reads it back for
    its checksum). ``kind`` names it in the manifest;
    ``units`` are the units it holds: the task's (None), or a range that splits them."""

    key: str
    kind: str
    data: bytes | None = None
    units: range | None = None


@dataclass
class TaskOutput:
    """What ``Workload.run_task`` returns on the worker.

    ``tables`` and ``files`` are what the task made: the runner writes each table as
    the part ``<job>/<kind>/part-NNNNNN.parquet`` (:meth:`Workload.table_bytes`), then
    each file, and lists them with their units and :func:`checksum` in the task's
    manifest entry, which it writes after everything else, and only when no unit
    failed. A workload with a manifest of its own (``Workload.manifest_columns`` that
    name no range, as the cubes' shards) writes its objects itself and returns the
    entry as ``manifest`` (a ``pyarrow.Table``: its objects, units and checksums),
    which the runner checks (:mod:`pipeline.contract`): a task without a valid entry
    fails.
    """

    #: The task's part of each table, by kind (in the order the entry lists them); a
    #: kind mapped to None: no part this time, and one an earlier attempt of the task
    #: wrote is deleted (a failures table whose units now succeeded).
    tables: dict[str, Any] = field(default_factory=dict)
    #: Its objects that are no table, listed after the tables.
    files: list[OutputFile] = field(default_factory=list)
    #: The entry of a workload with a manifest of its own; never beside tables or files.
    manifest: Any = None
    failures: list[UnitFailure] = field(default_factory=list)
    bytes_written: int = 0
    #: For output that is not written: a digest of what the task made,
    #: :func:`summed_fingerprint` of a 64-bit hash per unit (the driver sums the tasks'
    #: values the same way, so the job's does not depend on how it was cut into tasks).
    fingerprint: str | None = None
    busy_seconds: float | None = None
    #: Seconds by phase ("inputs", "compute", "writing"): where the task's time went.
    phases: dict[str, float] = field(default_factory=dict)
    #: Input bytes the task read, the part of them its units hold, and the seconds
    #: reading took (0 for workloads that do not say).
    bytes_read: int = 0
    bytes_needed: int = 0
    read_seconds: float = 0.0
    #: Units of this task that failed as data (what :meth:`Workload.recorded_failures`
    #: would read back for it), when the task knows them: the driver then need not
    #: read them back at the job's end. None: not said, so read.
    recorded_failures: list[UnitFailure] | None = None
    #: A small value the task sends back in its receipt (bytes; the joblib backend's
    #: pickled results): it travels with the receipt's event, never fetched from a worker.
    value: bytes | None = None


class Workload(ABC):
    """A job's work: ``n_units`` independent units, run in tasks on workers.

    Instances are pickled into every task: keep them small (settings and paths,
    never data). Methods marked *worker* run in a worker process; the others in the
    driver. The members come in groups, as docs/plugins.md lists them: the required
    ones, then optional ones by concern, each with a default that suits most.
    """

    # -- required: what the job is, its validation, and a task ---------------------------

    #: The name used as ``workload = "..."`` in job files.
    kind: ClassVar[str]
    #: The dataclass of its settings (fields made with ``pipeline.setting``).
    settings_class: ClassVar[type]
    job_id: str
    #: Set by ``preflight``: at least 1.
    n_units: int

    @classmethod
    @abstractmethod
    def from_settings(cls, settings: Any, job_id: str, options: Any) -> Workload:
        """The workload of one resolved job (``options``: its ``RunOptions``)."""

    @abstractmethod
    def preflight(self) -> None:
        """Validate every input and set ``n_units``; raise ``InputError``/``ConfigError``
        before any task. The runner calls it once per job and command."""

    @abstractmethod
    def fingerprint(self) -> dict[str, Any]:
        """The JSON-able settings that determine the output bytes (checked on resume)."""

    @abstractmethod
    def run_task(self, task: Task, store: Store | None) -> TaskOutput:
        """Worker: run the task's units; return the tables and files they made (the
        runner writes them and lists them in the task's manifest entry) and the units
        that failed."""

    # -- messages: what a unit is called, and the run's first line -----------------------

    unit_name: str = "unit"
    #: What a run's summary calls the time its tasks compute ("building" cubes).
    work_name: str = "work"

    def describe(self) -> str:
        """The run's first line: which job, of how many units."""
        return f"{self.kind} job {self.job_id!r}: {self.n_units} {self.unit_name}s"

    # -- planning: how units are cut into tasks (docs/planning.md); the defaults suit
    #    units of equal cost ---------------------------------------------------------------

    #: Tasks hold a multiple of this many units (e.g. whole shards).
    granularity: int = 1

    def natural_boundaries(self) -> Sequence[int] | None:
        """Unit indices where a task may start without sharing reads with the task
        before it (row groups, files, shards); None: every ``granularity`` units."""
        return None

    def unit_weights(self) -> Sequence[float] | None:
        """Each unit's relative cost (e.g. its rows), or None when they are alike."""
        return None

    def read_bytes(self, start: int, stop: int) -> int:
        """Input bytes a task of units ``start..stop-1`` would read (0: not known)."""
        return 0

    def output_bytes(self, units: int) -> int | None:
        """Bytes ``units`` of its units write, when known before they run (cubes know
        exactly): a local output is checked for that much free space before any task.
        None: not known."""
        return None

    # -- cluster: where tasks read, and what workers need before the first task ---------

    def input_urls(self) -> Sequence[str]:
        """Before ``preflight``: where its tasks read (folders, files, ``s3://``
        prefixes, or globs of files); the workers open these stores while the driver
        validates, and a job whose output is inside one (or its own folder holds
        one) is refused."""
        return ()

    #: Modules its tasks import: loaded on every worker while the driver validates the
    #: job's inputs, rather than by each worker's first task.
    worker_modules: ClassVar[tuple[str, ...]] = ()

    def prepare_cluster(self, client) -> None:
        """Anything the workers need before the first task (e.g. shipped code)."""
        return None

    # -- failures and resume: units that failed as data, and what a rerun does -----------

    def unit_key(self, unit: int) -> str:
        """Which unit ``unit`` is, for the failures a run lists (``ticker='AAA'``),
        when its number alone does not say; "" for none."""
        return ""

    def recorded_failures(self, store: Store, tasks: list[Task]) -> list[UnitFailure]:
        """Units of these complete tasks that failed as data (recorded in the
        output, so a rerun would not change them)."""
        return []

    #: The table that lists the units that failed as data (what ``recorded_failures``
    #: reads back): ``pipeline verify`` counts them (``count_failures``) and points
    #: there. A job whose units all succeeded may have no part of it.
    failures_table: ClassVar[str | None] = "failures"

    @classmethod
    def count_failures(cls, store: Store, job_id: str, parts: list[str]) -> int:
        """``pipeline verify``: units that failed as data in ``parts`` (the keys of the
        job's ``failures_table`` that its manifest lists; verify reports a damaged one).
        The default counts their rows, one a unit, reading their footers alone."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        from .storage import per_object

        def rows(key: str) -> int:
            try:
                with store.open_input(key) as f:
                    return pq.ParquetFile(f).metadata.num_rows
            except (pa.ArrowException, OSError, ValueError):
                return 0  # missing or damaged: verify says so

        return sum(per_object(store, rows, parts))

    #: Whether the next run calls again the units recorded as failed (user code can
    #: fail for passing reasons); else a recorded failure is the unit's answer.
    reruns_failed_units: bool = False

    def tasks_to_retry(self, store: Store, tasks: list[Task]) -> set[int]:
        """Of these complete tasks, those to run again for their failed units."""
        return set()

    #: Settings of the fingerprint that a resumed run may change: they decide how the
    #: units still to run are run, not what a unit writes (the map's ``retries``).
    resume_may_change: tuple[str, ...] = ()

    #: Settings of the fingerprint that are the workload's *code*: they decide how a
    #: unit is computed, not what it means (the map's function source and shipped
    #: code, the regressions' engine, a plug-in's own version). A run with
    #: ``keep_done`` (``--keep-done``) may change them: the tasks done are kept and
    #: only failed and missing units run with the new code. Each task's manifest entry
    #: records the code version that made it (:mod:`pipeline.manifest`).
    code_settings: tuple[str, ...] = ()
    #: Set by the runner, for the workers: this run's code version (None: none kept),
    #: and whether the job's units were made by another version before (a task run
    #: again for its failed units then keeps rows of both).
    code_version: str | None = None
    code_changed_before: bool = False

    # -- results and verify: the objects, the manifest, and `pipeline results`/`verify` --

    #: Whether tasks write to the store (resume needs a store).
    writes_output: bool = True

    def table_bytes(self, kind: str, table) -> bytes:
        """Worker: a table of ``TaskOutput.tables`` as the bytes of its parquet part;
        the default is ``pyarrow.parquet.write_table``'s, with its defaults."""
        import io

        import pyarrow.parquet as pq

        sink = io.BytesIO()
        pq.write_table(table, sink)
        return sink.getvalue()

    #: The manifest's columns of an entry's object, its first unit and the one past its
    #: last (None: each entry holds one unit, in a manifest the workload builds): what
    #: ``pipeline verify`` checks and ``--repair`` maps to tasks, and the order of the
    #: consolidated manifest.
    manifest_columns: ClassVar[tuple[str, str, str | None]] = UNIT_RANGE

    def finalize(self, store: Store, tasks: list[Task]) -> dict[str, Any]:
        """Once every task is complete, consolidate; return facts for the summary.

        The default writes the tasks' manifest entries as one ``manifest.parquet``, in
        unit order when they have unit ranges."""
        consolidate_manifest(store, self.job_id, tasks, order=self.manifest_columns[1])
        return {}

    #: Objects ``finalize`` writes under the job's prefix besides its manifests.
    final_objects: tuple[str, ...] = ()

    #: The table ``pipeline results`` shows when none is named.
    default_table: str | None = None
    #: Tables a job may have no part of (a map job whose units all succeeded has no
    #: failures): ``pipeline results`` shows them as empty, not as unknown.
    optional_tables: tuple[str, ...] = ()

    @classmethod
    def assemble_table(cls, store: Store, job_id: str, table: str, result, tables: dict):
        """``pipeline results``: the concatenated table, assembled further if need be."""
        return result

    @classmethod
    def summarize_table(cls, table: str, result) -> str | None:
        """``pipeline results`` without ``--out``: a summary, or None for the default."""
        return None

    @classmethod
    def verify_job(cls, store: Store, job_id: str, record: dict, manifest, check) -> set[str]:
        """``pipeline verify``: check the job's objects against its manifest (a pandas
        DataFrame, None if absent), recording problems in ``check``; return the
        objects the manifest lists. The default serves manifests that list objects
        with ``object``, ``checksum`` and unit ranges."""
        from .manifest import check_listed_objects

        return check_listed_objects(store, manifest, check, columns=cls.manifest_columns)
