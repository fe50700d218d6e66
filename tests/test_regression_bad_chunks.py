"""A degenerate chunk is its own failure: mixed into a task of good chunks, under every
engine and cov_type, each bad chunk is recorded with a message naming its cause and
each good chunk's rows of the tables are the bytes they are when it is alone in its
task. Shapes: no rows, one row, fewer rows than coefficients or as many, an
all-missing response or regressor, a constant or collinear column, infinities, a
constant response, a negative weight (WLS), a response logit is not defined on."""

from __future__ import annotations

import tempfile
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline import RunOptions, run_job
from pipeline.results import results_table
from pipeline.workloads.regressions import RegressionJob, RegressionWorkload

FORMULA = "y ~ x1 + x2 + x3"  # 4 coefficients
COV_TYPES = ("nonrobust", "HC0", "HC1", "HC2", "HC3", "HAC", "cluster")
ENGINES = ("auto", "batched", "statsmodels")
MODELS = ("ols", "wls", "logit")

#: shape -> (its rows, or None for any; the error recorded; what its message says)
SHAPES = {
    "no rows": (None, "EmptyChunk", "no rows to fit ({n} rows dropped for missing values: "),
    "one row": (1, "TooFewRows", "1 row for 4 parameters: need at least 5"),
    "fewer rows than coefficients": (3, "TooFewRows", "3 rows for 4 parameters"),
    "as many rows as coefficients": (4, "TooFewRows", "4 rows for 4 parameters"),
    "all-missing response": (None, "EmptyChunk", "dropped for missing values: {n} in y)"),
    "all-missing regressor": (None, "EmptyChunk", "dropped for missing values: {n} in x2)"),
    "constant column": (None, "SingularDesign", "rank 3 < 4 columns (collinear: Intercept, x2)"),
    "collinear columns": (None, "SingularDesign", "rank 3 < 4 columns (collinear: x1, x2, x3)"),
    "infinity in a regressor": (None, "NonFiniteValues", "x1: 0 NaN, 1 inf"),
    "infinity in the response": (None, "NonFiniteValues", "response: 0 NaN, 1 inf"),
    "constant response": (None, "ConstantResponse", "the response is constant (1.0 in all"),
    "negative weight": (None, "BadWeights", "1 weight is negative"),
    "non-binary response": (None, "BadResponse", "logit needs a response in [0, 1]"),
}


def shapes_of(model: str) -> list[str]:
    """The shapes that are degenerate for ``model`` (a response of 2 is fine for OLS)."""
    only = {"negative weight": "wls", "non-binary response": "logit"}
    return [s for s in SHAPES if only.get(s, model) == model]


def good_chunk(rng, n: int, model: str) -> pd.DataFrame:
    x = rng.normal(size=(n, 3))
    eta = x @ np.array([0.5, -0.4, 0.3])
    if model == "logit":
        y = (eta + rng.logistic(size=n) > 0).astype(float)
    else:
        y = 1.0 + eta + rng.normal(size=n)
    return pd.DataFrame({"y": y, "x1": x[:, 0], "x2": x[:, 1], "x3": x[:, 2],
                         "g": np.arange(n) % 3, "w": 1.0 + rng.random(n)})  # fmt: skip


