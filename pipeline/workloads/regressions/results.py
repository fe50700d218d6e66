"""The regressions' output (:class:`RegressionResults`): its tables as ``pipeline
results`` shows them, rows sorted by chunk (each chunk's terms in model order), the
models table with each chunk's ``fit_seconds`` joined back from the timings table
(kept apart so that the models parts are the same bytes run after run), and a
summary for the terminal; parts written with only their text columns
dictionary-encoded, a manifest by chunk range, and the failed fits counted."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from ...errors import InputError
from ...manifest import consolidate_manifest
from ...storage import Store, join, per_object, read_parquet_object, read_parquet_tables
from ...workload import TableResults, Task, Workload
from .taskio import parquet_bytes
from .verify import CHUNK_RANGE, check_regressions

__all__ = ["TABLES", "RegressionResults", "assemble", "summary_text"]

TABLES = ("coefficients", "models")


def _by_chunk(result: pa.Table) -> pa.Table:
    # Stable: each chunk's terms stay in model order.
    return result.take(pc.sort_indices(result, sort_keys=[("chunk_id", "ascending")]))


def assemble(store, job_id: str, table: str, result: pa.Table, tables: dict) -> pa.Table:
    result = _by_chunk(result)
    if table != "models":
        return result
    timings = _by_chunk(
        pa.concat_tables(read_parquet_tables(store, [k for _, k in tables["timings"]]))
    )
    if not timings.column("chunk_id").equals(result.column("chunk_id")):
        raise InputError(f"{store.describe(job_id)}: timings do not match the models table")
    at = result.column_names.index("warnings") + 1
    return result.add_column(at, "fit_seconds", timings.column("fit_seconds"))


def summary_text(table: str, result: pa.Table) -> str | None:
    if table not in TABLES:
        return None
    frame = result.to_pandas(use_threads=False)
    lines = []
    if table == "models":
        failed = frame["error_type"].notna()
        lines.append(
            f"{len(frame)} chunks: {int((~failed).sum())} fitted, {int(failed.sum())} failed"
        )
        for error, n in frame.loc[failed, "error_type"].value_counts().items():
            example = frame.loc[frame["error_type"] == error, "error_message"].iloc[0]
            lines.append(f"  {n} {error}: e.g. {example}")
        ok = frame.loc[~failed]
        if len(ok):
            lines.append(
                f"  nobs median {ok['nobs'].median():.0f}; rsquared median "
                f"{ok['rsquared'].median():.4g}; fit seconds total "
                f"{frame['fit_seconds'].sum():.3g} ({ok['fit_seconds'].sum():.3g} of the fitted)"
            )
    else:
        stats = frame.groupby("term", sort=False).agg(
            chunks=("estimate", "size"),
            mean=("estimate", "mean"),
            median=("estimate", "median"),
            std=("estimate", "std"),
            significant=("p_value", lambda p: float((p < 0.05).mean())),
        )
        lines.append(f"{len(frame)} coefficients over {frame['chunk_id'].nunique()} chunks")
        if len(frame):  # (no chunk fitted: pandas' "Empty DataFrame" says nothing more)
            lines.append(stats.to_string(float_format=lambda v: f"{v:.4g}"))
        else:
            lines.append("no chunk was fitted: the models table says why (--table models)")
    return "\n".join(lines)


class RegressionResults(TableResults):
    """The regressions' output hooks (:class:`pipeline.TableResults`)."""

    manifest_columns = CHUNK_RANGE
    final_objects = ("coefficients-summary.pdf",)
    default_table = "models"
    #: A chunk whose fit failed is a row of the models table with its error_type.
    failures_table = "models"

    @classmethod
    def table_bytes(cls, kind: str, table: pa.Table) -> bytes:
        return parquet_bytes(table)  # its text columns alone dictionary-encoded

    @classmethod
    def finalize(cls, workload: Workload, store: Store, tasks: list[Task]) -> dict:
        job_id = workload.job_id
        consolidate_manifest(store, job_id, tasks, order=cls.manifest_columns[1])
        details = {
            "coefficients": store.describe(join(job_id, "coefficients")),
            "models": store.describe(join(job_id, "models")),
        }
        if workload.job.plots:
            from .plots import write_summary_figure

            details["summary_figure"] = write_summary_figure(store, job_id)
        return details

    @classmethod
    def count_failures(cls, store: Store, job_id: str, parts: list[str]) -> int:
        def failed(key: str) -> int:
            try:
                errors = read_parquet_object(store, key, ["error_type"]).column(0)
            except OSError:  # missing, or damaged (UnreadableObject): verify says so
                return 0
            return len(errors) - errors.null_count

        return sum(per_object(store, failed, parts))

    @classmethod
    def assemble_table(cls, store: Store, job_id: str, table: str, result, tables: dict):
        return assemble(store, job_id, table, result, tables)

    @classmethod
    def summarize_table(cls, table: str, result) -> str | None:
        return summary_text(table, result)

    @classmethod
    def verify_job(cls, store: Store, job_id: str, record: dict, manifest, check) -> set[str]:
        return check_regressions(store, manifest, check)
