"""NIST's Statistical Reference Datasets for linear least squares (tests/data/strd):
every engine's estimates and standard errors against the certified values, scored in
correct digits (-log10 of the relative error; the absolute one for a certified 0).

Every estimate and standard error has at least 6 correct digits, through every engine,
OLS and WLS, in-process and through the runner; and at least as many as statsmodels'
own fit of the same design wherever statsmodels has 6 or more (counted up to 10: past
that both are at rounding level, and which is ahead is luck), except where the
certified value is 0 (there both are rounding noise)."""

from __future__ import annotations

from decimal import Decimal
from fractions import Fraction

import numpy as np
import pytest

from harness.exact_ols import ExactFit
from harness.strd import (
    SETS,
    certified,
    digits,
    fitted,
    frame,
    settings,
    statsmodels_digits,
    write,
)
from pipeline import RunOptions, run_job
from pipeline.results import results_table
from pipeline.workloads.regressions import RegressionJob, RegressionWorkload

MIN_DIGITS = 6.0
COUNTED = 10.0


def assert_accurate(name: str, params, bse, what: str) -> None:
    got_b, got_s = digits(name, params, bse)
    sm_b, sm_s = statsmodels_digits(name)
    beta, se = certified(name)
    for label, got, theirs, exact in (("estimates", got_b, sm_b, beta),
                                      ("std errors", got_s, sm_s, se)):  # fmt: skip
        assert got.min() >= MIN_DIGITS, (name, what, label, got)
        wanted = np.minimum(theirs, COUNTED) - 0.5  # half a digit of rounding luck
        # A certified 0 (the standard errors of a perfect fit, Wampler 1 and 2) is
        # scored by the size of each fit's rounding noise, which moves with the
        # machine's BLAS kernels (statsmodels' Wampler 1: 7.5 digits on one host, 8.4
        # on another): at least MIN_DIGITS there, not statsmodels' noise.
        worse = (theirs >= MIN_DIGITS) & (got < wanted) & (exact != 0)
        assert not worse.any(), (name, what, label, got, theirs)


@pytest.mark.parametrize("name", sorted(SETS))
def test_the_copied_data_give_the_certified_values_exactly(name):
    """The data as copied, fitted in rational arithmetic (the decimals as printed, the
    polynomial's powers exact), reproduce every certified value to its 15 digits."""
    s = SETS[name]
    x = [[Fraction(repr(float(v))) for v in (row if isinstance(row, list) else [row])]
         for row in s["x"]]  # fmt: skip
    k = len(s["certified_estimates"])
    if name == "Longley":
        X = [[Fraction(1), *row] for row in x]
    elif name.startswith("NoInt"):
        X = x
    else:
        X = [[row[0] ** j for j in range(k)] for row in x]
    exact = ExactFit(X, [Fraction(repr(float(v))) for v in s["y"]])
    for value, cert in zip(exact.beta, s["certified_estimates"], strict=True):
        c = Fraction(Decimal(cert))
        assert abs(value - c) <= Fraction(5, 10**15) * abs(c), (name, float(value), cert)
    for var, cert in zip(exact.cov_diag(), s["certified_std_errors"], strict=True):
        c = Decimal(cert)
        se = (Decimal(var.numerator) / Decimal(var.denominator)).sqrt()
        assert abs(se - c) <= Decimal("5e-15") * abs(c), (name, se, cert)


def test_statsmodels_alone_loses_digits_here():
    """What the engines improve on: statsmodels' default fit keeps no digit of Filip
    and 5.9 of Wampler 5's estimates (so the tests above are not vacuous)."""
    assert statsmodels_digits("Filip")[0].min() < 1
    assert statsmodels_digits("Wampler5")[0].min() < MIN_DIGITS


@pytest.mark.parametrize("weights", [False, True], ids=["ols", "wls"])
@pytest.mark.parametrize("engine", ["auto", "batched", "statsmodels"])
def test_every_engine_reaches_the_certified_values(tmp_path, engine, weights):
    for name in sorted(SETS):
        data = write(frame(name, weights), tmp_path / name)
        coefs, models = fitted(data, name, engine, weights)
        assert models.error_type.isna().all(), (name, models.error_message.tolist())
        assert_accurate(name, coefs.estimate, coefs.std_error, f"{engine}, wls={weights}")
        # perfect fits (Wampler 1 and 2) are handed to statsmodels by the batched engine
        perfect = name in ("Wampler1", "Wampler2")
        expected = "statsmodels" if engine == "statsmodels" or perfect else "batched"
        assert models.engine.tolist() == [expected], name
        assert models.method.iloc[0] in {"qr", "qr+refined", "pinv", "pinv+refined"}


def test_wls_with_unit_weights_is_ols(tmp_path):
    for name in ("Filip", "Longley", "Wampler5"):
        df = frame(name)
        df["w"] = 1.0
        data = write(df, tmp_path / name)
        for engine in ("batched", "statsmodels"):
            ols, _ = fitted(data, name, engine)
            job = RegressionJob(data=data, chunk_by="set", engine=engine, model="wls",
                                weights="w", **settings(name))  # fmt: skip
            w = RegressionWorkload(job, "s")
            w.preflight()
            wls = w.tables(0, w.fit_range(0, 1))[0].to_pandas()
            np.testing.assert_array_equal(wls.estimate, ols.estimate)
            np.testing.assert_array_equal(wls.std_error, ols.std_error)


def test_filip_is_fitted_not_refused_and_a_collinear_design_still_is(tmp_path):
    """Filip's columns differ by 15 orders of magnitude in scale but are independent;
    adding a column equal to x + x**2 makes the design truly rank-deficient."""
    df = frame("Filip")
    df["z"] = df.x + df.x**2
    data = write(df, tmp_path / "f")
    for engine in ("auto", "statsmodels"):
        _, models = fitted(data, "Filip", engine)
        assert models.error_type.isna().all()
        job = RegressionJob(data=data, chunk_by="set", engine=engine,
                            formula=settings("Filip")["formula"] + " + z")  # fmt: skip
        w = RegressionWorkload(job, "s")
        w.preflight()
        models = w.tables(0, w.fit_range(0, 1))[1].to_pandas()
        assert models.error_type.tolist() == ["SingularDesign"]
        message = models.error_message.iloc[0]
        assert "rank 11 < 12 columns" in message and "x, I(x ** 2)" in message
        assert message.endswith("z)")


def test_the_runner_reaches_the_certified_values(tmp_path, client):
    """Each set as a job over a parquet file, run on the embedded cluster."""
    for name in sorted(SETS):
        data = write(frame(name), tmp_path / name)
        job = RegressionJob(data=data, chunk_by="set", **settings(name))
        out = tmp_path / f"out-{name}"
        s = run_job(RegressionWorkload(job, "strd"), RunOptions(output=str(out), progress=False),
                    client, echo=lambda m: None)  # fmt: skip
        assert s.complete and not s.failures, (name, s.failures)
        coefs = results_table(str(out), "coefficients").to_pandas()
        assert_accurate(name, coefs.estimate, coefs.std_error, "runner")
