"""Least squares on stacks of same-shape designs, accurate on hard designs.

Every OLS and WLS fit of the project goes through these steps (the batched engine
on its stacks, the statsmodels engine on one chunk at a time), except that the batched
engine factors a well-conditioned scaled design by Cholesky QR instead (:mod:`.gram`):

1. **Column scaling.** Each column of the (whitened) design is multiplied by a power
   of two that brings its norm into [0.5, 1). A power of two scales without rounding,
   so the scaled problem is the same least-squares problem, and the estimates of the
   original are the scaled ones times the scales, exactly.
2. **Rank.** The rank is decided on the scaled design: the count of its singular
   values above ``max(n, k) * eps`` times the largest (numpy's ``matrix_rank``
   tolerance). Deciding on the unscaled design refuses full-rank designs whose
   columns only differ in scale (a degree-10 polynomial: condition number 1e15
   unscaled, 5e9 scaled). The singular values are only computed where the triangular
   factor cannot settle the question (see :func:`factor`).
3. **Householder QR** of the scaled design with the response beside it: R, ``Q'y``
   and the residual norm from one factorization, Q never formed.
4. **Refinement** where the error bound of step 3 exceeds ``REFINE_TOL`` of an
   estimate: one step of the corrected seminormal equations (Björck), with the
   residual and the gradient summed in twice the working precision (error-free
   products and sums). A backward-stable solve errs by ``eps * cond**2 * |r|`` on
   designs with large residuals (Wampler 5: 5.8 correct digits by any float64 solver);
   the refined solve is correct to the data's own rounding (15 digits there).
5. **Standard errors** from the inverse of the triangular factor (nonrobust), or from
   Q and that inverse (HC0-HC3: the sandwich ``R^-1 Q' diag(het) Q R^-T``, leverages
   the row sums of ``Q**2``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["Factor", "column_scales", "factor", "rank_tolerance", "refine", "scales_for", "solve"]

EPS = np.finfo(np.float64).eps
#: Refine where eps * cond * (|b| + cond * |r|) may exceed this share of an estimate.
REFINE_TOL = 1e-10
#: The refinement step contracts while cond**2 * eps < 1: above this (1-norm) estimate
#: of the scaled design's condition number it is not taken.
MAX_REFINE_CONDITION = 1e7
_SPLIT = 134217729.0  # 2**27 + 1: Dekker's splitting constant for float64


def rank_tolerance(n: int, k: int) -> float:
    """Singular values of the scaled design at or below this share of the largest count
    as zero."""
    return max(n, k) * EPS


def column_scales(X: np.ndarray) -> np.ndarray:
    """(B, k) powers of two bringing each column of X (B, n, k) to a norm in [0.5, 1)
    (1 for a zero or non-finite column)."""
    return scales_for(np.sqrt(np.einsum("bij,bij->bj", X, X)))


def scales_for(norms: np.ndarray) -> np.ndarray:
    """The powers of two bringing ``norms`` into [0.5, 1) (1 for 0 or non-finite)."""
    _, exponent = np.frexp(np.where(np.isfinite(norms), norms, 0.0))
    return np.ldexp(1.0, -exponent)


@dataclass
class Factor:
    """The triangular factor of a scaled stack ``[Xs, y]``, ``Xs = X * d`` (a row of
    ``d`` per chunk): R of Xs, ``z = Q'y`` and the residual norm ``rho``, without Q."""

    d: np.ndarray  # (B, k) column scales
    Xs: np.ndarray  # (B, n, k) the scaled design
    R: np.ndarray  # (B, k, k)
    z: np.ndarray  # (B, k)
    rho: np.ndarray  # (B,) |y - Xs b| at the least-squares solution (before refinement)
    Rinv: np.ndarray  # (B, k, k); the identity where the design is rank-deficient
    kappa: np.ndarray  # (B,) 1-norm condition number of R (inf where rank-deficient)
    rank: np.ndarray  # (B,) rank of the scaled design

    def singular_values(self) -> np.ndarray:
        """(B, k) singular values of the unscaled design, largest first (those of
        ``R / d``, which is X's own triangular factor)."""
        return np.linalg.svd(self.R / self.d[:, None, :], compute_uv=False)

    Q: np.ndarray | None = None  # (B, n, k), where asked for


