"""NIST's Statistical Reference Datasets for linear least squares (tests/data/strd) as
the tests and benchmarks of the regression engines' accuracy use them: the sets, the
certified model's design, a set as a table and as a regressions job, and scores in
correct digits (-log10 of the relative error; the absolute one for a certified 0)."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import statsmodels.api as sm

from harness.exact_ols import correct_digits
from pipeline.workloads.regressions import RegressionJob, RegressionWorkload

__all__ = ["SETS", "certified", "design", "digits", "fitted", "frame", "settings",
           "statsmodels_digits", "write"]  # fmt: skip

STRD = Path(__file__).resolve().parents[1] / "tests" / "data" / "strd" / "strd.json"
SETS = json.loads(STRD.read_text())["sets"]


def design(name: str, x=None) -> np.ndarray:
    """The set's design matrix, as the certified model has it (intercept first)."""
    s = SETS[name]
    x = np.asarray(s["x"] if x is None else x, dtype=float)
    k = len(s["certified_estimates"])
    if name == "Longley":
        return np.column_stack([np.ones(len(x)), x])
    if name.startswith("NoInt"):
        return x[:, None]
    return np.vander(x, k, increasing=True)


def certified(name: str) -> tuple[np.ndarray, np.ndarray]:
    s = SETS[name]
    return (np.array([float(v) for v in s["certified_estimates"]]),
            np.array([float(v) for v in s["certified_std_errors"]]))  # fmt: skip


def digits(name: str, params, bse) -> tuple[np.ndarray, np.ndarray]:
    beta, se = certified(name)
    return correct_digits(params, beta), correct_digits(bse, se)


def statsmodels_digits(name: str) -> tuple[np.ndarray, np.ndarray]:
    y = np.asarray(SETS[name]["y"], dtype=float)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = sm.OLS(y, design(name)).fit()
    return digits(name, res.params, res.bse)


def frame(name: str, weights: bool = False) -> pd.DataFrame:
    """The set as a table: y and x (x1..x6 for Longley); with ``weights``, the design's
    columns c0.. and y with each row divided by 2**m and a weight 4**m (m = 0..3 by
    row): WLS on it is exactly OLS on the set, so its certified values hold."""
    s = SETS[name]
    y = np.asarray(s["y"], dtype=float)
    if weights:
        X = design(name)
        m = np.arange(len(y)) % 4
        cols = {f"c{j}": X[:, j] / 2.0**m for j in range(X.shape[1])}
        return pd.DataFrame({"set": name, "y": y / 2.0**m, **cols, "w": 4.0**m})
    if name == "Longley":
        xs = np.asarray(s["x"], dtype=float)
        return pd.DataFrame({"set": name, "y": y, **{f"x{j + 1}": xs[:, j] for j in range(6)}})
    return pd.DataFrame({"set": name, "y": y, "x": np.asarray(s["x"], dtype=float)})


def settings(name: str, weights: bool = False) -> dict:
    k = len(SETS[name]["certified_estimates"])
    if weights:
        return dict(model="wls", weights="w", endog="y", exog=[f"c{j}" for j in range(k)],
                    add_constant=False)  # fmt: skip
    if name == "Longley":
        return dict(formula="y ~ " + " + ".join(f"x{j}" for j in range(1, 7)))
    if name.startswith("NoInt"):
        return dict(formula="y ~ x - 1")
    powers = ["x", *[f"I(x**{j})" for j in range(2, k)]]
    return dict(formula="y ~ " + " + ".join(powers))


def write(df: pd.DataFrame, folder: Path) -> str:
    folder.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pandas(df, preserve_index=False), folder / "data.parquet")
    return str(folder)


def fitted(data: str, name: str, engine: str, weights: bool = False):
    w = RegressionWorkload(
        RegressionJob(data=data, chunk_by="set", engine=engine, **settings(name, weights)), "s"
    )
    w.preflight()
    coefs, models, _ = w.tables(0, w.fit_range(0, w.n_units))
    return coefs.to_pandas(), models.to_pandas()
