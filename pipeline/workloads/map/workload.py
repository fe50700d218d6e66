"""The ``map`` workload: the user's function over dataset chunks, a grid, or files.

Each unit's call returns a mapping or pandas Series (one row), a pandas DataFrame,
pyarrow Table or list of mappings (rows), or None. A task writes its units' rows
and failures (:mod:`.task`); both are listed with checksums in the task's manifest
entry. The next run of the same command calls again only the units that raised;
the rewritten part holds the same bytes a clean run gives.

How returned values become rows (and the column rule across units) is :mod:`.rows`;
the job's settings :mod:`.job`; ``pipeline.map`` :mod:`.api`.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable

import pyarrow as pa
import pyarrow.compute as pc

from ...cluster.code_digest import source_hash
from ...cluster.shipped_code import add_import_paths
from ...config.settings import RowsFile, split_list
from ...errors import ConfigError, InputError
from ...manifest import consolidate_manifest, listed_parts
from ...results import differing_units
from ...storage import Store, join, per_object, read_parquet_schema, read_parquet_tables
from ...workload import TableResults, Task, TaskOutput, UnitFailure, Workload
from .grid import GridInput
from .inputs import DataInput, FilesInput
from .job import MapJob
from .points_file import PointsFileInput
from .rows import ONE_TYPE_A_COLUMN, UnitRows
from .task import recorded_failure, run_map_task
from .usercode import (
    accepts_seed,
    check_code_path,
    check_signature,
    code_hash,
    describe_function,
    load_function,
)

__all__ = ["MapJob", "MapWorkload"]


class MapResults(TableResults):
    """The map's output: a results table, and a failures table when units failed."""

    default_table = "results"
    optional_tables = ("failures",)

    @classmethod
    def finalize(cls, workload: Workload, store: Store, tasks: list[Task]) -> dict:
        check = functools.partial(_results_combine, store)
        consolidate_manifest(store, workload.job_id, tasks, check=check)
        return {"tables": store.describe(join(workload.job_id, "results"))}


def _results_combine(store: Store, manifest: pa.Table) -> None:
    """Raise when the tasks' results tables cannot make one table (a column of text
    in one task's units, of numbers in another's), as a task's units that differ
    fail it: the run is then not complete, where before its results could not be
    read. Only the tables' footers are read."""
    rows = manifest.filter(pc.equal(manifest.column("kind"), "results"))
    keys = rows.column("object").to_pylist()
    if len(keys) < 2:
        return
    schemas = per_object(store, lambda key: read_parquet_schema(store, key), keys)
    try:
        pa.unify_schemas(schemas, promote_options="permissive")
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as exc:
        starts = [f"from {u}" for u in rows.column("unit_start").to_pylist()]
        raise InputError(f"{differing_units(schemas, starts, exc)}: {ONE_TYPE_A_COLUMN}") from None


