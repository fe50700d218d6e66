"""Solving a stack of same-shape chunks, X (B, n, k) and y (B, n), as statsmodels' OLS and
WLS would (see :mod:`.batched` for what is batched and what is handed back): the checks
that send a chunk back to statsmodels, the estimates and covariances
(:mod:`.estimates`), and the statistics."""

from __future__ import annotations

import numpy as np

from .estimates import ratio, solve
from .stackfit import StackFit

__all__ = ["solve_stack"]

MIN_RESID_RATIO = 1e-12  # ssr / y'y below this: residuals are at rounding level (perfect fit)
MAX_LEVERAGE = 1.0 - 1e-6  # HC2/HC3 divide by 1 - h_ii
_EPS = np.finfo(np.float64).eps


def _constant_columns(X: np.ndarray) -> np.ndarray:
    """(B, k) mask of columns with max == min, as statsmodels' constant detection, for
    chunks of any number of rows n >= 1 (a column of one row is constant)."""
    n = X.shape[1]
    const = X[:, 0, :] == X[:, -1, :]  # cheap prefilter: a few rows equal the first
    for i in (1, n // 2, n - 2):
        if 0 < i < n - 1:  # rows of their own (none past the first two of 2 rows)
            const &= X[:, i, :] == X[:, 0, :]
    b, j = np.nonzero(const)
    const[b, j] = (X[b, :, j] == X[b, :1, j]).all(axis=1)
    return const


def solve_stack(
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
    reasons: dict[int, str] = {}
    live = np.ones(B, dtype=bool)  # over the stack; later checks only look at live chunks

    def reject(mask, reason):
        for b in np.flatnonzero(mask & live):
            reasons[int(b)] = reason(b) if callable(reason) else reason
        live[mask] = False

    def none_fitted():
        out = StackFit.empty(B, n, k, df_model, df_resid)
        out.reasons = reasons
        return out

    reject(~np.isfinite(X).all(axis=(1, 2)), "non-finite values (NaN/inf) in X")
    reject(~np.isfinite(y).all(axis=1), "non-finite values (NaN/inf) in y")
    if w is not None:
        reject(~(w > 0).all(axis=1) | ~np.isfinite(w).all(axis=1), "weights not positive")
    if n <= k:
        # Every chunk of the stack has too few rows; the checks below index rows (a
        # stack of one-row or empty chunks has no second or last row to compare).
        reject(live, f"n = {n} <= k = {k}: no residual degrees of freedom")
        return none_fitted()
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
    constant_y = y[:, 0] == y[:, -1]  # prefilter, then max == min
    constant_y[constant_y] = (y[constant_y] == y[constant_y, :1]).all(axis=1)
    if has_constant:
        reject(constant_y, "constant response y")
    if not live.any():
        return none_fitted()
    sel = np.flatnonzero(live)  # linear algebra only on clean chunks (NaN breaks the SVD)
    Xs, ys = (X[sel], y[sel]) if len(sel) < B else (X, y)
    if w is not None:  # statsmodels' WLS.whiten; the constant was detected on X itself
        ws = w[sel] if len(sel) < B else w
        sw = np.sqrt(ws)
        Xs, ys = sw[:, :, None] * Xs, ys * sw
    try:
        e = solve(Xs, ys, cov_type, df_resid)
        # statsmodels' condition number (and its singular values, for the implicit
        # constant's rank rule: of the whitened design, as statsmodels finds them)
        s = None if has_constant else e.singular_values()
        cond = e.condition_numbers() if s is None else ratio(s)
    except np.linalg.LinAlgError:
        out = none_fitted()
        if len(sel) == 1:
            out.reasons[int(sel[0])] = "SVD did not converge"
        else:  # isolate the chunk that does not converge
            for b in sel:
                one = solve_stack(
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

    reject_sel(e.rank < k, lambda j: f"rank-deficient design (rank {e.rank[j]} < k = {k})")
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
        return none_fitted()

    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        params, ssr = e.params, e.ssr
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

        if cov_type in ("HC2", "HC3"):
            reject_sel(
                ~(e.leverage <= MAX_LEVERAGE),
                "an observation has leverage h_ii ~ 1 (HC2/HC3 divide by 1 - h_ii)",
            )
        cov = e.cov
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
        ssr_llf = ssr
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
            fvalue, f_pvalue = np.full(len(sel), np.nan), np.full(len(sel), np.nan)
            no_f = np.ones(len(sel), dtype=bool)
        ci_low, ci_high = params - q * bse, params + q * bse

    done = sel[alive]
    computed = dict(params=params, bse=bse, tvalues=tvalues, pvalues=pvalues, ci_low=ci_low,
                    ci_high=ci_high, rsquared=rsquared, rsquared_adj=rsquared_adj, llf=llf,
                    aic=aic, bic=bic, condition_number=cond,
                    fvalue=fvalue, f_pvalue=f_pvalue, no_f=no_f, df_model=dfm,
                    refined=e.refined)  # fmt: skip
    if len(done) == B:  # the common case: the arrays as they are
        return StackFit(ok=np.ones(B, dtype=bool), reasons=reasons, nobs=n, df_resid=df_resid,
                        **computed)  # fmt: skip
    out = none_fitted()
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
