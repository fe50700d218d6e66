"""The per-chunk regression workload: one model fit per chunk of a parquet dataset.

Task ``i`` returns its parts of the tables ``coefficients`` (one row per chunk and
term), ``models`` (one row per chunk, failed ones included) and ``timings`` (each
chunk's ``fit_seconds``), and with ``plots`` a ``<job>/plots/<chunk>.pdf`` per chunk:
the runner writes them (``<job>/<table>/part-NNNNNN.parquet``) and lists them in
the task's manifest entry with the xxh3_64 of their bytes. A chunk whose fit fails
is a row of the models table (``error_type``, ``error_message``): its task still
completes, so a resumed run does not refit it; :meth:`RegressionResults.finalize` reports those
failures (``recorded_failures``) for ``--max-failures``.

Coefficients and models are deterministic: same job, same bytes, whatever the task
sizes or retries. Timings, which cannot be, are a table of their own, which
``pipeline results --table models`` joins back in as the ``fit_seconds`` column.
"""

from __future__ import annotations

import dataclasses
import time

import numpy as np
import pyarrow as pa

from ...config import split_list
from ...errors import ConfigError, InputError
from ...inputs.chunks import ChunkIndex, plan_chunks
from ...inputs.dataset import Dataset, check_columns, discover
from ...inputs.task_rows import read_task_rows
from ...layout import part_key
from ...manifest import listed_parts
from ...storage import Store, join, read_parquet_tables
from ...workload import OutputFile, Task, TaskOutput, UnitFailure, Workload
from .checks import check_chunk_sizes, check_chunking, check_formula, check_numeric, needed_columns
from .chunkfit import ChunkFit
from .design import ChunkError, TaskDesign, design_slices
from .engine import batched_covers, fit_task
from .options import check_fit_options, check_trial_fit
from .results import RegressionResults
from .spec import FormulaInfo, ModelSpec, RegressionJob
from .taskfits import COEF_COLUMNS, TaskFits, models_schema
from .taskio import decimals_as_floats, plot_name, text_columns

__all__ = ["COEF_COLUMNS", "PART_TABLES", "RegressionWorkload", "models_schema", "part_key"]

#: The tables each task writes, one part per task.
PART_TABLES = ("coefficients", "models", "timings")


