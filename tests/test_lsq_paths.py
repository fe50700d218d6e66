"""The batched engine's two least-squares paths (pipeline/workloads/regressions/gram.py
and lsq.py): which chunks take Cholesky QR, how accurate it is against exact rational
fits and against Householder QR on the same data, and that a chunk's bits do not
depend on which path its neighbours take."""

from __future__ import annotations

import numpy as np
import pytest
import statsmodels.api as sm

from harness.exact_ols import ExactFit, correct_digits
from harness.lsq_designs import correlated_design, response
from pipeline.workloads.regressions import estimates, gram
from pipeline.workloads.regressions.batched import batch_size, fit_ols_batch, fit_ols_stack


def both_paths(X, y, cov_type, monkeypatch):
    """estimates.solve of one chunk as the engine runs it, and with Cholesky QR off."""
    n, k = X.shape
    on = estimates.solve(X[None], y[None], cov_type, n - k)
    with monkeypatch.context() as m:
        m.setattr(gram, "MAX_CONDITION", 0.0)
        off = estimates.solve(X[None], y[None], cov_type, n - k)
    assert not off.on_gram[0]
    return on, off


def bse(e: estimates.Estimates) -> np.ndarray:
    cov = e.cov[0]
    return np.sqrt(cov if cov.ndim == 1 else np.diagonal(cov))


@pytest.mark.parametrize("cov_type", ["nonrobust", "HC1", "HC3"])
def test_cholesky_qr_keeps_11_digits_and_at_most_3_fewer_than_householder(cov_type, monkeypatch):
    """Against the exact fit of the same data: past the 10 digits the refinement policy
    asks for (REFINE_TOL), Cholesky QR keeps fewer than Householder QR (its error bound
    has kappa**2 where Householder's has kappa), but never fewer than 11."""
    rng = np.random.default_rng(["nonrobust", "HC1", "HC3"].index(cov_type))
    kappas = []
    for spread in (2.0, 1.0, 0.5, 0.25, 0.15, 0.1, 0.08, 0.05):
        X = correlated_design(rng, 60, spread)
        y = response(rng, X)
        on, off = both_paths(X, y, cov_type, monkeypatch)
        kappas.append(gram.gram_fit(X[None], y[None]).kappa[0])
        assert on.on_gram[0] == (kappas[-1] <= gram.MAX_CONDITION)
        exact = ExactFit(X, y)
        for ours, hh, truth in ((on.params[0], off.params[0], exact.params),
                                (bse(on), bse(off), exact.bse(cov_type))):  # fmt: skip
            got, theirs = correct_digits(ours, truth), correct_digits(hh, truth)
            assert got.min() >= 11, (kappas[-1], got, theirs)
            assert got.min() >= theirs.min() - 3, (kappas[-1], got, theirs)
    # the sweep spans the path's range, and past it
    assert min(kappas) < 5 and max(kappas) > gram.MAX_CONDITION


def test_a_small_estimate_is_refined_on_the_cholesky_path(monkeypatch):
    """Large residuals, orthogonal to the design, next to an estimate 1e-9 of the
    others: the normal equations' error bound asks for the refinement step."""
    rng = np.random.default_rng(4)
    X = correlated_design(rng, 80, 1.0)
    y = response(rng, X, noise=50.0, small=3)
    on, off = both_paths(X, y, "nonrobust", monkeypatch)
    assert on.on_gram[0] and on.refined[0] and off.refined[0]
    exact = ExactFit(X, y).params
    assert correct_digits(on.params[0], exact).min() >= 14
    assert correct_digits(on.params[0], exact)[3] >= correct_digits(off.params[0], exact)[3] - 1


def test_which_chunks_take_which_path():
    rng = np.random.default_rng(8)
    good = correlated_design(rng, 60, 1.0)
    close = correlated_design(rng, 60, 0.01)  # kappa ~ 300: Householder
    dup = np.column_stack([good[:, :5], good[:, 4]])  # Gram matrix singular: Householder
    X = np.stack([good, close, dup])
    y = np.stack([response(rng, x) for x in X])
    e = estimates.solve(X, y, "nonrobust", 54.0)
    assert e.on_gram.tolist() == [True, False, False]
    assert e.rank.tolist() == [6, 6, 5]
    # a row of leverage 1 - 5e-5: HC3's 1 / (1 - h) needs Householder's leverages
    lev = np.column_stack([good, np.eye(60)[7] + 1e-3 * rng.normal(size=60)])
    y = response(rng, lev)[None]
    assert estimates.solve(lev[None], y, "HC1", 53.0).on_gram[0]
    e = estimates.solve(lev[None], y, "HC3", 53.0)
    assert not e.on_gram[0] and 1e-5 < 1 - e.leverage[0] < 1e-4


def test_condition_numbers_are_statsmodels_by_either_route():
    """From the Gram matrix's eigenvalues where their bound allows (a well-conditioned
    design as given), else from the singular values (scales 1e-3..1e3: condition 1e6+
    unscaled, well-conditioned scaled, so still on the Cholesky path)."""
    rng = np.random.default_rng(9)
    plain = np.column_stack([np.ones(60), rng.normal(size=(60, 4))])
    scaled = correlated_design(rng, 60, 1.0)
    for X in (plain, scaled):
        y = response(rng, X)
        e = estimates.solve(X[None], y[None], "nonrobust", 60.0 - X.shape[1])
        assert e.on_gram[0]
        expected = sm.OLS(y, X).fit().condition_number
        np.testing.assert_allclose(e.condition_numbers(), [expected], rtol=1e-10)
    s = np.linalg.svd(scaled, compute_uv=False)
    assert s[0] / s[-1] > 1e5  # the second went the singular values' way


@pytest.mark.parametrize("cov_type", ["nonrobust", "HC0", "HC2", "HC3"])
def test_a_chunks_bits_do_not_depend_on_its_neighbours_paths(cov_type):
    """Stacks longer than a batch, mixing Cholesky, Householder and refined chunks: each
    chunk's numbers equal its fit alone, bit for bit."""
    rng = np.random.default_rng(10)
    spreads = rng.choice([1.0, 0.3, 0.01, 0.001], size=300)
    X = np.stack([correlated_design(rng, 250, s) for s in spreads])
    y = np.stack([response(rng, x, small=3 if i % 7 == 0 else None) for i, x in enumerate(X)])
    assert batch_size(250, 6) < len(X)
    whole = fit_ols_stack(X, y, cov_type=cov_type)
    e = estimates.solve(X, y, cov_type, 244.0)
    assert 0 < e.on_gram.sum() < len(X) and (e.refined & e.on_gram).any()
    for i in rng.choice(len(X), size=25, replace=False):
        (alone,) = fit_ols_batch([X[i]], [y[i]], cov_type=cov_type)
        for name in ("params", "bse", "pvalues", "rsquared", "llf", "condition_number"):
            np.testing.assert_array_equal(getattr(whole, name)[i], getattr(alone, name))
