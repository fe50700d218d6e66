"""Checks that a workload keeps the workload contract (``pipeline.Workload``), where
the runner takes what it gives: what its preflight leaves, its fingerprint (kept in
the job's record) and each task's tables and files, or manifest entry of its own.

A plug-in's mistake there was a traceback from deep in the runner, or a run that
said it completed what ``pipeline verify`` then found broken. It is now a
:class:`WorkloadError` naming the workload and what the contract expects: before
any task where that is knowable, else failing the task whose output it is.
"""

from __future__ import annotations

import json
import numbers

from . import registry
from .errors import PipelineError, StorageError, WorkloadError
from .layout import check_job_id
from .workload import OutputFile, TableResults, Task, TaskOutput, Workload

__all__ = [
    "as_recorded",
    "check_entry",
    "check_output",
    "describe",
    "json_value",
    "preflight",
    "recorded_fingerprint",
]

#: What the contract asks a task to return, as docs/plugins.md gives it.
ENTRY = (
    "a task returns its tables (TaskOutput.tables) and files (TaskOutput.files), which "
    "the runner lists in its entry, or an entry of its own: a pyarrow.Table with object, "
    "kind, unit_start, unit_stop and checksum (pipeline.checksum of the object's bytes); "
    "see docs/plugins.md"
)

#: A checksum as :func:`pipeline.checksum` writes it: xxh3_64, 16 hex digits.
CHECKSUM = "^[0-9a-f]{16}$"


def describe(workload: Workload) -> str:
    """How messages name the workload: ``workload 'x' (module:Class, from package p)``."""
    return registry.describe(workload.kind, type(workload))


def preflight(workload: Workload) -> None:
    """The job's name (:func:`~pipeline.layout.check_job_id`), ``workload.preflight()``,
    and what it must leave: ``n_units``, at least 1."""
    check_job_id(workload.job_id)
    try:
        workload.preflight()
    except PipelineError:
        raise
    except OSError as exc:  # the input or its store failing, not the plug-in's mistake
        raise StorageError(f"{describe(workload)}: its inputs could not be read: {exc}") from exc
    except Exception as exc:
        raise WorkloadError(
            f"{describe(workload)}: its preflight failed: {type(exc).__name__}: {exc} (a "
            "workload's preflight raises pipeline.InputError or ConfigError, naming the "
            "input or setting at fault)"
        ) from exc
    n = getattr(workload, "n_units", None)
    if not isinstance(n, numbers.Integral) or isinstance(n, bool) or n < 1:
        # (no units made pyarrow's "Must pass at least one table" at the job's end)
        raise WorkloadError(
            f"{describe(workload)}: its preflight left n_units = {n!r}; a job has at least one "
            "unit (a workload whose input has none raises pipeline.InputError saying so)"
        )


def _plain(value):
    """A value JSON does not have, as a job's record writes it: dates and times as ISO
    text, numpy values as numbers and lists, bytes as hex; else TypeError."""
    if hasattr(value, "isoformat"):
        return value.isoformat()
    if hasattr(value, "tolist"):  # numpy scalars and arrays
        return value.tolist()
    if isinstance(value, bytes):
        return value.hex()
    raise TypeError(repr(value)[:80])


def json_value(value):
    """A value as a job's JSON record writes it: :func:`_plain`, and other objects
    (an estimator in a grid from Python) as their repr, which for most says their
    parameters (the map refuses one that is a memory address)."""
    try:
        return _plain(value)
    except TypeError:
        return repr(value)


def as_recorded(value):
    """``value`` as its JSON record reads back (objects as their repr)."""
    return json.loads(json.dumps(value, sort_keys=True, default=json_value))


