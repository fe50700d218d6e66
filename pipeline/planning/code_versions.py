"""Which code made each task of a job: its *code version*.

A workload names the settings of its fingerprint that are its code, not its units'
meaning (``Workload.code_settings``: a map's function source and shipped code, the
regressions' engine, a plug-in's own version). A resume whose code settings changed
is refused unless the run is given ``keep_done`` (``--keep-done``): then the tasks
done are kept, and only the failed and missing units run, with the new code.

A code version is the :func:`pipeline.checksum` of those settings' values (16 hex
digits). Each task's manifest entry records the version that made it in its
``code`` column; a task run again for its failed units keeps the rows the earlier
code made, and its entry lists both versions (``a+b``, sorted). The job's record
(``job.json``) keeps each version's settings (``code_versions``), which
``pipeline verify`` reports with the tasks each made; ``pipeline results --code``
keeps the rows of the tasks a version made.
"""

from __future__ import annotations

import json
from collections.abc import Iterable

from ..layout import manifest_key
from ..manifest import checksum
from ..storage import Store, read_parquet_object

__all__ = [
    "CODE_COLUMN",
    "code_changes",
    "code_version",
    "entry_codes",
    "made_by",
    "stamp_entry",
    "tasks_by_code",
    "versions_record",
]

#: The manifest entry's column naming the code version(s) that made the task.
CODE_COLUMN = "code"


def code_version(fingerprint: dict | None, settings: Iterable[str]) -> str | None:
    """The code version of a job with ``fingerprint`` (as recorded), None for a
    workload without code settings."""
    settings = tuple(settings)
    if not settings or fingerprint is None:
        return None
    picked = {k: fingerprint.get(k) for k in settings}
    return checksum(json.dumps(picked, sort_keys=True).encode())


def code_changes(changed: list[str], settings: Iterable[str]) -> tuple[list[str], list[str]]:
    """Of the fingerprint's ``changed`` keys, those that are code settings and those
    that are not (the latter still change what the finished units mean)."""
    code = set(settings)
    return [k for k in changed if k in code], [k for k in changed if k not in code]


def versions_record(
    recorded: dict | None, before: dict | None, current: dict, settings: Iterable[str]
) -> dict[str, dict]:
    """The record's ``code_versions`` (version -> its settings' values) with the
    version of the ``before`` fingerprint (a record that predates them) and the
    ``current`` one added; empty for a workload without code settings."""
    settings = tuple(settings)
    if not settings:
        return {}
    out = dict(recorded or {})
    for fingerprint in (before, current):
        version = code_version(fingerprint, settings)
        if version is not None and version not in out:
            out[version] = {k: fingerprint.get(k) for k in settings}
    return out


def entry_codes(values: Iterable[str | None]) -> set[str]:
    """The code versions a manifest entry's ``code`` column names."""
    return {c for v in values if v for c in str(v).split("+") if c}


def stamp_entry(workload, store: Store | None, task, entry):
    """Worker: ``entry`` with its ``code`` column, the versions that made the task's
    objects: this run's, and for a job whose code changed before, those of the
    task's earlier entry (a task run again for its failed units keeps the others'
    rows). Unchanged for a workload without code settings, or an entry that names
    its own."""
    import pyarrow as pa

    version = workload.code_version
    if version is None or entry is None or CODE_COLUMN in entry.column_names:
        return entry
    codes = {version}
    if workload.code_changed_before and store is not None:
        key = manifest_key(workload.job_id, task.index)
        if store.exists(key):
            earlier = read_parquet_object(store, key)
            if CODE_COLUMN in earlier.column_names:
                codes |= entry_codes(earlier.column(CODE_COLUMN).to_pylist())
    value = "+".join(sorted(codes))
    return entry.append_column(CODE_COLUMN, pa.array([value] * entry.num_rows, pa.string()))


def made_by(entry, wanted: str) -> bool:
    """Whether a task's manifest entry (a pyarrow Table) names the code version
    ``wanted``, or one it is the start of (the first digits suffice, as for a git
    commit)."""
    if CODE_COLUMN not in entry.column_names:
        return False
    codes = entry_codes(set(entry.column(CODE_COLUMN).to_pylist()))
    return any(c.startswith(wanted) for c in codes)


def tasks_by_code(manifest, columns) -> dict[str, int]:
    """``pipeline verify``: tasks (distinct unit ranges) by the code value of their
    entry (a pandas DataFrame); empty when no entry records one."""
    if manifest is None or CODE_COLUMN not in manifest.columns:
        return {}
    _, start, stop = columns
    if stop is None or start not in manifest.columns:
        keys = [start] if start in manifest.columns else []
    else:
        keys = [start, stop]
    rows = manifest[[*keys, CODE_COLUMN]].drop_duplicates()
    counts = rows[CODE_COLUMN].fillna("unrecorded").value_counts()
    return {str(k): int(v) for k, v in counts.items()}
