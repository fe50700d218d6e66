"""The batched OLS engine against statsmodels: same numbers within 1e-8 relative where
statsmodels is that accurate (and more accurate where it is not), same failures.

Run ``python3 tests/test_batched_ols.py`` for the speed comparison with a statsmodels loop.
"""

from __future__ import annotations

import sys
import time
import warnings

import numpy as np
import pytest
import statsmodels.api as sm
from statsmodels.tools.sm_exceptions import MissingDataError, ValueWarning

from harness.exact_ols import ExactFit, correct_digits
from pipeline.workloads.regressions.batched import (
    COV_TYPES,
    BatchedOLSResult,
    Unsupported,
    fit_ols_batch,
)

RTOL = 1e-8
ARRAYS = ("params", "bse", "tvalues", "pvalues", "conf_int")
SCALARS = (
    "nobs",
    "df_model",
    "df_resid",
    "rsquared",
    "rsquared_adj",
    "llf",
    "aic",
    "bic",
    "condition_number",
)


def reference(X, y, cov_type):
    return sm.OLS(y, X).fit(cov_type=cov_type)


def assert_matches(res, X, y, cov_type):
    """res equals statsmodels' fit of (X, y) within RTOL."""
    assert isinstance(res, BatchedOLSResult), res
    ref = reference(X, y, cov_type)
    for name in ARRAYS:
        expected = getattr(ref, name)
        expected = expected() if callable(expected) else expected
        # A conf_int endpoint is params -/+ q * bse and may cancel to ~0: its rounding error is
        # relative to the interval's largest magnitude, not to the endpoint itself.
        atol = 1e-13 * np.abs(expected).max() if name == "conf_int" else 0.0
        np.testing.assert_allclose(getattr(res, name), expected, rtol=RTOL, atol=atol, err_msg=name)
    for name in SCALARS:
        # r-squared (adjusted) = 1 - ratio: rounding ~1e-16 relative to 1, and may be ~0
        atol = 1e-13 if name.startswith("rsquared") else 0.0
        np.testing.assert_allclose(
            getattr(res, name), getattr(ref, name), rtol=RTOL, atol=atol, err_msg=name
        )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        f_ref, fp_ref = ref.fvalue, ref.f_pvalue
    rank_warning = any("does not have full rank" in str(w.message) for w in caught)
    if res.fvalue is None:  # documented: statsmodels' robust F is rounding noise here
        assert rank_warning and res.f_pvalue is None and cov_type != "nonrobust"
    else:
        assert not rank_warning
        np.testing.assert_allclose(
            [res.fvalue, res.f_pvalue], [f_ref, fp_ref], rtol=RTOL, err_msg="fvalue, f_pvalue"
        )  # NaN == NaN here


def random_design(rng, n, k, const_at=0):
    """n x k normal design with a column of ones at const_at (None: no constant)."""
    if const_at is None:
        return rng.normal(size=(n, k)) + rng.normal(size=k)
    X = rng.normal(size=(n, k - 1)) * rng.uniform(0.5, 3, size=k - 1)
    return np.insert(X, const_at, 1.0, axis=1)


def response(rng, X):
    """Linear in X, heteroskedastic noise, one true zero coefficient."""
    beta = rng.normal(size=X.shape[1])
    beta[-1] = 0.0
    return X @ beta + rng.normal(size=len(X)) * (1 + np.abs(X[:, -1]))


def ill_conditioned_design(rng, n, k, cond, kind):
    """Full-rank (n, k) design with a constant column and condition number ~cond."""
    Z = rng.normal(size=(n, k - 1))
    if kind == "collinear":  # last column = first + a tiny independent part
        Z[:, -1] = Z[:, 0] + 2.0 / cond * rng.normal(size=n)
    else:  # "scaled": columns of very different magnitudes
        Z *= np.logspace(0, np.log10(cond), k - 1)
    return np.column_stack([np.ones(n), Z])


SHAPES = [  # (n, k, const_at)
    (250, 6, 0),
    (40, 3, 0),
    (100, 4, 2),
    (30, 1, 0),
    (250, 6, None),
    (12, 2, None),
]


@pytest.mark.parametrize("cov_type", COV_TYPES)
@pytest.mark.parametrize(("n", "k", "const_at"), SHAPES)
def test_random_data_matches_statsmodels(cov_type, n, k, const_at):
    rng = np.random.default_rng([n, k, COV_TYPES.index(cov_type)])
    Xs = [random_design(rng, n, k, const_at) for _ in range(12)]
    ys = [response(rng, X) for X in Xs]
    results = fit_ols_batch(Xs, ys, cov_type=cov_type, has_constant=const_at is not None)
    assert len(results) == len(Xs)
    for res, X, y in zip(results, Xs, ys, strict=True):
        assert_matches(res, X, y, cov_type)


