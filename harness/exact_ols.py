"""Exact least squares in rational arithmetic: the reference the engines' accuracy is
measured against (every float64 is a rational, so the fit of the data as given is
exact; only the final square roots round, to float64)."""

from __future__ import annotations

from fractions import Fraction

import numpy as np

__all__ = ["ExactFit", "correct_digits"]


def _inverse(A: list[list[Fraction]]) -> list[list[Fraction]]:
    k = len(A)
    M = [row[:] + [Fraction(int(i == j)) for j in range(k)] for i, row in enumerate(A)]
    for c in range(k):
        p = next(r for r in range(c, k) if M[r][c] != 0)
        M[c], M[p] = M[p], M[c]
        pivot = M[c][c]
        M[c] = [v / pivot for v in M[c]]
        for r in range(k):
            if r != c and M[r][c] != 0:
                f = M[r][c]
                M[r] = [a - f * b for a, b in zip(M[r], M[c], strict=True)]
    return [row[k:] for row in M]


def _rational(v) -> Fraction:
    return v if isinstance(v, Fraction) else Fraction(float(v))


class ExactFit:
    """OLS of y on X (or WLS with ``weights``), exactly: X, y, weights of floats (each
    the rational it is) or of Fractions; ``bse(cov_type)`` and the estimates as the
    float64 nearest the exact values."""

    def __init__(self, X, y, weights=None):
        n, k = len(X), len(X[0])
        w = [Fraction(1)] * n if weights is None else [_rational(v) for v in weights]
        self.X = [[_rational(v) for v in row] for row in X]
        self.y = [_rational(v) for v in y]
        self.w, self.n, self.k = w, n, k
        xtx = [
            [sum(w[r] * self.X[r][i] * self.X[r][j] for r in range(n)) for j in range(k)]
            for i in range(k)
        ]
        xty = [sum(w[r] * self.X[r][i] * self.y[r] for r in range(n)) for i in range(k)]
        self.inv = _inverse(xtx)
        self.beta = [sum(self.inv[i][j] * xty[j] for j in range(k)) for i in range(k)]
        self.resid = [
            self.y[r] - sum(self.X[r][j] * self.beta[j] for j in range(k)) for r in range(n)
        ]
        self.ssr = sum(w[r] * e * e for r, e in enumerate(self.resid))

    @property
    def params(self) -> np.ndarray:
        return np.array([float(b) for b in self.beta])

    def cov_diag(self, cov_type: str = "nonrobust") -> list[Fraction]:
        n, k, inv, X, w = self.n, self.k, self.inv, self.X, self.w
        df = n - k
        if cov_type == "nonrobust":
            return [self.ssr / df * inv[j][j] for j in range(k)]
        # sandwich (X'WX)^-1 X'W diag(het) W X (X'WX)^-1 in whitened terms
        rows = [[sum(inv[j][c] * X[r][c] for c in range(k)) for j in range(k)] for r in range(n)]
        het = [w[r] * e * e for r, e in enumerate(self.resid)]
        if cov_type == "HC1":
            het = [Fraction(n, df) * h for h in het]
        elif cov_type in ("HC2", "HC3"):
            lev = [w[r] * sum(rows[r][j] * X[r][j] for j in range(k)) for r in range(n)]
            power = 1 if cov_type == "HC2" else 2
            het = [h / (1 - lev[r]) ** power for r, h in enumerate(het)]
        return [sum(w[r] * rows[r][j] ** 2 * het[r] for r in range(n)) for j in range(k)]

    def bse(self, cov_type: str = "nonrobust") -> np.ndarray:
        return np.sqrt(np.array([float(v) for v in self.cov_diag(cov_type)]))


def correct_digits(estimate, exact, cap: float = 15.0) -> np.ndarray:
    """-log10 of the relative error (the absolute one where the exact value is 0),
    capped at ``cap``."""
    estimate, exact = np.asarray(estimate, dtype=float), np.asarray(exact, dtype=float)
    err = np.abs(estimate - exact) / np.where(exact == 0, 1.0, np.abs(exact))
    with np.errstate(divide="ignore"):
        return np.minimum(cap, -np.log10(err))
