"""Batched OLS: many small ``sm.OLS(y, X).fit(cov_type=...)`` fits at once with numpy.

Chunks are grouped by shape (n, k) and solved as stacked (batch, n, k) arrays on the
column-scaled design, by Cholesky QR where that is well-conditioned and Householder QR
elsewhere, refined where an error bound asks (:mod:`.estimates`, :mod:`.gram`,
:mod:`.lsq`): statsmodels' numbers within 1e-8 where statsmodels is that accurate, and
more accurate numbers where it is not (tests/test_batched_ols.py, tests/test_strd.py).
The statistics (p-values, intervals, R², llf, AIC/BIC, F, condition number) are
statsmodels' formulas, with scipy.special's functions where statsmodels calls
scipy.stats.

Chunks whose statsmodels result is an exception, a warning or rounding noise come back as
:class:`Unsupported` (with a reason) so the caller fits them with statsmodels, which gives its own
answer by construction: NaN/inf in X (statsmodels: MissingDataError) or y (NaN params); n <= k
(inf bse); rank deficiency of the scaled design (statsmodels warns and fits the minimum-norm
solution with a lower df_model); a constant response with an intercept
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

import numpy as np

from .stack import solve_stack
from .stackfit import BatchedOLSResult, StackFit, Unsupported

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
# Chunks per stacked solve ~ this / (n * k): a stack costs ~100 numpy calls whatever its
# size, so small stacks pay it per chunk (at 250 x 9, stacks of 42 chunks ran at 0.82-0.85
# of the rate of stacks of 128); much larger ones run out of cache (docs/benchmarks.md).
BATCH_CELLS = 300_000


def _canonical_cov_type(cov_type: str) -> str | None:
    """The engine's name for cov_type, None if statsmodels-only; ValueError if unknown."""
    if cov_type == "nonrobust":
        return cov_type
    if isinstance(cov_type, str) and cov_type.upper() in COV_TYPES[1:]:
        return cov_type.upper()  # statsmodels accepts "hc1" as well
    if isinstance(cov_type, str) and cov_type.lower() in _STATSMODELS_ONLY:
        return None
    raise ValueError(f"unknown cov_type {cov_type!r}; expected one of {COV_TYPES}")


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
            fit = solve_stack(X, y, canonical, has_constant, alpha, True, w)
            for j, i in enumerate(part):
                out[i] = fit.result(j)
    return out  # type: ignore[return-value]


def batch_size(n: int, k: int) -> int:
    """Chunks of shape (n, k) per stacked solve (see ``BATCH_CELLS``)."""
    return min(1024, max(8, BATCH_CELLS // max(n * k, 1)))


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
        solve_stack(
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
