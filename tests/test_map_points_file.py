"""A map grid given as a .csv or .parquet file of points: the driver reads it a batch
at a time and keeps its size and record; each task reads its own rows from the copy
under the output. The job is that of the same points given as a list: the same
record, the same bytes, whatever the task sizes and however it was resumed."""

from __future__ import annotations

import functools
import json
import tracemalloc

import cloudpickle
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest
import support.map_jobs as map_jobs
from mapfns import bulk

import pipeline
from pipeline import (
    ConfigError,
    InputError,
    MapJob,
    MapWorkload,
    RunOptions,
    StorageError,
    load_jobs,
    run_job,
)
from pipeline.results import results_table, write_results

BULK = "mapfns.bulk"
#: A map job run as the planner sizes its tasks.
run = functools.partial(map_jobs.run, units_per_task=None)


def result_bytes(out) -> bytes:
    write_results(str(out), None, f"{out}.parquet")
    with open(f"{out}.parquet", "rb") as f:
        return f.read()


def record(out) -> dict:
    with open(f"{out}/m/job.json") as f:
        return json.load(f)["fingerprint"]["grid"]


def driver_peak(settings: dict, output) -> tuple[int, MapWorkload]:
    """The Python memory the driver's reading of a job's grid peaks at: its settings
    resolved and the workload's preflight (the grid read, its record made)."""
    tracemalloc.start()
    try:
        (job,) = load_jobs([], settings, workload="map", environ={})
        w = MapWorkload.from_settings(job.settings, "m", RunOptions(output=str(output)))
        w.preflight()
        w.fingerprint()
        return tracemalloc.get_traced_memory()[1], w
    finally:
        tracemalloc.stop()


def test_a_points_file_is_read_by_its_tasks_and_is_the_job_of_its_points(tmp_path, client):
    """200,000 points: the driver holds a batch of them at a time (as Python values,
    they are some 50 MB), the workload the tasks carry none; CSV, parquet and the same
    points listed give the same record and the same bytes, in tasks of any size. The
    CSV's column x is integers but its last value, past its first block, as read_csv
    types it: floats."""
    n = 200_000
    csv = tmp_path / "points.csv"
    csv.write_text("i,x\n" + "".join(f"{i},{i % 7}\n" for i in range(n - 1)) + f"{n - 1},2.5\n")
    whole = pacsv.read_csv(csv)  # the file's rows as read whole, as the points listed
    assert whole.schema.field("x").type == pa.float64()
    points = whole.to_pylist()
    parquet = tmp_path / "points.parquet"
    pq.write_table(whole, parquet, row_group_size=30_000)

    small = tmp_path / "small.csv"
    small.write_text("i,x\n1,2\n")
    driver_peak({"function": f"{BULK}:typed", "grid": str(small)}, tmp_path / "warm")
    peak, w = driver_peak({"function": f"{BULK}:typed", "grid": str(csv)}, tmp_path / "csv")
    assert peak < 20e6, f"the driver's reading of the grid peaked at {peak / 1e6:.1f} MB"
    assert len(cloudpickle.dumps(w)) < 20_000  # what every task carries: no point

    options = RunOptions(output=str(tmp_path / "csv"), units_per_task=7_000, progress=False)
    s = run_job(w, options, client, echo=lambda m: None)
    assert s.complete and s.units == n and s.units_failed == 0
    s = pipeline.map(bulk.typed, grid=parquet, output=str(tmp_path / "parquet"), name="m",
                     client=client, progress=False)  # fmt: skip
    assert s.complete and s.units == n and s.units_failed == 0
    s = run(client, tmp_path / "list", units_per_task=7_000, function=f"{BULK}:typed",
            grid=points)  # fmt: skip
    assert s.complete and s.units == n

    assert record(tmp_path / "csv") == record(tmp_path / "list") == {"points": n, "sha256": (
        record(tmp_path / "list")["sha256"])}  # fmt: skip
    assert record(tmp_path / "parquet") == record(tmp_path / "list")
    assert result_bytes(tmp_path / "csv") == result_bytes(tmp_path / "list")
    # (in tasks of other sizes, the rows are the same; the bytes of one file of 200,000
    # rows are not, the list's as the file's: parquet's dictionary of a column gives
    # way to plain values at a point that depends on the parts it is written from)
    table = pq.read_table(f"{tmp_path / 'csv'}.parquet")
    assert results_table(str(tmp_path / "parquet")).equals(table)
    assert table.column("i").to_pylist() == list(range(n))
    assert table.schema.field("x").type == pa.float64()
    assert set(table.column("x_type").to_pylist()) == {"float"}
    assert table.column("x").to_pylist() == [p["x"] for p in points]


