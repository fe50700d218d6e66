"""Correct digits of the batched engine's Cholesky QR path against Householder QR on the
same designs, both scored against exact rational fits: the figures of
pipeline/workloads/regressions/gram.py and docs/regressions.md.

The designs are those of tests/test_lsq_paths.py (``correlated_design``: an intercept
and five columns of scales 1e-3..1e3, the last four close to the first by ``spread``,
60 rows; ``response``: heteroskedastic noise), ``--seeds`` of them per spread, and
only those whose scaled design takes the Cholesky path (kappa at most
``gram.MAX_CONDITION``) are counted. For each, the estimates and the standard errors
of each cov_type (nonrobust, HC1, HC3) are fitted both ways (``estimates.solve`` as
the engine runs it, and with the Cholesky path off) and scored in correct digits (the
worst of the design's, capped at 15); the minimum and the median by kappa band are
printed.

    python -m benchmarks.regression_cholesky_digits [--seeds 16]
"""

from __future__ import annotations

import argparse

import numpy as np

from harness.exact_ols import ExactFit, correct_digits
from harness.lsq_designs import correlated_design, response
from pipeline.workloads.regressions import estimates, gram

SPREADS = (2.0, 1.0, 0.5, 0.35, 0.25, 0.2, 0.15, 0.12, 0.1, 0.08)
COV_TYPES = ("nonrobust", "HC1", "HC3")
BANDS = ((0, 5), (5, 10), (10, 20), (20, gram.MAX_CONDITION))


def solve(X, y, cov_type, cholesky: bool) -> estimates.Estimates:
    n, k = X.shape
    limit = gram.MAX_CONDITION
    gram.MAX_CONDITION = limit if cholesky else 0.0
    try:
        return estimates.solve(X[None], y[None], cov_type, float(n - k))
    finally:
        gram.MAX_CONDITION = limit


def bse(e: estimates.Estimates) -> np.ndarray:
    cov = e.cov[0]
    return np.sqrt(cov if cov.ndim == 1 else np.diagonal(cov))


def measure(seeds: int) -> list[dict]:
    """One record per design on the Cholesky path: kappa and each score both ways."""
    out = []
    for seed in range(seeds):
        rng = np.random.default_rng(1000 + seed)
        for spread in SPREADS:
            X = correlated_design(rng, 60, spread)
            y = response(rng, X)
            kappa = float(gram.gram_fit(X[None], y[None]).kappa[0])
            if kappa > gram.MAX_CONDITION:
                continue
            exact = ExactFit(X, y)
            rec = {"kappa": kappa}
            for cov_type in COV_TYPES:
                truth = exact.bse(cov_type)
                for path, on in (("cholesky", True), ("householder", False)):
                    e = solve(X, y, cov_type, on)
                    assert bool(e.on_gram[0]) == on
                    rec[path, "estimates"] = correct_digits(e.params[0], exact.params).min()
                    rec[path, cov_type] = correct_digits(bse(e), truth).min()
            out.append(rec)
    return out


def summary(records: list[dict], path: str, what: tuple[str, ...]) -> str:
    scores = np.array([min(r[path, w] for w in what) for r in records])
    kappa = np.array([r["kappa"] for r in records])
    medians = [np.median(scores[(kappa > lo) & (kappa <= hi)])
               for lo, hi in BANDS if ((kappa > lo) & (kappa <= hi)).any()]  # fmt: skip
    return (f"{scores.min():.1f}-{scores.max():.1f} "
            f"(median by kappa band {min(medians):.1f}-{max(medians):.1f})")  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=16, help="designs per spread")
    args = ap.parse_args()
    records = measure(args.seeds)
    kappa = [r["kappa"] for r in records]
    bands = ", ".join(f"({lo}, {hi}]" for lo, hi in BANDS)
    print(f"{len(records)} designs on the Cholesky path, kappa {min(kappa):.1f}-{max(kappa):.1f}"
          f" (bands {bands})")  # fmt: skip
    for label, what in (("estimates", ("estimates",)), ("standard errors", COV_TYPES)):
        for path in ("cholesky", "householder"):
            print(f"  {label:16} {path:12} {summary(records, path, what)}")
    for cov_type in COV_TYPES:
        print(f"  std errors {cov_type:9} cholesky {summary(records, 'cholesky', (cov_type,))}"
              f"; householder {summary(records, 'householder', (cov_type,))}")  # fmt: skip


if __name__ == "__main__":
    main()
