"""Batched OLS: many small ``sm.OLS(y, X).fit(cov_type=...)`` fits at once with numpy.

Chunks are grouped by shape (n, k) and solved as stacked (batch, n, k) arrays, replicating
statsmodels' algorithm step by step (``pinv_extended``: SVD of X, pinv, ``pinv @ pinv.T``,
sandwich covariances from pinv) with the same LAPACK/BLAS calls, so params, bse and the rest are
equal to statsmodels' to the last bit or two -- also at condition numbers 1e8-1e9, where
statsmodels' own answers move by ~1e-6 under a 1e-12 perturbation (a QR or normal-equations
solve could not match them to 1e-8 there).

Chunks whose statsmodels result is an exception, a warning or rounding noise come back as
:class:`Unsupported` (with a reason) so the caller fits them with statsmodels, which gives its own
answer by construction: NaN/inf in X (statsmodels: MissingDataError) or y (NaN params); n <= k
(inf bse); rank deficiency by statsmodels' rank rule (it warns and fits the minimum-norm solution
with a lower df_model) or cond > ``MAX_CONDITION``; a constant response with an intercept
(r-squared -inf/NaN) or a perfect fit; h_ii ~ 1 under HC2/HC3; ``has_constant`` disagreeing with
statsmodels' constant detection; odd dtypes/shapes; cov types other than
nonrobust and HC0-HC3 (an unknown name raises ValueError).

One documented difference: with a robust covariance and cond(X) above ~3e7 statsmodels' Wald F
is rounding noise (it warns that the constraint covariance is not of full rank, lowers the df, and
f_pvalue depends on attribute access order); the engine then reports ``fvalue = f_pvalue = None``.

An implicit constant (no constant column, but columns spanning one: a dummy per level and no
intercept) is statsmodels' ``k_constant = 1``: a centered r-squared, ``df_model = k - 1``, and a
robust F of NaN, in the same solve as the stack's other chunks (``df_model`` is per chunk).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import numpy as np

__all__ = [
    "BatchedOLSResult",
    "StackFit",
    "Unsupported",
    "fit_ols_batch",
    "fit_ols_stack",
    "COV_TYPES",
]

COV_TYPES = ("nonrobust", "HC0", "HC1", "HC2", "HC3")
# statsmodels OLS covariance types this engine knows but does not implement (they need keywords
# or are rarely used): every chunk is returned as Unsupported so the caller falls back.
_STATSMODELS_ONLY = {
    "fixed scale",
    "fixed_scale",
    "hac",
    "cluster",
    "cluster-crv3",
    "cluster-jk",
    "hac-panel",
    "hac-groupsum",
    "nw-panel",
    "nw-groupsum",
}
MAX_CONDITION = 1e10  # beyond this, agreement with statsmodels to 1e-8 is not guaranteed
MIN_RESID_RATIO = 1e-12  # ssr / y'y below this: residuals are at rounding level (perfect fit)
MAX_LEVERAGE = 1.0 - 1e-6  # HC2/HC3 divide by 1 - h_ii
BATCH_CELLS = 96_000  # chunks per stacked solve ~ this / (n * k): arrays of ~768 kB stay in L2
_EPS = np.finfo(np.float64).eps


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


class Unsupported(Exception):
    """This chunk must be fitted by statsmodels instead; ``reason`` says why."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


def _canonical_cov_type(cov_type: str) -> str | None:
    """The engine's name for cov_type, None if statsmodels-only; ValueError if unknown."""
    if cov_type == "nonrobust":
        return cov_type
    if isinstance(cov_type, str) and cov_type.upper() in COV_TYPES[1:]:
        return cov_type.upper()  # statsmodels accepts "hc1" as well
    if isinstance(cov_type, str) and cov_type.lower() in _STATSMODELS_ONLY:
        return None
    raise ValueError(f"unknown cov_type {cov_type!r}; expected one of {COV_TYPES}")