def factor(X: np.ndarray, y: np.ndarray, *, with_q: bool = False) -> Factor:
    """Scale, factor and decide the rank of each design of the stack X (B, n, k), n > k,
    with its responses y (B, n): one Householder QR of ``[Xs, y]`` (R only, Q is never
    formed) gives R, ``Q'y`` and the residual norm; ``with_q``, the QR of Xs with Q
    formed (the sandwich covariances need it: ``Xs R^-1`` in its place loses digits
    at condition numbers of 1e8 and more).

    The rank needs the singular values only where the triangular factor leaves it
    open: ``min |r_jj| / max |r_jj|`` bounds the ratio of the smallest to the largest
    singular value from above (settling a rank deficiency at the tolerance), and a
    1-norm condition number ``kappa`` of R at most ``1 / (k * tol)`` bounds the
    2-norm one by ``1 / tol`` (settling full rank)."""
    B, n, k = X.shape
    d = column_scales(X)
    Xs = X * d[:, None, :]
    Q = None
    if with_q:
        Q, R = np.linalg.qr(Xs)
        z = np.matmul(Q.transpose(0, 2, 1), y[:, :, None])[:, :, 0]
        rho = None
    else:
        full = np.linalg.qr(np.concatenate([Xs, y[:, :, None]], axis=2), mode="r")
        R = np.ascontiguousarray(full[:, :k, :k])
        z, rho = full[:, :k, k], np.abs(full[:, k, k])
    tol = rank_tolerance(n, k)
    diag = np.abs(np.diagonal(R, axis1=1, axis2=2))
    deficient = ~(diag.min(axis=1) > tol * diag.max(axis=1))
    safe = R
    if deficient.any():
        safe = R.copy()
        safe[deficient] = np.eye(k)
    Rinv = np.linalg.inv(safe)
    kappa = np.abs(R).sum(axis=1).max(axis=1) * np.abs(Rinv).sum(axis=1).max(axis=1)
    kappa[deficient] = np.inf
    rank = np.full(B, k)
    unsure = ~(kappa <= 1.0 / (k * tol))
    if unsure.any():
        s = np.linalg.svd(R[unsure], compute_uv=False)
        rank[unsure] = (s > tol * s[:, :1]).sum(axis=1)
        Rinv[unsure & (rank < k)] = np.eye(k)
        kappa[rank < k] = np.inf
    if rho is None:
        b = np.matmul(Rinv, z[:, :, None])
        resid = y - np.matmul(Xs, b)[:, :, 0]
        rho = np.sqrt(np.einsum("bi,bi->b", resid, resid))
    return Factor(d, Xs, R, z, rho, Rinv, kappa, rank, Q)


def solve(f: Factor, y: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Scaled estimates (B, k), residual sums of squares (B,) and a mask of the chunks
    refined (B,), for the responses y (B, n) ``f`` was factored with; the estimates of
    X are the scaled ones times ``d``. Chunks of a rank below k get meaningless numbers
    (their caller sets them apart)."""
    b = np.matmul(f.Rinv, f.z[:, :, None])[:, :, 0]
    ssr = f.rho**2
    need = needs_refinement(f, b)
    if need.any():
        b[need], resid = refine(f.Xs[need], f.Rinv[need], y[need], b[need])
        ssr[need] = np.einsum("bi,bi->b", resid, resid)
    return b, ssr, need


def needs_refinement(f: Factor, b: np.ndarray) -> np.ndarray:
    """(B,) mask of the chunks whose first-order error bound, ``eps * kappa * (|b| +
    kappa * |r|)``, exceeds ``REFINE_TOL`` of their smallest estimate (scaled), and
    whose condition lets the refinement step contract."""
    size = np.abs(b)
    with np.errstate(invalid="ignore", over="ignore"):
        bound = EPS * f.kappa * (size.max(axis=1) + f.kappa * f.rho)
        return (bound > REFINE_TOL * size.min(axis=1)) & (f.kappa <= MAX_REFINE_CONDITION)


def refine(
    Xs: np.ndarray, Rinv: np.ndarray, y: np.ndarray, b: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """One step of the corrected seminormal equations from ``b``: ``b + R^-1 R^-T
    Xs' r`` with ``r = y - Xs b`` and ``Xs' r`` in twice the working precision.
    Returns the refined estimates and their residuals."""
    r_hi, r_lo = _residual(Xs, b, y)
    g = _gradient(Xs, r_hi, r_lo)
    step = np.matmul(Rinv, np.matmul(Rinv.transpose(0, 2, 1), g[:, :, None]))[:, :, 0]
    b = b + step
    return b, y - np.matmul(Xs, b[:, :, None])[:, :, 0]


# -- error-free transformations (Dekker, Knuth; Ogita, Rump & Oishi's dot products) ------


def _two_sum(a, b):
    s = a + b
    v = s - a
    return s, (a - (s - v)) + (b - v)


def _two_product(a, b):
    p = a * b
    c = _SPLIT * a
    a_hi = c - (c - a)
    a_lo = a - a_hi
    c = _SPLIT * b
    b_hi = c - (c - b)
    b_lo = b - b_hi
    return p, ((a_hi * b_hi - p) + a_hi * b_lo + a_lo * b_hi) + a_lo * b_lo


def _sum(terms: np.ndarray, errors: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sum of ``terms + errors`` along the last axis, as a float64 pair (hi, lo): a
    cascade of error-free pairwise sums, their errors added up with ``errors``."""
    low = errors.sum(axis=-1)
    while terms.shape[-1] > 1:
        if terms.shape[-1] % 2:
            terms = np.concatenate([terms, np.zeros_like(terms[..., :1])], axis=-1)
        terms, e = _two_sum(terms[..., 0::2], terms[..., 1::2])
        low = low + e.sum(axis=-1)
    hi, lo = _two_sum(terms[..., 0], low)
    return hi, lo


def _residual(Xs: np.ndarray, b: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``y - Xs b`` (B, n) as a pair (hi, lo) accurate to twice the working precision."""
    p, e = _two_product(Xs, b[:, None, :])
    terms = np.concatenate([y[:, :, None], -p], axis=2)
    return _sum(terms, -e)


def _gradient(Xs: np.ndarray, r_hi: np.ndarray, r_lo: np.ndarray) -> np.ndarray:
    """``Xs' (r_hi + r_lo)`` (B, k), summed in twice the working precision."""
    Xt = Xs.transpose(0, 2, 1)
    p, e = _two_product(Xt, r_hi[:, None, :])
    hi, lo = _sum(p, e + Xt * r_lo[:, None, :])
    return hi + lo
