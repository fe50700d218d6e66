"""Per-chunk regressions: results equal to statsmodels on the same chunk, bad chunks and
bad jobs, resume, results tables, verify, S3."""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
import statsmodels.api as sm
import statsmodels.formula.api as smf
import support.stored as stored
from support.regression_fits import FORMULA, assert_same, fit_all, panel, workload, write

from pipeline import ConfigError, InputError, RunOptions, run_job
from pipeline.inputs.chunks import plan_chunks
from pipeline.inputs.dataset import discover
from pipeline.results import results_table, summarize
from pipeline.storage import LocalStore
from pipeline.workloads.regressions import (
    RegressionJob,
    RegressionWorkload,
    write_regression_data,
)
from pipeline.workloads.regressions.generate import chunk_frame


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    path = tmp_path_factory.mktemp("reg") / "data"
    df = panel()
    return write(df, path), df


CASES = {
    "ols": ({}, lambda c: smf.ols(FORMULA, c).fit()),
    "ols-hc1": ({"cov_type": "HC1"}, lambda c: smf.ols(FORMULA, c).fit(cov_type="HC1")),
    "ols-hac": (
        {"cov_type": "HAC", "maxlags": 3},
        lambda c: smf.ols(FORMULA, c).fit(cov_type="HAC", cov_kwds={"maxlags": 3}),
    ),
    "ols-cluster": (
        {"cov_type": "cluster", "cluster": "g"},
        lambda c: smf.ols(FORMULA, c).fit(cov_type="cluster", cov_kwds={"groups": c["g"]}),
    ),
    "ols-log": (
        {"formula": "y ~ x1 + np.log(x_pos) + C(sector)"},
        lambda c: smf.ols("y ~ x1 + np.log(x_pos) + C(sector)", c).fit(),
    ),
    "wls": ({"model": "wls", "weights": "w"}, lambda c: smf.wls(FORMULA, c, weights=c["w"]).fit()),
    "glm-binomial": (
        {"model": "glm", "family": "binomial", "formula": "y_bin ~ x1 + x2 + C(sector)"},
        lambda c: smf.glm("y_bin ~ x1 + x2 + C(sector)", c, family=sm.families.Binomial()).fit(),
    ),
    "glm-poisson-log": (
        {"model": "glm", "family": "poisson", "link": "log", "formula": "y_count ~ x1 + x2"},
        lambda c: smf.glm(
            "y_count ~ x1 + x2", c, family=sm.families.Poisson(link=sm.families.links.Log())
        ).fit(),
    ),
    "logit": (
        {"model": "logit", "formula": "y_bin ~ x1 + x2 + C(sector)"},
        lambda c: smf.logit("y_bin ~ x1 + x2 + C(sector)", c).fit(disp=0),
    ),
    "probit-hc0": (
        {"model": "probit", "formula": "y_bin ~ x1 + x2", "cov_type": "HC0"},
        lambda c: smf.probit("y_bin ~ x1 + x2", c).fit(disp=0, cov_type="HC0"),
    ),
    "poisson": (
        {"model": "poisson", "formula": "y_count ~ x1 + x2 + x3", "fit_options": "maxiter=100"},
        lambda c: smf.poisson("y_count ~ x1 + x2 + x3", c).fit(disp=0, maxiter=100),
    ),
    "quantreg": ({"model": "quantreg", "q": 0.3}, lambda c: smf.quantreg(FORMULA, c).fit(q=0.3)),
    "rlm": (
        {"model": "rlm", "norm": "TukeyBiweight"},
        lambda c: smf.rlm(FORMULA, c, M=sm.robust.norms.TukeyBiweight()).fit(),
    ),
}


#: Cases the batched engine fits under engine = "auto" (the others: statsmodels).
BATCHED_CASES = {"ols", "ols-hc1", "ols-log", "wls"}


@pytest.mark.parametrize("engine", ["auto", "statsmodels"])
@pytest.mark.parametrize("case", list(CASES))
def test_every_model_equals_statsmodels_on_the_chunk(dataset, case, engine):
    data, df = dataset
    settings, reference = CASES[case]
    coefs, models = fit_all(workload(data, engine=engine, **settings))
    assert models.error_type.isna().all(), models.error_message.dropna().tolist()
    assert models.chunk_id.tolist() == list(range(8))
    batched = engine == "auto" and case in BATCHED_CASES
    assert models.engine.tolist() == ["batched" if batched else "statsmodels"] * 8
    for c in (0, 3, 7):
        res = reference(df[df.chunk == c].reset_index(drop=True))
        assert_same(coefs, c, res)
        row = models.iloc[c]
        assert row.nobs == res.nobs
        assert row.converged
        if case not in ("quantreg", "rlm"):
            assert row.llf == pytest.approx(res.llf, rel=1e-9)
        if case.startswith("ols"):
            assert row.rsquared == pytest.approx(res.rsquared, rel=1e-9)
            assert row.condition_number == pytest.approx(res.condition_number, rel=1e-9)


def test_endog_exog_arrays_equal_sm_ols(dataset):
    data, df = dataset
    coefs, _ = fit_all(workload(data, endog="y", exog="x1,x2"))
    c = df[df.chunk == 2]
    res = sm.OLS(c["y"], sm.add_constant(c[["x1", "x2"]])).fit()
    assert_same(coefs, 2, res, ["const", "x1", "x2"])


@pytest.mark.parametrize("engine", ["batched", "auto"])
def test_batched_engine_equals_statsmodels(dataset, engine):
    data, _df = dataset
    for cov in ("nonrobust", "HC3", "HAC"):
        extra = {"maxlags": 2} if cov == "HAC" else {}
        a, ma = fit_all(workload(data, engine=engine, cov_type=cov, **extra))
        b, mb = fit_all(workload(data, engine="statsmodels", cov_type=cov, **extra))
        for col in ("estimate", "std_error", "p_value", "ci_low", "ci_high"):
            np.testing.assert_allclose(a[col], b[col], rtol=1e-8, atol=1e-12)
        np.testing.assert_allclose(ma.rsquared, mb.rsquared, rtol=1e-10)
        assert set(ma.engine) == {"statsmodels" if cov == "HAC" else "batched"}
        assert set(mb.engine) == {"statsmodels"}


def test_auto_engine_on_uneven_chunks_equals_statsmodels(tmp_path):
    """Chunks of different row counts (gathered per row count), one missing a level and
    one with a NaN row (built on their own), a collinear one (handed back to
    statsmodels), and intervals at another alpha: the same tables as statsmodels'."""
    df = panel(chunks=9, rows=80)
    df = df[(df.chunk % 3 != 1) | (df.t < 70)]  # chunks 1, 4, 7 have 70 rows
    df.loc[(df.chunk == 2) & (df.sector == "A"), "sector"] = "B"
    df.loc[(df.chunk == 5) & (df.t == 3), "x2"] = np.nan
    c8 = df.chunk == 8
    df.loc[c8, "x3"] = df.loc[c8, "x1"] - df.loc[c8, "x2"]
    data = write(df.reset_index(drop=True), tmp_path / "d")
    a, ma = fit_all(workload(data, alpha=0.1, cov_type="HC2"))
    b, mb = fit_all(workload(data, alpha=0.1, cov_type="HC2", engine="statsmodels"))
    assert a.term.tolist() == b.term.tolist() and a.chunk_id.tolist() == b.chunk_id.tolist()
    for col in ("estimate", "std_error", "statistic", "p_value", "ci_low", "ci_high"):
        np.testing.assert_allclose(a[col], b[col], rtol=1e-8, atol=1e-12)
    for col in ("nobs", "nobs_dropped", "error_type", "error_message", "warnings"):
        assert ma[col].tolist() == mb[col].tolist(), col
    for col in ("df_model", "df_resid", "rsquared", "rsquared_adj", "llf", "aic", "bic"):
        np.testing.assert_allclose(ma[col], mb[col], rtol=1e-9)
    assert ma.error_type[8] == "SingularDesign" and "C(sector)[T.B]" not in set(
        a[a.chunk_id == 2].term
    )
    assert ma.nobs.tolist()[:3] == [80, 70, 80] and ma.nobs_dropped[5] == 1
    assert ma.engine.tolist() == ["batched"] * 8 + ["statsmodels"]
    for c in (1, 2, 5):
        chunk = df[df.chunk == c]
        assert_same(a, c, smf.ols(FORMULA, chunk).fit(cov_type="HC2"), alpha=0.1)