def recorded_fingerprint(workload: Workload) -> dict:
    """The workload's fingerprint as its job record reads it back. A value JSON cannot
    hold (beyond dates, numpy values and bytes) is refused, naming the key: written as
    its repr, an object's memory address, every resume was refused as a job "with
    other settings"."""
    fingerprint = workload.fingerprint()
    if not isinstance(fingerprint, dict):
        raise WorkloadError(
            f"{describe(workload)}: fingerprint() returned {type(fingerprint).__name__}; a dict "
            "of the settings that decide the output's bytes is expected"
        )
    try:
        return json.loads(json.dumps(fingerprint, sort_keys=True, default=_plain))
    except (TypeError, ValueError) as exc:
        key, why = None, exc
        for k, v in fingerprint.items():
            try:
                json.dumps(v, sort_keys=True, default=_plain)
            except (TypeError, ValueError) as value_exc:
                key, why = k, value_exc
                break
        where = f"key {key!r} holds" if key is not None else "holds"
        raise WorkloadError(
            f"{describe(workload)}: fingerprint() {where} {why}, which the job's record (JSON) "
            "cannot keep from run to run; give text, numbers, true/false, lists and dicts "
            "of them (dates, numpy values and bytes are taken too)"
        ) from None


def check_output(workload: Workload, task: Task, out, *, writes: bool) -> None:
    """Worker: what ``run_task`` returned is a ``TaskOutput`` and, in a job that
    ``writes`` output, its tables and files are what the runner can write and list
    (:func:`check_entry` checks the entry, once built, before it is written)."""
    if not isinstance(out, TaskOutput):
        raise WorkloadError(
            f"{describe(workload)}: task {task.index}'s run_task returned "
            f"{type(out).__name__}, not a pipeline.TaskOutput"
        )
    problem = _objects_problem(workload, out) if writes else None
    if problem:
        raise WorkloadError(f"{describe(workload)}: task {task.index} returned {problem}")


def _objects_problem(workload: Workload, out: TaskOutput) -> str | None:
    """Why the runner cannot write and list ``out``'s tables and files, or None."""
    import pyarrow as pa

    if not out.tables and not out.files:
        return None
    if out.manifest is not None:
        # Which lists the objects? An entry of its own beside them would be lost.
        return (
            "tables or files and a manifest entry of its own; return the one or the other "
            "(the runner lists the tables and files in the entry it builds)"
        )
    if workload.results.manifest_columns[2] is None:
        return (
            f"tables or files, but its manifest_columns {workload.results.manifest_columns!r} name "
            "no unit range to list them with; such a workload returns its own entry"
        )
    if not isinstance(out.tables, dict):
        return f"tables of type {type(out.tables).__name__}; a dict of kind -> pyarrow.Table"
    for kind, table in out.tables.items():
        # <job>/manifest/ holds the tasks' entries: a part there would be overwritten
        if not isinstance(kind, str) or not kind or "/" in kind or kind == "manifest":
            return (
                f"a table named {kind!r}; a table's kind is a name without '/' (its "
                "parts' folder), other than 'manifest'"
            )
        if table is not None and not isinstance(table, pa.Table):
            return f"table {kind!r} of type {type(table).__name__}, not a pyarrow.Table"
    prefix = workload.job_id + "/"
    for file in out.files:
        if not isinstance(file, OutputFile):
            return f"a file of type {type(file).__name__}, not a pipeline.OutputFile"
        if not isinstance(file.key, str) or not file.key.startswith(prefix):
            # --overwrite, verify and repair see the job's own folder alone
            return f"a file at {file.key!r}, outside the job's folder ({prefix})"
        if file.data is not None and not isinstance(file.data, bytes | bytearray | memoryview):
            return f"file {file.key!r} with data of type {type(file.data).__name__}, not bytes"
        if file.units is not None and not isinstance(file.units, range):
            return f"file {file.key!r} with units {file.units!r}, not a range"
    return None


def check_entry(workload: Workload, task: Task, manifest) -> None:
    """Worker, before the task's entry is written: raise :class:`WorkloadError` unless
    ``manifest`` is an entry that resume, consolidation and ``pipeline verify`` can use.
    A few checks of its columns: nothing beside the task's own work."""
    problem = _entry_problem(workload, task, manifest)
    if problem:  # (the workload named only here: describe() reads entry points)
        raise WorkloadError(f"{describe(workload)}: task {task.index} returned {problem}")