def test_a_points_file_resumes_to_the_same_bytes_and_a_changed_point_is_another_job(
    tmp_path, client, monkeypatch
):
    """Units that failed run again alone, a lost task again whole, each reading its
    rows from the copy (row groups of 512 here): the bytes of a clean run. A point
    changed in the file is another job, refused unless --overwrite."""
    from pipeline.workloads.map import points_scan

    monkeypatch.setattr(points_scan, "ROWS_PER_GROUP", 512)
    n = 5_000
    flag = tmp_path / "flag"
    csv = tmp_path / "points.csv"
    csv.write_text("i,flag\n" + "".join(f"{i},{flag}\n" for i in range(n)))
    settings = {"function": f"{BULK}:double_unless_flagged", "grid": str(csv)}
    assert run(client, tmp_path / "clean", units_per_task=3_000, **settings).complete
    clean = result_bytes(tmp_path / "clean")

    flag.write_text("")
    s = run(client, tmp_path / "out", units_per_task=700, **settings)
    failed = [u for u in range(n) if u % 997 == 3]
    assert sorted(f["unit"] for f in s.failures) == failed
    assert s.failures[0]["key"] == f"i=3, flag={str(flag)!r}"
    flag.unlink()
    (tmp_path / "out" / "m" / "manifest" / "part-000002.parquet").unlink()  # units 1400..2099
    s = run(client, tmp_path / "out", units_per_task=700, **settings)
    assert s.complete and s.units_failed == 0
    assert s.units_run == 700 + len([u for u in failed if not 1400 <= u < 2100])
    assert result_bytes(tmp_path / "out") == clean

    csv.write_text(csv.read_text().replace(f"\n4321,{flag}\n", f"\n4322,{flag}\n"))
    with pytest.raises(ConfigError, match=r"with other settings \(grid\)"):
        run(client, tmp_path / "out", units_per_task=700, **settings)
    options = RunOptions(output=str(tmp_path / "out"), overwrite=True, progress=False)
    w = MapWorkload(MapJob(**settings), "m", output=str(tmp_path / "out"))
    assert run_job(w, options, client, echo=lambda m: None).complete


@pytest.mark.parametrize(
    "text, error, said",
    [
        ("i,my x\n1,2\n", ConfigError, r"points.csv: column 'my x' is not a valid parameter name"),
        ("i,i\n1,2\n", ConfigError, r"points.csv: column 'i' appears 2 times"),
        ("unit,x\n1,2\n", ConfigError, r"grid key 'unit' has the name of the results' first col"),
        ("i,z\n1,2\n", ConfigError, r"does not accept the grid key\(s\) 'z'"),
        ("i,x\n" + "1,2\n" * 600_000 + "1,2,3\n", InputError,
         r"points.csv: CSV parse error: Row #600002: Expected 2 columns, got 3"),
    ],
)  # fmt: skip
def test_a_bad_points_file_is_refused_naming_it_before_any_task(
    text, error, said, tmp_path, client
):
    (tmp_path / "points.csv").write_text(text)
    with pytest.raises(error, match=said):
        run(client, tmp_path, function=f"{BULK}:typed", grid=str(tmp_path / "points.csv"))
    assert not (tmp_path / "m").exists()