def _constant_columns(X: np.ndarray) -> np.ndarray:
    """(B, k) mask of columns with max == min, as statsmodels' constant detection."""
    const = X[:, 0, :] == X[:, -1, :]  # cheap prefilter: first row equals last row
    b, j = np.nonzero(const)
    const[b, j] = (X[b, :, j] == X[b, :1, j]).all(axis=1)
    return const


def _check_chunk(X, y) -> tuple[np.ndarray, np.ndarray] | Unsupported:
    if (
        type(X) is np.ndarray
        and type(y) is np.ndarray
        and X.dtype == y.dtype == np.float64
        and X.ndim == 2
        and y.ndim == 1
        and X.shape[0] == y.shape[0]
        and X.shape[1] > 0
    ):
        return X, y  # the common case, quickly
    X, y = np.asarray(X), np.asarray(y)
    for name, a in (("X", X), ("y", y)):
        if a.dtype.kind not in "iuf" or (a.dtype.kind == "f" and a.dtype != np.float64):
            return Unsupported(f"{name} has dtype {a.dtype}; only float64 and integers are batched")
    if X.ndim != 2 or y.ndim != 1 or X.shape[0] != y.shape[0] or X.shape[1] == 0:
        return Unsupported(f"shapes X {X.shape}, y {y.shape}: need X (n, k >= 1) and y (n,)")
    return X.astype(np.float64, copy=False), y.astype(np.float64, copy=False)


def fit_ols_batch(
    Xs: list[np.ndarray],
    ys: list[np.ndarray],
    *,
    cov_type: str = "nonrobust",
    has_constant: bool = True,
    weights: list[np.ndarray] | None = None,
    alpha: float = 0.05,
) -> list[BatchedOLSResult | Unsupported]:
    """Fit each (X_i, y_i) like sm.OLS(y_i, X_i).fit(cov_type=cov_type), or like sm.WLS
    with ``weights`` (one float64 array per chunk); intervals at ``1 - alpha``.

    ``has_constant`` is the caller's claim that every X has an intercept column; a chunk where
    statsmodels' constant detection disagrees comes back Unsupported.  One result per chunk, in
    order; a bad chunk never changes the others' results, nor do its neighbours its bits.
    """
    canonical = _canonical_cov_type(cov_type)
    if len(Xs) != len(ys):
        raise ValueError(f"{len(Xs)} design matrices but {len(ys)} responses")
    if weights is not None and len(weights) != len(Xs):
        raise ValueError(f"{len(Xs)} design matrices but {len(weights)} weight arrays")
    out: list[BatchedOLSResult | Unsupported | None] = [None] * len(Xs)
    if canonical is None:
        return [
            Unsupported(f"cov_type {cov_type!r} is not implemented by the batched engine")
            for _ in Xs
        ]
    groups: dict[tuple[int, int], list[int]] = defaultdict(list)
    checked: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    for i, (X, y) in enumerate(zip(Xs, ys, strict=True)):
        c = _check_chunk(X, y)
        if isinstance(c, Unsupported):
            out[i] = c
        else:
            checked[i] = c
            groups[c[0].shape].append(i)
    for idx in groups.values():
        n, k = checked[idx[0]][0].shape
        size = batch_size(n, k)
        for start in range(0, len(idx), size):
            part = idx[start : start + size]
            # C order whatever the inputs' (np.stack keeps theirs): the results' last
            # bits depend on the layout BLAS and LAPACK are given
            X = np.ascontiguousarray(np.stack([checked[i][0] for i in part]))
            y = np.ascontiguousarray(np.stack([checked[i][1] for i in part]))
            w = None
            if weights is not None:
                w = np.ascontiguousarray(np.stack([weights[i] for i in part]), dtype=np.float64)
            fit = _solve_stack(X, y, canonical, has_constant, alpha, True, w)
            for j, i in enumerate(part):
                out[i] = fit.result(j)
    return out  # type: ignore[return-value]


