"""The estimates, covariances and condition numbers of a stack of clean chunks, each by
the cheapest exact path: Cholesky QR where the column-scaled design is well-conditioned
(:mod:`.gram`), Householder QR elsewhere (:mod:`.lsq`), merged chunk by chunk.

The covariances: nonrobust ``s**2 D R^-1 R^-T D``; the sandwich ``D R^-1 Q' diag(het)
Q R^-T D`` with Householder's Q, and on the Cholesky path with ``Q = Xs R^-1``
(orthonormal to ``eps * kappa**2``; HC0/HC1 there as ``D (R'R)^-1 Xs' diag(het) Xs
(R'R)^-1 D``, the same without forming Q). An HC2/HC3 leverage ``h_ii`` from the
Cholesky path is off by about ``eps * kappa**2 * h_ii``, which HC2/HC3 divide by
``1 - h_ii``: a chunk where that may exceed ``LEVERAGE_TOL`` relative takes the
Householder path instead.

statsmodels' condition number, ``sqrt`` of the largest over the smallest eigenvalue of
``X'X`` of the design as given, comes from the eigenvalues of the Gram matrix where
their error bound, ``(n + k) * eps * trace(X'X)`` (the Gram matrix's rounding and the
eigensolver's), is within ``COND_TOL`` of the smallest; elsewhere from the singular
values of the unscaled triangular factor (statsmodels' own singular values err by
``eps`` times the largest as well).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import gram, lsq

__all__ = ["Estimates", "ratio", "solve"]

#: An HC2/HC3 weight 1 / (1 - h_ii) from the Cholesky path may err by at most this.
LEVERAGE_TOL = 1e-10
#: The condition number from the Gram matrix's eigenvalues may err by at most this.
COND_TOL = 1e-10


@dataclass
class Estimates:
    """Per chunk of a stack (meaningless where ``rank < k``)."""

    params: np.ndarray  # (B, k) of the design as given
    ssr: np.ndarray  # (B,)
    cov: np.ndarray  # (B, k) variances (nonrobust) or (B, k, k) covariances (HC)
    rank: np.ndarray  # (B,) of the scaled design
    refined: np.ndarray  # (B,) took a refinement step
    leverage: np.ndarray | None  # (B,) the largest h_ii (HC2/HC3)
    # for the condition numbers:
    on_gram: np.ndarray  # (B,) solved by Cholesky QR
    gram: np.ndarray  # (B, k, k) X'X of the design as given (where on_gram)
    R: np.ndarray  # (B, k, k) triangular factor of the scaled design
    d: np.ndarray  # (B, k) column scales
    n: int  # rows of each design

    def singular_values(self) -> np.ndarray:
        """(B, k) singular values of each design as given, largest first (those of
        ``R / d``, its own triangular factor)."""
        return np.linalg.svd(self.R / self.d[:, None, :], compute_uv=False)

    def condition_numbers(self) -> np.ndarray:
        """(B,) statsmodels' condition numbers: from the eigenvalues of the Gram matrix
        where their error bound allows, else from the singular values."""
        cond = np.empty(len(self.d))
        n_k = self.n + self.d.shape[1]
        eig = np.flatnonzero(self.on_gram)
        other = np.flatnonzero(~self.on_gram)
        if len(eig):
            G = self.gram if len(eig) == len(self.d) else self.gram[eig]
            lam = np.linalg.eigvalsh(G)  # ascending
            trace = np.trace(G, axis1=1, axis2=2)
            sure = n_k * lsq.EPS * trace <= COND_TOL * lam[:, 0]
            cond[eig[sure]] = np.sqrt(lam[sure, -1] / lam[sure, 0])
            other = np.sort(np.concatenate([other, eig[~sure]]))
        if len(other):
            s = np.linalg.svd(self.R[other] / self.d[other][:, None, :], compute_uv=False)
            cond[other] = ratio(s)
        return cond


def solve(X: np.ndarray, y: np.ndarray, cov_type: str, df_resid: float) -> Estimates:
    """Fit each chunk of X (B, n, k), n > k, y (B, n), all finite."""
    B, n, k = X.shape
    g = gram.gram_fit(X, y)
    ok, d, R, Rinv, b, resid, ssr = g.ok, g.d, g.R, g.Rinv, g.b, g.resid, g.ssr
    refined, rank = g.refined, np.full(B, k)
    robust = cov_type != "nonrobust"
    leveraged = cov_type in ("HC2", "HC3")
    Q = h = None
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        if leveraged:
            Q = np.matmul(X, d[:, :, None] * Rinv)  # Xs R^-1
            h = _row_squares(Q)
            slack = (h / (1 - h)).max(axis=1)
            ok &= lsq.EPS * g.kappa**2 * slack <= LEVERAGE_TOL
        # HC0/HC1 on the Cholesky path: Xs' diag(het) Xs, without Q (one product less)
        cov = _covariance(cov_type, Rinv, d, ssr, resid, Q, h, n, df_resid, X)
        rest = np.flatnonzero(~ok)
        if len(rest):
            f = lsq.factor(X[rest], y[rest], with_q=robust)
            b[rest], ssr[rest], refined[rest] = lsq.solve(f, y[rest])
            d[rest], R[rest], Rinv[rest], rank[rest] = f.d, f.R, f.Rinv, f.rank
            r = y[rest] - np.matmul(f.Xs, b[rest][:, :, None])[:, :, 0] if robust else None
            hr = _row_squares(f.Q) if leveraged else None
            cov[rest] = _covariance(cov_type, f.Rinv, f.d, ssr[rest], r, f.Q, hr, n, df_resid)
            if leveraged:
                h[rest] = hr
    leverage = None if h is None else h.max(axis=1)
    return Estimates(b * d, ssr, cov, rank, refined, leverage, ok, g.gram, R, d, n)


def _row_squares(Q: np.ndarray) -> np.ndarray:
    """(B, n) squared norms of the rows of Q (B, n, k): the leverages (as a product with
    ones, BLAS's: a third faster than einsum's row sums)."""
    return np.matmul(Q * Q, np.ones(Q.shape[2]))


def _covariance(cov_type, Rinv, d, ssr, resid, Q, h, n, df_resid, X=None) -> np.ndarray:
    """(X'X)^-1 = D R^-1 R^-T D (its diagonal: only the robust F test needs the rest);
    the sandwich D R^-1 Q' diag(het) Q R^-T D, or without Q (HC0/HC1, ``X`` given)
    D (R'R)^-1 Xs' diag(het) Xs (R'R)^-1 D."""
    if cov_type == "nonrobust":
        return np.einsum("bij,bij->bi", Rinv, Rinv) * d**2 * (ssr / df_resid)[:, None]
    if cov_type == "HC0":
        het = resid**2
    elif cov_type == "HC1":
        het = n / df_resid * resid**2
    else:
        het = resid**2 / (1 - h) if cov_type == "HC2" else (resid / (1 - h)) ** 2
    dd = d[:, :, None] * d[:, None, :]
    if Q is None:
        ginv = np.matmul(Rinv, Rinv.transpose(0, 2, 1))
        meat = np.matmul(X.transpose(0, 2, 1), het[:, :, None] * X) * dd
        cov = np.matmul(np.matmul(ginv, meat), ginv)
    else:
        meat = np.matmul(Q.transpose(0, 2, 1), het[:, :, None] * Q)
        cov = np.matmul(np.matmul(Rinv, meat), Rinv.transpose(0, 2, 1))
    cov *= dd
    return cov


def ratio(s: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(s[:, -1] > 0, s[:, 0] / s[:, -1], np.inf)