@pytest.mark.parametrize("kind", ["collinear", "scaled"])
@pytest.mark.parametrize("cond", [1e6, 1e8, 1e9])
def test_ill_conditioned_full_rank_is_at_least_as_accurate_as_statsmodels(kind, cond):
    """Scored against the exact least-squares fit of the same float64 data: the worst
    estimate and standard error have at least statsmodels' correct digits, up to 10
    (less half a digit of rounding luck), and columns that only differ in scale cost nothing (13+
    digits where statsmodels keeps 5-11). statsmodels' HC3 errors, from leverages
    x_i'(X'X)^-1 x_i that cancel by cond**2, keep 0-2 digits at cond 1e8-1e9."""
    rng = np.random.default_rng([int(np.log10(cond)), len(kind)])
    X = ill_conditioned_design(rng, 200, 5, cond, kind)
    y = response(rng, X)
    assert cond / 20 < np.linalg.cond(X) < cond * 20  # the data really is ill-conditioned
    exact = ExactFit(X, y)
    for cov_type in ("nonrobust", "HC1", "HC3"):
        (res,) = fit_ols_batch([X], [y], cov_type=cov_type)
        assert isinstance(res, BatchedOLSResult), res
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ref = reference(X, y, cov_type)
        bse = exact.bse(cov_type)
        for name, ours, theirs, truth in (("params", res.params, ref.params, exact.params),
                                          ("bse", res.bse, ref.bse, bse)):  # fmt: skip
            got, sm_got = correct_digits(ours, truth), correct_digits(theirs, truth)
            # the worst coefficient of each, up to 10 digits: past that, both are rounding
            # (elementwise, a digit either way is luck)
            assert got.min() >= min(sm_got.min(), 10) - 0.5, (cov_type, name, got, sm_got)
            if kind == "scaled":
                assert got.min() >= 13, (cov_type, name, got)
        np.testing.assert_allclose(res.tvalues, res.params / res.bse, rtol=1e-15)


def test_normal_equations_would_not_pass_the_ill_conditioned_test():
    """The 1e-8 comparison has teeth: solving X'X b = X'y misses statsmodels at cond 1e8."""
    rng = np.random.default_rng(7)
    X = ill_conditioned_design(rng, 200, 5, 1e8, "collinear")
    y = response(rng, X)
    expected = reference(X, y, "nonrobust").params
    normal = np.linalg.solve(X.T @ X, X.T @ y)
    assert not np.allclose(normal, expected, rtol=RTOL, atol=0)
    np.testing.assert_allclose(fit_ols_batch([X], [y])[0].params, expected, rtol=RTOL)


@pytest.mark.parametrize("cov_type", COV_TYPES)
def test_observation_with_leverage_one(cov_type):
    """A dummy for one observation: h_ii = 1, and HC2/HC3 divide rounding noise by 1 - h_ii."""
    rng = np.random.default_rng(1)
    X = np.column_stack([random_design(rng, 60, 3), np.eye(60)[7]])
    y = response(rng, X)
    (res,) = fit_ols_batch([X], [y], cov_type=cov_type)
    if cov_type in ("HC2", "HC3"):
        assert isinstance(res, Unsupported) and "leverage h_ii ~ 1" in res.reason
    else:
        assert_matches(res, X, y, cov_type)


def _good(rng, n=60, k=4):
    X = random_design(rng, n, k)
    return X, response(rng, X)


def _with(X, i, j, value):
    X = X.copy()
    X[i, j] = value
    return X


def _dummies(rng, n):
    D = np.eye(3)[np.arange(n) % 3]  # three dummies summing to one: an implicit constant
    return np.column_stack([D, rng.normal(size=n)])


