"""The ``map`` workload: the user's function over dataset chunks, a grid, or files.

Each unit's call returns a mapping or pandas Series (one row), a pandas DataFrame,
pyarrow Table or list of mappings (rows), or None. Task ``i`` writes the rows of
its units, in unit order, with the unit's key columns first (``unit``, then the
chunk key, the grid's parameters or the file), to
``<job>/results/part-NNNNNN.parquet``; units that raised (after
``retries`` more tries) go to ``<job>/failures/part-NNNNNN.parquet`` with their
error and the innermost frame of the user's code. Both are listed with checksums
in the task's manifest entry. The next run of the same command calls again only
the units that raised; the rewritten part holds the same bytes a clean run gives.

How returned values become rows (and the column rule across units) is :mod:`.map_rows`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import inspect
import io
import re
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ...cluster.shipped_code import add_import_paths
from ...config import check_settings, setting
from ...errors import ConfigError, InputError
from ...layout import part_key
from ...manifest import checksum, consolidate_manifest
from ...results import differing_units
from ...storage import (
    Store,
    join,
    per_object,
    read_parquet_object,
    read_parquet_schema,
    read_parquet_tables,
)
from ...workload import USER_ERRORS, Task, TaskOutput, UnitFailure, Workload
from .inputs import DataInput, FilesInput, GridInput, has_address
from .rows import ONE_TYPE_A_COLUMN, UnitRows
from .usercode import (
    accepts_seed,
    check_code_path,
    check_signature,
    code_hash,
    describe_function,
    load_function,
    unit_seed,
)

__all__ = ["MapJob", "MapWorkload"]


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
        "Input: a table of lists (a single value is held fixed), called with each "
        "combination; or a list of points (tables), called with each. JSON, or a .toml, "
        ".json, .csv or .parquet file.",
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


class MapWorkload(Workload):
    kind = "map"
    settings_class = MapJob
    default_table = "results"
    optional_tables = ("failures",)

    def __init__(self, job: MapJob, job_id: str, fn: Callable | None = None):
        self.job = job
        self.job_id = job_id
        self.fn = fn
        self.input: DataInput | GridInput | FilesInput | None = None
        self.rows: UnitRows | None = None  # the calls' results as rows (of self.input)
        self.n_units = 0
        self.unit_name = "unit"
        self._seeded = False
        self._code_hash: str | None = None
        self._by_name = False

    def __getstate__(self) -> dict:
        # A function named 'module:callable' travels by name and is imported where the
        # task runs: the scheduler, which also unpickles tasks, may not have the module
        # (shipped code reaches the workers only).
        state = dict(self.__dict__)
        if self._by_name:
            state["fn"] = None
        return state

    def _function(self) -> Callable:
        if self.fn is None:
            self.fn = load_function(self.job.function)
        return self.fn

    @classmethod
    def from_settings(cls, settings: MapJob, job_id: str, options=None) -> MapWorkload:
        return cls(settings, job_id)

    def __sizeof__(self) -> int:
        # joblib's Dask backend scatters arguments over 1 kB once instead of per task.
        return object.__sizeof__(self) + (self.input.__sizeof__() if self.input else 0)

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
        from ..regressions.spec import split_list

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
        job["function_source"] = _source_hash(self.fn)
        job["code"] = self._code_hash
        return {**job, **self.input.fingerprint()}

    def prepare_cluster(self, client) -> None:
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
        t0 = time.perf_counter()
        out = TaskOutput(phases={"compute": 0.0, "writing": 0.0})
        kept, retry = self._previous(store, task)
        pieces: dict[int, Any] = dict(kept)
        failed: list[dict] = []
        for unit, args, kwargs in self.input.calls(task.start, task.stop):
            if retry is not None and unit not in retry:
                continue
            if self._seeded:
                kwargs = {**kwargs, "seed": unit_seed(self.job.seed, unit)}
            piece, failure = self._call(unit, args, kwargs)
            if failure is not None:
                failed.append(failure)
            elif piece is not None:
                pieces[unit] = piece
        results = self.rows.assemble(pieces, failed)
        if results is None:  # every unit returned None, or failed: a part of no rows
            results = self.rows.empty()
        failed.sort(key=lambda f: f["unit"])
        out.phases["compute"] = time.perf_counter() - t0
        t_write = time.perf_counter()
        entries = []
        if store is not None:
            entries.append(self._write(store, "results", task, results, out))
        if failed and store is not None:
            entries.append(self._write(store, "failures", task, self.rows.failures(failed), out))
        elif store is not None:
            store.delete_prefix(_part(self.job_id, "failures", task.index))
        out.phases["writing"] = time.perf_counter() - t_write
        out.manifest = pa.table(
            {
                "object": pa.array([e[0] for e in entries], pa.string()),
                "kind": pa.array([e[1] for e in entries], pa.string()),
                "unit_start": pa.array([task.start] * len(entries), pa.int64()),
                "unit_stop": pa.array([task.stop] * len(entries), pa.int64()),
                "size": pa.array([e[2] for e in entries], pa.int64()),
                "checksum": pa.array([e[3] for e in entries], pa.string()),
            }
        )
        out.recorded_failures = [_recorded(f, f["key"]) for f in failed]
        out.busy_seconds = time.perf_counter() - t0
        return out

    def unit_key(self, unit: int) -> str:
        return self.rows.key_label(unit)

    def _call(self, unit: int, args: tuple, kwargs: dict):
        """The unit's rows (key columns first) or its failure record."""
        error: BaseException | None = None
        attempt = 0
        for attempt in range(self.job.retries + 1):  # noqa: B007 - reported below
            try:
                returned = self._function()(*args, **kwargs)
                return self.rows.from_return(unit, returned), None
            except USER_ERRORS as exc:
                error = exc
        return None, self.rows.failure(unit, error, attempt + 1)

    def _write(self, store: Store, table: str, task: Task, data: pa.Table, out: TaskOutput):
        sink = io.BytesIO()
        pq.write_table(data, sink)
        payload = sink.getvalue()
        key = _part(self.job_id, table, task.index)
        out.bytes_written += store.write_bytes(key, payload)
        return key, table, len(payload), checksum(payload)

    def _previous(self, store: Store | None, task: Task):
        """An earlier attempt's rows by unit, and the units it recorded as failed; or
        ({}, None) when there is none (then every unit runs)."""
        if store is None:
            return {}, None
        failures_key = _part(self.job_id, "failures", task.index)
        if not store.exists(failures_key):
            return {}, None
        retry = set(read_parquet_object(store, failures_key).column("unit").to_pylist())
        kept: dict[int, pa.Table] = {}
        results_key = _part(self.job_id, "results", task.index)
        if store.exists(results_key):
            rows = read_parquet_object(store, results_key)
            units = rows.column("unit").to_numpy()
            for unit in sorted(set(units.tolist()) - retry):
                kept[unit] = rows.filter(pa.array(units == unit))
        return kept, retry

    # -- after the run --------------------------------------------------------------------

    def tasks_to_retry(self, store: Store, tasks: list[Task]) -> set[int]:
        present = set(store.list(join(self.job_id, "failures")))
        return {t.index for t in tasks if _part(self.job_id, "failures", t.index) in present}

    #: Units recorded as failed are called again by the next run of the same command.
    reruns_failed_units = True
    #: Retries never change a unit's output: a rerun may ask for more.
    resume_may_change = ("retries",)

    def recorded_failures(self, store: Store, tasks: list[Task]) -> list[UnitFailure]:
        failed = []
        keys = [
            _part(self.job_id, "failures", t) for t in sorted(self.tasks_to_retry(store, tasks))
        ]
        for table in read_parquet_tables(store, keys):
            failed += [_recorded(row, self.unit_key(row["unit"])) for row in table.to_pylist()]
        return failed

    def finalize(self, store: Store, tasks: list[Task]) -> dict:
        check = functools.partial(self._results_combine, store)
        consolidate_manifest(store, self.job_id, tasks, check=check)
        return {"tables": store.describe(join(self.job_id, "results"))}

    def _results_combine(self, store: Store, manifest: pa.Table) -> None:
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
            raise InputError(
                f"{differing_units(schemas, starts, exc)}: {ONE_TYPE_A_COLUMN}"
            ) from None


