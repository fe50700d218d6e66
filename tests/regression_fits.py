"""Regressions for the tests: a workload on a dataset, its fits of every chunk in this
process, and a chunk's coefficients compared with statsmodels' results."""

from __future__ import annotations

import numpy as np

from pipeline.workloads.regressions import RegressionJob, RegressionWorkload

FORMULA = "y ~ x1 + x2 + x3 + C(sector)"


def workload(data, **settings) -> RegressionWorkload:
    settings.setdefault("chunk_by", "chunk")
    if "endog" not in settings:
        settings.setdefault("formula", FORMULA)
    w = RegressionWorkload(RegressionJob(data=data, **settings), "reg")
    w.preflight()
    return w


def fit_all(w):
    fits = w.fit_range(0, w.n_units)
    coefs, models, _timings = w.tables(0, fits)
    return coefs.to_pandas(), models.to_pandas()


def assert_same(coefs, chunk_id, res, names=None, alpha=0.05):
    got = coefs[coefs.chunk_id == chunk_id]
    names = list(names if names is not None else res.params.index)
    assert got.term.tolist() == names
    np.testing.assert_allclose(got.estimate, np.asarray(res.params), rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(got.std_error, np.asarray(res.bse), rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(got.statistic, np.asarray(res.tvalues), rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(got.p_value, np.asarray(res.pvalues), rtol=1e-8, atol=1e-14)
    ci = np.asarray(res.conf_int(alpha))
    np.testing.assert_allclose(got.ci_low, ci[:, 0], rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(got.ci_high, ci[:, 1], rtol=1e-9, atol=1e-12)