def bad_chunk(rng, shape: str, n: int, model: str) -> pd.DataFrame:
    n = SHAPES[shape][0] or n
    df = good_chunk(rng, n, model)
    if shape == "no rows":  # every row misses a value, no column all of them
        df.loc[::2, "x1"] = np.nan
        df.loc[1::2, "x2"] = np.nan
    elif shape == "all-missing response":
        df["y"] = np.nan
    elif shape == "all-missing regressor":
        df["x2"] = np.nan
    elif shape == "constant column":
        df["x2"] = 1.5
    elif shape == "collinear columns":
        df["x3"] = df.x1 - 2.0 * df.x2
    elif shape == "infinity in a regressor":
        df.loc[n // 2, "x1"] = np.inf
    elif shape == "infinity in the response":
        df.loc[n // 2, "y"] = -np.inf
    elif shape == "constant response":
        df["y"] = 1.0
    elif shape == "negative weight":
        df.loc[n // 2, "w"] = -1.0
    elif shape == "non-binary response":
        df.loc[::3, "y"] = 2.0
    return df


def write(chunks: list[pd.DataFrame], folder: Path) -> str:
    df = pd.concat([c.assign(chunk=i) for i, c in enumerate(chunks)], ignore_index=True)
    folder.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pandas(df, preserve_index=False), folder / "data.parquet")
    return str(folder)


def job(data: str, model: str, engine: str, cov_type: str) -> RegressionJob:
    kw = {"maxlags": 2} if cov_type == "HAC" else {}
    kw.update({"cluster": "g"} if cov_type == "cluster" else {})
    kw.update({"weights": "w"} if model == "wls" else {})
    return RegressionJob(data=data, chunk_by="chunk", formula=FORMULA, model=model,
                         engine=engine, cov_type=cov_type, **kw)  # fmt: skip


def rows_of(table: pa.Table, chunk: int | None = None) -> list:
    """A chunk's rows of a table (or all), floats as their bytes (NaN equals NaN, -0.0
    not 0.0)."""
    if chunk is not None:
        table = table.filter(pa.compute.equal(table["chunk_id"], chunk))
    rows = table.to_pandas()
    return [rows[c].to_numpy().tobytes() if rows[c].dtype.kind == "f" else rows[c].tolist()
            for c in rows.columns]  # fmt: skip


def assert_each_chunk_its_own(data: str, kinds: list[tuple[str, int]], settings: RegressionJob):
    """Fit the chunks in one task and each alone: the same rows; the bad ones failed
    with their shape's message, the good ones (of OLS and WLS) fitted."""
    w = RegressionWorkload(settings, "reg")
    w.preflight()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # statsmodels' own, on the bad chunks
        whole = w.tables(0, w.fit_range(0, w.n_units))
        alone = [w.tables(i, w.fit_range(i, i + 1)) for i in range(w.n_units)]
    models = whole[1].to_pandas()
    for i, (kind, n) in enumerate(kinds):
        for table, own in zip(whole[:2], alone[i][:2], strict=True):
            assert rows_of(table, i) == rows_of(own, i), (i, kind)
        error, message = models.error_type[i], models.error_message[i]
        if kind == "good":
            assert settings.model == "logit" or pd.isna(error), (i, error, message)
            continue
        _, expected, said = SHAPES[kind]
        assert error == expected, (i, kind, error, message)
        assert said.format(n=n) in message, (i, kind, message)


#: (engine batched fits ols and wls only: a logit job with it is refused before any task)
MODEL_ENGINES = [(m, e) for m in MODELS for e in ENGINES if (m, e) != ("logit", "batched")]


@pytest.mark.parametrize("cov_type", COV_TYPES)
@pytest.mark.parametrize(("model", "engine"), MODEL_ENGINES)
def test_every_bad_shape_in_one_task_fails_alone(tmp_path, model, engine, cov_type):
    rng = np.random.default_rng(COV_TYPES.index(cov_type))
    chunks, kinds = [], []
    for shape in shapes_of(model):  # each between good chunks of as many rows
        chunks += [good_chunk(rng, 40, model), bad_chunk(rng, shape, 40, model)]
        kinds += [("good", 40), (shape, 40)]
    chunks.append(good_chunk(rng, 40, model))
    kinds.append(("good", 40))
    data = write(chunks, tmp_path / "d")
    assert_each_chunk_its_own(data, kinds, job(data, model, engine, cov_type))


@pytest.mark.parametrize("engine", ENGINES)
def test_a_chunk_whose_every_row_has_a_null_category_has_no_rows(tmp_path, engine):
    """Rows with a null text value leave the task's table before its design is built
    (as statsmodels drops them): a chunk of only such rows has none left, and was a
    DesignError ("negative dimensions are not allowed")."""
    rng = np.random.default_rng(7)
    chunks = [good_chunk(rng, 20, "ols").assign(s=["a", "b"] * 10) for _ in range(3)]
    chunks[1]["s"] = None
    data = write(chunks, tmp_path / "d")
    settings = RegressionJob(data=data, chunk_by="chunk", formula="y ~ x1 + x2 + C(s)",
                             engine=engine)  # fmt: skip
    w = RegressionWorkload(settings, "reg")
    w.preflight()
    models = w.tables(0, w.fit_range(0, 3))[1].to_pandas()
    assert models.error_type.tolist()[1] == "EmptyChunk" and models.nobs_dropped[1] == 20
    assert models.error_message[1] == "no rows to fit (20 rows dropped for missing values: 20 in s)"
    assert models.error_type.isna().tolist() == [True, False, True]


@st.composite
def mixes(draw):
    """A model, engine, cov_type and 2-9 chunks, each good or of a bad shape, of 6-30
    rows (so that bad chunks share stacks with good ones of their rows); a seed."""
    model, engine = draw(st.sampled_from(MODEL_ENGINES))
    cov_type = draw(st.sampled_from(COV_TYPES))
    kinds = draw(st.lists(st.sampled_from(["good", "good", *shapes_of(model)]),
                          min_size=1, max_size=8))  # fmt: skip
    # one good chunk at least: a job whose every chunk is too small is refused whole
    kinds.insert(draw(st.integers(0, len(kinds))), "good")
    low = 30 if model == "logit" else 6  # logit: fewer rows often separate
    sizes = draw(st.lists(st.integers(low, low + 24), min_size=len(kinds), max_size=len(kinds)))
    return model, engine, cov_type, kinds, sizes, draw(st.integers(0, 2**32 - 1))


@settings(max_examples=40, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow])  # fmt: skip
@given(mixes())
def test_random_mixes_of_good_and_bad_chunks(mix):
    model, engine, cov_type, kinds, sizes, seed = mix
    rng = np.random.default_rng(seed)
    chunks, said = [], []
    for kind, n in zip(kinds, sizes, strict=True):
        df = good_chunk(rng, n, model) if kind == "good" else bad_chunk(rng, kind, n, model)
        chunks.append(df)
        said.append((kind, len(df)))
    with tempfile.TemporaryDirectory() as tmp:
        data = write(chunks, Path(tmp) / "d")
        assert_each_chunk_its_own(data, said, job(data, model, engine, cov_type))


def test_a_one_row_chunk_fails_alone_through_the_runner(tmp_path, client):
    """The report: 50 chunks, chunk 3 of one row, tasks of 25 chunks. It failed its
    whole task (IndexError on each of its 25 chunks); now it alone fails, and the
    tables are those of tasks of one chunk."""
    rng = np.random.default_rng(3)
    chunks = [good_chunk(rng, 1 if c == 3 else 40, "ols") for c in range(50)]
    data = write(chunks, tmp_path / "d")
    w = RegressionWorkload(job(data, "ols", "auto", "nonrobust"), "reg")
    s = run_job(w, RunOptions(output=str(tmp_path / "a"), units_per_task=25, progress=False),
                client, echo=lambda m: None)  # fmt: skip
    assert s.complete and s.units_failed == 1, s.failures
    (failure,) = s.failures
    assert failure["unit"] == "chunk=3" and failure["error_type"] == "TooFewRows"
    assert "1 row for 4 parameters" in failure["message"]
    w = RegressionWorkload(job(data, "ols", "auto", "nonrobust"), "reg")
    run_job(w, RunOptions(output=str(tmp_path / "b"), units_per_task=1, progress=False),
            client, echo=lambda m: None)  # fmt: skip
    for table in ("coefficients", "models"):
        a = results_table(str(tmp_path / "a"), table)
        b = results_table(str(tmp_path / "b"), table)
        if table == "models":
            a, b = a.drop_columns(["fit_seconds"]), b.drop_columns(["fit_seconds"])
        assert rows_of(a) == rows_of(b), table
