"""The regressions' tables as ``pipeline results`` shows them: rows sorted by chunk
(each chunk's terms in model order), the models table with each chunk's
``fit_seconds`` joined back from the timings table (kept apart so that the models
parts are the same bytes run after run), and a summary for the terminal."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from ...errors import InputError
from ...storage import read_parquet_tables

__all__ = ["TABLES", "assemble", "summary_text"]

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
