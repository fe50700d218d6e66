"""Designs for measuring the batched engine's least-squares paths (tests/test_lsq_paths.py,
benchmarks/regression_cholesky_digits.py): columns of very different scales, close to
one another by a chosen spread, and responses whose error bounds ask for refinement."""

from __future__ import annotations

import numpy as np

__all__ = ["SCALES", "correlated_design", "response"]

SCALES = np.logspace(-3, 3, 5)  # columns of very different scales: the scaling's job


def correlated_design(rng, n: int, spread: float) -> np.ndarray:
    """n x 6: an intercept and five columns of scales 1e-3..1e3, the last four close to
    the first (by ``spread``): the scaled design's kappa ~ 3 / spread."""
    Z = rng.normal(size=(n, 5))
    Z[:, 1:] = Z[:, :1] + spread * Z[:, 1:]
    return np.column_stack([np.ones(n), Z * SCALES])


def response(rng, X, noise=2.0, small=None):
    """X b plus heteroskedastic noise, b of the columns' scales; with ``small``, that
    coefficient 1e-9 of the others and the noise orthogonal to X (so the fit's estimate
    is as small): an error bound that asks for the refinement step."""
    beta = rng.normal(size=X.shape[1]) / np.abs(X).mean(axis=0)
    e = rng.normal(size=len(X)) * noise * (1 + np.abs(X[:, 1]) / np.abs(X[:, 1]).mean())
    if small is not None:
        beta[small] *= 1e-9
        e -= X @ np.linalg.lstsq(X, e, rcond=None)[0]
    return X @ beta + e
