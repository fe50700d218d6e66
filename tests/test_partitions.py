"""Hive-partitioned datasets: ``key=value`` folders are columns of their files' rows."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import statsmodels.formula.api as smf
from support.map_jobs import FN, run
from support.regression_fits import assert_same, fit_all, workload

from pipeline import InputError, RunOptions, run_job
from pipeline.inputs.dataset import discover
from pipeline.results import results_table
from pipeline.workloads.regressions import RegressionJob, RegressionWorkload


def _frame(rows: int = 600, seed: int = 3) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    df = pd.DataFrame({
        "day": np.repeat(np.arange(rows // 30), 30),
        "firm": np.tile(["a", "b", "c"], rows // 3),
        "x1": rng.normal(size=rows),
        "year": np.repeat(np.arange(rows // 30), 30) % 3 + 2020,
        "region": np.where(np.arange(rows) % 4 == 0, "east", "west"),
    })  # fmt: skip
    df["y"] = 1 + 2 * df.x1 + (df.region == "east") + rng.normal(size=rows)
    return df


@pytest.fixture(scope="module")
def hive(tmp_path_factory):
    """Written as pandas' partition_cols writes it: year=2020/region=east/<uuid>.parquet."""
    df = _frame()
    path = tmp_path_factory.mktemp("hive") / "data"
    df.to_parquet(path, partition_cols=["year", "region"], row_group_size=50)
    return str(path), df


def test_partition_folders_are_columns_of_the_schema(hive):
    path, _ = hive
    ds = discover(path)
    assert ds.schema.names[-2:] == ["year", "region"]
    assert str(ds.schema.field("year").type) == "int64"
    assert str(ds.schema.field("region").type) == "string"
    assert len(ds.keys) == 6


def test_chunks_by_a_partition_column_fit_as_statsmodels_does(hive):
    path, df = hive
    coefs, models = fit_all(workload(path, chunk_by="year", formula="y ~ x1 + C(region)"))
    assert models.year.tolist() == [2020, 2021, 2022]
    for i, year in enumerate([2020, 2021, 2022]):
        chunk = df[df.year == year].sort_values(["region", "day"], kind="stable")
        res = smf.ols("y ~ x1 + C(region)", chunk).fit()
        assert_same(coefs, i, res)


def test_a_partition_column_in_the_formula_and_in_a_composite_key(hive):
    path, df = hive
    coefs, models = fit_all(workload(path, chunk_by=["year", "firm"], formula="y ~ x1 + region"))
    assert len(models) == 9 and models.error_type.isna().all()
    chunk = df[(df.year == 2021) & (df.firm == "b")].sort_values(["region", "day"], kind="stable")
    assert_same(coefs, 4, smf.ols("y ~ x1 + region", chunk).fit())


def test_a_run_reads_partition_values_on_the_workers(hive, tmp_path, client):
    path, df = hive
    job = RegressionJob(data=path, chunk_by="day", formula="y ~ x1 + C(region)")
    s = run_job(RegressionWorkload(job, "r"), RunOptions(output=str(tmp_path), units_per_task=3,
                                                         progress=False), client)  # fmt: skip
    assert s.complete and s.units == 20 and not s.units_failed
    # map's chunks carry the partition columns too.
    run(client, tmp_path / "m", function=f"{FN}:chunk_stats", data=path, chunk_by="region",
        columns=["y", "year"])  # fmt: skip
    table = results_table(str(tmp_path / "m")).to_pandas()
    assert table.region.tolist() == ["east", "west"]
    assert table.n.tolist() == [150, 450]
    assert table.y_mean.tolist() == pytest.approx(df.groupby("region").y.mean().tolist())


def test_files_partitioned_by_different_folders_are_refused(tmp_path):
    df = _frame(60)
    df.to_parquet(tmp_path / "d", partition_cols=["year"])
    df.to_parquet(tmp_path / "d" / "loose.parquet")
    with pytest.raises(InputError, match="partitioned by different folders"):
        discover(str(tmp_path / "d"))


def test_a_partition_column_also_in_the_files_is_refused(tmp_path):
    df = _frame(60)
    (tmp_path / "d" / "year=1").mkdir(parents=True)
    df.to_parquet(tmp_path / "d" / "year=1" / "p.parquet")
    with pytest.raises(InputError, match="'year' is both a partition folder"):
        discover(str(tmp_path / "d"))
