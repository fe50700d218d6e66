"""The settings of a ``map`` job: its job-file keys, ``--flags`` and ``PIPELINE_*``
variables (the run's own are :class:`pipeline.config.RunOptions`)."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from ...config import check_settings, setting

__all__ = ["MapJob"]


def _listing(default, help: str):
    return setting(default, str, help, sequence=True)


@dataclasses.dataclass(frozen=True)
class MapJob:
    """The settings of a map job (job-file keys, ``--flags``, ``PIPELINE_*`` vars)."""

    def __post_init__(self) -> None:
        check_settings(self)

    #: A job has one input: an exported PIPELINE_FILES does not join a job file's grid.
    ONE_OF: ClassVar = (("data", "grid", "files"),)
    #: Settings of a data input, taken from the environment only for one.
    APPLIES_WITH: ClassVar = {"chunk_by": "data", "chunk_rows": "data", "columns": "data"}

    name: str | None = setting(
        None, str, "Job id: names the job's folder in the output. Default: the job file's name."
    )
    function: str | None = setting(
        None, str, "The function to call per unit: 'module:callable' (e.g. 'fits:fit_one')."
    )
    data: str | None = setting(
        None, str, "Input: parquet file, folder or s3:// prefix, called per chunk (a DataFrame)."
    )
    chunk_by: str | None = _listing(None, "With data: column(s) whose values define the chunks.")
    chunk_rows: int | None = setting(
        None, int, "With data: chunks of this many consecutive rows.", minimum=1
    )
    columns: str | None = _listing(None, "With data: only these columns reach the function.")
    grid: dict | list | None = setting(  # noqa: RUF009 - a TOML table, never mutated
        None,
        dict,
        "Input: a table of lists (a single value is held fixed; a range of integers as "
        "{start, stop, step}), called with each combination; or a list of points (tables), "
        "called with each. JSON, or a .toml, .json, .csv or .parquet file.",
        rows=True,
    )
    files: str | None = setting(
        None, str, "Input: a folder, a glob or an s3:// prefix; called with each file's path."
    )
    seed: int = setting(
        0, int, "Job seed: a function with a `seed` parameter gets unit_seed(seed, unit).",
        minimum=0,
    )  # fmt: skip
    retries: int = setting(0, int, "Retries of a unit that raises, within the run.", minimum=0)
    code: str | None = setting(
        None, str, "A .py file or package folder shipped to every worker (remote clusters)."
    )
