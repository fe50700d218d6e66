"""``pipeline results OUTPUT --table coefficients|models [--out FILE.parquet] [--job ID]``.

Concatenates a regression job's per-task tables (those listed in its manifest
entries, so a partial run's completed tasks) into one table sorted by chunk,
or summarizes them.
"""

from __future__ import annotations

import io
import json

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ..errors import InputError
from ..storage import join, open_store

__all__ = ["TABLES", "find_job", "results_table", "summarize", "write_results"]

TABLES = ("coefficients", "models")


def find_job(output: str, job: str | None = None) -> str:
    """The regression job under ``output``: ``job`` or the only one there is."""
    store = open_store(output)
    records = [k for k in store.list() if k.endswith("/job.json") and k.count("/") == 1]
    jobs = {}
    for key in records:
        record = json.loads(store.read_bytes(key))
        if record.get("workload") == "regressions":
            jobs[key.split("/", 1)[0]] = record
    if job is not None:
        if job not in jobs:
            raise InputError(
                f"{store.url}: no regressions job {job!r} "
                f"(found: {', '.join(sorted(jobs)) or 'none'})"
            )
        return job
    if len(jobs) != 1:
        found = ", ".join(sorted(jobs)) or "none"
        raise InputError(
            f"{store.url}: {'several' if jobs else 'no'} regressions jobs ({found}); "
            + ("name one with --job" if jobs else "run one first")
        )
    return next(iter(jobs))


def results_table(output: str, table: str, job: str | None = None) -> pa.Table:
    """One table of every completed task's rows, sorted by chunk (and term order).

    ``models`` comes with each chunk's ``fit_seconds``, from the timings table that
    is kept apart so that the models parts are the same bytes run after run."""
    if table not in TABLES:
        raise InputError(f"--table {table!r}: expected one of {', '.join(TABLES)}")
    store = open_store(output)
    job_id = find_job(output, job)
    parts = _part_keys(store, job_id)
    result = _concat(store, parts.get(table, []))
    if table == "models":
        timings = _concat(store, parts.get("timings", []))
        at = result.column_names.index("warnings") + 1
        seconds = timings.column("fit_seconds")
        if timings.column("chunk_id").equals(result.column("chunk_id")):
            result = result.add_column(at, "fit_seconds", seconds)
        else:
            raise InputError(f"{store.describe(job_id)}: timings do not match the models table")
    return result


def _part_keys(store, job_id: str) -> dict[str, list[str]]:
    """The parts the manifest entries list, by table: only completed tasks' parts."""
    by_kind: dict[str, list[str]] = {}
    for entry in store.list(join(job_id, "manifest")):
        if not entry.endswith(".parquet"):
            continue
        manifest = pq.read_table(io.BytesIO(store.read_bytes(entry)), columns=["object", "kind"])
        for key, kind in zip(
            manifest.column("object").to_pylist(), manifest.column("kind").to_pylist(), strict=True
        ):
            by_kind.setdefault(kind, []).append(key)
    if not by_kind:
        raise InputError(f"{store.describe(job_id)}: no completed tasks yet")
    return by_kind


def _concat(store, keys: list[str]) -> pa.Table:
    result = pa.concat_tables([pq.read_table(store.open_input(k)) for k in sorted(keys)])
    # Parts are per task, tasks cover increasing chunk ranges: sorting by chunk_id
    # (stable) keeps each chunk's terms in model order.
    order = pc.sort_indices(result, sort_keys=[("chunk_id", "ascending")])
    return result.take(order)


def write_results(output: str, table: str, out: str, job: str | None = None) -> int:
    """Write the concatenated table to ``out`` (a local path or s3:// URL); return rows."""
    result = results_table(output, table, job)
    parent, _, name = out.rstrip("/").rpartition("/")
    store = open_store(parent or ".")
    sink = io.BytesIO()
    pq.write_table(result, sink)
    store.write_bytes(name, sink.getbuffer())
    return result.num_rows


def summarize(output: str, table: str, job: str | None = None) -> str:
    """A few lines about the table, for the terminal."""
    result = results_table(output, table, job).to_pandas()
    lines = []
    if table == "models":
        failed = result["error_type"].notna()
        lines.append(
            f"{len(result)} chunks: {int((~failed).sum())} fitted, {int(failed.sum())} failed"
        )
        for error, n in result.loc[failed, "error_type"].value_counts().items():
            example = result.loc[result["error_type"] == error, "error_message"].iloc[0]
            lines.append(f"  {n} {error}: e.g. {example}")
        ok = result.loc[~failed]
        if len(ok):
            lines.append(
                f"  nobs median {ok['nobs'].median():.0f}; rsquared median "
                f"{ok['rsquared'].median():.4g}; fit seconds total {ok['fit_seconds'].sum():.3g}"
            )
    else:
        stats = result.groupby("term", sort=False).agg(
            chunks=("estimate", "size"),
            mean=("estimate", "mean"),
            median=("estimate", "median"),
            std=("estimate", "std"),
            significant=("p_value", lambda p: float((p < 0.05).mean())),
        )
        lines.append(f"{len(result)} coefficients over {result['chunk_id'].nunique()} chunks")
        lines.append(stats.to_string(float_format=lambda v: f"{v:.4g}"))
    return "\n".join(lines)