def test_chunk_missing_a_level_gets_the_chunk_alone_answer(tmp_path):
    df = panel(chunks=4, rows=80)
    # chunk 1 lacks A (the reference level elsewhere), chunk 2 has only B and C,
    # chunk 3 has a level E that no other chunk has.
    df.loc[(df.chunk == 1) & (df.sector == "A"), "sector"] = "B"
    df.loc[(df.chunk == 2), "sector"] = np.where(df.loc[df.chunk == 2, "t"] % 2, "B", "C")
    df.loc[(df.chunk == 3) & (df.t < 15), "sector"] = "E"
    formula = "y ~ x1 + C(sector) + C(sector):x2"
    data = write(df, tmp_path / "d")
    coefs, models = fit_all(workload(data, formula=formula))
    assert models.error_type.isna().all(), models.error_message.dropna().tolist()
    for c in range(4):
        assert_same(coefs, c, smf.ols(formula, df[df.chunk == c]).fit())
    assert "C(sector)[T.B]" not in coefs[coefs.chunk_id == 1].term.tolist()
    # WLS too: the chunks lacking a level are batched one by one, with their weights.
    coefs, models = fit_all(workload(data, formula=formula, model="wls", weights="w"))
    assert models.engine.tolist() == ["batched"] * 4
    for c in range(4):
        chunk = df[df.chunk == c]
        assert_same(coefs, c, smf.wls(formula, chunk, weights=chunk["w"]).fit())
    # A formula with a stateful transform is built per chunk, and still matches.
    coefs, _ = fit_all(workload(data, formula="y ~ center(x1) + C(sector)"))
    for c in range(4):
        assert_same(coefs, c, smf.ols("y ~ center(x1) + C(sector)", df[df.chunk == c]).fit())


def test_zero_weights_fit_as_statsmodels_does_negative_ones_fail(tmp_path):
    # Weight 0 masks a row: statsmodels fits such a chunk (the row still counts in
    # nobs), and so must the engine, not fail it as BadWeights.
    df = panel(chunks=4, rows=60)
    c = df.chunk
    df.loc[df.index[c == 0][:5], "w"] = 0.0  # some rows weigh nothing
    df.loc[c == 1, "w"] = 0.0  # every row
    df.loc[df.index[c == 2][:1], "w"] = -1.0
    data = write(df, tmp_path / "d")
    coefs, models = fit_all(workload(data, model="wls", weights="w"))
    chunk = df[c == 0]
    res = smf.wls(FORMULA, chunk, weights=chunk["w"]).fit()
    assert_same(coefs, 0, res)
    assert models.nobs[0] == res.nobs == 60 and models.df_resid[0] == res.df_resid
    assert models.error_type[1] == "TooFewRows"
    assert "0 rows of positive weight for 7 parameters" in models.error_message[1]
    assert (
        models.error_type[2] == "BadWeights" and "1 weight is negative" in models.error_message[2]
    )
    assert pd.isna(models.error_type[3])


@pytest.mark.parametrize("engine", ["auto", "statsmodels"])
def test_hc2_hc3_with_a_row_fitted_exactly_fail_the_chunk_saying_why(tmp_path, engine):
    # A category level with one row has leverage 1: HC3 divides by 1 - h_ii, so the
    # standard errors would be rounding noise; the chunk fails, saying why.
    df = panel(chunks=3, rows=60)
    df.loc[df.index[df.chunk == 1][0], "sector"] = "Z"  # one row of its own level
    data = write(df, tmp_path / "d")
    coefs, models = fit_all(workload(data, cov_type="HC3", engine=engine))
    assert models.error_type[1] == "HighLeverage", models.error_message[1]
    assert "leverage 1" in models.error_message[1] and "HC1" in models.error_message[1]
    for c in (0, 2):
        assert_same(coefs, c, smf.ols(FORMULA, df[df.chunk == c]).fit(cov_type="HC3"))


def test_a_chunk_of_one_cluster_fails_saying_so(tmp_path):
    # statsmodels' own error there: "ZeroDivisionError: float division by zero"
    df = panel(chunks=3, rows=60)
    df.loc[df.chunk == 1, "g"] = df.loc[df.chunk == 1, "g"].iloc[0]
    data = write(df, tmp_path / "d")
    _, models = fit_all(workload(data, cov_type="cluster", cluster="g"))
    assert models.error_type[1] == "TooFewClusters", models.error_message[1]
    assert "1 cluster (g = " in models.error_message[1]
    assert "np." not in models.error_message[1]  # the value, not numpy's repr of it
    assert "at least 2" in models.error_message[1]
    assert pd.isna(models.error_type[0]) and pd.isna(models.error_type[2])


def test_explicit_contrasts_are_designed_once_per_task_and_match_each_chunk_alone(tmp_path):
    df = panel(chunks=5, rows=80)
    # chunk 1 lacks C (Treatment('C')'s reference: the chunk alone cannot be designed),
    # chunk 2 lacks A (a Sum or Helmert coding of three levels has other values).
    df.loc[(df.chunk == 1) & (df.sector == "C"), "sector"] = "B"
    df.loc[(df.chunk == 2) & (df.sector == "A"), "sector"] = "D"
    data = write(df, tmp_path / "d")
    for formula in (
        "y ~ x1 + C(sector, Treatment('C'))",
        "y ~ x1 + C(sector, Sum) + C(sector, Helmert):x2",
        "y ~ C(sector, Poly) + C(sector, levels=['D', 'C', 'B', 'A']):x1",
    ):
        w = workload(data, formula=formula)
        assert w.info.explicit_contrasts and not w.info.exact_only
        coefs, models = fit_all(w)
        for c in range(5):
            chunk = df[df.chunk == c]
            if c == 1 and "Treatment('C')" in formula:
                assert models.error_type[c] == "DesignError", formula
                continue
            if c in (1, 2) and "levels=" in formula:  # a level it lacks: a zero column
                assert models.error_type[c] == "SingularDesign", formula
                continue
            assert pd.isna(models.error_type[c]), (formula, c, models.error_message[c])
            assert_same(coefs, c, smf.ols(formula, chunk).fit())
        assert models.engine.tolist().count("batched") >= 3  # the chunks with every level


def test_a_dummy_per_level_without_intercept_is_batched_and_matches_statsmodels(dataset):
    # "0 + C(sector)": the dummies span the intercept (statsmodels' implicit constant).
    data, df = dataset
    formula = "y ~ 0 + C(sector) + x1"
    coefs, models = fit_all(workload(data, formula=formula, cov_type="HC1"))
    assert set(models.engine) == {"batched"}
    for c in range(3):
        res = smf.ols(formula, df[df.chunk == c]).fit(cov_type="HC1")
        assert_same(coefs, c, res)
        np.testing.assert_allclose(models.rsquared[c], res.rsquared, rtol=1e-9)
        assert models.df_model[c] == res.df_model


