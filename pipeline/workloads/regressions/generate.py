"""``pipeline data regressions``: a panel with known coefficients per chunk.

Chunk ``c`` draws everything from ``numpy.random.default_rng([seed, c])``:
``rows`` rows of features ``x1..xK`` ~ N(0, 1), a ``sector`` in A-D, an
intercept ~ N(0, 1), slopes ``beta`` ~ N(0, 1), sector effects (A = 0) ~ N(0, 0.5),
and ``y = intercept + X @ beta + effect[sector] + N(0, sigma)``, plus a binary
``y_bin`` (logistic in the same linear predictor scaled by 1/2) and a count
``y_count`` (Poisson with log-mean 0.2 x that predictor, clipped) for the
discrete models. ``t`` is the row's position in its chunk (an order for HAC).

Rows of a chunk are contiguous, and row groups hold whole chunks (about
65,536 rows each), so a task reads only the row groups of its chunks; files
hold 16 row groups. ``_truth.parquet`` (skipped as data: its name starts with
``_``) holds the true coefficients, named like the formula's terms.
"""

from __future__ import annotations

import io

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ...errors import InputError
from ...storage import Store, join

__all__ = ["SECTORS", "chunk_frame", "regression_formula", "true_coefficients",
           "write_regression_data"]  # fmt: skip

SECTORS = ("A", "B", "C", "D")
ROW_GROUP_ROWS = 65_536
ROW_GROUPS_PER_FILE = 16
SIGMA = 1.0


def regression_formula(features: int) -> str:
    return "y ~ " + " + ".join(f"x{j}" for j in range(1, features + 1)) + " + C(sector)"


def _draw(seed: int, chunk: int, rows: int, features: int):
    rng = np.random.default_rng([seed, chunk])
    intercept = rng.normal()
    beta = rng.normal(size=features)
    effects = np.concatenate([[0.0], rng.normal(scale=0.5, size=len(SECTORS) - 1)])
    X = rng.normal(size=(rows, features))
    sector = rng.integers(0, len(SECTORS), size=rows)
    eta = intercept + X @ beta + effects[sector]
    y = eta + rng.normal(scale=SIGMA, size=rows)
    y_bin = (rng.random(rows) < 1.0 / (1.0 + np.exp(-0.5 * eta))).astype(np.int8)
    y_count = rng.poisson(np.exp(np.clip(0.2 * eta, -5, 5))).astype(np.int32)
    return intercept, beta, effects, X, sector, y, y_bin, y_count


def true_coefficients(seed: int, chunk: int, features: int, rows: int = 1) -> dict[str, float]:
    """The coefficients chunk ``chunk`` was drawn with, by formula term name."""
    intercept, beta, effects, *_ = _draw(seed, chunk, rows, features)
    return _terms(intercept, beta, effects)


def _terms(intercept, beta, effects) -> dict[str, float]:
    out = {"Intercept": float(intercept)}
    out.update({f"x{j + 1}": float(b) for j, b in enumerate(beta)})
    out.update(
        {f"C(sector)[T.{s}]": float(e) for s, e in zip(SECTORS[1:], effects[1:], strict=True)}
    )
    return out


def chunk_frame(seed: int, chunk: int, rows: int, features: int) -> pa.Table:
    return _frame([chunk], [_draw(seed, chunk, rows, features)], rows, features)


def _frame(chunks, draws, rows: int, features: int) -> pa.Table:
    """The rows of ``chunks`` (one draw each) as one table, built column by column."""
    X = np.concatenate([d[3] for d in draws])
    sector = np.concatenate([d[4] for d in draws])
    cols = {
        "chunk": pa.array(np.repeat(np.asarray(chunks, dtype=np.int64), rows)),
        "t": pa.array(np.tile(np.arange(rows, dtype=np.int32), len(chunks))),
        "sector": pa.array(np.asarray(SECTORS, dtype=object)[sector], pa.string()),
    }
    for j in range(features):
        cols[f"x{j + 1}"] = pa.array(X[:, j])
    cols["y"] = pa.array(np.concatenate([d[5] for d in draws]))
    cols["y_bin"] = pa.array(np.concatenate([d[6] for d in draws]))
    cols["y_count"] = pa.array(np.concatenate([d[7] for d in draws]))
    return pa.table(cols)


def dictionary_columns(table: pa.Table) -> list[str]:
    """Columns worth dictionary-encoding: all but the floats. Random doubles never fit a
    dictionary, and the failed attempt (a dictionary page, then plain pages) reads 1.7x
    slower than plain pages."""
    return [f.name for f in table.schema if not pa.types.is_floating(f.type)]


def write_regression_data(
    store: Store, prefix: str = "", *, chunks: int, rows: int, features: int, seed: int = 0
) -> dict:
    """Write the panel under ``prefix``; return facts about it."""
    for name, value in (("chunks", chunks), ("rows", rows), ("features", features)):
        if value < 1:
            raise InputError(f"--{name} must be at least 1, got {value}")
    per_group = max(1, ROW_GROUP_ROWS // rows)
    per_file = per_group * ROW_GROUPS_PER_FILE
    keys = []
    truth: dict[str, list] = {"chunk": []}
    for f, first in enumerate(range(0, chunks, per_file)):
        sink = io.BytesIO()
        writer = None
        for g0 in range(first, min(chunks, first + per_file), per_group):
            ids = range(g0, min(chunks, first + per_file, g0 + per_group))
            draws = [_draw(seed, c, rows, features) for c in ids]  # each chunk drawn once
            table = _frame(ids, draws, rows, features)
            if writer is None:
                writer = pq.ParquetWriter(
                    sink, table.schema, use_dictionary=dictionary_columns(table)
                )
            writer.write_table(table, row_group_size=table.num_rows)
            for c, (intercept, beta, effects, *_) in zip(ids, draws, strict=True):
                truth["chunk"].append(c)
                for term, value in _terms(intercept, beta, effects).items():
                    truth.setdefault(term, []).append(value)
        writer.close()
        key = join(prefix, f"part-{f:05d}.parquet")
        store.write_bytes(key, sink.getbuffer())
        keys.append(key)
    sink = io.BytesIO()
    pq.write_table(pa.table(truth), sink)
    store.write_bytes(join(prefix, "_truth.parquet"), sink.getbuffer())
    return {
        "files": len(keys),
        "rows": chunks * rows,
        "chunks": chunks,
        "formula": regression_formula(features),
        "url": store.describe(prefix),
    }