class RegressionWorkload(Workload):
    kind = "regressions"
    unit_name = "chunk"
    settings_class = RegressionJob
    results = RegressionResults
    #: How chunks are fitted, not what a fit means: the engines agree within 1e-8
    #: relative, and the models table's engine column says which fitted each chunk.
    #: A resume with another engine may keep the chunks done (``keep_done``); the
    #: model, formula, covariance, options, chunking and data may not
    #: (docs/regressions.md).
    code_settings = ("engine",)

    @property
    def worker_modules(self) -> tuple[str, ...]:
        """What the workers import while the driver checks the inputs: statsmodels
        (with scipy.stats, 1.4 s of a core per worker) only when the batched engine
        does not fit the job's chunks (an odd chunk imports it when it comes)."""
        modules = ("pipeline.workloads.regressions.engine", "scipy.special", "patsy")
        try:
            batched = batched_covers(ModelSpec.from_job(self.job))
        except ConfigError:  # for preflight to report
            batched = False
        return modules if batched else (*modules, "scipy.stats", "statsmodels.api")

    def __init__(self, job: RegressionJob, job_id: str):
        self.job = job
        self.job_id = job_id
        self.n_units = 0
        self.spec: ModelSpec | None = None
        self.info: FormulaInfo | None = None
        self.dataset: Dataset | None = None
        self.index: ChunkIndex | None = None
        self.columns: tuple[str, ...] = ()

    @classmethod
    def from_settings(cls, settings: RegressionJob, job_id: str, options=None):
        return cls(settings, job_id)

    def __getstate__(self) -> dict:
        # The planner's byte counter stays on the driver: tasks never weigh ranges.
        return {k: v for k, v in self.__dict__.items() if k != "_read_bytes"}

    # -- driver ---------------------------------------------------------------------------

    def input_urls(self) -> tuple[str, ...]:
        return (self.job.data,) if self.job.data else ()

    def preflight(self) -> None:
        if self.index is not None:
            return
        job = self.job
        spec = ModelSpec.from_job(job)
        check_fit_options(spec)
        by = split_list(job.chunk_by)
        check_chunking(job, by)
        ds = discover(job.data, tuple(by))
        needed, info = needed_columns(spec, by)
        check_columns(ds, needed)
        check_numeric(ds, spec)
        index = plan_chunks(ds, by, job.chunk_rows)
        if index.n_chunks == 0:
            raise InputError(f"dataset {ds.describe()} has no rows")
        self.spec, self.info, self.dataset, self.index = spec, info, ds, index
        self.columns = tuple(c for c in needed if c not in by or needed[c] != "chunk_by")
        self.n_units = index.n_chunks
        self._check_design()

    def _check_design(self) -> None:
        """Evaluate the formula on the first chunk: a bad formula fails the job here."""
        rows = self._read_rows(0, 1)
        try:
            design = TaskDesign(self.spec, rows.table, rows.offsets, self.info)
        except Exception:
            if self.spec.formula is not None:
                check_formula(self.spec, rows)  # says what is wrong with the formula, if it is
            raise
        if self.spec.formula is not None and design.exact:
            # Not built whole (patsy failed there, or the formula needs chunks alone):
            # patsy's own evaluation says what is wrong, if anything. (Built whole, the
            # formula evaluated, to one response column: that check would cost 10 ms.)
            check_formula(self.spec, rows)
        try:
            first = design.prepare(0)
        except ChunkError:
            first = None  # a bad first chunk is that chunk's failure, recorded when it runs
        check_chunk_sizes(
            self.dataset,
            self.index,
            first if not design.exact and not design.factor_codes else None,
        )
        if first is not None:
            check_trial_fit(self.spec, first)

    def fingerprint(self) -> dict:
        settings = dataclasses.asdict(self.job)
        settings.pop("name")
        return {
            "data": self.dataset.url,
            "files": list(self.dataset.keys),
            "versions": list(self.dataset.versions),
            **settings,
        }

    def describe(self) -> str:
        by = ",".join(self.index.by) if self.index and self.index.by else None
        how = f"by {by}" if by else f"of {self.job.chunk_rows} rows"
        return f"regressions job {self.job_id!r}: {self.job.model} on {self.n_units} chunks {how}"

    # -- for the planner ------------------------------------------------------------------

    def natural_boundaries(self) -> np.ndarray:
        """Chunks starting a row group (or file): tasks cut there read disjoint data."""
        from ...inputs.chunks import chunk_boundaries

        return chunk_boundaries(self.dataset, self.index)

    def unit_weights(self) -> np.ndarray | None:
        """Rows per chunk, when chunks differ in size: a fit's cost grows with them."""
        return self.index.rows

    def read_bytes(self, start: int, stop: int) -> int:
        if getattr(self, "_read_bytes", None) is None:
            rg_bytes = self.dataset.rg_bytes([*self.columns, *self.index.by])
            self._read_bytes = self.index.bytes_reader(self.dataset, rg_bytes)
        return self._read_bytes(start, stop)

    # -- worker ---------------------------------------------------------------------------

    def fit_range(self, start: int, stop: int, *, keep_resid: bool = False) -> TaskFits:
        """Fit chunks ``start..stop-1``: their rows read once, designed and fitted a slice
        at a time (:func:`.design.design_slices`); their results by local position."""
        spec = self.spec
        text = text_columns(spec, self.dataset, self.columns)
        rows = self._read_rows(start, stop, dictionary=text)
        has_constant = self.info.has_intercept if self.info is not None else spec.add_constant
        table, offsets = rows.table, rows.offsets
        fits = TaskFits(stop - start)
        for a, b in design_slices(offsets, table.num_columns):
            lo, hi = int(offsets[a]), int(offsets[b])
            design = TaskDesign(spec, table.slice(lo, hi - lo), offsets[a : b + 1] - lo, self.info)
            fits.add(fit_task(spec, design, has_constant, keep_resid=keep_resid), a)
        return fits

    def _read_rows(self, start: int, stop: int, dictionary: tuple[str, ...] = ()):
        """Chunks ``start..stop-1``'s rows of the model's columns, decimals as floats."""
        rows = read_task_rows(self.dataset, self.index, start, stop, list(self.columns),
                              dictionary=dictionary)  # fmt: skip
        return decimals_as_floats(rows)

    def run_task(self, task: Task, store: Store | None) -> TaskOutput:
        from ...inputs.task_rows import READS

        t0 = time.perf_counter()
        reads = dataclasses.replace(READS)
        tables, files, recorded = self._task_objects(task)
        out = TaskOutput(tables=tables, files=files, recorded_failures=recorded)
        out.bytes_read, out.bytes_needed, out.read_seconds = READS.since(reads)
        out.busy_seconds = time.perf_counter() - t0
        out.phases = {"inputs": out.read_seconds, "compute": out.busy_seconds - out.read_seconds}
        return out

    def _task_objects(self, task: Task) -> tuple[dict, list[OutputFile], list[UnitFailure]]:
        """The task's tables (by kind), its plots, and its chunks whose fit failed."""
        plots = self.job.plots
        fits = self.fit_range(task.start, task.stop, keep_resid=plots)
        recorded = [  # (the batched engine's blocks are fits that succeeded)
            UnitFailure(self.chunk_label(task.start + i), fit.error_type, fit.error_message)
            for i, fit in sorted(fits.single.items())
            if fit.error_type is not None
        ]
        tables = dict(zip(PART_TABLES, self.tables(task.start, fits), strict=True))
        files = []
        if plots:
            from .plots import chunk_figure

            for i, fit in enumerate(fits):
                if fit.ok and fit.resid is not None:
                    label = self.chunk_label(task.start + i)
                    key = join(self.job_id, "plots", f"{plot_name(task.start + i, label)}.pdf")
                    files.append(OutputFile(key, "plot", chunk_figure(fit, label)))
        return tables, files, recorded

    # -- tables ---------------------------------------------------------------------------

    def unit_key(self, unit: int) -> str:
        return self.chunk_label(unit)

    def chunk_label(self, chunk: int) -> str:
        if self.index.by:
            values = self.index.key_values(chunk, chunk + 1)
            return ",".join(f"{b}={values[b][0]}" for b in self.index.by)
        first = chunk * self.index.chunk_rows
        return f"rows {first}-{min(first + self.index.chunk_rows, self.index.total_rows) - 1}"

    def _key_columns(self, start: int, positions: np.ndarray) -> dict[str, pa.Array]:
        cols = {"chunk_id": pa.array(start + positions, pa.int64())}
        if self.index.by:
            keys = self.index.keys.take(pa.array(start + positions))
            for b in self.index.by:
                cols[b] = keys.column(b).combine_chunks()
        else:
            first = (start + positions) * self.index.chunk_rows
            cols["row_start"] = pa.array(first, pa.int64())
            cols["row_stop"] = pa.array(
                np.minimum(first + self.index.chunk_rows, self.index.total_rows), pa.int64()
            )
        return cols

    def tables(
        self, start: int, fits: TaskFits | list[ChunkFit]
    ) -> tuple[pa.Table, pa.Table, pa.Table]:
        """The coefficients, models and timings tables of chunks ``start..``."""
        if not isinstance(fits, TaskFits):
            fits = TaskFits.of(fits)
        n = len(fits)
        timings = {
            "chunk_id": pa.array(start + np.arange(n), pa.int64()),
            "fit_seconds": pa.array(fits.fit_seconds(), pa.float64()),
        }
        models = self._key_columns(start, np.arange(n))
        models.update(fits.models_columns())
        positions, values = fits.coefficient_columns()
        coefs = self._key_columns(start, positions)
        coefs.update(values)
        return pa.table(coefs), pa.table(models), pa.table(timings)

    # -- after the run --------------------------------------------------------------------

    def recorded_failures(self, store: Store, tasks: list[Task]) -> list[UnitFailure]:
        failed = []
        parts = listed_parts(store, self.job_id, "models", {t.index for t in tasks})
        keys = [parts[t.index] for t in tasks if t.index in parts]
        for models in read_parquet_tables(store, keys, ["chunk_id", "error_type", "error_message"]):
            errors = models.column("error_type").to_pylist()
            for cid, et, msg in zip(
                models.column("chunk_id").to_pylist(),
                errors,
                models.column("error_message").to_pylist(),
                strict=True,
            ):
                if et is not None:
                    failed.append(UnitFailure(self.chunk_label(cid), et, msg))
        return failed