_part = part_key


def _why_not_importable(spec: str) -> str | None:
    """Worker: why ``spec`` does not import here, or None."""
    try:
        load_function(spec)
    except ConfigError as exc:
        return str(exc)
    return None


def _source_hash(fn: Callable) -> str | None:
    """A hash of what the function's results depend on that the job's settings do not
    say: its source, and the values it captures (closures, a partial's arguments) or
    reads from its module (constants; helper functions' source): a resume with
    ``make(5)`` where ``make(2)`` ran returned the old results."""
    texts = _code_texts(fn)
    return hashlib.sha256("\0".join(texts).encode()).hexdigest()[:16] if texts else None


def _code_texts(fn: Callable, helper: bool = False) -> list[str]:
    if isinstance(fn, functools.partial):
        bound = [*fn.args, *sorted(fn.keywords.items())]
        return [*_code_texts(fn.func, helper), *filter(None, map(_stable_text, bound))]
    try:
        texts = [inspect.getsource(fn)]
    except (OSError, TypeError):
        return []
    code = getattr(fn, "__code__", None)
    if code is None or helper:
        return texts  # a helper's own source: not what it reads in turn
    cells = []
    for cell in fn.__closure__ or ():
        with contextlib.suppress(ValueError):  # an empty cell
            cells.append(cell.cell_contents)
    names = getattr(fn, "__globals__", {})
    for value in [*cells, *(names[n] for n in code.co_names if n in names)]:
        if inspect.isfunction(value):
            texts += _code_texts(value, helper=True)
        elif (text := _stable_text(value)) is not None:
            texts.append(text)
    return texts