# name -> (build(rng) -> (X, y), has_constant, words expected in the reason)
BAD = {
    "collinear columns": (
        lambda r: (lambda X, y: (np.column_stack([X, X[:, 1] - 2 * X[:, 2]]), y))(*_good(r)),
        True,
        "rank-deficient",
    ),
    "duplicated column": (
        lambda r: (lambda X, y: (np.column_stack([X, X[:, 1]]), y))(*_good(r)),
        True,
        "rank-deficient",
    ),
    "no rows": (lambda r: _good(r, n=0, k=4), True, "n = 0 <= k = 4"),
    "one row": (lambda r: _good(r, n=1, k=4), True, "n = 1 <= k = 4"),
    "one row, no constant": (lambda r: _good(r, n=1, k=1), False, "n = 1 <= k = 1"),
    "n < k": (lambda r: _good(r, n=3, k=4), True, "n = 3 <= k = 4"),
    "n == k": (lambda r: _good(r, n=4, k=4), True, "n = 4 <= k = 4"),
    "constant y": (lambda r: (_good(r)[0], np.full(60, 2.5)), True, "constant response"),
    "zero y": (lambda r: (_good(r)[0], np.zeros(60)), True, "constant response"),
    "zero y, no constant": (lambda r: (r.normal(size=(60, 3)), np.zeros(60)), False, "perfect fit"),
    "perfect fit": (
        lambda r: (lambda X: (X, X @ [1.0, 2.0, -1.0, 0.5]))(_good(r)[0]),
        True,
        "perfect fit",
    ),
    "NaN in X": (
        lambda r: (lambda X, y: (_with(X, 5, 2, np.nan), y))(*_good(r)),
        True,
        "non-finite values (NaN/inf) in X",
    ),
    "inf in X": (
        lambda r: (lambda X, y: (_with(X, 0, 1, -np.inf), y))(*_good(r)),
        True,
        "non-finite values (NaN/inf) in X",
    ),
    "NaN in y": (
        lambda r: (lambda X, y: (X, np.where(np.arange(60) == 9, np.nan, y)))(*_good(r)),
        True,
        "non-finite values (NaN/inf) in y",
    ),
    "inf in y": (
        lambda r: (lambda X, y: (X, np.where(np.arange(60) == 0, np.inf, y)))(*_good(r)),
        True,
        "non-finite values (NaN/inf) in y",
    ),
    "unclaimed constant": (lambda r: _good(r), False, "column 0 of X is constant"),
    "float32": (
        lambda r: (lambda X, y: (X.astype(np.float32), y))(*_good(r)),
        True,
        "dtype float32",
    ),
    "1-D X": (lambda r: (np.ones(60), r.normal(size=60)), True, "need X (n, k >= 1)"),
    "length mismatch": (lambda r: (lambda X, y: (X, y[:-1]))(*_good(r)), True, "need X (n, k"),
    "claimed constant missing": (
        lambda r: (lambda X, y: (X[:, 1:], y))(*_good(r)),
        True,
        "has_constant=True but X has no constant column",
    ),
}


@pytest.mark.parametrize("cov_type", COV_TYPES)
def test_an_implicit_constant_is_fitted_as_statsmodels_counts_it(cov_type):
    # A dummy per level and no intercept: statsmodels' k_constant = 1 (centered
    # r-squared, df_model k - 1, a robust F of NaN), next to chunks without one.
    rng = np.random.default_rng(11)
    Xs = [_dummies(rng, 60), random_design(rng, 60, 4, None), _dummies(rng, 60)]
    ys = [response(rng, X) for X in Xs]
    results = fit_ols_batch(Xs, ys, cov_type=cov_type, has_constant=False)
    for X, y, res in zip(Xs, ys, results, strict=True):
        assert_matches(res, X, y, cov_type)
    assert [r.df_model for r in results] == [3.0, 4.0, 3.0]
    w = [rng.uniform(0.5, 2, 60) for _ in Xs]
    results = fit_ols_batch(Xs, ys, cov_type=cov_type, has_constant=False, weights=w)
    for X, y, wi, res in zip(Xs, ys, w, results, strict=True):
        ref = sm.WLS(y, X, weights=wi).fit(cov_type=cov_type)
        for name in ("params", "bse", "pvalues", "rsquared", "rsquared_adj", "llf", "aic"):
            np.testing.assert_allclose(getattr(res, name), getattr(ref, name), rtol=RTOL)
        assert res.df_model == ref.df_model


