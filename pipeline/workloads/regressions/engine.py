"""Which engine fits which chunk of a task, and the batched fast path.

``engine = "auto"`` (the default) and ``"batched"`` fit every chunk the batched engine
covers (OLS and WLS with a nonrobust or HC0-HC3 covariance, and no ``fit_options``:
``engine = "batched"`` refuses them before any task runs) with it, and the rest with
statsmodels; ``"statsmodels"`` fits every chunk with statsmodels. The batched engine
hands back the chunks it does not fit (see :mod:`.batched`), and those are fitted by
statsmodels. Both solve OLS and WLS on the column-scaled design (see :mod:`.lsq`), so
they agree with each other, and with statsmodels' own fit wherever that is accurate
(within 1e-8 relative). The models table's ``engine`` and ``method`` columns say which
engine and method fitted each chunk.

The fast path: a chunk whose rows the task's design holds as they are (every
categorical level present, so the chunk-alone design has the same columns) is fitted
straight from the task's design matrix, as a (chunks, rows, columns) view of it when
its neighbours have as many rows (no copy), else gathered once per row count.
"""

from __future__ import annotations

import time

import numpy as np

from .batched import COV_TYPES, fit_ols_batch, fit_ols_stack
from .chunkchecks import check_chunk
from .chunkfit import ChunkFit, dropped_warning, finish_inference, from_batched
from .design import ChunkError, TaskDesign
from .fit import fit_chunk
from .spec import ENGINES, ModelSpec
from .taskfits import FitBlock, TaskFits

__all__ = ["ENGINES", "batched_covers", "fit_task"]


def batched_covers(spec: ModelSpec) -> bool:
    """Whether the batched engine fits this job's chunks (unless a chunk is odd): not
    with ``fit_options``, which it cannot apply (statsmodels does)."""
    return (
        spec.engine != "statsmodels"
        and spec.model in ("ols", "wls")
        and spec.cov_type in COV_TYPES
        and not spec.fit_options
    )


def fit_task(
    spec: ModelSpec, design: TaskDesign, has_constant: bool, *, keep_resid: bool = False
) -> TaskFits:
    """Fit the task's chunks, each with the engine the settings choose for it."""
    out = TaskFits(design.n)
    rest = list(range(design.n))
    if batched_covers(spec):
        rest = _fit_stacks(spec, design, has_constant, out, keep_resid)
        if rest:
            rest = _fit_batched_list(spec, design, has_constant, rest, out, keep_resid)
    if rest:
        # Imported before any chunk's clock starts: the first chunk fitted by
        # statsmodels had its import (1.5-3 s) in its fit_seconds.
        import statsmodels.api  # noqa: F401
    for i in rest:
        t0 = time.perf_counter()
        try:
            p = design.prepare(i)
        except ChunkError as exc:
            out.single[i] = ChunkFit.failed(
                exc.error_type, exc.message, fit_seconds=time.perf_counter() - t0
            )
            continue
        fit = fit_chunk(spec, p, keep_resid=keep_resid)
        fit.fit_seconds = time.perf_counter() - t0
        out.single[i] = fit
    finish_inference(list(out.single.values()), spec.alpha)
    return out


def _fit_stacks(spec, design: TaskDesign, has_constant, out: TaskFits, keep_resid) -> list[int]:
    """Fit the chunks the task's design holds as they are; return the others."""
    ok = design.plain_chunks()
    if not ok.any():
        return list(range(design.n))
    rows = np.diff(design.offsets)
    rest = set(np.flatnonzero(~ok).tolist())
    for n in np.unique(rows[ok]):
        chunks = np.flatnonzero(ok & (rows == n))
        t0 = time.perf_counter()
        X, y, w = design.stack(chunks, int(n))
        fit = fit_ols_stack(X, y, cov_type=spec.cov_type, has_constant=has_constant,
                            alpha=spec.alpha, with_f=False, weights=w)  # fmt: skip
        good = fit.ok
        each = (time.perf_counter() - t0) / len(chunks)
        rest.update(chunks[~good].tolist())  # statsmodels decides (after dropping NaN rows)
        if good.all():
            block = FitBlock(chunks, design.names, fit, each)
        else:
            block = FitBlock(chunks[good], design.names, fit.take(good), each)
        if keep_resid:
            block.X, block.y = X[good], y[good]
        out.blocks.append(block)
    return sorted(rest)


def _fit_batched_list(
    spec, design: TaskDesign, has_constant, todo: list[int], out: TaskFits, keep_resid: bool
) -> list[int]:
    """Chunks built one by one (dropped rows, missing levels, per-chunk formulas): the
    batched engine on their arrays (row-major, as the stacked chunks': a chunk gets the
    same bits whichever way its neighbours send it); return those it hands back."""
    idx, Xs, ys, preps, rest = [], [], [], {}, []
    t0 = time.perf_counter()
    for i in todo:
        try:
            p = design.prepare(i)
        except ChunkError as exc:
            out.single[i] = ChunkFit.failed(exc.error_type, exc.message)
            continue
        try:
            check_chunk(p, spec, svd=False)  # the engine flags rank deficiency itself
        except ChunkError as exc:  # the same row statsmodels' path gives
            out.single[i] = ChunkFit.failed(
                exc.error_type,
                exc.message,
                nobs=len(p.y),
                nobs_dropped=p.dropped,
                warnings=dropped_warning(p),
            )
            continue
        preps[i] = p
        idx.append(i)
        Xs.append(p.X)
        ys.append(p.y)
    if not idx:
        return rest
    weights = [preps[i].weights for i in idx] if spec.model == "wls" else None
    results = fit_ols_batch(Xs, ys, cov_type=spec.cov_type, has_constant=has_constant,
                            weights=weights, alpha=spec.alpha)  # fmt: skip
    each = (time.perf_counter() - t0) / len(idx)
    for i, r in zip(idx, results, strict=True):
        if isinstance(r, Exception):
            rest.append(i)
        else:
            fit = out.single[i] = from_batched(r, preps[i], each)
            if keep_resid:
                fit.fitted = preps[i].X @ fit.params
                fit.resid = preps[i].y - fit.fitted
    return rest