@pytest.mark.parametrize(
    ("output", "error", "said"),
    [
        ("afile", StorageError, r"output {tmp}/afile: {tmp}/afile is a file, expected a folder"),
        ("afile/sub", StorageError, r"output {tmp}/afile/sub: {tmp}/afile is a file, expected a"),
        ("s3://", ConfigError, r"S3 URL 's3://' has no bucket"),
    ],
)
def test_an_output_the_points_cannot_be_copied_to_is_named_as_given(output, error, said, tmp_path):
    """The copy's write failed as `cannot write .../afile/inputs/points-....parquet:
    Not a directory`, and `s3://` as `'s3:/inputs' reads as a URL missing a '/' (did
    you mean 's3://inputs'?)`: a bucket the user never named."""
    (tmp_path / "afile").write_text("not a folder")
    (tmp_path / "points.csv").write_text("i,x\n1,2\n")
    output = output if "://" in output else str(tmp_path / output)
    points = str(tmp_path / "points.csv")
    w = MapWorkload(MapJob(function=f"{BULK}:typed", grid=points), "m", output=output)
    with pytest.raises(error, match=said.format(tmp=tmp_path)):
        w.preflight()
    assert (tmp_path / "afile").read_text() == "not a folder"


def test_a_points_file_whose_every_point_returns_nothing_has_its_key_columns(tmp_path, client):
    (tmp_path / "points.csv").write_text("x\n1\n2\n3\n")
    s = run(client, tmp_path, function="mapfns.userfns:nothing", grid=str(tmp_path / "points.csv"))
    assert s.complete and s.units == 3
    table = results_table(str(tmp_path))
    assert table.num_rows == 0 and table.schema.names == ["unit", "x"]
    assert table.schema.field("x").type == pa.int64()


def test_workers_that_cannot_read_the_copy_are_refused_before_any_task(tmp_path, client):
    (tmp_path / "points.csv").write_text("i,x\n1,2\n3,4\n")
    w = MapWorkload(MapJob(function=f"{BULK}:typed", grid=str(tmp_path / "points.csv")), "m")
    w.preflight()  # (without an output: the copy goes to this machine's temporary folder)
    (tmp_path / "gone").mkdir()
    w.input.copy_folder = str(tmp_path / "gone")
    options = RunOptions(output=str(tmp_path / "out"), progress=False)
    with pytest.raises(ConfigError, match=r"2 of 2 workers cannot read the copy of grid file "):
        run_job(w, options, client, echo=lambda m: None)
    assert not (tmp_path / "out" / "m" / "results").exists()


def test_a_files_record_and_key_types_are_those_of_its_points_listed():
    """The record's digest is that of the points' JSON text, however it is made (by
    Arrow for integers, booleans and plain text; through Python values for floats,
    dates, escaped text), and each key's type the one its values listed get."""
    import datetime
    import hashlib

    import numpy as np

    from pipeline.contract import json_value
    from pipeline.workloads.map.inputs import key_type
    from pipeline.workloads.map.points_record import PointsRecord

    rng = np.random.default_rng(1)
    n = 25_000

    def some_missing(values):
        return [None if rng.random() < 0.1 else v for v in values]

    texts = ["x", "", 'q"uote', "back\\slash", "é", "tab\t", "plain text"]
    table = pa.table({
        "b_int": pa.array(some_missing(rng.integers(-10**12, 10**12, n).tolist()), pa.int64()),
        "a_small": pa.array(rng.integers(-100, 100, n), pa.int8()),
        "flag": pa.array(some_missing((rng.random(n) < 0.5).tolist())),
        "text": pa.array(some_missing([texts[k] for k in rng.integers(0, len(texts), n)])),
        "plain": pa.array([f"name-{i}" for i in range(n)]),
        "f": pa.array(some_missing((rng.standard_normal(n) * 1e-6).tolist())),
        "d": pa.array([datetime.date(2020, 1, 1) + datetime.timedelta(days=i) for i in range(n)]),
        "u": pa.array(rng.integers(0, 2**63, n, dtype=np.uint64), pa.uint64()),
        "\u03b1": pa.array(np.arange(n)),  # (a name JSON escapes)
        "none": pa.nulls(n),
    })  # fmt: skip
    for columns in (table.column_names, ["b_int", "a_small", "flag", "plain", "\u03b1"]):
        part = table.select(columns)
        record = PointsRecord(tuple(columns))
        for batch in part.to_batches(max_chunksize=7_000):
            record.add(batch)
        text = json.dumps(part.to_pylist(), sort_keys=True, default=json_value)
        assert record.recorded() == {
            "points": n,
            "sha256": hashlib.sha256(text.encode()).hexdigest(),
        }
        listed = {k: key_type(part.column(k).to_pylist()) for k in columns}
        assert record.key_types() == listed