@pytest.mark.parametrize("cov_type", COV_TYPES)
@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_chunk_is_unsupported_and_leaves_the_others_alone(case, cov_type):
    build, has_constant, words = BAD[case]
    rng = np.random.default_rng(len(case))
    X_bad, y_bad = build(rng)
    goods = [random_design(rng, 60, 4, 0 if has_constant else None) for _ in range(3)]
    goods = [(X, response(rng, X)) for X in goods]  # same shape as most bad chunks
    Xs = [goods[0][0], X_bad, goods[1][0], goods[2][0]]
    ys = [goods[0][1], y_bad, goods[1][1], goods[2][1]]
    results = fit_ols_batch(Xs, ys, cov_type=cov_type, has_constant=has_constant)
    bad = results[1]
    assert isinstance(bad, Unsupported) and isinstance(bad, Exception)
    assert words in bad.reason and str(bad) == bad.reason
    alone = fit_ols_batch(
        [g[0] for g in goods], [g[1] for g in goods], cov_type=cov_type, has_constant=has_constant
    )
    for res, solo, (X, y) in zip([results[0], *results[2:]], alone, goods, strict=True):
        assert_matches(res, X, y, cov_type)
        for name in ARRAYS:  # a neighbour in the batch changes nothing, not even rounding
            np.testing.assert_array_equal(getattr(res, name), getattr(solo, name))


def test_what_statsmodels_does_with_the_bad_chunks():
    """The fallback answers the engine defers to (so a change in statsmodels shows up here)."""
    rng = np.random.default_rng(3)
    X, y = _good(rng)
    with pytest.warns(Warning, match="rank-deficient"):  # fits, minimum-norm, df_model lowered
        res = sm.OLS(y, np.column_stack([X, X[:, 1]])).fit()
    assert res.df_model == 3 and np.isfinite(res.params).all()
    with pytest.raises(MissingDataError):
        sm.OLS(y, _with(X, 5, 2, np.nan)).fit()
    assert np.isnan(sm.OLS(np.where(np.arange(60) == 9, np.nan, y), X).fit().params).all()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert np.isinf(sm.OLS(y[:3], X[:3]).fit().bse).all()  # n < k
        assert not np.isfinite(sm.OLS(np.full(60, 2.5), X).fit().rsquared)  # constant y
    res = sm.OLS(y, X).fit(cov_type="HC1")
    assert not res.use_t  # robust p-values and intervals use the normal distribution
    X = ill_conditioned_design(rng, 200, 5, 1e8, "collinear")
    with pytest.warns(ValueWarning, match="full rank"):  # the robust F the engine reports as None
        assert np.isfinite(reference(X, response(rng, X), "HC1").fvalue)


def test_mixed_shapes_in_one_call_keep_order():
    rng = np.random.default_rng(11)
    shapes = [(250, 6), (40, 3), (250, 6), (17, 2), (40, 3), (250, 6), (8, 1)]
    Xs = [random_design(rng, n, k) for n, k in shapes]
    Xs[::2] = [np.asfortranarray(X) for X in Xs[::2]]  # e.g. from patsy: same numbers
    ys = [response(rng, X) for X in Xs]
    for cov_type in COV_TYPES:
        for res, X, y in zip(fit_ols_batch(Xs, ys, cov_type=cov_type), Xs, ys, strict=True):
            assert_matches(res, X, y, cov_type)


def test_cov_type_names():
    rng = np.random.default_rng(5)
    X, y = _good(rng)
    for wrong in ("HC4", "bogus", "robust"):
        with pytest.raises(ValueError, match=wrong):
            fit_ols_batch([X], [y], cov_type=wrong)
    lower = fit_ols_batch([X], [y], cov_type="hc1")[0]  # statsmodels accepts "hc1" too
    np.testing.assert_array_equal(lower.bse, fit_ols_batch([X], [y], cov_type="HC1")[0].bse)
    (hac,) = fit_ols_batch([X], [y], cov_type="HAC")  # statsmodels-only: falls back
    assert isinstance(hac, Unsupported) and "'HAC'" in hac.reason
    with pytest.raises(ValueError, match="2 design matrices but 1 responses"):
        fit_ols_batch([X, X], [y])
    assert fit_ols_batch([], []) == []


def test_integer_data_is_accepted():
    rng = np.random.default_rng(9)
    X = np.column_stack([np.ones(50, dtype=int), rng.integers(0, 20, size=(50, 2))])
    y = rng.integers(0, 100, size=50)
    assert_matches(fit_ols_batch([X], [y])[0], X, y, "nonrobust")


