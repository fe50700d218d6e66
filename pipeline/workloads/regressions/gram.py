"""Least squares by Cholesky QR, for the chunks of a stack whose column-scaled design is
well-conditioned.

The triangular factor R of the scaled design ``Xs = X * d`` (:mod:`.lsq`) is also the
Cholesky factor of its Gram matrix ``Xs'Xs``: Cholesky QR. The Gram matrix costs one
pass over X (Householder QR passes over the remaining columns once per reflector), but
it squares the condition number, so the path is taken only where the scaled design is
well-conditioned: a 1-norm condition number ``kappa`` of R at most ``MAX_CONDITION``.
There:

- **Estimates** solve the normal equations, with an error of about
  ``eps * kappa**2 * (|b| + |r|)`` (first order). Where that may exceed ``REFINE_TOL``
  of an estimate they take one step of the corrected seminormal equations in working
  precision, which leaves about Householder's error, ``eps * kappa * (|b| + kappa *
  |r|)``; where that still may, the same compensated refinement step as Householder's
  (:func:`.lsq.refine`, which contracts by ``eps * kappa**2`` with either R). Elsewhere
  they are within the same bound as Householder's, with fewer digits past it.
- **Residuals** are computed from the estimates: the Gram matrix's factor has their
  norm only as a difference of squares, which cancels when the fit is close.
- **Standard errors** come from ``R^-1`` as Householder's do, but the Gram matrix's
  rounding bounds their error by ``eps * kappa**2`` (2e-13 at the limit) where
  Householder's measure about ``eps * kappa``.

Measured against exact rational fits (``python -m benchmarks.regression_cholesky_digits``:
118 designs of 60 rows with columns of scales 1e-3..1e3 on this path, kappa 2.9-29.8):
estimates 11.6-15 correct digits (medians by kappa band 12.8-14.6) where Householder's
have 12.7-15 (14.2-14.9), standard errors (nonrobust, HC1, HC3) 12.3-15 (13.2-15) where
Householder's have 14.6-15 (15); tests/test_lsq_paths.py asks for at least 11, and at
most 3 fewer than Householder's.

Every operation is per chunk, so a chunk's bits do not depend on its neighbours. The
chunks this path does not settle (a Gram matrix that is not numerically positive
definite, ``kappa`` above the limit) are marked for Householder QR.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import lsq

__all__ = ["MAX_CONDITION", "GramFit", "gram_fit"]

#: Cholesky QR where the scaled design's kappa is at most this (else Householder QR):
#: eps * kappa**2 <= 2e-13 (measured: up to 2.7 digits below Householder's).
MAX_CONDITION = 30.0


@dataclass
class GramFit:
    """A stack's Cholesky QR fits; only the chunks where ``ok`` is True are meaningful."""

    ok: np.ndarray  # (B,) settled here
    gram: np.ndarray  # (B, k, k) X'X of the design as given
    d: np.ndarray  # (B, k) column scales
    R: np.ndarray  # (B, k, k) triangular factor of the scaled design
    Rinv: np.ndarray  # (B, k, k)
    kappa: np.ndarray  # (B,) 1-norm condition number of R
    b: np.ndarray  # (B, k) estimates of the scaled design (the design's: b * d)
    resid: np.ndarray  # (B, n)
    ssr: np.ndarray  # (B,)
    refined: np.ndarray  # (B,) took the refinement step


def gram_fit(X: np.ndarray, y: np.ndarray) -> GramFit:
    """Cholesky QR least squares of each finite chunk of X (B, n, k), n > k, y (B, n)."""
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        return _fit(X, y)


