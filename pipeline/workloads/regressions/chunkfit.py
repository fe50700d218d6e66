"""One chunk's fit result, however it was fitted: :class:`ChunkFit` (a models-table row
and its coefficients; a chunk that cannot be fitted is one with ``error_type`` and
``error_message`` and no coefficients), the p-values and intervals of a task's linear
fits computed at once (:func:`finish_inference`), and a batched-engine result as a
ChunkFit (:func:`from_batched`)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .design import Prepared

__all__ = ["ChunkFit", "batched_method", "dropped_warning", "finish_inference", "from_batched"]


def batched_method(refined: bool) -> str:
    """The models table's ``method`` of a chunk the batched engine fitted."""
    return "qr+refined" if refined else "qr"


@dataclass
class ChunkFit:
    nobs: int = 0
    nobs_dropped: int = 0
    df_model: float = np.nan
    df_resid: float = np.nan
    rsquared: float = np.nan
    rsquared_adj: float = np.nan
    rsquared_kind: str | None = None
    llf: float = np.nan
    aic: float = np.nan
    bic: float = np.nan
    condition_number: float = np.nan
    converged: bool | None = None
    warnings: str | None = None
    fit_seconds: float = 0.0
    error_type: str | None = None
    error_message: str | None = None
    engine: str | None = None  # "statsmodels" or "batched": what fitted it (None: nothing did)
    method: str | None = None  # how: "qr", "pinv", "newton", ...; "+refined" (see .lsq)
    terms: tuple[str, ...] = ()
    params: np.ndarray | None = None
    bse: np.ndarray | None = None
    statistic: np.ndarray | None = None
    p_value: np.ndarray | None = None
    ci_low: np.ndarray | None = None
    ci_high: np.ndarray | None = None
    # Deferred inference (linear models): p-values and intervals computed per task at once.
    use_t: bool = True
    df_inference: float = np.nan
    resid: np.ndarray | None = field(default=None, repr=False)
    fitted: np.ndarray | None = field(default=None, repr=False)

    @classmethod
    def failed(cls, error_type: str, message: str, **kw) -> ChunkFit:
        return cls(error_type=error_type, error_message=message, **kw)

    @property
    def ok(self) -> bool:
        return self.error_type is None


def dropped_warning(p: Prepared) -> str | None:
    """The models table's note of a chunk's rows dropped for missing values, failed or not."""
    rows = "row" if p.dropped == 1 else "rows"
    return f"dropped {p.dropped} {rows} with missing values" if p.dropped else None


def finish_inference(fits: list[ChunkFit], alpha: float) -> None:
    """p-values and intervals of the linear fits, all at once (what statsmodels'
    ``pvalues`` and ``conf_int`` compute, elementwise, per chunk)."""
    todo = [f for f in fits if f.ok and f.p_value is None]
    if not todo:
        return
    from scipy import stats  # here: a second of imports that the CLI need not pay

    sizes = [len(f.params) for f in todo]
    stat = np.concatenate([f.statistic for f in todo])
    params = np.concatenate([f.params for f in todo])
    bse = np.concatenate([f.bse for f in todo])
    use_t = np.repeat([f.use_t for f in todo], sizes)
    df = np.repeat([f.df_inference for f in todo], sizes)
    with np.errstate(all="ignore"):
        pt = stats.t.sf(np.abs(stat), df) * 2
        pn = stats.norm.sf(np.abs(stat)) * 2
        qt = stats.t.ppf(1 - alpha / 2, df)
        qn = stats.norm.ppf(1 - alpha / 2)
    pval = np.where(use_t, pt, pn)
    q = np.where(use_t, qt, qn)
    low, high = params - q * bse, params + q * bse
    bounds = np.cumsum([0, *sizes])
    for f, a, b in zip(todo, bounds[:-1], bounds[1:], strict=True):
        f.p_value, f.ci_low, f.ci_high = pval[a:b], low[a:b], high[a:b]


def from_batched(r, p: Prepared, seconds: float) -> ChunkFit:
    """A :class:`ChunkFit` from the batched engine's result for one chunk (its intervals
    at the job's level, as the stacked chunks' are: the same bits by either way)."""
    out = ChunkFit(
        nobs=int(r.nobs),
        nobs_dropped=p.dropped,
        df_model=float(r.df_model),
        df_resid=float(r.df_resid),
        rsquared=float(r.rsquared),
        rsquared_adj=float(r.rsquared_adj),
        rsquared_kind="r2",
        llf=float(r.llf),
        aic=float(r.aic),
        bic=float(r.bic),
        condition_number=float(r.condition_number),
        converged=True,
        terms=p.names,
        params=np.asarray(r.params),
        bse=np.asarray(r.bse),
        statistic=np.asarray(r.tvalues),
        fit_seconds=seconds,
        engine="batched",
        method=batched_method(r.refined),
        warnings=dropped_warning(p),
    )
    out.p_value = np.asarray(r.pvalues)
    ci = np.asarray(r.conf_int)
    out.ci_low, out.ci_high = ci[:, 0], ci[:, 1]
    return out
