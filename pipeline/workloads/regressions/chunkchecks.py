"""The checks a chunk passes before statsmodels fits it, in order (:func:`check_chunk`:
no rows, non-finite values, too few rows, constant response, a response the model is
not defined on, one cluster, negative weights, rank-deficient design), and the ones on
statsmodels' model (:func:`check_leverage`); each raises :class:`~.design.ChunkError`
saying what is wrong (:func:`singular` names the collinear columns)."""

from __future__ import annotations

import numpy as np

from . import lsq
from .design import ChunkError, Prepared
from .spec import ModelSpec

__all__ = ["check_chunk", "check_leverage", "singular"]


#: The responses a model's likelihood is defined on: (low, high, whether low is allowed,
#: what to say).
_UNIT_INTERVAL = (0.0, 1.0, True, "in [0, 1] (0/1 outcomes or proportions)")
_COUNTS = (0.0, np.inf, True, "at least 0 (counts)")
_POSITIVE = (0.0, np.inf, False, "above 0")
_RESPONSE_DOMAINS = {
    "logit": _UNIT_INTERVAL,
    "probit": _UNIT_INTERVAL,
    "poisson": _COUNTS,
    "glm:binomial": _UNIT_INTERVAL,
    "glm:poisson": _COUNTS,
    "glm:negative_binomial": _COUNTS,
    "glm:gamma": _POSITIVE,
    "glm:inverse_gaussian": _POSITIVE,
}


def _check_response_domain(spec, y: np.ndarray) -> None:
    """A response its model is not defined on fails the chunk, naming the values: the
    fit would stop on a message about its internals, or return estimates of nothing."""
    model = f"glm:{spec.family}" if spec.model == "glm" else spec.model
    domain = _RESPONSE_DOMAINS.get(model)
    if domain is None:
        return
    low, high, low_ok, wanted = domain
    outside = (y > high) | ((y < low) if low_ok else (y <= low))
    if outside.any():
        example = y[np.argmax(outside)]
        name = model.replace("glm:", "glm with family ")
        raise ChunkError(
            "BadResponse",
            f"{name} needs a response {wanted}; {int(outside.sum())} of {len(y)} rows are "
            f"not (e.g. {example:g})",
        )


def _count_bad(a: np.ndarray) -> tuple[int, int]:
    nan = int(np.isnan(a).sum())
    return nan, int(a.size - nan - np.isfinite(a).sum())


def _plain(value):
    """A numpy scalar as the Python value it holds: its repr is np.float64(4.0)."""
    return value.item() if isinstance(value, np.generic) else value


def check_chunk(p: Prepared, spec: ModelSpec, *, svd: bool = True) -> np.ndarray | None:
    """Raise :class:`ChunkError` for a chunk that cannot be fitted; return X's singular values."""
    n, k = p.X.shape
    if n == 0:
        raise ChunkError("EmptyChunk", f"no rows to fit{p.dropped_note()}")
    problems = []
    for label, arr in () if p.finite else (("response", p.y), ("weights", p.weights)):
        if arr is not None and not np.isfinite(arr).all():
            nan, inf = _count_bad(arr)
            problems.append(f"{label}: {nan} NaN, {inf} inf")
    if not p.finite and not np.isfinite(p.X).all():
        for j, name in enumerate(p.names):
            col = p.X[:, j]
            if not np.isfinite(col).all():
                nan, inf = _count_bad(col)
                problems.append(f"{name}: {nan} NaN, {inf} inf")
    if problems:
        hint = "" if spec.missing == "drop" else " (missing = fail)"
        raise ChunkError("NonFiniteValues", f"non-finite values{hint}: {'; '.join(problems)}")
    if n <= k:
        raise ChunkError(
            "TooFewRows",
            f"{n} row{'s' if n != 1 else ''} for {k} parameters: need at least {k + 1}"
            + p.dropped_note(),
        )
    if spec.model != "quantreg" and np.all(p.y == p.y[0]):
        raise ChunkError(
            "ConstantResponse", f"the response is constant ({p.y[0].item()!r} in all {n} rows)"
        )
    _check_response_domain(spec, p.y)
    if p.groups is not None and len(p.groups):
        clusters = len(np.unique(p.groups))
        if clusters < 2:  # statsmodels: "ZeroDivisionError: float division by zero"
            raise ChunkError(
                "TooFewClusters",
                f"1 cluster ({spec.cluster} = {_plain(p.groups[0])!r}) in this chunk: "
                "cluster-robust errors need at least 2",
            )
    X = p.X
    if p.weights is not None:
        negative = int((p.weights < 0).sum())
        if negative:
            are = "weight is" if negative == 1 else "weights are"
            raise ChunkError("BadWeights", f"{negative} {are} negative")
        # Rows of weight 0 are kept, and counted in nobs, as statsmodels does; the
        # fit itself rests on the others.
        kept = p.weights > 0
        if kept.sum() <= k:
            raise ChunkError(
                "TooFewRows",
                f"{int(kept.sum())} rows of positive weight for {k} parameters: need at "
                f"least {k + 1} ({n - int(kept.sum())} weights are 0)",
            )
        X = X if kept.all() else X[kept]
    if not svd:
        return None
    sv = np.linalg.svd(X, compute_uv=False)
    tol = sv.max(initial=0.0) * max(n, k) * np.finfo(float).eps
    rank = int((sv > tol).sum())
    if rank < k:
        singular(p, rank, X)
    return sv


def check_leverage(spec: ModelSpec, model) -> None:
    """HC2 and HC3 divide each squared residual by 1 - h_ii: a row fitted exactly
    (h_ii = 1: the one row of a category) gives standard errors that are rounding
    noise (16 % apart from statsmodels' own, from the same data), said as fitted."""
    from .stack import MAX_LEVERAGE

    pinv = getattr(model, "pinv_wexog", None)  # (not made by fit(method="qr"))
    pinv = np.linalg.pinv(model.wexog) if pinv is None else pinv
    h = np.einsum("ij,ji->i", model.wexog, pinv)  # as statsmodels' HC2/HC3 find them
    row = int(np.argmax(h))
    if h[row] > MAX_LEVERAGE:
        raise ChunkError(
            "HighLeverage",
            f"row {row} of the chunk has leverage {h[row]:.6g}: it is fitted exactly (a "
            f"category level with one row?), and {spec.cov_type} divides by 1 - h_ii; "
            "HC1 or HC0 does not",
        )


def singular(p: Prepared, rank: int, X: np.ndarray | None = None) -> None:
    """Raise SingularDesign naming the collinear columns (of ``X``: the rows that
    count, when some weigh nothing): those in the null space of the column-scaled
    design, where a column's scale does not decide whether it shows."""
    if X is None:
        X = p.X if p.weights is None else p.X[p.weights > 0]
    k = X.shape[1]
    _, _, vt = np.linalg.svd(X * lsq.column_scales(X[None])[0], full_matrices=False)
    null = np.abs(vt[rank:]).max(axis=0)
    involved = [p.names[j] for j in np.flatnonzero(null > 1e-8)]
    zero = [p.names[j] for j in range(k) if not X[:, j].any()]
    why = f"; all-zero columns: {', '.join(zero)}" if zero else ""
    raise ChunkError(
        "SingularDesign",
        f"the design matrix has rank {rank} < {k} columns (collinear: {', '.join(involved)}{why})",
    )
