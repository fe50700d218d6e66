"""What a task is and what it returns: units ``start`` to ``stop - 1``, the tables and
files they made, and the units that failed."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "USER_ERRORS",
    "OutputFile",
    "Task",
    "TaskOutput",
    "UnitFailure",
    "unit_label",
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
    the part ``<job>/<kind>/part-NNNNNN.parquet`` (``Workload.results.table_bytes``), then
    each file, and lists them with their units and :func:`checksum` in the task's
    manifest entry, which it writes after everything else, and only when no unit
    failed. A workload with a manifest of its own (``results.manifest_columns`` that
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
