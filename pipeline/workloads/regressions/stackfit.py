"""The batched engine's results: one chunk's statistics as statsmodels names them
(:class:`BatchedOLSResult`), a stack's as arrays (:class:`StackFit`), and the chunks
handed back to statsmodels (:class:`Unsupported`)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["BatchedOLSResult", "StackFit", "Unsupported"]


@dataclass(slots=True)
class BatchedOLSResult:
    """The statistics of one chunk, as the same-named attributes of statsmodels' OLS results."""

    params: np.ndarray
    bse: np.ndarray
    tvalues: np.ndarray
    pvalues: np.ndarray
    conf_int: np.ndarray  # (k, 2), alpha=0.05
    nobs: int
    df_model: float
    df_resid: float
    rsquared: float
    rsquared_adj: float
    llf: float
    aic: float
    bic: float
    condition_number: float
    fvalue: float | None  # NaN where statsmodels gives NaN (e.g. intercept-only model)
    f_pvalue: float | None
    refined: bool = False  # the estimates took a refinement step (see .lsq)


class Unsupported(Exception):
    """This chunk must be fitted by statsmodels instead; ``reason`` says why."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


@dataclass
class StackFit:
    """The results of a (B, n, k) stack as arrays over the stack (a chunk's row holds NaN
    where ``ok`` is False; ``reasons`` says why for those)."""

    ok: np.ndarray  # (B,) bool
    reasons: dict[int, str]
    nobs: int
    df_resid: float
    params: np.ndarray  # (B, k), and bse, tvalues, pvalues, ci_low, ci_high
    bse: np.ndarray
    tvalues: np.ndarray
    pvalues: np.ndarray
    ci_low: np.ndarray
    ci_high: np.ndarray
    rsquared: np.ndarray  # (B,), and the other scalars
    rsquared_adj: np.ndarray
    llf: np.ndarray
    aic: np.ndarray
    bic: np.ndarray
    condition_number: np.ndarray
    fvalue: np.ndarray
    f_pvalue: np.ndarray
    no_f: np.ndarray  # (B,) bool: fvalue/f_pvalue undefined (None)
    df_model: np.ndarray  # (B,): k - 1 with a constant, explicit or implicit, else k
    refined: np.ndarray  # (B,) bool: the estimates took a refinement step (see .lsq)

    _ROWS = ("params", "bse", "tvalues", "pvalues", "ci_low", "ci_high")
    _SCALARS = ("rsquared", "rsquared_adj", "llf", "aic", "bic", "condition_number",
                "fvalue", "f_pvalue")  # fmt: skip
    _PER_CHUNK = ("ok", "no_f", "df_model", "refined")

    @classmethod
    def empty(cls, B: int, n: int, k: int, df_model: float, df_resid: float) -> StackFit:
        rows = {name: np.full((B, k), np.nan) for name in cls._ROWS}
        scalars = {name: np.full(B, np.nan) for name in cls._SCALARS}
        return cls(np.zeros(B, dtype=bool), {}, n, df_resid, **rows, **scalars,
                   no_f=np.zeros(B, dtype=bool), df_model=np.full(B, df_model),
                   refined=np.zeros(B, dtype=bool))  # fmt: skip

    def put(self, where, other: StackFit, other_where=slice(None)) -> None:
        """Copy ``other``'s chunks ``other_where`` into this stack's chunks ``where``."""
        for name in (*self._ROWS, *self._SCALARS, *self._PER_CHUNK):
            getattr(self, name)[where] = getattr(other, name)[other_where]

    @staticmethod
    def concat(parts: list[StackFit]) -> StackFit:
        if len(parts) == 1:
            return parts[0]
        first, offset, reasons = parts[0], 0, {}
        for p in parts:
            reasons.update({offset + b: r for b, r in p.reasons.items()})
            offset += len(p.ok)
        arrays = {
            name: np.concatenate([getattr(p, name) for p in parts])
            for name in (*StackFit._ROWS, *StackFit._SCALARS, *StackFit._PER_CHUNK)
        }
        return StackFit(reasons=reasons, nobs=first.nobs, df_resid=first.df_resid, **arrays)

    def take(self, mask: np.ndarray) -> StackFit:
        """The chunks where ``mask`` is True, as a stack of their own."""
        where = np.flatnonzero(mask)
        arrays = {
            name: getattr(self, name)[where]
            for name in (*self._ROWS, *self._SCALARS, *self._PER_CHUNK)
        }
        reasons = {j: self.reasons[int(b)] for j, b in enumerate(where) if int(b) in self.reasons}
        return StackFit(reasons=reasons, nobs=self.nobs, df_resid=self.df_resid, **arrays)

    def result(self, b: int) -> BatchedOLSResult | Unsupported:
        if not self.ok[b]:
            return Unsupported(self.reasons[b])
        no_f = bool(self.no_f[b])
        return BatchedOLSResult(
            params=self.params[b],
            bse=self.bse[b],
            tvalues=self.tvalues[b],
            pvalues=self.pvalues[b],
            conf_int=np.stack([self.ci_low[b], self.ci_high[b]], axis=1),
            nobs=self.nobs,
            df_model=float(self.df_model[b]),
            df_resid=self.df_resid,
            rsquared=float(self.rsquared[b]),
            rsquared_adj=float(self.rsquared_adj[b]),
            llf=float(self.llf[b]),
            aic=float(self.aic[b]),
            bic=float(self.bic[b]),
            condition_number=float(self.condition_number[b]),
            fvalue=None if no_f else float(self.fvalue[b]),
            f_pvalue=None if no_f else float(self.f_pvalue[b]),
            refined=bool(self.refined[b]),
        )