def _entry_problem(workload: Workload, task: Task, manifest) -> str | None:
    import inspect

    import pyarrow as pa

    if manifest is None:
        return f"no manifest entry (TaskOutput.manifest); {ENTRY}"
    if not isinstance(manifest, pa.Table):
        return f"a manifest entry of type {type(manifest).__name__}; {ENTRY}"
    columns = manifest.column_names
    key, first, last = workload.results.manifest_columns
    ranges = (first, last) if last and {first, last} <= set(columns) else None
    # A workload without a verify_job of its own is verified by its entries' objects,
    # checksums and unit ranges: without them `pipeline verify` was a traceback.
    # (a static attribute lookup: a plug-in's verify_job may be a staticmethod)
    generic = inspect.getattr_static(workload.results, "verify_job") is inspect.getattr_static(
        TableResults, "verify_job"
    )
    if generic:
        lacking = [c for c in (key, "checksum") if c not in columns]
        lacking += [] if ranges else [c for c in (first, last) if c not in columns]
        if lacking:
            return (
                f"a manifest entry without {', '.join(lacking)} (its columns: "
                f"{', '.join(columns) or 'none'}); {ENTRY}"
            )
    if key in columns and _not_text(manifest.column(key)):
        return f"a manifest entry whose objects are not all keys; {ENTRY}"
    if "checksum" in columns and (problem := _checksums_problem(manifest.column("checksum"))):
        return problem
    if ranges and (manifest.num_rows or generic):
        return _ranges_problem(task, manifest, ranges)
    return None


def _whole(value) -> bool:
    """A unit number: an integer, or a float that is one (NaN, None and text are not)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    return value == value and value not in (float("inf"), float("-inf")) and value == int(value)


def _not_text(column) -> bool:
    import pyarrow as pa

    return column.null_count > 0 or not (
        pa.types.is_string(column.type) or pa.types.is_large_string(column.type)
    )


def _checksums_problem(column) -> str | None:
    import pyarrow.compute as pc

    if not _not_text(column):
        bad = pc.invert(pc.match_substring_regex(column, CHECKSUM))
        if not pc.any(bad).as_py():
            return None
        first = repr(column.filter(bad)[0].as_py())
    else:
        first = f"a column of {column.type}" + (" with nulls" if column.null_count else "")
    # Another hash (sha256) ran "complete", and verify then called every object corrupt
    return (
        f"a manifest entry whose checksum is not pipeline.checksum(data) of its "
        f"object ({first[:80]}); the checksum is the xxh3_64 of the object's bytes in 16 "
        "hex digits, what `pipeline verify` compares"
    )


def _ranges_problem(task: Task, manifest, ranges: tuple[str, str]) -> str | None:
    """The entry's distinct unit ranges cover the task's units, each once: ranges that
    overlapped ran "complete", and only `pipeline verify` found the units duplicated."""
    start, stop = ranges
    distinct = set(zip(*(manifest.column(c).to_pylist() for c in ranges), strict=True))
    pairs = sorted(p for p in distinct if all(_whole(v) for v in p))
    odd = len(pairs) < len(distinct)  # nulls, NaN, text...
    at = task.start
    for a, b in [] if odd else pairs:
        if a != at or b <= a:
            break
        at = b
    else:
        if at == task.stop and not odd:
            return None
    shown = ", ".join(f"{a}..{b}" for a, b in pairs[:6]) + (" ..." if len(pairs) > 6 else "")
    return (
        f"a manifest entry whose ranges ({start}..{stop}: {shown or 'none'}) do not "
        f"cover the task's, {task.start}..{task.stop}, once each; each object's range "
        "is that of its task, or one of ranges that split it (verify counts the units of "
        "ranges that overlap as duplicated, those of none as missing)"
    )