def _stable_text(value) -> str | None:
    """A plain value's repr, the same in every process (not a set's: its order is not;
    not an object's default repr: its address is not)."""
    if not isinstance(value, int | float | str | bytes | bool | tuple | list | dict | type(None)):
        return None
    text = repr(value)
    return None if has_address(text) else text


def run_map(
    fn: Callable,
    *,
    data: str | None = None,
    grid: Mapping[str, list] | Sequence[Mapping] | None = None,
    files: str | None = None,
    output: str | None = None,
    name: str | None = None,
    client=None,
    **settings,
):
    """Call ``fn`` per unit of one input, on the embedded cluster (or ``client``'s),
    writing the rows it returns under ``output``; return the run's summary.

    ``grid`` is a mapping of lists (each combination) or a sequence of mappings or a
    pandas DataFrame (each point, in order). ``fn`` may be defined in the calling
    script (it travels by value). ``settings``
    are the map job's (``chunk_by``, ``chunk_rows``, ``columns``, ``seed``,
    ``retries``) and the run's (``workers``, ``overwrite``, ``max_failures``, ...).
    A second call resumes: only units not yet done, or that raised, run. Settings not
    given come from ``PIPELINE_*`` variables, as for ``pipeline run`` (``output``
    from ``PIPELINE_OUTPUT``, else ``results``).
    """
    from ...config import RunOptions, resolve, settings_of
    from ...driver import CONNECTION_SETTINGS, run_workload

    run_keys = {f.name for f in settings_of(RunOptions)}
    map_keys = {f.name for f in settings_of(MapJob)}
    unknown = sorted(set(settings) - run_keys - map_keys)
    if unknown:
        raise ConfigError(f"pipeline.map: unknown setting(s) {', '.join(unknown)}")
    ignored = [k for k in CONNECTION_SETTINGS if settings.get(k) is not None]
    if client is not None and ignored:
        # The run is on client's cluster: they would have been ignored, unsaid.
        given = ", ".join(f"{k}={settings[k]!r}" for k in ignored)
        raise ConfigError(
            f"pipeline.map: {given} set up a cluster, but client= gives the cluster to run "
            "on; leave them out (or the client, to have pipeline.map start or reach one)"
        )
    given = {
        "name": name,
        "function": describe_function(fn),
        "data": data,
        "grid": _grid_value(grid),
        "files": files,
        **{k: v for k, v in settings.items() if k in map_keys},
    }
    job = resolve(MapJob, None, given)
    run_given = {k: v for k, v in settings.items() if k in run_keys}
    options = resolve(RunOptions, None, {"output": output, **run_given})
    workload = MapWorkload(job, name or _default_name(fn), fn=fn)
    return run_workload(workload, options, client=client)


def _default_name(fn: Callable) -> str:
    """The job's folder when no name is given: the function's name, as a folder name
    (a lambda's '<lambda>' would make a folder named with angle brackets)."""
    while isinstance(fn, functools.partial):  # partial(fit, alpha=2): 'fit'
        fn = fn.func
    name = re.sub(r"[^\w.-]", "", getattr(fn, "__name__", "")).lstrip("._")
    return name or "map"


def _grid_value(grid) -> dict | list | None:
    if grid is None:
        return None
    if isinstance(grid, Mapping):
        return dict(grid)
    if hasattr(grid, "to_dict") and hasattr(grid, "columns"):  # a DataFrame of points
        return grid.to_dict("records")
    return [dict(point) if isinstance(point, Mapping) else point for point in grid]


def _recorded(row: dict, key: str) -> UnitFailure:
    """A failures table's row (or the record it is written from) as a UnitFailure."""
    where = f" (at {row['where']})" if row.get("where") else ""
    return UnitFailure(row["unit"], row["error_type"], f"{row['message']}{where}", key)