def _fit(X: np.ndarray, y: np.ndarray) -> GramFit:
    Xt = X.transpose(0, 2, 1)
    gram = np.matmul(Xt, X)
    c = np.matmul(Xt, y[:, :, None])[:, :, 0]
    squares = np.diagonal(gram, axis1=1, axis2=2)
    # the scales of .lsq, from the Gram matrix's diagonal: powers of two, so the scaled
    # Gram matrix is the scaled design's, exactly
    d = lsq.scales_for(np.sqrt(squares))
    scaled = gram * d[:, :, None] * d[:, None, :]
    ok = (squares > 0).all(axis=1) & np.isfinite(scaled).all(axis=(1, 2))
    R = _cholesky(scaled, ok).transpose(0, 2, 1)
    Rinv = _upper_inverse(R)
    kappa = np.abs(R).sum(axis=1).max(axis=1) * np.abs(Rinv).sum(axis=1).max(axis=1)
    ok &= kappa <= MAX_CONDITION
    z = np.matmul(Rinv.transpose(0, 2, 1), (c * d)[:, :, None])
    b = np.matmul(Rinv, z)[:, :, 0]
    resid = y - np.matmul(X, (b * d)[:, :, None])[:, :, 0]
    ssr = np.einsum("bi,bi->b", resid, resid)
    step = ok & exceeds(lsq.EPS * kappa**2 * (np.abs(b).max(axis=1) + np.sqrt(ssr)), b)
    if step.any():  # the normal equations' bound is too wide for some
        b[step], r = _seminormal_step(X[step], d[step], Rinv[step], y[step], resid[step], b[step])
        resid[step], ssr[step] = r, np.einsum("bi,bi->b", r, r)
    bound = lsq.EPS * kappa * (np.abs(b).max(axis=1) + kappa * np.sqrt(ssr))
    refined = step & exceeds(bound, b)  # Householder's bound, after the step
    if refined.any():
        Xs = X[refined] * d[refined][:, None, :]
        b[refined], r = lsq.refine(Xs, Rinv[refined], y[refined], b[refined])
        resid[refined], ssr[refined] = r, np.einsum("bi,bi->b", r, r)
    return GramFit(ok, gram, d, R, Rinv, kappa, b, resid, ssr, refined)


def exceeds(bound: np.ndarray, b: np.ndarray) -> np.ndarray:
    """(B,) mask of the chunks whose error ``bound`` exceeds ``REFINE_TOL`` of their
    smallest estimate (scaled)."""
    return bound > lsq.REFINE_TOL * np.abs(b).min(axis=1)


def _seminormal_step(X, d, Rinv, y, resid, b) -> tuple[np.ndarray, np.ndarray]:
    """One step of the corrected seminormal equations in working precision, ``b + R^-1
    R^-T Xs' r``: it contracts the normal equations' error by ``eps * kappa**2`` and
    leaves about Householder's (the rounding of ``r`` and ``Xs' r``). Returns the
    estimates and their residuals."""
    g = np.matmul(X.transpose(0, 2, 1), resid[:, :, None])[:, :, 0] * d
    b = b + np.matmul(Rinv, np.matmul(Rinv.transpose(0, 2, 1), g[:, :, None]))[:, :, 0]
    return b, y - np.matmul(X, (b * d)[:, :, None])[:, :, 0]


def _cholesky(A: np.ndarray, ok: np.ndarray) -> np.ndarray:
    """Lower Cholesky factors of the stack A where ``ok`` (the identity elsewhere);
    ``ok`` loses the chunks whose matrix is not numerically positive definite."""
    k = A.shape[-1]
    A = np.where(ok[:, None, None], A, np.eye(k))
    try:
        return np.linalg.cholesky(A)
    except np.linalg.LinAlgError:  # numpy does not say which: one at a time (same bits)
        L = np.empty_like(A)
        for j in range(len(A)):
            try:
                L[j] = np.linalg.cholesky(A[j])
            except np.linalg.LinAlgError:
                ok[j] = False
                L[j] = np.eye(k)
        return L


def _upper_inverse(R: np.ndarray) -> np.ndarray:
    """Inverses of the upper-triangular stack R, a column at a time (as LAPACK's dtrti2;
    on small stacks a third of ``np.linalg.inv``'s time, which factors R again)."""
    k = R.shape[-1]
    out = np.zeros_like(R)
    recip = 1.0 / np.diagonal(R, axis1=1, axis2=2)
    out[:, 0, 0] = recip[:, 0]
    for j in range(1, k):
        out[:, j, j] = recip[:, j]
        out[:, :j, j] = (
            -np.matmul(out[:, :j, :j], R[:, :j, j : j + 1])[:, :, 0] * recip[:, j : j + 1]
        )
    return out