class MapWorkload(Workload):
    kind = "map"
    settings_class = MapJob
    results = MapResults

    def __init__(
        self, job: MapJob, job_id: str, fn: Callable | None = None, output: str | None = None
    ):
        self.job = job
        self.job_id = job_id
        self.fn = fn
        #: Where a grid file's copy goes (its inputs/ folder), which each task reads
        #: its points from; not known: this machine's temporary folder.
        self.output = output
        self.input: DataInput | GridInput | PointsFileInput | FilesInput | None = None
        self.rows: UnitRows | None = None  # the calls' results as rows (of self.input)
        self.n_units = 0
        self.unit_name = "unit"
        self._seeded = False
        self._code_hash: str | None = None
        self._by_name = False

    def __getstate__(self) -> dict:
        # A function named 'module:callable' travels by name and is imported where the
        # task runs: the scheduler, which also unpickles tasks, may not have the module
        # (shipped code reaches the workers only). The grid travels as the input holds
        # it, not twice: listed points as the settings hold them were a large graph.
        state = dict(self.__dict__)
        if self._by_name:
            state["fn"] = None
        if self.job.grid is not None and self.input is not None:
            state["job"] = dataclasses.replace(self.job, grid=None)
        return state

    @property
    def seeded(self) -> bool:
        """Whether each call gets its unit's seed (a ``seed`` parameter the grid does
        not give)."""
        return self._seeded

    def function(self) -> Callable:
        if self.fn is None:
            self.fn = load_function(self.job.function)
        return self.fn

    @classmethod
    def from_settings(cls, settings: MapJob, job_id: str, options=None) -> MapWorkload:
        return cls(settings, job_id, output=options.output if options is not None else None)

    # -- driver ---------------------------------------------------------------------------

    def input_urls(self) -> tuple[str, ...]:
        where = self.job.data or self.job.files
        return (where,) if where else ()

    def preflight(self) -> None:
        if self.input is not None:
            return
        job = self.job
        given = [k for k in ("data", "grid", "files") if getattr(job, k) is not None]
        if len(given) != 1:
            raise ConfigError(
                "a map job takes exactly one input: data, grid or files"
                + (f" (got {' and '.join(given)})" if given else " (none given)")
            )
        stray = [k for k in ("chunk_by", "chunk_rows", "columns") if getattr(job, k) is not None]
        if job.data is None and stray:
            # Ignored, they would still bind the job: a resume without them was refused
            raise ConfigError(
                f"{', '.join(stray)}: {'applies' if len(stray) == 1 else 'apply'} to a data "
                f"input only; this job's input is {given[0]}"
            )
        if job.code:
            code = check_code_path(job.code)
            self._code_hash = code_hash(code)
            # Importable here as on the workers, which get a file beside their own
            # modules and a folder on their import path (its parent too: a package)
            add_import_paths(*((code.parent,) if code.is_file() else (code, code.parent)))
        if self.fn is None:
            if not job.function:
                raise ConfigError("a map job needs function = 'module:callable'")
            self.fn = load_function(job.function)
            self._by_name = True
        elif not callable(self.fn):
            raise ConfigError(f"map: {self.fn!r} is not callable")

        if isinstance(job.grid, RowsFile):
            grid = PointsFileInput(job.grid, self.output)
        else:
            grid = GridInput(job.grid) if job.grid is not None else None
        for what, keys in (("chunk_by column", split_list(job.chunk_by) if job.data else ()),
                           ("grid key", grid.keys if grid else ())):  # fmt: skip
            if "unit" in keys:
                # The results begin with the unit's number, named `unit`: the key would
                # take its place and the numbers would be lost.
                raise ConfigError(
                    f"{what} 'unit' has the name of the results' first column (each "
                    f"unit's number); rename the {what.split()[-1]}"
                )
        if job.data is not None:
            self.input = DataInput(
                job.data, split_list(job.chunk_by), job.chunk_rows, split_list(job.columns)
            )
            check_signature(self.fn, positional=1, what="a chunk (a pandas DataFrame)")
            self.unit_name = "chunk"
        elif grid is not None:
            self.input = grid
            check_signature(self.fn, keywords=self.input.keys, what="the grid's keys")
            self.unit_name = "point"
        else:
            self.input = FilesInput(job.files)
            check_signature(self.fn, positional=1, what="a file's path")
            self.unit_name = "file"
        # A grid of seeds (grid = {seed = [0, 1, 2]}) passes its own: a derived seed
        # would silently replace the values the grid asked for.
        self._seeded = accepts_seed(self.fn) and "seed" not in (grid.keys if grid else ())
        self.rows = UnitRows(self.input)
        self.n_units = self.input.n_units

    def fingerprint(self) -> dict:
        # The grid as the input records it (a copy of a grid of 300,000 points cost 4 s)
        job = dataclasses.asdict(dataclasses.replace(self.job, grid=None))
        job.pop("name")
        job["function"] = job["function"] or describe_function(self.fn)
        job["function_source"] = source_hash(self.fn)
        job["code"] = self._code_hash
        return {**job, **self.input.fingerprint()}

    def prepare_cluster(self, client) -> None:
        if isinstance(self.input, PointsFileInput):
            self.input.check_readable(client)
        if self.job.code:
            from ...cluster.shipped_code import ship_code

            ship_code(client, check_code_path(self.job.code))
        if self._by_name:
            # Known now rather than from every unit's failure: a remote cluster's
            # workers import the function by name, from their own import path.
            # (Named without "error": the scale test counts log lines that say it, and
            # each worker logs the name of a function it is asked to run.)
            answers = client.run(_why_not_importable, self.job.function)
            failing = {worker: why for worker, why in answers.items() if why}
            if failing:
                worker, why = min(failing.items())
                raise ConfigError(
                    f"{len(failing)} of {len(answers)} workers "
                    f"cannot import the function; on {worker}: {why}"
                )

    def describe(self) -> str:
        function = self.job.function or describe_function(self.fn)
        return f"map job {self.job_id!r}: {function} over {self.input.describe()}"

    # -- worker ---------------------------------------------------------------------------

    def run_task(self, task: Task, store: Store | None) -> TaskOutput:
        return run_map_task(self, task, store)

    def unit_key(self, unit: int) -> str:
        return self.rows.key_label(unit)

    # -- after the run --------------------------------------------------------------------

    #: Units recorded as failed are called again by the next run of the same command.
    reruns_failed_units = True
    #: Retries never change a unit's output: a rerun may ask for more.
    resume_may_change = ("retries",)
    #: The function's source and the shipped code: a fix to either may keep the units
    #: done (``keep_done``). Its name, the input and the seed are what a unit means.
    code_settings = ("function_source", "code")

    def recorded_failures(self, store: Store, tasks: list[Task]) -> list[UnitFailure]:
        failed = []
        parts = listed_parts(store, self.job_id, "failures", {t.index for t in tasks})
        keys = [parts[i] for i in sorted(parts)]
        for table in read_parquet_tables(store, keys):
            failed += [recorded_failure(r, self.rows.row_label(r)) for r in table.to_pylist()]
        return failed


def _why_not_importable(spec: str) -> str | None:
    """Worker: why ``spec`` does not import here, or None."""
    try:
        load_function(spec)
    except ConfigError as exc:
        return str(exc)
    return None
