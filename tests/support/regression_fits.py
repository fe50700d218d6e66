"""Regressions for the tests: a panel of chunks written as a dataset, a workload on
it, its fits of every chunk in this process, and a chunk's coefficients compared with
statsmodels' results."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.workloads.regressions import RegressionJob, RegressionWorkload
from pipeline.workloads.regressions.generate import chunk_frame

FORMULA = "y ~ x1 + x2 + x3 + C(sector)"


def panel(chunks=8, rows=120, seed=5) -> pd.DataFrame:
    df = pd.concat(
        [chunk_frame(seed, c, rows, 3).to_pandas() for c in range(chunks)], ignore_index=True
    )
    df["w"] = 1.0 + np.abs(df["x3"])
    df["g"] = (df["t"] // 12).astype(np.int64)
    df["x_pos"] = np.exp(df["x2"])
    return df


def write(df: pd.DataFrame, path, row_group_size=240):
    path.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pandas(df, preserve_index=False), path / "data.parquet",
                   row_group_size=row_group_size)  # fmt: skip
    return str(path)


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