def benchmark(n_chunks=10_000, n=250, k=6, repeats=3):
    """fits/s of the engine and of a plain statsmodels loop (best of `repeats`)."""
    rng = np.random.default_rng(0)
    Xs = [random_design(rng, n, k) for _ in range(n_chunks)]
    ys = [response(rng, X) for X in Xs]
    m = min(n_chunks, 2000)  # the statsmodels loop is timed on a subset

    def best(f):
        times = []
        for _ in range(repeats):
            t = time.process_time()
            f()
            times.append(time.process_time() - t)
        return min(times)

    def read_all(r):
        return (
            r.params,
            r.bse,
            r.pvalues,
            r.conf_int(),
            r.rsquared_adj,
            r.aic,
            r.bic,
            r.fvalue,
            r.condition_number,
        )

    def sm_loop(cov_type, read):
        for X, y in zip(Xs[:m], ys[:m], strict=True):
            res = sm.OLS(y, X).fit(cov_type=cov_type)
            if read:
                read_all(res)

    for cov_type in ("nonrobust", "HC1"):
        t_batch = best(lambda c=cov_type: fit_ols_batch(Xs, ys, cov_type=c)) / n_chunks
        t_fit = best(lambda c=cov_type: sm_loop(c, read=False)) / m
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            t_all = best(lambda c=cov_type: sm_loop(c, read=True)) / m
        print(
            f"{cov_type:9s} {n_chunks} chunks of {n}x{k}: batched {1 / t_batch:8.0f} fits/s;"
            f" sm fit() {1 / t_fit:6.0f}/s ({t_fit / t_batch:.1f}x);"
            f" sm fit()+statistics {1 / t_all:6.0f}/s ({t_all / t_batch:.1f}x)"
        )


if __name__ == "__main__":
    benchmark(*(int(a) for a in sys.argv[1:2]))


@pytest.mark.parametrize("cov_type", COV_TYPES)
@pytest.mark.parametrize(("n", "k", "const_at"), [(60, 3, 0), (250, 6, 2), (40, 2, None)])
def test_weighted_stack_matches_statsmodels_wls(cov_type, n, k, const_at):
    """fit_ols_stack with weights: sm.WLS's numbers (the whitened fit, the weighted
    centered total sum of squares, the weights' term in the log-likelihood)."""
    from pipeline.workloads.regressions.batched import fit_ols_stack

    rng = np.random.default_rng([n, k, 7, COV_TYPES.index(cov_type)])
    X = np.stack([random_design(rng, n, k, const_at) for _ in range(9)])
    y = np.stack([response(rng, x) for x in X])
    w = rng.uniform(0.2, 3.0, size=y.shape)
    w[4, 0] = 0.0  # not positive: handed back
    fit = fit_ols_stack(X, y, cov_type=cov_type, has_constant=const_at is not None, weights=w)
    assert not fit.ok[4] and "weights" in fit.reasons[4]
    for b in np.flatnonzero(fit.ok):
        ref = sm.WLS(y[b], X[b], weights=w[b]).fit(cov_type=cov_type)
        for name, expected in (("params", ref.params), ("bse", ref.bse),
                               ("tvalues", ref.tvalues), ("pvalues", ref.pvalues),
                               ("ci_low", ref.conf_int()[:, 0]),
                               ("ci_high", ref.conf_int()[:, 1])):  # fmt: skip
            atol = 1e-13 * np.abs(expected).max()
            np.testing.assert_allclose(
                getattr(fit, name)[b], expected, rtol=RTOL, atol=atol, err_msg=name
            )
        for name in ("rsquared", "rsquared_adj", "llf", "aic", "bic", "condition_number"):
            atol = 1e-13 if name.startswith("rsquared") else 0.0
            np.testing.assert_allclose(
                getattr(fit, name)[b], getattr(ref, name), rtol=RTOL, atol=atol, err_msg=name
            )
    assert fit.ok.sum() == 8


def test_the_f_tail_is_scipys_bit_for_bit_without_importing_scipy_stats():
    from scipy import stats

    from pipeline.workloads.regressions.stack import _f_sf

    x = np.concatenate([np.random.default_rng(1).exponential(3, 10_000),
                        [-1.0, -1e-16, 0.0, 1e-300, 1e6, np.inf, np.nan]])  # fmt: skip
    for dfn, dfd in [(1, 5), (3, 100), (7, 243.0), (12, 3)]:
        np.testing.assert_array_equal(_f_sf(x, dfn, dfd), stats.f.sf(x, dfn, dfd))


def test_workers_import_statsmodels_only_for_jobs_the_batched_engine_does_not_fit():
    from pipeline.workloads.regressions import RegressionJob, RegressionWorkload

    def modules(**settings):
        job = RegressionJob(data="d", chunk_by="c", formula="y ~ x", **settings)
        return RegressionWorkload(job, "r").worker_modules

    assert "statsmodels.api" not in modules()
    assert "statsmodels.api" not in modules(model="wls", weights="w", cov_type="HC1")
    assert "statsmodels.api" in modules(engine="statsmodels")
    assert "statsmodels.api" in modules(model="logit")
