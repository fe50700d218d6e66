"""A task's fit results, and the coefficients, models and timings tables built from them.

Chunks fitted as a stack by the batched engine stay arrays (:class:`FitBlock`: one row
per chunk); the others are one :class:`~.chunkfit.ChunkFit` each. The tables are assembled
column by column from both, with no Python object per batched chunk: at ~70 µs per
batched fit, a few µs of per-chunk bookkeeping would be a visible share of a task.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from .batched import StackFit
from .chunkfit import ChunkFit, batched_method

__all__ = ["COEF_COLUMNS", "FitBlock", "TaskFits", "models_schema"]

COEF_COLUMNS = ("estimate", "std_error", "statistic", "p_value", "ci_low", "ci_high")
_COEF_FIELDS = ("params", "bse", "statistic", "p_value", "ci_low", "ci_high")
_BLOCK_FIELDS = ("params", "bse", "tvalues", "pvalues", "ci_low", "ci_high")
_FLOATS = ("df_model", "df_resid", "rsquared", "rsquared_adj", "llf", "aic", "bic",
           "condition_number")  # fmt: skip
_BLOCK_SCALARS = ("df_model", "rsquared", "rsquared_adj", "llf", "aic", "bic",
                  "condition_number")  # fmt: skip


def models_schema() -> list[tuple[str, pa.DataType]]:
    return [
        ("nobs", pa.int64()), ("nobs_dropped", pa.int64()),
        *[(n, pa.float64()) for n in _FLOATS[:4]], ("rsquared_kind", pa.string()),
        *[(n, pa.float64()) for n in _FLOATS[4:]],
        ("converged", pa.bool_()), ("warnings", pa.string()),
        ("error_type", pa.string()), ("error_message", pa.string()), ("engine", pa.string()),
        ("method", pa.string()),
    ]  # fmt: skip


@dataclass
class FitBlock:
    """Chunks (local positions ``chunks``) fitted together by the batched engine, all with
    the same rows count, terms and no dropped rows; ``fit`` rows are theirs, in order."""

    chunks: np.ndarray
    names: tuple[str, ...]
    fit: StackFit
    seconds_each: float
    X: np.ndarray | None = None  # (B, n, k) and (B, n): kept for residual plots
    y: np.ndarray | None = None

    def chunk_fit(self, j: int) -> ChunkFit:
        """Row ``j`` as a ChunkFit (for plots; the tables do not need it)."""
        f = self.fit
        out = ChunkFit(
            nobs=f.nobs, df_resid=f.df_resid, rsquared_kind="r2",
            converged=True, terms=self.names, fit_seconds=self.seconds_each, engine="batched",
            method=batched_method(bool(f.refined[j])),
            **{a: float(getattr(f, a)[j]) for a in _BLOCK_SCALARS},
        )  # fmt: skip
        out.params, out.bse, out.statistic = f.params[j], f.bse[j], f.tvalues[j]
        out.p_value, out.ci_low, out.ci_high = f.pvalues[j], f.ci_low[j], f.ci_high[j]
        if self.X is not None:
            out.fitted = self.X[j] @ out.params
            out.resid = self.y[j] - out.fitted
        return out


class TaskFits:
    """The results of a task's ``n`` chunks, by local position: blocks and single fits."""

    def __init__(self, n: int):
        self.n = n
        self.blocks: list[FitBlock] = []
        self.single: dict[int, ChunkFit] = {}

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> ChunkFit:
        if i in self.single:
            return self.single[i]
        for block in self.blocks:
            j = np.searchsorted(block.chunks, i)
            if j < len(block.chunks) and block.chunks[j] == i:
                return block.chunk_fit(int(j))
        raise IndexError(i)

    def __iter__(self) -> Iterator[ChunkFit]:
        return (self[i] for i in range(self.n))

    def add(self, part: TaskFits, at: int) -> None:
        """Take ``part``'s results as those of chunks ``at..at + len(part) - 1``."""
        for b in part.blocks:
            b.chunks = b.chunks + at
            self.blocks.append(b)
        self.single.update({i + at: f for i, f in part.single.items()})

    @classmethod
    def of(cls, fits: list[ChunkFit]) -> TaskFits:
        out = cls(len(fits))
        out.single = dict(enumerate(fits))
        return out

    # -- tables -------------------------------------------------------------------------

    def fit_seconds(self) -> np.ndarray:
        seconds = np.zeros(self.n)
        for b in self.blocks:
            seconds[b.chunks] = b.seconds_each
        for i, f in self.single.items():
            seconds[i] = f.fit_seconds
        return seconds

    def models_columns(self) -> dict[str, pa.Array]:
        """The models table's columns after the chunk keys."""
        n, cols = self.n, {}
        single = sorted(self.single)
        fits = [self.single[i] for i in single]
        for name, typ in models_schema():
            if typ == pa.string() or typ == pa.bool_():
                values = np.full(n, None, dtype=object)
            else:
                values = np.full(n, 0 if typ == pa.int64() else np.nan)
            for b in self.blocks:
                values[b.chunks] = _block_value(b, name)
            if single:
                values[single] = [getattr(f, name) for f in fits]
            cols[name] = pa.array(values, typ)
        return cols

    def coefficient_columns(self) -> tuple[np.ndarray, dict[str, pa.Array]]:
        """Each coefficient row's local chunk position, and the term and value columns."""
        sizes = np.zeros(self.n, dtype=np.int64)
        for b in self.blocks:
            sizes[b.chunks] = len(b.names)
        ok = {i: f for i, f in self.single.items() if f.ok and len(f.terms)}
        for i, f in ok.items():
            sizes[i] = len(f.terms)
        starts = np.concatenate([[0], np.cumsum(sizes)])
        total = int(starts[-1])
        terms = np.empty(total, dtype=object)
        values = {c: np.empty(total) for c in COEF_COLUMNS}
        for b in self.blocks:
            where = (starts[b.chunks][:, None] + np.arange(len(b.names))).ravel()
            terms[where] = np.tile(np.asarray(b.names, dtype=object), len(b.chunks))
            for col, attr in zip(COEF_COLUMNS, _BLOCK_FIELDS, strict=True):
                values[col][where] = getattr(b.fit, attr).ravel()
        for i, f in ok.items():
            a, e = starts[i], starts[i + 1]
            terms[a:e] = f.terms
            for col, attr in zip(COEF_COLUMNS, _COEF_FIELDS, strict=True):
                values[col][a:e] = getattr(f, attr)
        cols = {"term": pa.array(terms, pa.string())}
        cols.update({c: pa.array(v, pa.float64()) for c, v in values.items()})
        return np.repeat(np.arange(self.n), sizes), cols


def _block_value(b: FitBlock, name: str):
    f = b.fit
    if name in _BLOCK_SCALARS:
        return getattr(f, name)
    if name == "method":
        return np.where(f.refined, batched_method(True), batched_method(False)).astype(object)
    return {
        "nobs": f.nobs,
        "nobs_dropped": 0,
        "df_resid": f.df_resid,
        "rsquared_kind": "r2",
        "converged": True,
        "engine": "batched",
    }.get(name)
