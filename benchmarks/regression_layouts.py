"""Data layouts for the planner's benchmark (benchmarks/bench_regressions.py --layouts).

The same panel (``pipeline.workloads.regressions.generate.chunk_frame``: chunk ``c`` is the same
rows in every layout) written four ways:

  (i)   few files, row groups of hundreds of chunks (``pipeline data regressions``);
  (ii)  thousands of small files of 1 to 3 chunks, one row group each;
  (iii) row groups and files whose sizes are no multiple of a chunk's rows, so
        chunks span two row groups or two files;
  (iv)  layout (i) on S3 (SeaweedFS in a process of its own; the figures in
        docs/benchmarks.md were measured on moto's server).
"""

from __future__ import annotations

import io
import os

import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.storage import Store
from pipeline.workloads.regressions.generate import (
    chunk_frame,
    dictionary_columns,
    write_regression_data,
)

LAYOUTS = {
    "i": "few files, row groups of 262 chunks",
    "ii": "thousands of small files of 1-3 chunks",
    "iii": "chunks spanning row groups and files",
    "iv": "layout (i) on S3 (SeaweedFS)",
}
#: Layout (iii): rows per row group and per file, no multiple of the chunks' rows.
SPAN_GROUP_ROWS = 9_999
SPAN_FILE_ROWS = 7 * SPAN_GROUP_ROWS + 4_321


def write_layout(layout: str, store: Store, *, chunks: int, rows: int, features: int) -> int:
    """Write ``chunks`` chunks in ``layout``; return the number of files."""
    if layout in ("i", "iv"):
        return write_regression_data(store, chunks=chunks, rows=rows, features=features)["files"]
    if layout == "ii":
        return _small_files(store, chunks, rows, features)
    if layout == "iii":
        return _spanning(store, chunks, rows, features)
    raise ValueError(f"unknown layout {layout!r}; known: {', '.join(LAYOUTS)}")


def _put(store: Store, key: str, tables: list[pa.Table], group_rows: int) -> None:
    sink = io.BytesIO()
    table = pa.concat_tables(tables)
    pq.write_table(table, sink, row_group_size=group_rows, use_dictionary=dictionary_columns(table))
    store.write_bytes(key, sink.getbuffer())


def _small_files(store: Store, chunks: int, rows: int, features: int) -> int:
    c, f = 0, 0
    while c < chunks:
        n = min(chunks - c, 1 + f % 3)
        frames = [chunk_frame(1, k, rows, features) for k in range(c, c + n)]
        _put(store, f"part-{f:06d}.parquet", frames, n * rows)
        c, f = c + n, f + 1
    return f


def _spanning(store: Store, chunks: int, rows: int, features: int) -> int:
    pending: list[pa.Table] = []
    held, f = 0, 0
    for c in range(chunks):
        pending.append(chunk_frame(1, c, rows, features))
        held += rows
        while held >= SPAN_FILE_ROWS or (c == chunks - 1 and held):
            table = pa.concat_tables(pending)
            take = min(SPAN_FILE_ROWS, table.num_rows)
            _put(store, f"part-{f:05d}.parquet", [table.slice(0, take)], SPAN_GROUP_ROWS)
            rest = table.slice(take)
            pending, held, f = ([rest] if rest.num_rows else []), rest.num_rows, f + 1
    return f


class S3Process:
    """SeaweedFS (:class:`harness.seaweedfs.SeaweedS3`) in a process of its own on
    loopback (not in the driver, whose one core is the scheduler's), with its keys in
    this process's environment so the embedded cluster's workers inherit them."""

    def __init__(self) -> None:
        from harness.seaweedfs import ADMIN, SeaweedS3

        self.server = SeaweedS3().start()
        self.endpoint = self.server.endpoint
        self.env = {
            "PIPELINE_S3_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": ADMIN.key_id,
            "AWS_SECRET_ACCESS_KEY": ADMIN.secret,
            "AWS_DEFAULT_REGION": "us-east-1",
        }
        os.environ.update(self.env)

    def make_bucket(self, name: str) -> str:
        self.server.client().create_bucket(Bucket=name)
        return f"s3://{name}"

    def stop(self) -> None:
        self.server.stop()