def batch_size(n: int, k: int) -> int:
    """Chunks of shape (n, k) per stacked solve (see ``BATCH_CELLS``)."""
    return min(1024, max(8, BATCH_CELLS // max(n * k, 1)))


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

    _ROWS = ("params", "bse", "tvalues", "pvalues", "ci_low", "ci_high")
    _SCALARS = ("rsquared", "rsquared_adj", "llf", "aic", "bic", "condition_number",
                "fvalue", "f_pvalue")  # fmt: skip
    _PER_CHUNK = ("ok", "no_f", "df_model")

    @classmethod
    def empty(cls, B: int, n: int, k: int, df_model: float, df_resid: float) -> StackFit:
        rows = {name: np.full((B, k), np.nan) for name in cls._ROWS}
        scalars = {name: np.full(B, np.nan) for name in cls._SCALARS}
        return cls(np.zeros(B, dtype=bool), {}, n, df_resid, **rows, **scalars,
                   no_f=np.zeros(B, dtype=bool), df_model=np.full(B, df_model))  # fmt: skip

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
        )


def fit_ols_stack(
    X: np.ndarray,
    y: np.ndarray,
    *,
    cov_type: str = "nonrobust",
    has_constant: bool = True,
    alpha: float = 0.05,
    with_f: bool = True,
    weights: np.ndarray | None = None,
) -> StackFit:
    """Fit a stack of same-shape chunks, X (B, n, k) and y (B, n) float64 (views are fine:
    each stacked solve of ``batch_size`` chunks works on slices of them), like
    :func:`fit_ols_batch` but with the results as arrays and intervals at ``1 - alpha``
    (and the F test only ``with_f``); with ``weights`` (B, n), like ``sm.WLS``."""
    canonical = _canonical_cov_type(cov_type)
    B, n, k = X.shape
    if canonical is None:
        raise ValueError(f"cov_type {cov_type!r} is not implemented by the batched engine")
    size = batch_size(n, k)
    parts = [
        _solve_stack(
            X[a : a + size],
            y[a : a + size],
            canonical,
            has_constant,
            alpha,
            with_f,
            None if weights is None else weights[a : a + size],
        )
        for a in range(0, B, size)
    ]
    if not parts:
        k_const = 1 if has_constant else 0
        return StackFit.empty(0, n, k, float(k - k_const), float(n - k))
    return StackFit.concat(parts)


def _solve_stack(
    X: np.ndarray,
    y: np.ndarray,
    cov_type: str,
    has_constant: bool,
    alpha: float,
    with_f: bool = True,
    w: np.ndarray | None = None,
) -> StackFit:
    """Fit a (B, n, k) stack: OLS, or WLS with weights ``w`` (B, n) as statsmodels'
    WLS does it (OLS of the whitened sqrt(w) y on sqrt(w) X, with the weighted centered
    total sum of squares and the weights' term in the log-likelihood). Without
    ``has_constant``, a chunk whose X has an implicit constant is fitted as statsmodels
    counts it (k_constant 1)."""
    from scipy import special  # here: 0.3 s of imports that the CLI need not pay

    B, n, k = X.shape
    k_const = 1 if has_constant else 0
    df_resid, df_model = float(n - k), float(k - k_const)
    out = StackFit.empty(B, n, k, df_model, df_resid)
    live = np.ones(B, dtype=bool)  # over the stack; later checks only look at live chunks

    def reject(mask, reason):
        for b in np.flatnonzero(mask & live):
            out.reasons[int(b)] = reason(b) if callable(reason) else reason
        live[mask] = False

    reject(~np.isfinite(X).all(axis=(1, 2)), "non-finite values (NaN/inf) in X")
    reject(~np.isfinite(y).all(axis=1), "non-finite values (NaN/inf) in y")
    if w is not None:
        reject(~(w > 0).all(axis=1) | ~np.isfinite(w).all(axis=1), "weights not positive")
    if n <= k:
        reject(live, f"n = {n} <= k = {k}: no residual degrees of freedom")
    # statsmodels' constant detection (data._handle_constant with hasconst=None)
    const_col = _constant_columns(X)
    if has_constant:
        reject(~const_col.any(axis=1), "has_constant=True but X has no constant column")
    else:
        reject(
            const_col.any(axis=1),
            lambda b: (
                "has_constant=False but column "
                f"{int(np.argmax(const_col[b]))} of X is constant (statsmodels: intercept)"
            ),
        )
    # centered total sum of squares 0 (a constant, or an implicit one found below):
    # statsmodels' r-squared is -inf/NaN
    constant_y = y.max(axis=1) == y.min(axis=1)
    if has_constant:
        reject(constant_y, "constant response y")
    if not live.any():
        return out
    sel = np.flatnonzero(live)  # linear algebra only on clean chunks (NaN breaks the SVD)
    Xs, ys = (X[sel], y[sel]) if len(sel) < B else (X, y)
    if w is not None:  # statsmodels' WLS.whiten; the constant was detected on X itself
        ws = w[sel] if len(sel) < B else w
        sw = np.sqrt(ws)
        Xs, ys = sw[:, :, None] * Xs, ys * sw
    try:
        u, s, vt = np.linalg.svd(Xs, full_matrices=False)
    except np.linalg.LinAlgError:
        if len(sel) == 1:
            out.reasons[int(sel[0])] = "SVD did not converge"
        else:  # isolate the chunk that does not converge
            for b in sel:
                one = _solve_stack(
                    X[b : b + 1], y[b : b + 1], cov_type, has_constant, alpha, with_f,
                    None if w is None else w[b : b + 1],
                )  # fmt: skip
                out.put(b, one, 0)
                out.reasons.update({int(b): r for r in one.reasons.values()})
        return out

    def reject_sel(mask_sel, reason):
        full = np.zeros(B, dtype=bool)
        full[sel] = mask_sel
        reject(full, (lambda b: reason(np.searchsorted(sel, b))) if callable(reason) else reason)

    # statsmodels: rank = matrix_rank(diag(s)), i.e. tolerance max(s) * k * eps
    rank = (s > s.max(axis=1, keepdims=True) * k * _EPS).sum(axis=1)
    reject_sel(rank < k, lambda j: f"rank-deficient design (rank {rank[j]} < k = {k})")
    eig = s**2  # results.condition_number = sqrt(max/min eigenvalue of X'X)
    with np.errstate(divide="ignore", invalid="ignore"):
        cond = np.where(eig[:, -1] > 0, np.sqrt(eig[:, 0] / eig[:, -1]), np.inf)
    reject_sel(
        cond > MAX_CONDITION,
        lambda j: f"ill-conditioned design (condition number {cond[j]:.3g} > {MAX_CONDITION:g})",
    )
    if not has_constant and live.any():
        # implicit constant: rank([1, X]) == rank(X), both with tolerance max(s) * max(n, k) * eps
        aug = np.concatenate([np.ones((len(sel), n, 1)), X[sel]], axis=2)
        s_aug = np.linalg.svd(aug, compute_uv=False)
        r_aug = (s_aug > s_aug.max(axis=1, keepdims=True) * max(n, k + 1) * _EPS).sum(axis=1)
        r_orig = (s > s.max(axis=1, keepdims=True) * max(n, k) * _EPS).sum(axis=1)
        implicit = r_aug == r_orig  # statsmodels' k_constant 1, const_idx None
        reject_sel(implicit & constant_y[sel], "constant response y")
    else:
        implicit = np.zeros(len(sel), dtype=bool)
    kc = np.where(implicit, 1, k_const)  # per chunk of sel
    if not live.any():
        return out

    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        # pinv_extended: cutoff 1e-15 * max(s); normalized_cov_params = pinv @ pinv.T
        s_inv = np.where(s > 1e-15 * s.max(axis=1, keepdims=True), 1.0 / s, 0.0)
        # (same products and BLAS calls as statsmodels, so bitwise-equal pinv and params)
        u *= s_inv[:, None, :]
        pinv = np.matmul(vt.transpose(0, 2, 1), u.transpose(0, 2, 1))
        params = np.matmul(pinv, ys[:, :, None])[:, :, 0]
        resid = ys - np.matmul(Xs, params[:, :, None])[:, :, 0]
        ssr = np.einsum("bi,bi->b", resid, resid)
        uncentered_tss = np.einsum("bi,bi->b", ys, ys)
        if has_constant or implicit.any():
            if w is None:
                yc = ys - ys.mean(axis=1, keepdims=True)
                centered_tss = np.einsum("bi,bi->b", yc, yc)
            else:  # RegressionResults.centered_tss with weights (np.average, then the sum)
                y0 = y[sel] if len(sel) < B else y
                mean = np.multiply(y0, ws).sum(axis=1) / ws.sum(axis=1)
                centered_tss = np.sum(ws * (y0 - mean[:, None]) ** 2, axis=1)
            tss = np.where(kc == 1, centered_tss, uncentered_tss)
        else:
            tss = uncentered_tss
        reject_sel(
            ~(ssr > MIN_RESID_RATIO * uncentered_tss),
            "perfect fit: residuals are at rounding level",
        )

        if cov_type == "nonrobust":  # only the F-test would need the off-diagonal elements
            cov = np.einsum("bij,bij->bi", pinv, pinv) * (ssr / df_resid)[:, None]
        else:  # RegressionResults.cov_HCx: pinv @ diag(het) @ pinv.T
            if cov_type == "HC0":
                het = resid**2
            elif cov_type == "HC1":
                het = n / df_resid * resid**2
            else:
                ncov = np.matmul(pinv, pinv.transpose(0, 2, 1))
                h = np.einsum("bij,bik,bkj->bi", Xs, Xs, ncov)  # leverages, as statsmodels
                reject_sel(
                    ~(h.max(axis=1) <= MAX_LEVERAGE),
                    "an observation has leverage h_ii ~ 1 (HC2/HC3 divide by 1 - h_ii)",
                )
                het = resid**2 / (1 - h) if cov_type == "HC2" else (resid / (1 - h)) ** 2
            cov = np.matmul(pinv, het[:, :, None] * pinv.transpose(0, 2, 1))
        bse = np.sqrt(cov if cov.ndim == 2 else np.diagonal(cov, axis1=1, axis2=2))
        reject_sel(
            ~(bse > 0).all(axis=1) | ~np.isfinite(bse).all(axis=1),
            "non-finite or zero standard errors",
        )
        tvalues = params / bse
        # statsmodels' use_t: True for nonrobust, else False. scipy.special's functions are
        # what stats.t/stats.norm call (same values) without their per-call overhead.
        if cov_type == "nonrobust":
            pvalues = special.stdtr(df_resid, -np.abs(tvalues)) * 2
            q = special.stdtrit(df_resid, 1 - alpha / 2)
        else:
            pvalues = special.ndtr(-np.abs(tvalues)) * 2
            q = special.ndtri(1 - alpha / 2)

        rsquared = 1 - ssr / tss
        rsquared_adj = 1 - (n - kc) / df_resid * (1 - rsquared)
        ssr_llf = np.sum(resid**2, axis=1)  # OLS.loglike recomputes it this way
        if w is None:
            llf = -n / 2.0 * np.log(2 * np.pi) - n / 2.0 * np.log(ssr_llf / n) - n / 2.0
        else:  # WLS.loglike
            nobs2 = n / 2.0
            llf = -np.log(ssr_llf) * nobs2
            llf -= (1 + np.log(np.pi / nobs2)) * nobs2
            llf += 0.5 * np.sum(np.log(ws), axis=1)
        dfm = (k - kc).astype(float)
        aic = -2 * llf + 2 * (dfm + kc)
        bic = -2 * llf + np.log(n) * (dfm + kc)
        alive = live[sel]
        if with_f:
            const_idx = np.argmax(const_col[sel], axis=1) if has_constant else None
            fvalue, f_pvalue, no_f = _fvalue(
                cov_type, params, cov, ssr, tss, dfm, df_resid, const_idx, alive, implicit
            )
        else:  # not asked for: the tables have no F test (and the robust one costs an SVD)
            fvalue = f_pvalue = np.full(len(sel), np.nan)
            no_f = np.ones(len(sel), dtype=bool)
        ci_low, ci_high = params - q * bse, params + q * bse

    done = sel[alive]
    computed = dict(params=params, bse=bse, tvalues=tvalues, pvalues=pvalues, ci_low=ci_low,
                    ci_high=ci_high, rsquared=rsquared, rsquared_adj=rsquared_adj, llf=llf,
                    aic=aic, bic=bic, condition_number=cond,
                    fvalue=fvalue, f_pvalue=f_pvalue, no_f=no_f, df_model=dfm)  # fmt: skip
    for name, values in computed.items():
        getattr(out, name)[done] = values[alive]
    out.ok[done] = True
    return out


def _fvalue(cov_type, params, cov, ssr, tss, df_model, df_resid, const_idx, alive, implicit):
    """statsmodels' fvalue and f_pvalue, and a mask of chunks where they are left undefined
    (robust F whose constraint covariance statsmodels finds rank-deficient: see the module doc).
    ``df_model`` per chunk; ``implicit``: chunks with an implicit constant, whose robust F
    statsmodels gives as NaN (its #2444)."""
    nan, none = np.full(len(ssr), np.nan), np.zeros(len(ssr), dtype=bool)
    if not df_model.any():  # intercept-only model: statsmodels gives NaN for both
        return nan, nan, none
    if cov_type == "nonrobust":
        fvalue = ((tss - ssr) / df_model) / (ssr / df_resid)
        return fvalue, _f_sf(fvalue, df_model, df_resid), none
    # Wald test that all non-constant coefficients are zero, with the robust covariance:
    # F = b_R' pinv(V_RR) b_R / J, J = rank(V_RR), F(J, df_resid) p-value.
    k = params.shape[1]
    if const_idx is None:
        rows = np.broadcast_to(np.arange(k), params.shape)
    else:
        rows = np.arange(k - 1) + (np.arange(k - 1) >= const_idx[:, None])  # skip const_idx
    b_r = np.take_along_axis(params, rows, axis=1)
    v_rr = np.take_along_axis(
        np.take_along_axis(cov, rows[:, :, None], axis=1), rows[:, None, :], axis=2
    )
    J = rows.shape[1]
    fvalue = nan.copy()
    live = alive & np.isfinite(v_rr).all(axis=(1, 2))  # rejected chunks may hold inf/NaN
    v_rr, b_r = v_rr[live], b_r[live]
    undefined = none.copy()
    # np.linalg.matrix_rank and np.linalg.pinv (rcond 1e-15) from one SVD
    u, s, vt = np.linalg.svd(v_rr, full_matrices=False)
    undefined[live] = (s > s.max(axis=1, keepdims=True) * J * _EPS).sum(axis=1) < J
    s_inv = np.where(s > 1e-15 * s.max(axis=1, keepdims=True), 1.0 / s, 0.0)
    inv = np.matmul(vt.transpose(0, 2, 1), s_inv[:, :, None] * u.transpose(0, 2, 1))
    # same operation order as statsmodels' wald_test: (b' pinv(V)) b / J
    quad = np.matmul(np.matmul(b_r[:, None, :], inv), b_r[:, :, None])
    fvalue[live] = quad[:, 0, 0] / J
    undefined &= ~implicit
    fvalue[undefined | implicit] = np.nan
    return fvalue, _f_sf(fvalue, J, df_resid), undefined


def _f_sf(x: np.ndarray, dfn, dfd) -> np.ndarray:
    """``scipy.stats.f.sf(x, dfn, dfd)``, bit for bit (it is ``special.fdtrc`` inside,
    and 1 below the support), without importing scipy.stats: a second of a worker's
    start that a job fitted by this engine alone need not pay."""
    from scipy import special

    return special.fdtrc(dfn, dfd, np.where(x < 0, 0.0, x))
