"""An example workload plug-in: the words of each text file in a folder, counted.

It uses only what ``pipeline`` exports for workloads: its settings, how it is built
from them, its preflight, its fingerprint, and a task that returns its tables. The
runner does the rest: task sizing, writing the tables, failures per unit, resume,
the manifest and its consolidation, ``pipeline verify`` and ``pipeline results``.
"""

from __future__ import annotations

import collections
import dataclasses
from pathlib import Path

import pyarrow as pa

import pipeline
from pipeline import (
    InputError,
    TableResults,
    TaskOutput,
    UnitFailure,
    Workload,
    check_settings,
    setting,
)


@dataclasses.dataclass(frozen=True)
class WordCountJob:
    def __post_init__(self) -> None:
        check_settings(self)  # values made in Python, checked as flags and job files are

    name: str | None = setting(None, str, "Job id. Default: the job file's name.")
    folder: str | None = setting(None, str, "Folder of .txt files to count the words of.")
    top: int = setting(3, int, "How many of each file's most common words to keep.", minimum=1)


class WordCountResults(TableResults):  # the defaults, but for which tables it shows
    default_table = "counts"
    optional_tables = ("failures",)  # a job whose files were all read has none


class WordCountWorkload(Workload):
    kind = "wordcount"
    unit_name = "file"
    settings_class = WordCountJob
    results = WordCountResults

    def __init__(self, job: WordCountJob, job_id: str):
        self.job, self.job_id, self.files, self.n_units = job, job_id, (), 0

    @classmethod
    def from_settings(cls, settings, job_id, options=None):
        return cls(settings, job_id)

    def preflight(self) -> None:
        folder = Path(self.job.folder or "")
        if not self.job.folder or not folder.is_dir():
            raise InputError(f"folder = {self.job.folder!r}: expected a folder of .txt files")
        self.files = tuple(str(p) for p in sorted(folder.glob("*.txt")))
        if not self.files:
            raise InputError(f"folder {folder}: no .txt files")
        self.n_units = len(self.files)

    def fingerprint(self) -> dict:
        return {"files": list(self.files), "top": self.job.top}

    def unit_key(self, unit: int) -> str:
        return Path(self.files[unit]).name  # failures name the file, not its number

    def run_task(self, task, store) -> TaskOutput:
        counts, failed = [], []
        for unit in task.units:
            try:
                words = Path(self.files[unit]).read_text(encoding="utf-8").split()
            except (OSError, UnicodeDecodeError) as exc:
                # Recorded as data: a rerun would fail it the same way, and the task's
                # other files are kept (a unit in TaskOutput.failures would leave the
                # whole task to run again, and the job never complete).
                failed.append(UnitFailure.from_exception(unit, exc))
                continue
            for word, count in collections.Counter(words).most_common(self.job.top):
                counts.append({"unit": unit, "file": self.unit_key(unit), "word": word,
                               "count": count})  # fmt: skip
        tables = {"counts": pa.Table.from_pylist(counts, schema=COUNTS)}
        if failed:
            tables["failures"] = pa.Table.from_pylist(
                [{"unit": f.unit, "file": self.unit_key(f.unit), "error_type": f.error_type,
                  "message": f.message} for f in failed],
                schema=FAILURES,
            )  # fmt: skip
        return TaskOutput(tables=tables, recorded_failures=failed)

    def recorded_failures(self, store, tasks) -> list[UnitFailure]:
        """The unreadable files of earlier runs' tasks, read back from their output."""
        failed = []
        # Each task's part of "failures" that its entry lists (parts are named by the
        # attempt that wrote them: the entry says which one counts).
        parts = pipeline.listed_parts(store, self.job_id, "failures", {t.index for t in tasks})
        for index in sorted(parts):
            rows = pipeline.read_parquet_object(store, parts[index]).to_pylist()
            failed += [UnitFailure(r["unit"], r["error_type"], r["message"]) for r in rows]
        return failed


COUNTS = pa.schema([("unit", pa.int64()), ("file", pa.string()), ("word", pa.string()),
                    ("count", pa.int64())])  # fmt: skip
FAILURES = pa.schema([("unit", pa.int64()), ("file", pa.string()), ("error_type", pa.string()),
                      ("message", pa.string())])  # fmt: skip