def test_chunk_by_a_pandas_categorical_column(tmp_path):
    # pandas writes a categorical as a parquet dictionary column (with its own type in
    # the file's schema): chunk keys are its values, alone or with another column.
    df = panel(chunks=4, rows=60)
    df["sector"] = df["sector"].astype("category")
    path = tmp_path / "d"
    path.mkdir()
    df.to_parquet(path / "data.parquet", row_group_size=50)
    assert pa.types.is_dictionary(pq.read_schema(path / "data.parquet").field("sector").type)
    for by in ("sector", "sector,chunk"):
        w = workload(str(path), chunk_by=by, formula="y ~ x1")
        coefs, models = fit_all(w)
        keys = df[by.split(",")].drop_duplicates().sort_values(by.split(",")).astype(str)
        assert w.n_units == len(keys) and models.error_type.isna().all()
        for c, key in enumerate(keys.itertuples(index=False)):
            rows = (df[by.split(",")].astype(str) == pd.Series(key._asdict())).all(axis=1)
            assert_same(coefs, c, smf.ols("y ~ x1", df[rows]).fit())


def test_files_whose_schemas_drifted(tmp_path):
    # Files written on different days: a regressor stored as integers in one, a chunk key
    # as int32 in another, a column added later and one dropped. Numbers read at the
    # widest type, whatever the task; a column some files lack fails a job that uses it.
    df = panel(chunks=6, rows=60)
    df["x1"] = np.round(df["x1"] * 10)
    path = tmp_path / "d"
    path.mkdir()
    parts = [df[df.chunk // 2 == i].copy() for i in range(3)]
    parts[0]["x1"] = parts[0]["x1"].astype(np.int64)
    parts[1]["chunk"] = parts[1]["chunk"].astype(np.int32)
    parts[1]["late"] = 1.0
    parts[2] = parts[2].drop(columns=["w"])
    for i, part in enumerate(parts):
        part.to_parquet(path / f"part-{i}.parquet", index=False)
    w = workload(str(path), formula="y ~ x1 + x2")
    coefs, models = fit_all(w)
    assert models.error_type.isna().all() and w.n_units == 6
    for c in range(6):
        expected = smf.ols("y ~ x1 + x2", df[df.chunk == c]).fit()
        assert_same(coefs, c, expected)
        alone = w.tables(c, w.fit_range(c, c + 1))[0].to_pandas()  # a task of one file
        assert_same(alone, c, expected)
    for settings, column, lacking in (
        ({"formula": "y ~ x1 + late"}, "late", "part-0.parquet"),
        ({"formula": "y ~ x1", "model": "wls", "weights": "w"}, "w", "part-2.parquet"),
    ):
        with pytest.raises(InputError, match=f"{lacking} has no column '{column}'"):
            workload(str(path), **settings)
    parts[2]["x2"] = "text"
    parts[2].to_parquet(path / "part-2.parquet", index=False)
    with pytest.raises(
        InputError, match=r"column 'x2' is (large_)?string in dataset file .*part-2"
    ):
        workload(str(path), formula="y ~ x1 + x2")


def test_column_names_with_dots_and_spaces(tmp_path):
    # Exported data names columns "sales.usd" or "x 1": parquet paths join nested
    # fields with dots, so the footers' "sales.usd" must not be read as a field "sales".
    df = panel(chunks=3, rows=40).rename(columns={"y": "sales.usd", "x1": "x 1"})
    df["s"] = [{"k": i} for i in range(len(df))]  # a nested column: path "s.k"
    path = tmp_path / "d"
    path.mkdir()
    df.to_parquet(path / "data.parquet", index=False)
    renamed = df.rename(columns={"sales.usd": "y", "x 1": "x1"})
    for settings in ({"formula": 'Q("sales.usd") ~ Q("x 1") + x2'},
                     {"endog": "sales.usd", "exog": "x 1,x2"}):  # fmt: skip
        coefs, models = fit_all(workload(str(path), **settings))
        assert models.error_type.isna().all()
        for c in range(3):
            expected = smf.ols("y ~ x1 + x2", renamed[renamed.chunk == c]).fit()
            np.testing.assert_allclose(coefs[coefs.chunk_id == c].estimate, expected.params,
                                       rtol=1e-9)  # fmt: skip


def test_decimal_columns_are_numbers(tmp_path):
    # Columns exported from a database as decimals: regressors to a formula and to
    # endog/exog, not categoricals of one level per distinct value (which patsy makes
    # of pandas' Decimal objects), and each value the float nearest it.
    import decimal

    df = panel(chunks=4, rows=60)
    table = pa.Table.from_pandas(df, preserve_index=False)
    exact = [decimal.Decimal(f"{v:.6f}") for v in df["x1"]]
    j = table.schema.get_field_index("x1")
    table = table.set_column(j, "x1", pa.array(exact, pa.decimal128(18, 6)))
    path = tmp_path / "d"
    path.mkdir()
    pq.write_table(table, path / "data.parquet")
    as_floats = df.assign(x1=[float(v) for v in exact])
    for settings in ({"formula": "y ~ x1 + x2"}, {"endog": "y", "exog": "x1,x2"}):
        coefs, models = fit_all(workload(str(path), **settings))
        assert models.error_type.isna().all() and (models.df_model == 2).all()
        for c in range(4):
            expected = smf.ols("y ~ x1 + x2", as_floats[as_floats.chunk == c]).fit()
            got = coefs[coefs.chunk_id == c].estimate
            np.testing.assert_allclose(got, expected.params, rtol=1e-9, atol=1e-12)


def test_design_slices_cover_a_task_in_order_within_the_cells():
    from pipeline.workloads.regressions.design import SLICE_CELLS, design_slices

    offsets = np.array([0, 100, 250, 250, 400, 2000, 2100])  # an empty chunk, a long one
    assert design_slices(offsets, 5) == [(0, 6)]  # all within one slice's cells
    wide = SLICE_CELLS // 200  # a table this wide: slices of 200 rows at most, or a chunk
    assert design_slices(offsets, wide) == [(0, 1), (1, 3), (3, 4), (4, 5), (5, 6)]
    assert design_slices(np.array([0]), 5) == []


@pytest.mark.parametrize("settings", [{}, {"cov_type": "HC1"}, {"model": "wls", "weights": "w"},
                                      {"cov_type": "HAC", "maxlags": 2}])  # fmt: skip
def test_a_task_fitted_in_slices_gives_the_tables_of_a_whole_design(tmp_path, monkeypatch,
                                                                      settings):  # fmt: skip
    from pipeline.workloads.regressions import design

    # Slices with other level sets than the task's: chunk 1 lacks A, chunk 3 has E.
    df = panel(chunks=6, rows=60)
    df.loc[(df.chunk == 1) & (df.sector == "A"), "sector"] = "B"
    df.loc[(df.chunk == 3) & (df.t < 15), "sector"] = "E"
    w = workload(write(df, tmp_path / "d"), **settings)
    whole = fit_all(w)
    monkeypatch.setattr(design, "SLICE_CELLS", 60 * 2 * len(w.columns))  # 2 chunks a slice
    sliced = fit_all(w)
    for a, b in zip(whole, sliced, strict=True):
        a, b = (
            a.drop(columns=["fit_seconds"], errors="ignore"),
            b.drop(columns=["fit_seconds"], errors="ignore"),
        )
        pd.testing.assert_frame_equal(a, b, check_exact=True)
    assert (sliced[1].engine == "batched").any() == (settings.get("cov_type") != "HAC")


@pytest.mark.parametrize("formula", ["y ~ np.log(x1)", "y ~ np.log(x1) + C(sector)"])
def test_a_formula_that_makes_values_non_finite_fails_those_chunks_without_warnings(
    tmp_path, formula
):
    # np.log(0): numpy warned from the driver and every worker, naming pandas' internals,
    # beside the chunk's own failure that says the same
    df = panel(chunks=3, rows=60)
    df["x1"] = df.x1.abs() + 1
    df.loc[df.chunk == 1, "x1"] = 0.0
    data = write(df, tmp_path / "d")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _, models = fit_all(workload(data, formula=formula, missing="fail"))
    assert models.error_type.fillna("").tolist() == ["", "NonFiniteValues", ""]
    assert "np.log(x1): 0 NaN, 60 inf" in models.error_message[1]


def test_nan_rows_are_dropped_like_statsmodels_or_fail(tmp_path):
    df = panel(chunks=3, rows=60)
    df.loc[5, "x1"] = np.nan
    df.loc[7, "y"] = np.nan
    data = write(df, tmp_path / "d")
    coefs, models = fit_all(workload(data))
    assert_same(coefs, 0, smf.ols(FORMULA, df[df.chunk == 0]).fit())
    assert models.nobs[0] == 58 and models.nobs_dropped[0] == 2
    assert "dropped 2 rows" in models.warnings[0]
    _, models = fit_all(workload(data, missing="fail"))
    assert models.error_type[0] == "NonFiniteValues"
    assert "x1: 1 NaN" in models.error_message[0] and "response: 1 NaN" in models.error_message[0]
    assert models.error_type[1:].isna().all()
    # dropped NaN rows, then a chunk failing on the -inf that remains: both said
    df.loc[df.chunk == 2, "x_pos"] = 0.0
    data = write(df, tmp_path / "d2")
    _, models = fit_all(workload(data, formula="y ~ x1 + np.log(x_pos)"))
    assert models.error_type[2] == "NonFiniteValues" and models.nobs_dropped[0] == 2
    df.loc[df.index[df.chunk == 2][0], "x1"] = np.nan
    data = write(df, tmp_path / "d3")
    _, models = fit_all(workload(data, formula="y ~ x1 + np.log(x_pos)"))
    assert models.error_type[2] == "NonFiniteValues" and models.nobs_dropped[2] == 1
    assert models.warnings[2] == "dropped 1 row with missing values", models.warnings[2]


def test_nulls_in_text_and_boolean_columns_drop_like_statsmodels_or_fail(tmp_path):
    # A null category (text, a pandas categorical, a pandas nullable boolean) is a
    # missing value, dropped as statsmodels drops it: never a level of its own
    # ("b[T.None]"), with the task's design built once or with missing = "fail", and a
    # formula on a categorical with nulls is accepted.
    df = panel(chunks=4, rows=60)
    rng = np.random.default_rng(3)
    df["txt"] = np.where(rng.random(len(df)) < 0.1, None, df["sector"].to_numpy(object))
    cat = pd.Categorical(df["sector"])
    cat[rng.random(len(df)) < 0.1] = np.nan
    df["catd"] = cat
    flag = pd.array(rng.random(len(df)) < 0.5, dtype="boolean")
    flag[rng.random(len(df)) < 0.1] = pd.NA
    df["flag"] = flag
    last = df.chunk == 3  # a chunk without nulls, fitted from the task's design
    df.loc[last, "txt"] = df.loc[last, "sector"]
    df.loc[last, "catd"] = df.loc[last, "sector"]
    df.loc[last, "flag"] = df.loc[last, "flag"].fillna(False)
    path = tmp_path / "d"
    path.mkdir()
    df.to_parquet(path / "data.parquet", index=False)
    plain = df.astype({"flag": object, "catd": object}).replace({pd.NA: None})
    for formula in ("y ~ x1 + C(txt)", "y ~ x1 + catd", "y ~ x1 + flag",
                    "y ~ x1 + C(catd, levels=['A', 'B', 'C', 'D'])"):  # fmt: skip
        coefs, models = fit_all(workload(str(path), formula=formula))
        assert models.error_type.isna().all(), (formula, models.error_message.tolist())
        for c in range(4):
            chunk = plain[plain.chunk == c]
            expected = smf.ols(formula, chunk).fit()
            assert_same(coefs, c, expected)
            assert models.nobs[c] == expected.nobs
            assert models.nobs_dropped[c] == len(chunk) - expected.nobs, (formula, c)
        _, models = fit_all(workload(str(path), formula=formula, missing="fail"))
        column = formula.split("+")[1].strip().removeprefix("C(").split(",")[0].rstrip(")")
        for c in range(3):
            assert models.error_type[c] == "MissingValues", (formula, models.error_type[c])
            assert f"'{column}': " in models.error_message[c], models.error_message[c]


def test_text_stored_as_a_categorical_in_one_file_and_strings_in_another(tmp_path):
    # pandas writes a categorical as a dictionary column: it must read beside a file of
    # plain strings (a task reading both, not an ArrowInvalid on every rerun).
    df = panel(chunks=6, rows=60)
    path = tmp_path / "d"
    path.mkdir()
    first, second = df[df.chunk < 3].copy(), df[df.chunk >= 3].copy()
    first["sector"] = first["sector"].astype("category")
    first.to_parquet(path / "a.parquet", index=False)
    pq.write_table(pa.Table.from_pandas(second, preserve_index=False).cast(
        pa.Table.from_pandas(second, preserve_index=False).schema.set(
            second.columns.get_loc("sector"), pa.field("sector", pa.large_string()))),
        path / "b.parquet")  # fmt: skip
    for settings in ({"formula": "y ~ x1 + C(sector)"},
                     {"formula": "y ~ x1", "chunk_by": "sector"}):  # fmt: skip
        w = workload(str(path), **settings)
        coefs, models = fit_all(w)
        assert models.error_type.isna().all(), models.error_message.tolist()
        if "chunk_by" not in settings:
            for c in range(6):
                assert_same(coefs, c, smf.ols("y ~ x1 + C(sector)", df[df.chunk == c]).fit())
        else:
            for c, key in enumerate(sorted(df.sector.unique())):
                assert_same(coefs, c, smf.ols("y ~ x1", df[df.sector == key]).fit())


def test_iterative_models_get_smfs_layout_and_its_numbers(tmp_path):
    # quantreg's iterations stop a step apart on a row-major copy of the design (5e-9
    # here, 3e-7 in a user's data): statsmodels' formula API gives it column-major.
    rng = np.random.default_rng(2)
    parts = []
    for c in range(40):
        n = int(rng.integers(30, 200))
        x = rng.normal(size=n)
        parts.append(pd.DataFrame({"chunk": c, "x1": x, "x2": rng.normal(size=n),
                                   "y": 1 + 2 * x + rng.standard_t(3, size=n)}))  # fmt: skip
    df = pd.concat(parts, ignore_index=True)
    data = write(df, tmp_path / "d")
    coefs, models = fit_all(workload(data, formula="y ~ x1 + x2", model="quantreg", q=0.8))
    fitted = models.chunk_id[models.error_type.isna()]
    assert len(fitted) >= 35
    for c in fitted:
        expected = smf.quantreg("y ~ x1 + x2", df[df.chunk == c]).fit(q=0.8).params
        got = coefs[coefs.chunk_id == c].estimate
        np.testing.assert_allclose(got, expected, rtol=1e-13, atol=0)


def bad_panel():
    df = panel(chunks=7, rows=60)
    c = df.chunk
    df.loc[c == 1, "x3"] = df.loc[c == 1, "x1"] * 2 + df.loc[c == 1, "x2"]  # collinear
    df.loc[c == 2, "y"] = 4.0  # constant response
    df.loc[(c == 3) & (df.t == 10), "x2"] = np.inf
    df = df[(c != 4) | (df.t < 5)]  # 5 rows for 7 parameters
    df.loc[df.chunk == 5, "w"] = 0.0  # np.log(0) = -inf
    return df.reset_index(drop=True)


@pytest.mark.parametrize("engine", ["auto", "statsmodels"])
def test_bad_chunks_are_recorded_and_the_others_fitted(tmp_path, engine):
    data = write(bad_panel(), tmp_path / "d")
    coefs, models = fit_all(workload(data, formula=FORMULA + " + np.log(w)", engine=engine))
    errors = {
        c: e if isinstance(e, str) else None
        for c, e in zip(models.chunk_id, models.error_type, strict=True)
    }
    assert errors == {
        0: None, 1: "SingularDesign", 2: "ConstantResponse", 3: "NonFiniteValues",
        4: "TooFewRows", 5: "NonFiniteValues", 6: None,
    }  # fmt: skip
    msg = dict(zip(models.chunk_id, models.error_message, strict=True))
    assert "x1" in msg[1] and "x2" in msg[1] and "x3" in msg[1] and "rank" in msg[1]
    assert "the response is constant (4.0 in all 60 rows)" in msg[2]
    assert "x2: 0 NaN, 1 inf" in msg[3]
    assert "5 rows for 7 parameters" in msg[4]
    assert "np.log(w): 0 NaN, 60 inf" in msg[5]
    assert set(coefs.chunk_id) == {0, 6}  # failed chunks have no coefficients


def test_non_convergence_and_perfect_separation(tmp_path):
    df = panel(chunks=3, rows=80)
    sep = df.chunk >= 1
    # chunk 2: a point next to the separating line, so the iterations stop before
    # every fitted probability is 0 or 1 (statsmodels says only "not converged")
    df.loc[df.index[df.chunk == 2][0], "x1"] = 1e-4
    df.loc[sep, "y_bin"] = (df.loc[sep, "x1"] > 0).astype(np.int8)
    data = write(df, tmp_path / "d")
    _, models = fit_all(workload(data, model="logit", formula="y_bin ~ x1 + x2"))
    assert pd.isna(models.error_type[0])
    assert models.error_type[1] == "PerfectSeparation", models.warnings[1]
    assert models.error_type[2] == "PerfectSeparation", models.error_message[2]
    assert "classify every observation" in models.error_message[2]
    # another optimizer, which calls itself converged there
    _, models = fit_all(workload(data, model="logit", formula="y_bin ~ x1 + x2",
                                 fit_options="method=bfgs,maxiter=500"))  # fmt: skip
    assert pd.isna(models.error_type[0])
    assert list(models.error_type[1:]) == ["PerfectSeparation"] * 2, models.error_message
    # a proportion response fitted well is no separation, though its estimates put
    # every row on the side of 0.5 its value is on
    rng = np.random.default_rng(4)
    x = rng.uniform(0.3, 2, size=200) * rng.choice([-1, 1], size=200)  # none near 0.5
    share = 1 / (1 + np.exp(-2 * x)) + rng.normal(scale=0.002, size=200)
    prop = pd.DataFrame({"chunk": 0, "x1": x, "share": np.clip(share, 0.001, 0.999)})
    coefs, models = fit_all(workload(write(prop, tmp_path / "p"), model="glm",
                                     family="binomial", formula="share ~ x1"))  # fmt: skip
    assert pd.isna(models.error_type[0]), models.error_message[0]
    assert_same(coefs, 0, smf.glm("share ~ x1", prop, family=sm.families.Binomial()).fit())
    _, models = fit_all(
        workload(data, model="logit", formula="y_bin ~ x1 + x2", fit_options="maxiter=1")
    )
    assert models.error_type[0] == "NotConverged"
    assert not models.converged[0]
    assert "ConvergenceWarning" in models.warnings[0]
    assert (
        "(--fit-options maxiter=N), above the 1 given; if they do not help, the response never "
        "varies" in models.error_message[0]
    )
    # quantreg says so with an IterationLimitWarning: its message is the detail
    _, models = fit_all(
        workload(data, model="quantreg", formula="y ~ x1", fit_options="max_iter=1")
    )
    assert models.error_type[0] == "NotConverged"
    assert "Maximum number of iterations (1) reached" in models.error_message[0]
    assert models.error_message[0].endswith("(--fit-options max_iter=N), above the 1 given")


@pytest.mark.parametrize(
    ("settings", "error", "match"),
    [
        ({"formula": "y ~ x1 + nope"}, InputError, "no column 'nope'"),
        ({"formula": "y ~ x1 +"}, ConfigError, "does not parse"),
        ({"formula": "y ~ x-2"}, ConfigError, r"does not parse(.|\n)*is written Q\(\"x-2\"\)"),
        ({"formula": "y ~ my x"}, ConfigError, r"'my x' is not valid.*written Q\('my x'\)"),
        ({"formula": "y ~ np.lgo(x1)"}, ConfigError, "cannot be evaluated"),
        ({"formula": "y ~ lgo(x1)"}, ConfigError, r"lgo\(\) is not a function a formula knows"),
        (  # patsy makes a True/False response two columns
            {"model": "logit", "formula": "I(y > 0) ~ x1"},
            ConfigError,
            r"gives 2 columns: I\(y > 0\)\[False\], I\(y > 0\)\[True\]\); a True/False "
            r"response is fitted as 0/1: write I\(\(y > 0\) \* 1\)",
        ),
        (  # a text response: its type said, a few of patsy's columns shown
            {"formula": "sector ~ x1"},
            ConfigError,
            r"column 'sector' is \w*string, which patsy codes as \d+ columns: "
            r"sector\[\w+\], sector\[\w+\], sector\[\w+\], \.\.\. \(\d+ more\)\)$",
        ),
        (  # chunks too small for any fit: every one would fail
            {"formula": "y ~ x1 + x2", "chunk_by": None, "chunk_rows": 3},
            InputError,
            r"chunk_rows = 3 gives chunks of 3 rows, and the model has 3 parameters: .*"
            r"every chunk would fail \(TooFewRows\)",
        ),
        # Refused when the settings are made, as flags and job files are.
        ({"model": "tobit"}, ConfigError, r"RegressionJob\(model='tobit'\): 'tobit' is not one"),
        ({"cov_type": "HC9"}, ConfigError, r"cov_type='HC9'\): 'HC9' is not one of nonrobust"),
        ({"cov_type": "HAC"}, ConfigError, "needs maxlags"),
        ({"chunk_by": "ticker"}, InputError, "no column 'ticker'"),
        (
            {"chunk_by": "chunk,term"},
            ConfigError,
            "chunk_by column 'term' has the name of a column of the results' tables",
        ),
        ({"chunk_by": None}, ConfigError, "no chunks"),
        ({"model": "wls"}, ConfigError, "needs weights"),
        ({"endog": "y", "exog": "sector", "formula": None}, InputError, "not numeric"),
        ({"fit_options": "maxiter"}, ConfigError, "key=value"),
        (  # the type fit() expects, from its default
            {"model": "logit", "formula": "y_bin ~ x1", "fit_options": "maxiter=abc"},
            ConfigError,
            r"maxiter='abc': expected an integer \(the default is 35\), got str",
        ),
        ({"fit_options": "bogus=1"}, ConfigError, r"OLS.fit\(\) has no option 'bogus'"),
        (
            {"model": "logit", "formula": "y_bin ~ x1", "fit_options": "method=fast"},
            ConfigError,
            "method='fast': expected one of newton, nm, bfgs",
        ),
        (  # accepted by the signature, refused by the optimizer on the first chunk
            {"model": "logit", "formula": "y_bin ~ x1", "fit_options": "gtol=fine,method=bfgs"},
            ConfigError,
            "fails with them on the first chunk and not without them",
        ),
        ({"model": "rlm", "cov_type": "HC1"}, ConfigError, "own covariance"),
        ({"data": "/no/such/place"}, InputError, "no such folder or file"),
        # set where they do nothing, they are refused (--maxlags alone means nonrobust)
        ({"maxlags": 5}, ConfigError, "maxlags applies to cov_type HAC, not nonrobust"),
        ({"cov_type": "HC1", "maxlags": 5}, ConfigError, "maxlags applies to cov_type HAC"),
        ({"q": 0.3}, ConfigError, "q applies to model quantreg, not ols"),
        ({"norm": "TukeyBiweight"}, ConfigError, "norm applies to model rlm, not ols"),
        ({"cluster": "sector"}, ConfigError, "cluster applies to cov_type cluster"),
    ],
)
def test_bad_jobs_fail_before_any_task(dataset, tmp_path, client, settings, error, match):
    data, _ = dataset
    kw = {"data": data, "formula": FORMULA, "chunk_by": "chunk", **settings}
    out = tmp_path / "out"
    with pytest.raises(error, match=match):
        w = RegressionWorkload(RegressionJob(**kw), "bad")
        run_job(w, RunOptions(output=str(out), progress=False), client, echo=lambda m: None)
    assert not out.exists()


def run(client, out, data, units_per_task=3, **settings):
    settings.setdefault("formula", FORMULA)
    settings.setdefault("chunk_by", "chunk")
    w = RegressionWorkload(RegressionJob(data=data, **settings), "reg")
    options = RunOptions(output=str(out), units_per_task=units_per_task, progress=False)
    return run_job(w, options, client, echo=lambda m: None)


def test_run_resume_results_and_verify(tmp_path, client):
    from pipeline.verify import verify_output

    data = write(bad_panel(), tmp_path / "d")
    out = tmp_path / "out"
    s = run(client, out, data)
    assert s.complete and s.tasks == 3 and s.units == 7
    assert s.units_failed_in_run == 4 and s.units_retryable == 0
    assert s.units_failed == 4
    assert [f["unit"] for f in s.failures] == [
        "chunk=1",
        "chunk=2",
        "chunk=3",
        "chunk=4",
    ]
    # The tasks said which chunks failed: what the driver would read back from the models
    # tables (and does for tasks of an earlier run).
    from dataclasses import asdict

    from pipeline.workload import Task

    w = RegressionWorkload(RegressionJob(data=data, formula=FORMULA, chunk_by="chunk"), "reg")
    w.preflight()
    tasks = [Task(0, 0, 3), Task(1, 3, 6), Task(2, 6, 7)]
    assert [asdict(f) for f in w.recorded_failures(LocalStore(out), tasks)] == s.failures
    models = results_table(str(out), "models").to_pandas()
    assert models.chunk_id.tolist() == list(range(7))
    coefs = results_table(str(out), "coefficients").to_pandas()
    assert set(coefs.chunk_id) == {0, 5, 6}
    assert "3 fitted, 4 failed" in summarize(str(out), "models")
    assert "x1" in summarize(str(out), "coefficients")

    (check,) = verify_output(str(out))
    assert check.ok and check.units_ok == 7, check
    assert (check.failed_units, check.failures_table) == (4, "models")
    # Resume: remove task 1's entry and tables; only it runs again, same bytes.
    before = stored.part(out / "reg/coefficients", 1).read_bytes()
    (out / "reg/manifest/part-000001.parquet").unlink()
    stored.part(out / "reg/coefficients", 1).unlink()
    (out / "reg/manifest.parquet").unlink()
    s2 = run(client, out, data)
    assert s2.tasks_skipped == 2 and s2.units_run == 3 and s2.complete
    assert stored.part(out / "reg/coefficients", 1).read_bytes() == before  # (a new name)
    assert s2.units_failed == 4 and s2.units_failed_in_run == 2  # skipped tasks count too
    models = stored.part(out / "reg/models", 2)
    before_models = models.read_bytes()
    models.write_bytes(b"garbage")
    (check,) = verify_output(str(out))
    assert not check.ok and check.corrupt
    assert check.units_ok == 6  # task 2's chunk is not verified (it counted, before)
    # Anything no manifest lists is extra, wherever it is under the job's prefix.
    models.write_bytes(before_models)
    (out / "reg/stray-notes.txt").write_text("notes")
    (out / "reg/manifest/notes.txt").write_text("notes")
    (check,) = verify_output(str(out))
    assert check.extra == [f"{out}/reg/manifest/notes.txt", f"{out}/reg/stray-notes.txt"]
    assert not check.ok and not check.corrupt


def test_results_of_a_job_whose_every_chunk_failed_say_so(tmp_path, client):
    df = panel(chunks=3, rows=60)
    df["y"] = 4.0  # every chunk's response constant: no chunk is fitted
    s = run(client, tmp_path / "out", write(df, tmp_path / "d"))
    assert s.complete and s.units_failed == 3
    shown = summarize(str(tmp_path / "out"), "coefficients")
    assert "0 coefficients over 0 chunks" in shown
    assert "no chunk was fitted: the models table says why" in shown
    assert "Empty DataFrame" not in shown, shown


def test_only_the_text_columns_of_the_tables_are_dictionary_encoded(tmp_path, client):
    # Dictionaries of the statistics (distinct floats) would be built and thrown away:
    # writing several times as long, and larger files.
    run(client, tmp_path / "out", write(panel(chunks=6, rows=60), tmp_path / "d"))
    (part, *_) = sorted((tmp_path / "out" / "reg" / "coefficients").glob("part-*.parquet"))
    meta = pq.ParquetFile(part).metadata.row_group(0)
    encodings = {meta.column(j).path_in_schema: meta.column(j).encodings
                 for j in range(meta.num_columns)}  # fmt: skip
    assert any("DICTIONARY" in e for e in encodings["term"])
    assert not any("DICTIONARY" in e for e in encodings["estimate"]), encodings["estimate"]


def test_same_job_same_tables_whatever_the_task_sizes(dataset, tmp_path, client):
    data, _ = dataset
    run(client, tmp_path / "a", data, units_per_task=2)
    run(client, tmp_path / "b", data, units_per_task=5)
    for table in ("coefficients", "models"):
        a = results_table(str(tmp_path / "a"), table)
        b = results_table(str(tmp_path / "b"), table)
        if table == "models":
            assert pc.min(a["fit_seconds"]).as_py() > 0
            a, b = a.drop_columns(["fit_seconds"]), b.drop_columns(["fit_seconds"])
        assert a.equals(b)


def test_same_job_same_bytes(dataset, tmp_path, client):
    # Timings live in their own table: the coefficients and models parts are the
    # same bytes run after run, so their checksums are too.
    data, _ = dataset
    run(client, tmp_path / "a", data, units_per_task=3)
    run(client, tmp_path / "b", data, units_per_task=3)
    for table in ("coefficients", "models"):  # (their names carry their attempts)
        parts = stored.contents(tmp_path / "a" / "reg" / table)
        assert parts and parts == stored.contents(tmp_path / "b" / "reg" / table)
    timings = stored.contents(tmp_path / "a" / "reg" / "timings")
    assert sorted(timings) == sorted(parts)


def test_chunk_plan_reads_only_the_row_groups_of_a_task(tmp_path):
    store = LocalStore(tmp_path / "gen")
    facts = write_regression_data(store, chunks=40, rows=5000, features=2, seed=3)
    assert facts["files"] == 1
    ds = discover(str(tmp_path / "gen"))
    assert len(ds.rg_rows) == 4  # 13 whole chunks of 5,000 rows per row group
    index = plan_chunks(ds, ("chunk",), None)
    assert index.n_chunks == 40
    assert len(index.row_groups(0, 13, ds)) == 1
    assert len(index.row_groups(12, 14, ds)) == 2
    w = workload(str(tmp_path / "gen"), formula="y ~ x1 + x2 + C(sector)")
    truth = pq.read_table(tmp_path / "gen" / "_truth.parquet").to_pandas()
    coefs, _ = fit_all(w)
    est = coefs.pivot(index="chunk_id", columns="term", values="estimate")
    np.testing.assert_allclose(est["x1"], truth["x1"], atol=0.1)


def test_multi_column_chunk_by_on_unsorted_data_and_chunk_rows(tmp_path):
    df = panel(chunks=4, rows=90).sample(frac=1.0, random_state=1).reset_index(drop=True)
    df["half"] = (df["t"] >= 45).astype(np.int64)
    data = write(df, tmp_path / "d", row_group_size=100)
    coefs, models = fit_all(workload(data, chunk_by="chunk,half"))
    assert models.shape[0] == 8 and models[["chunk", "half"]].values.tolist()[:2] == [
        [0, 0],
        [0, 1],
    ]
    part = df[(df.chunk == 2) & (df.half == 1)]
    assert_same(coefs, 5, smf.ols(FORMULA, part).fit())
    coefs, models = fit_all(workload(data, chunk_by=None, chunk_rows=70))
    assert models.shape[0] == 6 and models.row_start.tolist()[:2] == [0, 70]
    assert_same(coefs, 2, smf.ols(FORMULA, df.iloc[140:210]).fit())


def test_plots_are_written(dataset, tmp_path, client):
    pytest.importorskip("matplotlib")
    data, _ = dataset
    s = run(client, tmp_path / "out", data, units_per_task=4, plots=True)
    pdfs = sorted((tmp_path / "out/reg/plots").glob("*.pdf"))
    assert len(pdfs) == 8 and stored.unnamed(pdfs[0].name) == "0000000-chunk=0.pdf"
    assert pdfs[0].read_bytes().startswith(b"%PDF")
    assert (tmp_path / "out/reg/coefficients-summary.pdf").exists()
    assert s.details["summary_figure"].endswith("coefficients-summary.pdf")


@pytest.mark.integration
def test_s3_input_and_output(s3, s3_bucket, tmp_path):
    from pipeline import connect
    from pipeline.storage import open_store

    write_regression_data(open_store(f"{s3_bucket}/data"), chunks=6, rows=100, features=3, seed=2)
    out = f"{s3_bucket}/out"
    with connect(RunOptions(workers=2)) as client:  # workers that see the S3 settings
        s = run(client, out, f"{s3_bucket}/data", units_per_task=2)
    assert s.complete and s.units == 6 and s.units_failed == 0, s.failures[:1]
    coefs = results_table(out, "coefficients").to_pandas()
    df = pd.concat([chunk_frame(2, c, 100, 3).to_pandas() for c in range(6)])
    assert_same(coefs, 4, smf.ols(FORMULA, df[df.chunk == 4]).fit())


def test_example_job_file_and_flags_resolve():
    from pipeline.config import check_unknown_keys, resolve
    from pipeline.jobs import load_job_file
    from pipeline.workloads.regressions import ModelSpec

    jf = load_job_file("examples/regressions.toml", "cubes")
    check_unknown_keys(jf, RunOptions, RegressionJob)
    job = resolve(RegressionJob, jf, {"cov_type": "HAC"}, {"PIPELINE_MAXLAGS": "4"})
    spec = ModelSpec.from_job(job)
    assert (spec.cov_type, spec.maxlags, spec.formula) == ("HAC", 4, jf.values["formula"])
    job = resolve(
        RegressionJob,
        None,
        {
            "exog": "x1, x2",
            "endog": "y",
            "chunk_by": "a,b",
            "fit_options": "maxiter=200,method=newton,disp=false",
        },
    )
    spec = ModelSpec.from_job(job)
    assert spec.exog == ("x1", "x2")
    assert dict(spec.fit_options) == {"maxiter": 200, "method": "newton", "disp": False}


def test_a_statsmodels_error_names_its_type_once():
    from pipeline.workloads.regressions.design import Prepared
    from pipeline.workloads.regressions.fit import fit_chunk
    from pipeline.workloads.regressions.spec import ModelSpec

    rng = np.random.default_rng(0)
    X = np.column_stack([np.ones(50), rng.normal(size=50)])
    y = np.abs(rng.normal(size=50))
    job = RegressionJob(data="d", model="glm", family="poisson", endog="y", exog="x1",
                        fit_options='method="foo"')  # fmt: skip
    fit = fit_chunk(ModelSpec.from_job(job), Prepared(y, X, ("const", "x1")))
    assert fit.error_type == "ValueError"
    assert fit.error_message.startswith("method must be one of"), fit.error_message


@pytest.mark.parametrize(
    ("model", "family", "y", "match"),
    [
        (
            "logit",
            "gaussian",
            [0, 1, 2],
            "logit needs a response in [0, 1] (0/1 outcomes or "
            "proportions); 1 of 3 rows are not (e.g. 2)",
        ),
        ("poisson", "gaussian", [0, -1, 2], "poisson needs a response at least 0 (counts); 1 of 3"),
        ("glm", "poisson", [0, -1, 2], "glm with family poisson needs a response at least 0"),
        ("glm", "gamma", [0, 1, 2], "glm with family gamma needs a response above 0; 1 of 3"),
        ("glm", "binomial", [0.5, 1.5, 0], "binomial needs a response in [0, 1]"),
    ],
)
def test_a_response_its_model_is_not_defined_on_fails_the_chunk(model, family, y, match):
    # The chunk fails, saying why, where statsmodels' own message is obscure ("endog
    # must be in the unit interval" for logit, "NaN, inf or invalid value detected in
    # weights" for negative counts) or it would fit a Poisson to them anyway.
    from pipeline.workloads.regressions.design import Prepared
    from pipeline.workloads.regressions.fit import fit_chunk
    from pipeline.workloads.regressions.spec import ModelSpec

    y = np.resize(np.asarray(y, dtype=float), 3)
    X = np.column_stack([np.ones(3), [0.1, 0.5, 0.2]])
    job = RegressionJob(data="d", model=model, family=family, endog="y", exog="x1")
    fit = fit_chunk(ModelSpec.from_job(job), Prepared(np.tile(y, 10), np.tile(X, (10, 1)),
                                                      ("const", "x1")))  # fmt: skip
    assert fit.error_type == "BadResponse"
    assert match.replace("1 of 3", "10 of 30") in fit.error_message, fit.error_message


@pytest.mark.parametrize(
    "formula",
    [
        "y ~ x1 * C(sector) + np.log(x_pos) + C(sector):x2:x3 + I(x1 ** 2) + C(g)",
        # explicit contrasts: their codes are taken whole, not a row at a time
        "y ~ x1 * C(sector, Sum) + C(sector, Treatment('B')):x2 + C(g, Helmert)",
    ],
)
def test_task_design_is_patsys_bit_for_bit(dataset, formula):
    """The design built once per task, column by column, equals patsy's own matrices."""
    import patsy

    from pipeline.workloads.regressions.design import TaskDesign
    from pipeline.workloads.regressions.spec import eval_env

    data, _df = dataset
    w = workload(data, formula=formula)
    rows = read_all_rows(w)
    design = TaskDesign(w.spec, rows.table, rows.offsets, w.info)
    assert not design.exact and design.Xg.flags.c_contiguous
    y, X = patsy.dmatrices(formula, rows.table.to_pandas(), eval_env=eval_env())
    assert design.names == tuple(X.design_info.column_names)
    np.testing.assert_array_equal(design.Xg, np.asarray(X))
    np.testing.assert_array_equal(design.yg, np.asarray(y)[:, 0])


def read_all_rows(w):
    from pipeline.inputs.task_rows import read_task_rows

    return read_task_rows(w.dataset, w.index, 0, w.n_units, list(w.columns))


def test_profile_tasks_merges_the_workers_profiles(dataset, tmp_path, client):
    import pstats

    data, _ = dataset
    w = RegressionWorkload(RegressionJob(data=data, formula=FORMULA, chunk_by="chunk"), "reg")
    path = tmp_path / "prof" / "{job}.pstats"
    options = RunOptions(output=str(tmp_path / "out"), units_per_task=3, progress=False,
                         profile_tasks=str(path))  # fmt: skip
    s = run_job(w, options, client, echo=lambda m: None)
    assert s.complete and s.tasks == 3
    assert s.details["task_profile"] == str(tmp_path / "prof" / "reg.pstats")
    stats = pstats.Stats(s.details["task_profile"]).stats
    calls = {(f.rsplit("/", 1)[-1], name): nc for (f, _line, name), (_cc, nc, *_) in stats.items()}
    assert calls[("engine.py", "fit_task")] == 3  # one per task, from both workers
    assert calls[("stack.py", "solve_stack")] >= 3
    assert calls[("task.py", "execute_task")] == 3
    # without the setting, receipts carry no statistics and no file is written
    s = run_job(w, RunOptions(output=str(tmp_path / "out2"), units_per_task=3, progress=False),
                client, echo=lambda m: None)  # fmt: skip
    assert "task_profile" not in s.details


def test_dictionary_strings_code_like_patsy_on_the_rows_read():
    """String columns read as dictionaries: levels are the values the rows use, sorted,
    whatever each row group's dictionary holds (here an unused "zz" and other orders)."""
    from pipeline.workloads.regressions.patsy_fast import coded_columns

    a = pa.array(["b", "a", "b"]).dictionary_encode()
    b = pa.DictionaryArray.from_arrays(pa.array([2, 1, 2], pa.int32()), pa.array(["zz", "é", "c"]))
    table = pa.table({"s": pa.chunked_array([a, b])})
    coded = coded_columns(table)["s"]
    assert list(coded.categories) == ["a", "b", "c", "é"]
    assert list(coded) == ["b", "a", "b", "c", "é", "c"]


@pytest.mark.parametrize(
    "formula", ["y ~ x + C(g)", "y ~ x * C(k)", "y ~ C(g) + C(k) + (x > 1.5)", "y ~ C(g, Sum) + x"]
)
def test_a_design_learned_on_earlier_rows_is_what_these_rows_learn(formula):
    """design_once keeps what patsy learned for the next rows of the same formula and
    column types; rows with fewer levels (C(int) sniffs them from the values, a bool
    factor has both), or a value it never saw, get what learning on them gives."""
    import patsy

    from pipeline.workloads.regressions import patsy_fast
    from pipeline.workloads.regressions.spec import model_desc

    desc = model_desc(formula)

    def rows(k: list[int], x=(1.0, 1.2, 1.7, 2.0), g=("a", "b", "c", "a")) -> dict:
        table = pa.table({"y": np.arange(4.0), "x": np.array(x), "g": list(g),
                          "k": np.array(k, dtype=np.int64)})  # fmt: skip
        return patsy_fast.coded_columns(table)

    batches = [
        rows([1, 2, 3, 1]),
        rows([3, 3, 2, 1]),  # the same levels: what was learned serves
        rows([1, 2, 1, 2]),  # C(k) sniffs its levels from the values: fewer here
        rows([1, 2, 3, 4]),  # 4, never seen
        rows([1, 2, 3, 1], x=(1.0, 1.1, 1.2, 1.3)),  # (x > 1.5) all False
        rows([1, 2, 3, 1], g=("a", "a", "b", "a")),  # g's categories are its values
    ]
    patsy_fast._LEARNED.clear()
    for data in batches:
        y, X, info, _ = patsy_fast.design_once(desc, data)
        fresh_y, fresh_X = patsy.dmatrices(formula, data, eval_env=patsy_fast._fast_env(),
                                           NA_action=patsy_fast.keep_all_na())  # fmt: skip
        assert info.column_names == fresh_X.design_info.column_names
        assert np.array_equal(X, np.asarray(fresh_X)) and np.array_equal(y, np.asarray(fresh_y))
    assert patsy_fast._LEARNED


def test_bytes_read_by_a_range_of_chunks_count_each_row_group_once(tmp_path):
    """The planner's byte counter (prefix sums where row groups come in order, the
    row groups themselves otherwise) against the row groups a task reads, on chunks
    by key in file order, out of file order, and by row count."""
    import pickle

    rng = np.random.default_rng(3)
    in_order = np.repeat(np.arange(40), rng.integers(1, 30, 40))
    shuffled = rng.permutation(40)[in_order]  # the same runs, keys out of order
    for name, keys in (("ordered", in_order), ("unordered", shuffled)):
        folder = tmp_path / name
        folder.mkdir()
        for f, part in enumerate(np.array_split(keys, 3)):
            table = pa.table({"g": part, "x": rng.normal(size=len(part))})
            pq.write_table(table, folder / f"part-{f}.parquet", row_group_size=7)
        ds = discover(str(folder), ("g",))
        rg_bytes = rng.integers(1, 1000, len(ds.rg_rows))
        for by, chunk_rows in ((("g",), None), ((), 11)):
            index = plan_chunks(ds, by, chunk_rows)
            read = index.bytes_reader(ds, rg_bytes)
            n = index.n_chunks
            for start in range(n):
                for stop in range(start + 1, n + 1):
                    expected = int(rg_bytes[index.row_groups(start, stop, ds)].sum())
                    assert read(start, stop) == expected, (name, by, start, stop)
    w = workload(str(tmp_path / "ordered"), formula="x ~ 1", chunk_by="g")
    assert w.read_bytes(0, 3) > 0
    assert "_read_bytes" not in pickle.loads(pickle.dumps(w)).__dict__  # driver-only


def test_fit_options_are_applied_by_statsmodels_or_refused(dataset):
    """The batched engine applies no fit_options: under engine auto their chunks are
    fitted by statsmodels with them (the models table says so), engine batched refuses
    them before any task runs."""
    data, _df = dataset
    _, models = fit_all(workload(data, fit_options="method=qr"))
    fitted = models[models.error_type.isna()]
    assert len(fitted) and set(fitted.engine) == {"statsmodels"}
    assert set(fitted.method) <= {"qr", "qr+refined"}
    _, models = fit_all(workload(data))
    fitted = models[models.error_type.isna()]
    assert set(fitted.engine) == {"batched"} and set(fitted.method) <= {"qr", "qr+refined"}
    with pytest.raises(ConfigError, match=r"engine batched applies no fit_options \(method='qr'\)"):
        workload(data, engine="batched", fit_options="method=qr")


def test_pipeline_results_exits_cleanly_every_time(tmp_path, client, dataset):
    """``pipeline results --table ... --out`` in 50 processes in a row, each exit 0:
    a pyarrow pool thread alive at interpreter exit aborted it (exit 134) after it had
    written its file, now and then."""
    import subprocess
    import sys
    from pathlib import Path

    data, _df = dataset
    out = tmp_path / "out"
    assert run(client, out, data).complete
    cli = str(Path(sys.executable).with_name("pipeline"))
    codes = []
    for i in range(50):
        table = ("models", "coefficients")[i % 2]
        done = subprocess.run(
            [cli, "results", str(out), "--table", table, "--out", str(tmp_path / f"{i}.parquet")],
            capture_output=True, text=True,
        )  # fmt: skip
        codes.append((done.returncode, done.stderr[-300:]))
    assert [c for c in codes if c[0] != 0] == []
    assert pq.read_table(tmp_path / "49.parquet").num_rows > 0
