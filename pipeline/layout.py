"""The output layout: where a job's objects live under the output (one module knows).

<job>/job.json                      the job's record: workload, settings, plan
<job>/manifest/part-NNNNNN.parquet  task NNNNNN's entry, written last, only when
                                    all of its data is written, created once: the
                                    first attempt of the task to commit wins
<job>/manifest/part-NNNNNN.rR.parquet  its entry of round R: a rerun of the task
                                    (its units recorded as failed called again)
                                    that supersedes the round before
<job>/manifest.parquet              every entry, once every task is complete
<job>/<table>/part-NNNNNN.aXXXXXXXX.parquet  task NNNNNN's part of a table
                                    (regressions' coefficients, models, timings; map
                                    results, failures; a plug-in's own), written by
                                    its attempt XXXXXXXX (0.2.0 wrote part-NNNNNN.parquet)
<job>/shards/NNNNNN.aXXXXXXXX.npy   cube shard NNNNNN, written by attempt XXXXXXXX of
                                    the task holding it (0.2.0 wrote NNNNNN.npy);
                                    readers find it through the entries' "shard" column
_locks/<job>                        held by the run writing <job> (outside it: an
                                    --overwrite empties <job> while holding it)
_receipts/<job>/<run>/NNNNNN.json   the receipt of task NNNNNN's attempt that failed
                                    units, for run <run>'s driver to find after a
                                    reconnect (removed when the run ends)
inputs/                             the cube jobs' default frames (made once)
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

from .errors import ConfigError, InputError
from .storage import join, open_store
from .storage.globs import has_magic, reaches, split

__all__ = [
    "check_job_id",
    "inside_job_folder",
    "reads_below",
    "completed_tasks",
    "job_folder",
    "is_consolidated",
    "job_records",
    "job_record_key",
    "read_job_record",
    "readable_table",
    "manifest_key",
    "manifest_prefix",
    "consolidated_manifest_key",
    "part_key",
    "attempt_key",
    "attempt_of",
    "written_by_attempt",
    "current_entries",
    "shard_key",
    "lock_key",
    "receipt_key",
    "receipts_prefix",
]

log = logging.getLogger(__name__)


#: Folders of the output that are not jobs' (besides those starting with '_').
OUTPUT_FOLDERS = ("inputs",)


def check_job_id(job_id: str) -> None:
    """A job's name is one folder under the output, beside the output's own (``_locks``,
    ``inputs``): ``a/b`` would hide the job from ``pipeline results`` and ``verify``,
    ``_locks`` would mix it with the locks, and an ``--overwrite`` of a job named
    ``inputs`` would delete the default frames."""
    if (
        not isinstance(job_id, str)
        or not job_id
        or job_id != job_id.strip()
        or any(c in job_id for c in "/\\")
        or job_id[0] in "._"
        or not job_id.isprintable()
        or job_id in OUTPUT_FOLDERS
    ):
        raise ConfigError(
            f"job name {job_id!r}: a job's name is one folder under the output: printable, "
            "without '/' or '\\', not starting with '.' or '_', without spaces at either end, "
            f"and not {', '.join(map(repr, OUTPUT_FOLDERS))} (the output's own); set "
            "name = '...' (--name)"
        )


def inside_job_folder(url: str, output: str, job_id: str) -> bool:
    """Whether ``url`` (an input's folder or file) lies in the job's own folder, which
    ``--overwrite`` empties and ``verify`` checks object by object."""
    folder = (*_parts(output), job_id)
    return _parts(url)[: len(folder)] == folder


def reads_below(url: str, folder: str) -> bool:
    """Whether an input ``url`` (a folder, file, ``s3://`` prefix, or a glob of them)
    takes in files below ``folder`` (a job's output: they would become its input)."""
    if not has_magic(url):
        top = _parts(url)
        return _parts(folder)[: len(top)] == top
    root, segments = split(url)
    top, names = _parts(root or "."), _parts(folder)
    return names[: len(top)] == top and reaches(segments, list(names[len(top) :]))


def _parts(where: str) -> tuple[str, ...]:
    if "://" in where:
        scheme, rest = where.split("://", 1)
        return (scheme, *(p for p in rest.split("/") if p))
    return Path(where).expanduser().resolve().parts


def job_records(store) -> dict[str, str]:
    """Job id -> its record's key, for every job under ``store``."""
    keys = [k for k in store.list() if k.endswith("/job.json") and k.count("/") == 1]
    return {k.split("/", 1)[0]: k for k in keys}


def job_folder(output: str, job: str | None = None) -> tuple[str, str | None]:
    """``(output, job)``, with a job's own folder given as ``output`` (what a run
    prints: ``results: results/cubes``) taken as its parent and the job's name."""
    output = str(output)
    if job is None and open_store(output).exists("job.json"):
        parent, _, name = output.rstrip("/").rpartition("/")
        return parent or ".", name
    return output, job


def job_record_key(job_id: str) -> str:
    return join(job_id, "job.json")


def read_job_record(store, key: str) -> dict:
    """The job record (``job.json``) at ``key``; a damaged one is named, not a traceback."""
    import json

    try:
        record = json.loads(store.read_bytes(key))
    except (ValueError, UnicodeDecodeError) as exc:
        record = exc
    if not isinstance(record, dict):
        why = f": {record}" if isinstance(record, Exception) else ""
        raise InputError(
            f"{store.describe(key)} is not a job record (damaged{why}); a run with "
            "--overwrite writes the job again from the start"
        )
    return record


def readable_table(store, key: str) -> str | None:
    """None when the parquet object at ``key`` has a readable footer, else why not (a
    consolidated manifest damaged after its run: the job is not complete then)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        with store.open_input(key) as f:
            pq.ParquetFile(f).metadata  # noqa: B018 - reading the footer is the check
    except (pa.ArrowException, OSError, ValueError) as exc:
        return str(exc)
    return None


def manifest_prefix(job_id: str) -> str:
    return join(job_id, "manifest")


def manifest_key(job_id: str, index: int, round: int = 0) -> str:
    """Task ``index``'s entry; of ``round`` > 0: a rerun of a complete task that
    supersedes the entry of the round before."""
    name = f"part-{index:06d}.r{round}.parquet" if round else f"part-{index:06d}.parquet"
    return join(job_id, "manifest", name)


def attempt_key(key: str, attempt: str) -> str:
    """``key`` as written by task attempt ``attempt``: its id before the name's
    extension (``part-000003.parquet`` -> ``part-000003.a1b2c3d4.parquet``), so
    that no attempt writes over another's objects."""
    if not attempt:
        return key
    folder, _, name = key.rpartition("/")
    stem, dot, ext = name.partition(".")
    name = f"{stem}.a{attempt}{dot}{ext}"
    return f"{folder}/{name}" if folder else name


#: An attempt's id in an object's name: 8 hex digits after ".a", before the extension.
_ATTEMPT = re.compile(r"\.a([0-9a-f]{8})(?:\.|$)")


def attempt_of(key: str) -> str | None:
    """The id of the attempt that wrote ``key`` (:func:`attempt_key`), or None."""
    found = _ATTEMPT.search(key.rsplit("/", 1)[-1])
    return found.group(1) if found else None


#: A task's object as 0.2.0 named it, before attempts named them: a table's part or a
#: cube shard in a folder of the job (not its manifest).
_UNNAMED = re.compile(r"[^/]+/(?!manifest/)[^/]+/(part-\d{6}\.parquet|\d{6}\.npy)")


def written_by_attempt(job_id: str, key: str) -> bool:
    """Whether ``key`` is the kind of object a task attempt writes (named by its
    attempt, or as 0.2.0 named them): one no entry lists is then left by an attempt
    that did not commit, not a stranger's."""
    return attempt_of(key) is not None or (
        key.startswith(f"{job_id}/") and _UNNAMED.fullmatch(key) is not None
    )


def entry_round(key: str) -> int:
    """The round of an entry's key (:func:`manifest_key`)."""
    found = re.search(r"\.r(\d+)\.parquet$", key)
    return int(found.group(1)) if found else 0


def current_entries(keys) -> dict[int, str]:
    """Task index -> its current entry (its latest round), of the entries' ``keys``."""
    current: dict[int, str] = {}
    for key in keys:
        index = task_index(key)
        if index is not None and (
            index not in current or entry_round(key) > entry_round(current[index])
        ):
            current[index] = key
    return current


def consolidated_manifest_key(job_id: str) -> str:
    return join(job_id, "manifest.parquet")


def is_consolidated(store, job_id: str) -> bool:
    """Whether the job's consolidated manifest is there and readable: one damaged after
    its run (garbage in manifest.parquet) made the job "complete" with its index lost;
    the run now writes it again from the tasks' entries."""
    key = consolidated_manifest_key(job_id)
    if not store.exists(key):
        return False
    damage = readable_table(store, key)
    if damage is not None:
        log.warning("%s is damaged (%s): written again from the tasks' entries",
                    store.describe(key), damage)  # fmt: skip
    return damage is None


def part_key(job_id: str, table: str, index: int) -> str:
    return join(job_id, table, f"part-{index:06d}.parquet")


def shard_key(job_id: str, shard: int) -> str:
    return join(job_id, "shards", f"{shard:06d}.npy")


def lock_key(job_id: str) -> str:
    return join("_locks", job_id)


def receipts_prefix(job_id: str, run: str = "") -> str:
    return join("_receipts", job_id, run)


def receipt_key(job_id: str, run: str, index: int) -> str:
    return join("_receipts", job_id, run, f"{index:06d}.json")


_TASK_KEY = re.compile(r"part-(\d{6,})(?:\.r\d+|\.a[0-9a-f]{8})?\.parquet")


def task_index(key: str) -> int | None:
    """The task a ``.../part-NNNNNN[.rR|.aXXXXXXXX].parquet`` key is of (an entry, a
    table's part), or None for another key."""
    found = _TASK_KEY.fullmatch(key.rsplit("/", 1)[-1])
    return int(found.group(1)) if found else None


def task_parts(store, job_id: str, indices: set[int]) -> list[str]:
    """The parts of the job's tables (``<job>/<table>/part-NNNNNN.parquet``) of the tasks
    ``indices``, from one listing of the job."""
    if not indices:
        return []
    return [
        k
        for k in store.list(job_id)
        if task_index(k) in indices and k.count("/") == job_id.count("/") + 2
    ]


def completed_tasks(store, job_id: str) -> set[int]:
    """The indices of the job's tasks that wrote their manifest entry (all their data
    is written)."""
    found = (task_index(key) for key in store.list(manifest_prefix(job_id)))
    return {index for index in found if index is not None}


def tasks_done(store, job_id: str) -> set[int]:
    """The job's complete tasks (by their entries), none without an output."""
    return completed_tasks(store, job_id) if store is not None else set()
