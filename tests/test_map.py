"""The map workload: the user's function over a grid, files or dataset chunks, with
the guarantees of the built-in workloads (resume, failures as data, verify)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from mapfns import userfns
from support.map_jobs import FN, run
from support.stored import part

import pipeline
from pipeline import (
    ConfigError,
    InputError,
    MapJob,
    MapWorkload,
    RunOptions,
    connect,
    run_job,
    unit_seed,
)
from pipeline.layout import completed_tasks
from pipeline.results import results_table, write_results
from pipeline.storage import LocalStore
from pipeline.verify import verify_output


def calls(log) -> list[str]:
    return sorted(log.read_text().splitlines()) if log.exists() else []


def test_grid_in_product_order_with_keys_first_and_seeds(tmp_path, client):
    s = run(client, tmp_path, function=f"{FN}:power", grid={"x": [1, 2, 3], "p": [2, 3]})
    assert s.complete and s.units == 6 and s.units_failed == 0
    table = results_table(str(tmp_path)).to_pandas()
    assert table.columns.tolist() == ["unit", "x", "p", "value", "noise"]
    assert table[["x", "p"]].values.tolist() == [[1, 2], [1, 3], [2, 2], [2, 3], [3, 2], [3, 3]]
    assert table["value"].tolist() == [1, 1, 4, 8, 9, 27]
    expected = [float(np.random.default_rng(unit_seed(0, u)).random()) for u in range(6)]
    assert table["noise"].tolist() == expected
    (check,) = verify_output(str(tmp_path))
    assert check.ok and check.units_ok == 6, check


def test_grid_values_from_python_may_be_ranges_tuples_and_arrays(tmp_path, client):
    lists = run(
        client, tmp_path / "lists", function=f"{FN}:power", grid={"x": [0, 1, 2], "p": [2.0, 3.0]}
    )
    grid = {"x": range(3), "p": np.array([2.0, 3.0])}
    other = run(client, tmp_path / "other", function=f"{FN}:power", grid=grid)
    series = {"x": (0, 1, 2), "p": pd.Series([2.0, 3.0])}
    third = run(client, tmp_path / "third", function=f"{FN}:power", grid=series)
    tables = [results_table(str(tmp_path / d)) for d in ("lists", "other", "third")]
    assert lists.complete and other.complete and third.complete
    assert tables[0].equals(tables[1]) and tables[0].equals(tables[2])
    assert tables[1].column("p").type == pa.float64()  # Python scalars, not numpy objects
    with pytest.raises(ConfigError, match=r"grid: key 'x' is \{1, 2\}; expected a value or a"):
        run(client, tmp_path / "set", function=f"{FN}:power", grid={"x": {1, 2}})
    # A single value is held fixed: the same job as a list of one.
    one = run(client, tmp_path / "one", function=f"{FN}:power", grid={"x": [0, 1, 2], "p": [2.0]})
    fixed = run(client, tmp_path / "one", function=f"{FN}:power", grid={"x": [0, 1, 2], "p": 2.0})
    assert one.complete and fixed.complete and fixed.units == 3 and fixed.units_run == 0
    table = results_table(str(tmp_path / "one")).to_pandas()
    assert table[["x", "p"]].values.tolist() == [[0, 2.0], [1, 2.0], [2, 2.0]]


def test_a_list_of_points_runs_each_in_its_order(tmp_path, client):
    # A sweep from a table of chosen points (not every combination): `[[grid]]`
    # tables, a JSON list, a CSV file, or a DataFrame from Python.
    points = [{"x": 3, "p": 2}, {"x": 1, "p": 3}, {"x": 2, "p": 1}]
    s = run(client, tmp_path / "a", function=f"{FN}:power", grid=points)
    assert s.complete and s.units == 3
    table = results_table(str(tmp_path / "a")).to_pandas()
    assert table.columns.tolist() == ["unit", "x", "p", "value", "noise"]
    assert table[["x", "p", "value"]].values.tolist() == [[3, 2, 9], [1, 3, 1], [2, 1, 2]]
    expected = [float(np.random.default_rng(unit_seed(0, u)).random()) for u in range(3)]
    assert table["noise"].tolist() == expected
    # One task or three: the same bytes; a DataFrame of the points, the same job.
    s = pipeline.map(userfns.power, grid=pd.DataFrame(points), output=str(tmp_path / "b"), name="m",
                client=client, units_per_task=3, progress=False)  # fmt: skip
    assert s.complete and s.tasks == 1
    for out in ("a", "b"):
        write_results(str(tmp_path / out), None, str(tmp_path / f"{out}.parquet"))
    a, b = (pq.read_table(tmp_path / f"{out}.parquet") for out in ("a", "b"))
    assert a.equals(b)
    (check,) = verify_output(str(tmp_path / "a"))
    assert check.ok and check.units_ok == 3, check


def test_an_empty_csv_cell_is_missing_whatever_its_columns_type(tmp_path, client):
    """An empty cell reached the function as '' in a text column but as None in a
    number column, and the job's record said "" and null."""
    import json

    from pipeline import load_jobs

    (tmp_path / "pts.csv").write_text("a,b,c\n1,x,2.5\n2,,3\n3,z,\n")
    cli = {"function": f"{FN}:reprs", "grid": str(tmp_path / "pts.csv")}
    (job,) = load_jobs([], cli, workload="map", environ={})
    options = RunOptions(output=str(tmp_path / "out"), units_per_task=3, progress=False)
    w = MapWorkload.from_settings(job.settings, "m", options)
    assert run_job(w, options, client, echo=lambda m: None).complete
    table = results_table(str(tmp_path / "out")).to_pydict()
    assert table["b_repr"] == ["'x'", "None", "'z'"] and table["c_repr"] == ["2.5", "3.0", "None"]
    assert table["b"] == ["x", None, "z"]
    recorded = json.loads((tmp_path / "out" / "m" / "job.json").read_text())["fingerprint"]
    assert [p["b"] for p in recorded["grid"]] == ["x", None, "z"]
    assert [p["c"] for p in recorded["grid"]] == [2.5, 3.0, None]


def test_many_listed_points_are_recorded_by_digest_and_still_compared(
    tmp_path, client, monkeypatch
):
    """A job's record holds a long list of points as their digest (300,000 made a
    16 MB job.json, written at each plan step): a changed point still refuses resume."""
    import json

    from pipeline.workloads.map import inputs as map_inputs

    monkeypatch.setattr(map_inputs, "LISTED_RECORDED", 3)
    points = [{"x": x, "p": 2} for x in range(5)]
    assert run(client, tmp_path, function=f"{FN}:power", grid=points).complete
    recorded = json.loads((tmp_path / "m" / "job.json").read_text())["fingerprint"]["grid"]
    assert recorded["points"] == 5 and len(recorded["sha256"]) == 64
    assert run(client, tmp_path, function=f"{FN}:power", grid=points).units_run == 0
    points[4] = {"x": 40, "p": 2}
    with pytest.raises(ConfigError, match=r"with other settings \(grid\)"):
        run(client, tmp_path, function=f"{FN}:power", grid=points)


def test_grids_of_dates_or_objects_are_recorded_and_resume(tmp_path, client):
    # The job record (JSON) must hold any grid value: a TOML grid of days, an estimator
    # passed from Python (json alone cannot write a date).
    import datetime

    days = {"day": [datetime.date(2024, 1, 1), datetime.date(2024, 3, 5)]}
    for _ in range(2):
        s = run(client, tmp_path / "days", function=f"{FN}:weekday", grid=days)
        assert s.complete
    assert s.units_run == 0  # the second run found the first complete
    assert results_table(str(tmp_path / "days")).column("weekday").to_pylist() == [0, 1]
    grid = {"model": [userfns.Scale(2), userfns.Scale(3)], "x": [1, 2]}
    for _ in range(2):
        s = pipeline.map(userfns.scaled, grid=grid, output=str(tmp_path / "objects"),
                         client=client, progress=False)  # fmt: skip
    assert s.complete and s.units_run == 0
    table = results_table(str(tmp_path / "objects")).to_pandas()
    assert table["model"].tolist() == ["Scale(k=2)"] * 2 + ["Scale(k=3)"] * 2
    assert table["y"].tolist() == [2, 4, 3, 6]
    # Python's default repr is a memory address, another in every run: refused up front
    bare = {"model": [userfns.Bare(2)], "x": [1]}
    with pytest.raises(
        ConfigError,
        match=r"grid 'model': a value's text, <mapfns.userfns.Bare "
        r"object at 0x[0-9a-f]+>, is its memory address.*give Bare a __repr__",
    ):
        pipeline.map(userfns.scaled, grid=bare, output=str(tmp_path / "bare"), client=client)
    assert not (tmp_path / "bare").exists()


def test_code_that_exits_or_interrupts_fails_its_unit_not_the_run(tmp_path, client):
    # sys.exit() or a KeyboardInterrupt raised by a unit's code fails that unit: it
    # must neither end `pipeline run` (exit 0, no summary) nor pass for a Ctrl-C.
    s = run(client, tmp_path, function=f"{FN}:exits_or_interrupts", grid={"x": [1, 2, 3, 4]})
    assert s.units_failed == 2 and s.units_run == 4
    assert [(f["unit"], f["error_type"]) for f in s.failures] == [
        (1, "SystemExit"), (2, "KeyboardInterrupt")
    ]  # fmt: skip
    assert results_table(str(tmp_path)).column("y").to_pylist() == [1, 4]


def test_a_module_that_exits_when_imported_is_named(tmp_path, monkeypatch):
    (tmp_path / "script_like.py").write_text(
        "import sys\n\ndef f(x):\n    return x\n\nsys.exit(0)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    w = MapWorkload(MapJob(function="script_like:f", grid={"x": [1]}), "m")
    with pytest.raises(ConfigError, match="module 'script_like' exits when imported"):
        w.preflight()


def test_a_lambdas_job_folder_is_a_plain_name(tmp_path, client):
    s = pipeline.map(lambda x: 2 * x, grid={"x": [1, 2]}, output=str(tmp_path), client=client,
                     progress=False)  # fmt: skip
    assert s.complete and s.job_id == "lambda"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["_locks", "lambda"]
    assert results_table(str(tmp_path)).column("result").to_pylist() == [2, 4]
    import functools

    s = pipeline.map(functools.partial(userfns.power, p=3), grid={"x": [2]},
                     output=str(tmp_path), client=client, progress=False)  # fmt: skip
    assert s.job_id == "power"


def test_the_results_of_an_unfinished_run_say_so(tmp_path, client):
    from pipeline.layout import consolidated_manifest_key, manifest_key
    from pipeline.results import IncompleteJob, summarize

    run(client, tmp_path, function=f"{FN}:power", grid={"x": [1, 2, 3], "p": [2, 3]})
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a finished job's table: no warning
        assert results_table(str(tmp_path)).num_rows == 6
    # As if the driver had been killed before task 1 (units 2-3) wrote its entry.
    (tmp_path / manifest_key("m", 1)).unlink()
    (tmp_path / consolidated_manifest_key("m")).unlink()
    note = "the job's run has not finished: these are the rows of 4 of its 6 units"
    with pytest.warns(IncompleteJob, match=note):
        assert results_table(str(tmp_path)).column("x").to_pylist() == [1, 1, 3, 3]
    assert f"\nincomplete: {note}; run the job again to finish it\n" in summarize(str(tmp_path))


def test_the_results_of_a_run_stopped_while_probing_count_only_its_complete_tasks(tmp_path, client):
    # Only complete tasks' units count: those of tasks not planned yet are not there,
    # and the count must agree with verify's.
    from support.workloads import stopped_while_probing

    from pipeline.results import IncompleteJob, summarize

    grid = {"x": list(range(200))}
    run(client, tmp_path / "full", units_per_task=None, function=f"{FN}:power", grid=grid)
    head = stopped_while_probing(tmp_path / "full", tmp_path / "out", "m")
    have = sum(head[:-1])
    note = f"the job's run has not finished: these are the rows of {have:,} of its 200 units"
    with pytest.warns(IncompleteJob, match=note):
        assert results_table(str(tmp_path / "out")).num_rows == have
    assert f"\nincomplete: {note}; run the job again" in summarize(str(tmp_path / "out"))
    (check,) = verify_output(str(tmp_path / "out"))
    assert check.units_ok == have


def test_a_grid_of_seeds_passes_its_own(tmp_path, client):
    # The derived seed is for functions that want randomness; a sweep over seeds
    # asked for these ones.
    run(client, tmp_path, function=f"{FN}:power", grid={"x": [2], "seed": [5, 6]})
    table = results_table(str(tmp_path)).to_pandas()
    assert table["seed"].tolist() == [5, 6]
    assert table["noise"].tolist() == [float(np.random.default_rng(s).random()) for s in (5, 6)]


def test_same_bytes_whatever_the_task_sizes(tmp_path, client):
    grid = {"x": list(range(7))}
    for size in (1, 3):
        run(client, tmp_path / f"s{size}", function=f"{FN}:rows_per_unit", grid=grid,
            units_per_task=size)  # fmt: skip
        write_results(str(tmp_path / f"s{size}"), None, str(tmp_path / f"r{size}.parquet"))
    assert (tmp_path / "r1.parquet").read_bytes() == (tmp_path / "r3.parquet").read_bytes()
    table = pq.read_table(tmp_path / "r1.parquet").to_pandas()
    assert len(table) == sum(range(7)) and table["unit"].is_monotonic_increasing


def test_a_grid_key_has_one_type_whatever_the_task_sizes(tmp_path, client):
    # A grid key's type is the whole grid's, not each task's: typed per task, True is
    # 1.0 beside floats and a bool alone, which the other tasks' numbers cannot be
    # combined with, so the outcome would depend on the task sizes.
    grid = {"x": [1, 2.5, True], "p": [1, 2.5]}
    for size in (1, 3):
        s = run(client, tmp_path / f"s{size}", function=f"{FN}:kind_of", grid=grid,
                units_per_task=size)  # fmt: skip
        assert s.complete and s.units_failed == 0
        write_results(str(tmp_path / f"s{size}"), None, str(tmp_path / f"r{size}.parquet"))
    assert (tmp_path / "r1.parquet").read_bytes() == (tmp_path / "r3.parquet").read_bytes()
    table = pq.read_table(tmp_path / "r1.parquet")
    assert table.schema.field("x").type == pa.string()  # mixed kinds: their repr
    assert table.column("x").to_pylist() == ["1", "1", "2.5", "2.5", "True", "True"]
    assert table.schema.field("p").type == pa.float64()  # integers with floats
    assert table.column("kind").to_pylist() == ["int", "int", "float", "float", "bool", "bool"]


def test_units_that_return_none_complete_with_no_rows(tmp_path, client):
    # A task whose units all return None still writes its (empty) part: verify and
    # `pipeline results` find every unit's task.
    s = run(client, tmp_path, function=f"{FN}:nothing", grid={"x": [1, 2, 3, 4]})
    assert s.complete and s.units_failed == 0
    table = results_table(str(tmp_path))
    assert table.num_rows == 0 and table.column_names == ["unit", "x"]
    (check,) = verify_output(str(tmp_path))
    assert check.ok and check.units_ok == 4, check


def test_verify_counts_only_the_units_whose_objects_are_intact(tmp_path, client):
    run(client, tmp_path, function=f"{FN}:double", grid={"x": list(range(6))})
    results = tmp_path / "m" / "results"
    part(results, 1).open("ab").write(b"garbage")
    part(results, 2).unlink()
    (check,) = verify_output(str(tmp_path))
    assert not check.ok and len(check.corrupt) == 1 and len(check.missing) == 1
    assert check.units_ok == 2, check  # damaged units do not count as verified


def test_a_results_part_lost_before_the_job_completes_is_said_with_its_repair(tmp_path, client):
    # Killed before consolidating, then a complete task's part deleted: the rerun must
    # run that task again, not fail reading the part back on every rerun.
    settings = {"function": f"{FN}:double", "grid": {"x": list(range(6))}}
    run(client, tmp_path, **settings)
    clean = results_table(str(tmp_path)).to_pandas()
    (tmp_path / "m" / "manifest.parquet").unlink()
    lost = part(tmp_path / "m" / "results", 1)
    lost.unlink()
    with pytest.raises(pipeline.errors.StorageError, match=re.escape(lost.name)) as err:
        run(client, tmp_path, **settings)
    assert f"pipeline verify {tmp_path} --repair" in str(err.value)
    verify_output(str(tmp_path), repair=True)
    assert run(client, tmp_path, **settings).complete
    pd.testing.assert_frame_equal(results_table(str(tmp_path)).to_pandas(), clean)


def test_verify_says_how_many_units_failed_as_data_and_where_they_are(tmp_path, client):
    # Units that failed as data are not "verified": verify counts them and says where
    # they are recorded.
    from click.testing import CliRunner

    from pipeline.cli import main

    s = run(client, tmp_path, function=f"{FN}:odd_fails", grid={"x": [1, 2, 3, 4, 6, 8]})
    assert s.complete and s.units_failed == 2
    shown = CliRunner().invoke(main, ["verify", str(tmp_path)])
    assert shown.exit_code == 0, shown.output  # its objects are whole
    lines = shown.output.splitlines()
    assert lines[0].startswith("m (map): OK: 6 of 6 units verified in 5 objects;"), lines
    assert lines[1] == (
        "  failed: 2 units failed as data, recorded in the output (not damage): `pipeline "
        f"results {tmp_path} --table failures` lists them; the job's command, run again, "
        "calls them again"
    )
    assert results_table(str(tmp_path), "failures").num_rows == 2


def test_repairing_an_unreadable_entry_runs_its_task_whole_again(tmp_path, client):
    # An entry that cannot be read says nothing of its parts: its task runs whole
    # again, keeping none of them (a damaged part would fail every rerun).
    settings = {"function": f"{FN}:odd_fails", "grid": {"x": list(range(8))}}
    run(client, tmp_path, **settings)
    clean = results_table(str(tmp_path)).to_pandas()
    (tmp_path / "m" / "manifest.parquet").unlink()
    for damaged in ("manifest", "results"):
        (tmp_path / "m" / damaged / "part-000001.parquet").write_bytes(b"PAR1 not a table")
    (check,) = verify_output(str(tmp_path), repair=True)
    assert [t.index for t in check.repaired] == [1], check
    assert not (tmp_path / "m" / "results" / "part-000001.parquet").exists()
    run(client, tmp_path, **settings)
    pd.testing.assert_frame_equal(results_table(str(tmp_path)).to_pandas(), clean)


def test_failures_are_recorded_and_only_they_run_again(tmp_path, client):
    log, flag = tmp_path / "calls.log", tmp_path / "fail.flag"
    flag.touch()
    grid = {"x": [1, 2, 3, 4, 5], "log": [str(log)], "flag": [str(flag)]}
    settings = {"function": f"{FN}:power", "grid": grid}
    first = run(client, tmp_path / "out", units_per_task=2, **settings)
    assert first.units_failed == 1 and first.units_retryable == 1
    (failure,) = first.failures
    assert failure["error_type"] == "ValueError" and failure["unit"] == 2
    assert failure["key"].startswith("x=3, log='")  # which point, not only its number
    assert "x = 3 is refused" in failure["message"]
    assert "userfns.py:" in failure["message"] and "in power" in failure["message"]
    # The task said so; reading its failures table back gives the same.
    from dataclasses import asdict

    from pipeline.workload import Task

    w = MapWorkload(MapJob(**settings), "m")
    w.preflight()
    read = w.recorded_failures(LocalStore(tmp_path / "out"), [Task(1, 2, 4)])
    assert [asdict(f) for f in read] == first.failures
    failures = results_table(str(tmp_path / "out"), "failures").to_pandas()
    assert failures[["unit", "x", "error_type"]].values.tolist() == [[2, 3, "ValueError"]]
    from pipeline.results import summarize

    shown = summarize(str(tmp_path / "out")).splitlines()
    assert shown[1] == "failed: 1 unit, not in this table (--table failures)", shown
    assert len(calls(log)) == 5
    flag.unlink()
    log.unlink()
    # The rerun may ask for retries: they never change what a unit writes, so they are
    # not "other settings" a resume refuses
    second = run(client, tmp_path / "out", units_per_task=2, retries=1, **settings)
    assert second.units_failed == 0 and second.complete
    # one unit ran: the other four, one of them in the failed unit's task, were kept
    assert second.units_run == 1 and second.units_skipped == 4, second
    assert "failed:" not in summarize(str(tmp_path / "out"))
    assert calls(log) == ["power 3 2"]  # the failed unit only, not its task's other unit
    clean = tmp_path / "clean"
    run(client, clean, units_per_task=2, **settings)
    # no unit failed: an empty failures table, not "no table 'failures'"
    assert results_table(str(clean), "failures").num_rows == 0
    write_results(str(tmp_path / "out"), None, str(tmp_path / "a.parquet"))
    write_results(str(clean), None, str(tmp_path / "b.parquet"))
    assert (tmp_path / "a.parquet").read_bytes() == (tmp_path / "b.parquet").read_bytes()
    # The suffix chooses the format: .csv is CSV, not parquet bytes in a .csv file.
    write_results(str(clean), None, str(tmp_path / "b.csv"))
    assert pd.read_csv(tmp_path / "b.csv").equals(pd.read_parquet(tmp_path / "b.parquet"))
    with pytest.raises(ConfigError, match=r"b\.txt: write to a \.parquet or \.csv file"):
        write_results(str(clean), None, str(tmp_path / "b.txt"))
    (check,) = verify_output(str(tmp_path / "out"))
    assert check.ok, check
    third = run(client, tmp_path / "out", units_per_task=2, **settings)
    assert third.units_run == 0 and third.complete


def test_retries_within_the_run(tmp_path, client):
    markers = [str(tmp_path)]
    grid = {"x": [1, 2], "markers": markers}
    s = run(client, tmp_path / "o1", function=f"{FN}:flaky", grid=grid, retries=1)
    assert s.units_failed == 0
    s = run(client, tmp_path / "o2", function=f"{FN}:flaky", grid={"x": [5], "markers": markers})
    assert s.units_failed == 1 and s.failures[0]["error_type"] == "ConnectionError"


def test_files_and_dataset_chunks(tmp_path, client):
    files = tmp_path / "files"
    (files / "sub").mkdir(parents=True)
    (files / "a.txt").write_bytes(b"abc")
    (files / "sub" / "b.txt").write_bytes(b"12345")
    (files / ".hidden").write_bytes(b"x")
    run(client, tmp_path / "f", function=f"{FN}:file_size", files=str(files))
    table = results_table(str(tmp_path / "f")).to_pandas()
    assert table["name"].tolist() == ["a.txt", "b.txt"] and table["bytes"].tolist() == [3, 5]
    assert table["file"].tolist() == [str(files / "a.txt"), str(files / "sub" / "b.txt")]

    df = pd.DataFrame({"g": np.repeat(["b", "a", "c"], 4), "y": np.arange(12.0)})
    data = tmp_path / "data"
    data.mkdir()
    pq.write_table(pa.Table.from_pandas(df, preserve_index=False), data / "d.parquet",
                   row_group_size=5)  # fmt: skip
    run(client, tmp_path / "d", function=f"{FN}:chunk_stats", data=str(data), chunk_by="g")
    table = results_table(str(tmp_path / "d")).to_pandas()
    assert table[["g", "n", "y_mean"]].values.tolist() == [
        ["a", 4, 5.5], ["b", 4, 1.5], ["c", 4, 9.5]
    ]  # fmt: skip
    run(client, tmp_path / "r", function=f"{FN}:chunk_stats", data=str(data), chunk_rows=5)
    table = results_table(str(tmp_path / "r")).to_pandas()
    assert table[["row_start", "row_stop", "n"]].values.tolist() == [[0, 5, 5], [5, 10, 5],
                                                                    [10, 12, 2]]  # fmt: skip


def test_a_resume_after_an_input_file_changed_is_refused(tmp_path, client, monkeypatch):
    """A file's contents were not in the job's record (a dataset's files' versions
    were): a resume after an edit kept the results of the old contents as complete."""
    import json
    import os

    from pipeline.workloads.map import inputs as map_inputs

    files = tmp_path / "texts"
    files.mkdir()
    for i in range(4):
        (files / f"t{i}.txt").write_text("line\n" * i)
    settings = {"function": f"{FN}:line_count", "files": str(files)}
    assert run(client, tmp_path / "out", **settings).complete
    recorded = json.loads((tmp_path / "out" / "m" / "job.json").read_text())["fingerprint"]
    assert len(recorded["versions"]) == 4 and recorded["versions"][1].startswith("5-")
    assert run(client, tmp_path / "out", **settings).units_run == 0  # unchanged: resumed
    (files / "t1.txt").write_text("edited\n" * 7)
    changed = r"holds job 'm' whose input files changed since"
    with pytest.raises(ConfigError, match=changed):
        run(client, tmp_path / "out", **settings)
    # A long list is recorded by its digest (as a grid's points): still compared
    monkeypatch.setattr(map_inputs, "LISTED_RECORDED", 3)
    assert run(client, tmp_path / "long", **settings).complete
    recorded = json.loads((tmp_path / "long" / "m" / "job.json").read_text())["fingerprint"]
    assert recorded["files"]["files"] == 4 and recorded["versions"]["versions"] == 4
    assert len(recorded["versions"]["sha256"]) == 64
    assert run(client, tmp_path / "long", **settings).units_run == 0
    stat = (files / "t2.txt").stat()  # the same size, another time
    os.utime(files / "t2.txt", ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    with pytest.raises(ConfigError, match=changed):
        run(client, tmp_path / "long", **settings)


def test_pipeline_map_takes_paths_as_path_objects(tmp_path, client):
    """`output=Path(...)` (and data=, files=) was refused: "--output: expected a
    string, got PosixPath(...)"; a DataFrame as data= was shown whole as "--data"."""
    files = tmp_path / "files"
    files.mkdir()
    (files / "a.txt").write_bytes(b"abc")
    pq.write_table(pa.table({"g": ["a", "b"], "y": [1.0, 2.0]}), tmp_path / "d.parquet")
    s = pipeline.map(userfns.file_size, files=files, output=tmp_path / "f", client=client,
                     verbose=0)  # fmt: skip
    assert s.complete and results_table(str(tmp_path / "f")).column("bytes").to_pylist() == [3]
    s = pipeline.map(userfns.chunk_stats, data=tmp_path / "d.parquet", chunk_by="g",
                     output=tmp_path / "d", client=client, verbose=0)  # fmt: skip
    assert s.complete and results_table(str(tmp_path / "d")).column("n").to_pylist() == [1, 1]
    frame = pd.DataFrame({"g": ["a"], "y": [1.0]})
    with pytest.raises(ConfigError, match=r"^pipeline.map: data= is a parquet file, folder or "
                       r"s3:// prefix, not a DataFrame: write it with df.to_parquet"):  # fmt: skip
        pipeline.map(userfns.chunk_stats, data=frame, chunk_rows=1, output=tmp_path / "x",
                     client=client, verbose=0)  # fmt: skip


def test_files_given_as_empty_text_are_refused_not_the_working_folder(
    tmp_path, client, monkeypatch
):
    """`--files ''` ran over every file below the working folder, its outputs too."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a.txt").write_bytes(b"abc")
    with pytest.raises(InputError, match=r"^no files given: set files \(--files FOLDER"):
        run(client, tmp_path / "out", function=f"{FN}:file_size", files="")
    assert not (tmp_path / "out").exists()


def test_an_output_inside_a_files_input_is_refused(tmp_path, client):
    """`--files in --output in/results`: the rerun listed the job's own results as its
    inputs (and was refused, 'other settings (files)')."""
    (tmp_path / "in" / "sub").mkdir(parents=True)
    for name in ("a.txt", "b.txt", "sub/c.txt"):
        (tmp_path / "in" / name).write_text("x\n")
    import re

    out = str(tmp_path / "in" / "results")
    o = re.escape(out)
    for files in (str(tmp_path / "in"), f"{tmp_path}/in/**"):
        with pytest.raises(ConfigError, match=rf"^{re.escape(files)}: (the output \({o}\) is "
                           rf"inside this input|this glob matches files inside the output \({o}\)"
                           "), so the job's next run would read its results as inputs; give "
                           r"another output \(--output\)$"):  # fmt: skip
            pipeline.map(userfns.file_size, files=files, output=out, client=client)
    assert not (tmp_path / "in" / "results").exists()
    # A glob that cannot reach the output: its results stay out of the next run's inputs
    for _ in range(2):
        s = pipeline.map(userfns.file_size, files=f"{tmp_path}/in/*.txt", output=out,
                         client=client, progress=False)  # fmt: skip
        assert s.complete and s.units == 2
    assert s.units_run == 0


def test_a_file_name_that_is_not_utf8_is_kept_escaped(tmp_path, client):
    files = tmp_path / "files"
    files.mkdir()
    (files / "ok.txt").write_bytes(b"abc")
    (files / "bad\udcffname.txt").write_bytes(b"12345")  # the name's bytes: bad\xffname
    s = run(client, tmp_path / "f", function=f"{FN}:file_bytes", files=str(files))
    assert s.complete and not s.failures
    table = results_table(str(tmp_path / "f")).to_pandas()
    assert table["file"].tolist() == [str(files / "bad\\xffname.txt"), str(files / "ok.txt")]
    assert table["bytes"].tolist() == [5, 3]
    (check,) = verify_output(str(tmp_path / "f"))
    assert check.ok


def test_a_job_whose_every_unit_failed_has_an_empty_results_table(tmp_path, client):
    # The results table exists, empty, even when every unit failed.
    flag = tmp_path / "fail.flag"
    flag.touch()
    grid = {"x": [3], "p": [2, 3], "flag": [str(flag)]}
    s = run(client, tmp_path / "out", function=f"{FN}:power", grid=grid)
    assert s.units_failed == 2
    table = results_table(str(tmp_path / "out"))
    assert table.num_rows == 0 and "unit" in table.column_names
    from pipeline.results import summarize

    shown = summarize(str(tmp_path / "out"))
    assert shown.splitlines()[0].endswith(
        "/out/m: table 'results' is empty: no rows (its columns: unit, x, p, flag)"
    )
    assert "failed: 2 units, not in this table" in shown and "Empty DataFrame" not in shown


def test_results_name_every_table_a_job_has_and_an_empty_one_in_a_line(tmp_path, client):
    # `--table nope` lists every table; an empty failures table is said in words, not
    # as pandas' text of an empty frame.
    from click.testing import CliRunner

    from pipeline.cli import main

    run(client, tmp_path, function=f"{FN}:power", grid={"x": [1, 2, 3]})
    nope = CliRunner().invoke(main, ["results", str(tmp_path), "--table", "nope"])
    assert nope.exit_code == 1
    assert nope.output.endswith("/m: no table 'nope'; its tables: results, failures\n")
    empty = CliRunner().invoke(main, ["results", str(tmp_path), "--table", "failures"])
    assert (
        empty.exit_code == 0
        and empty.output == f"{tmp_path}/m: table 'failures' is empty: no rows\n"
    )


def test_the_python_api_takes_settings_from_the_environment(tmp_path, client, monkeypatch):
    # pipeline.map resolves its settings as the command line does: PIPELINE_* apply.
    monkeypatch.setenv("PIPELINE_OUTPUT", str(tmp_path / "from-env"))
    monkeypatch.setenv("PIPELINE_SEED", "5")
    monkeypatch.chdir(tmp_path)
    s = pipeline.map(userfns.power, grid={"x": [1, 2]}, client=client, progress=False)
    assert s.complete and (tmp_path / "from-env" / "power").is_dir()
    noise = results_table(str(tmp_path / "from-env")).column("noise").to_pylist()
    assert noise == [float(np.random.default_rng(unit_seed(5, u)).random()) for u in (0, 1)]
    # an argument outranks the environment
    s = pipeline.map(userfns.power, grid={"x": [1]}, output=str(tmp_path / "given"),
                     client=client, progress=False)  # fmt: skip
    assert (tmp_path / "given" / "power").is_dir()


def test_cluster_settings_beside_a_client_are_refused(tmp_path, client):
    # Refused, not ignored: a client given decides the cluster, and settings for
    # another one would silently not apply.
    refused = r"^pipeline\.map: scheduler='tls://10\.0\.0\.1:8786', workers=5 set up a cluster"
    with pytest.raises(ConfigError, match=refused + ", but client= gives the cluster to run on"):
        pipeline.map(userfns.power, grid={"x": [1]}, output=str(tmp_path), client=client,
                     workers=5, scheduler="tls://10.0.0.1:8786")  # fmt: skip
    assert not (tmp_path / "power").exists()
    s = pipeline.map(userfns.power, grid={"x": [1]}, output=str(tmp_path), client=client,
                     progress=False, units_per_task=1)  # fmt: skip
    assert s.complete


def test_the_python_api_writes_the_report_and_the_profile_it_is_given(tmp_path, client):
    # Checked as writable, then never written: `pipeline run` alone wrote them.
    import json
    import pstats

    report, profile = tmp_path / "report", tmp_path / "driver.pstats"
    s = pipeline.map(userfns.power, grid={"x": [1, 2]}, output=str(tmp_path / "out"),
                     client=client, report=str(report), profile=str(profile),
                     progress=False)  # fmt: skip
    assert s.complete
    assert sorted(p.name for p in report.iterdir()) == [
        "power-dask-report.html", "power-report.html", "power-summary.json"
    ]  # fmt: skip
    assert json.loads((report / "power-summary.json").read_text())["units"] == 2
    assert pstats.Stats(str(profile)).total_calls > 0


def test_a_return_of_another_type_fails_its_unit(tmp_path, client):
    s = run(client, tmp_path, function=f"{FN}:wrong_type", grid={"x": [1]})
    assert s.failures[0]["error_type"] == "TypeError"
    assert (
        "returned a builtins.set; expected a value (number, text, date, array or list), a "
        "mapping or a " in (s.failures[0]["message"])
    )


def test_a_single_value_is_a_row_of_one_column(tmp_path, client):
    # As joblib's Parallel collects one value per call; numpy's scalars are values too.
    # An array or a list of values (`return loss, acc`) is one value: a list cell.
    values = [("int", 7), ("float", 0.5), ("text", "abc"), ("array", [1.5, 2.5]),
              ("matrix", [[1.0, 0.0], [0.0, 1.0]]), ("pair", [0.25, 3.0])]  # fmt: skip
    for kind, want in values:
        run(client, tmp_path / kind, function=f"{FN}:one_value", grid={"x": [kind]})
        table = results_table(str(tmp_path / kind))
        assert table.column_names == ["unit", "x", "result"]
        assert table.column("result").to_pylist() == [want]
    run(client, tmp_path / "day", function=f"{FN}:one_value", grid={"x": ["day"]})
    assert str(results_table(str(tmp_path / "day")).column("result")[0]) == "2024-01-02"
    # A mapping's labels name the columns as text, as a Series' do.
    run(client, tmp_path / "q", function=f"{FN}:quantiles", grid={"x": [1]})
    assert results_table(str(tmp_path / "q")).to_pylist() == [
        {"unit": 0, "x": 1, "0.5": 1, "0.9": 2}
    ]


def test_arrays_in_a_row_are_values_as_a_returned_array_is(tmp_path, client):
    """`return np.eye(2)` was a list of lists and `return {"m": np.eye(2)}` failed its
    unit (as did a 0-d array, np.median's of an axis-less array): 'Can only convert
    1-dimensional array values'."""
    s = run(client, tmp_path, function=f"{FN}:arrays_in_a_row", grid={"x": [1, 2]})
    assert s.units_failed == 0
    assert results_table(str(tmp_path)).to_pylist() == [
        {"unit": u, "x": x, "matrix": [[x, 0.0], [0.0, x]], "mean": x * 1.5,
         "vector": [0.0, 1.0]}
        for u, x in enumerate([1, 2])
    ]  # fmt: skip


def test_a_series_rows_as_dicts_and_a_groupbys_frame_keep_every_value(tmp_path, client):
    df = pd.DataFrame({"g": np.repeat(["a", "b"], 4), "h": ["p", "q"] * 4, "y": np.arange(8.0)})
    data = tmp_path / "data"
    data.mkdir()
    df.to_parquet(data / "d.parquet", index=False)

    def table(fn: str) -> pd.DataFrame:
        run(client, tmp_path / fn, function=f"{FN}:{fn}", data=str(data), chunk_by="g")
        return results_table(str(tmp_path / fn)).to_pandas()

    # The groupby's index (h) is data: kept as a column, after the unit's keys.
    t = table("group_means")
    assert list(t.columns) == ["unit", "g", "h", "y"]
    assert t[["g", "h", "y"]].values.tolist() == [["a", "p", 1.0], ["a", "q", 2.0],
                                                  ["b", "p", 5.0], ["b", "q", 6.0]]  # fmt: skip
    # A filtered chunk's index is row labels, left out.
    assert list(table("big_rows").columns) == ["unit", "g", "y"]
    # A Series is one row, its labels naming the columns.
    t = table("summary_series")
    assert t[["g", "min", "max"]].values.tolist() == [["a", 0.0, 3.0], ["b", 4.0, 7.0]]
    # Columns of two levels (agg with a list) are named level by level: y_mean.
    t = table("several_statistics")
    assert list(t.columns) == ["unit", "g", "h", "y_mean", "y_max"]
    assert t[["h", "y_mean", "y_max"]].values.tolist()[:2] == [["p", 1.0, 2.0], ["q", 2.0, 3.0]]
    # A list of mappings is rows.
    t = table("rows_as_dicts")
    assert t[["unit", "i", "y"]].values.tolist()[:5] == [[0, 0, 0.0], [0, 1, 1.0], [0, 2, 2.0],
                                                         [0, 3, 3.0], [1, 0, 4.0]]  # fmt: skip


def test_key_columns_returned_as_they_came_are_left_out_others_fail(tmp_path, client):
    # Returning the parameters (or a groupby on the chunk key) is the same data as the
    # key columns the results begin with: kept once. A different value fails the unit.
    run(client, tmp_path / "a", function=f"{FN}:echoes_its_parameters",
        grid={"x": [1, 2], "p": [2, 3]})  # fmt: skip
    t = results_table(str(tmp_path / "a")).to_pandas()
    assert t.values.tolist() == [[0, 1, 2, 1], [1, 1, 3, 1], [2, 2, 2, 4], [3, 2, 3, 8]]
    assert list(t.columns) == ["unit", "x", "p", "y"]
    df = pd.DataFrame({"g": np.repeat(["a", "b"], 4), "h": ["p", "q"] * 4, "y": np.arange(8.0)})
    data = tmp_path / "data"
    data.mkdir()
    df.to_parquet(data / "d.parquet", index=False)
    run(client, tmp_path / "b", function=f"{FN}:group_means_by_key", data=str(data), chunk_by="g")
    t = results_table(str(tmp_path / "b")).to_pandas()
    assert t[["g", "h", "y"]].values.tolist() == [["a", "p", 1.0], ["a", "q", 2.0],
                                                  ["b", "p", 5.0], ["b", "q", 6.0]]  # fmt: skip
    s = run(client, tmp_path / "c", function=f"{FN}:changes_its_key", grid={"x": [1, 2]})
    assert [f["error_type"] for f in s.failures] == ["ValueError"] * 2
    assert "returned a column 'x' holding 2, but 'x' is a key column" in s.failures[0]["message"]
    assert "this unit's x is 1" in s.failures[0]["message"]
    s = run(client, tmp_path / "c2", function=f"{FN}:changes_its_key_in_numpy", grid={"x": [1]})
    assert "holding 2.0, but" in s.failures[0]["message"]  # not np.float64(2.0)
    run(client, tmp_path / "d", function=f"{FN}:rows_generated", grid={"x": [0, 2]})
    assert results_table(str(tmp_path / "d")).to_pandas().values.tolist() == [[1, 2, 0], [1, 2, 1]]
    # Values yielded are one list cell, as values returned in a list.
    run(client, tmp_path / "e", function=f"{FN}:values_generated", grid={"x": [0, 3]})
    assert results_table(str(tmp_path / "e")).to_pylist() == [
        {"unit": 1, "x": 3, "result": [0, 1, 2]}
    ]
    s = run(client, tmp_path / "f", function=f"{FN}:rows_and_values", grid={"x": [1]})
    assert "list of rows (mappings) mixed with other values" in s.failures[0]["message"]


def test_a_chunks_types_do_not_depend_on_its_file(tmp_path, client):
    # One file stores x as integers, the other as floats: every chunk gets floats, in
    # tasks of one file or of both; a column one file lacks is named before any task.
    data = tmp_path / "data"
    data.mkdir()
    pd.DataFrame({"g": [0, 0, 1], "x": [1, 2, 3]}).to_parquet(data / "a.parquet", index=False)
    pd.DataFrame({"g": [2, 2], "x": [0.5, 1.5], "only_b": 1}).to_parquet(data / "b.parquet")
    for size in (1, 3):
        out = tmp_path / f"out{size}"
        run(client, out, function=f"{FN}:column_types", data=str(data), chunk_by="g",
            columns=["x"], units_per_task=size)  # fmt: skip
        assert results_table(str(out)).column("x_type").to_pylist() == ["float64"] * 3
    with pytest.raises(InputError, match=r"a.parquet has no column 'only_b' \(needed by the fu"):
        run(client, tmp_path / "all", function=f"{FN}:column_types", data=str(data), chunk_by="g")


def test_columns_that_differ_between_units_name_two_units(tmp_path, client):
    s = run(client, tmp_path, function=f"{FN}:mixed_types", grid={"x": [1, 2, 3]},
            units_per_task=3)  # fmt: skip
    assert s.units_failed == 3
    message = s.failures[0]["message"]
    assert "results of units 0 and 1 cannot be combined: column 'v'" in message
    assert message.endswith("fix the function, then run the job again with --overwrite")
    # In tasks of their own, each task's units agree: the disagreement shows when the
    # results are combined, and must stop the run there with the same advice.
    out = tmp_path / "apart"
    with pytest.raises(InputError, match=r"units from 0 and from 1 cannot be combined: column "
                       r"'v' is int64 in one and string in the other: .* --overwrite"):  # fmt: skip
        run(client, out, function=f"{FN}:mixed_types", grid={"x": [1, 2, 3]}, units_per_task=1)
    assert len(completed_tasks(LocalStore(str(out)), "m")) == 3
    assert not (out / "m" / "manifest.parquet").exists()
    with pytest.raises(InputError, match=r"cannot be combined"):
        results_table(str(out))


def test_a_value_no_column_can_hold_fails_only_its_unit(tmp_path, client):
    s = run(client, tmp_path, function=f"{FN}:unstorable", grid={"x": [0, 1, 2, 3]},
            units_per_task=4)  # fmt: skip
    assert s.units_failed == 2
    by_unit = {f["unit"]: f["message"] for f in s.failures}
    assert by_unit[1].startswith("column 'v': 1180591620717411303424 (int) cannot be stored")
    assert by_unit[2].startswith("column 'w': <object object at")
    table = results_table(str(tmp_path)).to_pandas()
    assert table[["unit", "v", "w"]].values.tolist() == [[0, 0, 0.5], [3, 3, 0.5]]


@pytest.mark.parametrize(
    ("settings", "error", "match"),
    [
        ({"function": "no_such_module:f", "grid": {"x": [1]}}, ConfigError,
         "module 'no_such_module' does not import: ModuleNotFoundError"),
        ({"function": f"{FN}:missing", "grid": {"x": [1]}}, ConfigError, "has no 'missing'"),
        ({"function": f"{FN}:not_callable", "grid": {"x": [1]}}, ConfigError, "not callable"),
        ({"function": f"{FN}:power", "grid": {"x": [1], "q": [2]}}, ConfigError,
         "does not accept the grid key\\(s\\) 'q'"),
        ({"function": f"{FN}:keyword_only", "files": "."}, ConfigError,
         "needs a positional parameter"),
        ({"function": f"{FN}:power"}, ConfigError, "exactly one input.*none given"),
        ({"function": f"{FN}:power", "grid": {"x": [1]}, "files": "."}, ConfigError,
         "got grid and files"),
        ({"function": f"{FN}:power", "grid": {"x": [1]}, "chunk_rows": 5, "columns": "a"},
         ConfigError, "chunk_rows, columns: apply to a data input only; this job's input is grid"),
        ({"function": f"{FN}:file_size", "files": ".", "chunk_by": "k"}, ConfigError,
         "chunk_by: applies to a data input only; this job's input is files"),
        ({"function": f"{FN}:power", "grid": {"x": None}}, ConfigError,
         "a value or a non-empty list"),
        ({"function": f"{FN}:power", "grid": [{"x": 1, "p": 2}, {"x": 2}]}, ConfigError,
         r"point 1 has keys \(x\) where point 0 has \(p, x\); every point"),
        ({"function": f"{FN}:power", "grid": [{}, {}]}, ConfigError, "point 0 has no keys"),
        ({"function": f"{FN}:power", "grid": [{"x": 1, "q": 2}]}, ConfigError,
         "does not accept the grid key\\(s\\) 'q'"),
        ({"function": f"{FN}:power", "grid": [{"x": 1, "unit": 2}]}, ConfigError,
         "grid key 'unit' has the name"),
        ({"function": f"{FN}:file_size", "files": "/no/such/folder"}, InputError,
         "no such folder"),
        ({"function": f"{FN}:power", "grid": {"x": [1]}, "code": "/no/such/code.py"},
         ConfigError, r"code = '/no/such/code.py': no such file or folder \(/no/such/code.py: "),
        ({"function": f"{FN}:chunk_stats", "data": "/no/such/data", "chunk_rows": 2},
         InputError, "/no/such/data: no such folder or file"),
        ({"function": "power", "grid": {"x": [1]}}, ConfigError, "expected 'module:callable'"),
        ({"function": f"{FN}:power", "grid": {"x": [1], "unit": [2]}}, ConfigError,
         "grid key 'unit' has the name of the results' first column .* rename the key"),
        ({"function": f"{FN}:chunk_stats", "data": "/no/such/data", "chunk_by": "g,unit"},
         ConfigError, "chunk_by column 'unit' has the name of the results' first column"),
    ],
)  # fmt: skip
def test_bad_jobs_fail_before_any_task(tmp_path, client, settings, error, match):
    with pytest.raises(error, match=match):
        run(client, tmp_path / "out", **settings)
    assert not (tmp_path / "out").exists()


def test_a_callable_object_is_named_by_its_class_not_its_address():
    # Its repr held a memory address: in the job's description and fingerprint, so a
    # run of pipeline.map over it in a new process never matched the last one.
    from pipeline.workloads.map.usercode import describe_function

    class Scaler:
        def __call__(self, x):
            return {"y": 2 * x}

    name = describe_function(Scaler())
    assert name.startswith(f"{__name__}:") and name.endswith(".Scaler object"), name
    assert "0x" not in name
    assert describe_function(np.sqrt) == "numpy:sqrt"


def test_a_function_defined_in_the_calling_script_travels_by_value(tmp_path):
    script = tmp_path / "driver.py"
    script.write_text(
        textwrap.dedent(f"""
        import pipeline

        def cube(x):
            return {{"x3": x ** 3}}

        if __name__ == "__main__":
            s = pipeline.map(cube, grid={{"x": [1, 2, 3]}}, output={str(tmp_path / "out")!r},
                             workers=1, progress=False)
            print(s.complete, s.units_run)
            again = pipeline.map(cube, grid={{"x": [1, 2, 3]}}, output={str(tmp_path / "out")!r},
                                 workers=1, progress=False)
            print(again.complete, again.units_run)
            print(pipeline.results_table({str(tmp_path / "out")!r}).column("x3").to_pylist())
    """)
    )
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=180, cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["True 3", "True 0", "[1, 8, 27]"]


def test_a_job_file_function_imports_from_the_job_files_folder(tmp_path):
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    (jobs / "mine.py").write_text("def twice(x):\n    return {'y': 2 * x}\n")
    (jobs / "grid.toml").write_text(
        'workload = "map"\nfunction = "mine:twice"\n[grid]\nx = [1, 2, 3]\n'
    )
    proc = subprocess.run(
        [sys.executable, "-m", "pipeline", "run", str(jobs / "grid.toml"), "--output",
         str(tmp_path / "out"), "--workers", "1"],
        capture_output=True, text=True, timeout=180, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "map job 'grid': 3 of 3 points" in proc.stdout
    shown = subprocess.run([sys.executable, "-m", "pipeline", "results", str(tmp_path / "out")],
                           capture_output=True, text=True, timeout=60)  # fmt: skip
    assert "table 'results', 3 rows" in shown.stdout, shown.stderr


def test_a_unit_that_kills_its_worker_fails_its_task_alone(tmp_path):
    # Dask gives up on a task after its 4th worker dies, and on any task that was
    # queued on those workers each time (it counts every task a dead worker held):
    # each runs again alone after the others; task 1 (unit 3 ends its process) fails,
    # the others complete. A task whose attempt committed before its worker died
    # (its receipt not sent) loses its next attempt's commit: the recorded failures
    # come from its entry then (the test below).
    with connect(RunOptions(workers=2)) as c:
        s = run(c, tmp_path, function=f"{FN}:ends_its_process", grid={"x": list(range(8))},
                units_per_task=2)  # fmt: skip
    # Unit 6's own failure is listed too, beside the KilledWorker of its task.
    assert (s.units_ok, s.units_failed) == (5, 3)
    failed = {f["unit"]: f for f in s.failures}
    assert sorted(failed) == [2, 3, 6] and failed[3]["error_type"] == "KilledWorker"
    assert "died each of the 4 times it ran it (units 2..3)" in failed[3]["message"]
    assert failed[3]["key"] == "x=3" and failed[6]["error_type"] == "SystemExit"
    # The failed task wrote no entry: the run has not finished, and the table says so.
    from pipeline.results import IncompleteJob

    with pytest.warns(IncompleteJob, match="the rows of 6 of its 8 units"):
        assert results_table(str(tmp_path)).column("y").to_pylist() == [0, 1, 4, 5, 7]


def test_a_lost_attempts_recorded_failures_count_in_a_run_that_did_not_complete(tmp_path):
    # The test above failed once with (6, 2): task 3's attempt committed, its worker died
    # (unit 3 ending it) before its receipt left, and the attempt run again lost the
    # commit; a lost attempt's receipt says nothing of the units recorded as failed
    # (the winner's entry holds them), and the summary of a run that did not complete
    # read none from the entries. Here both attempts of task 3 run in this process.
    from pipeline.dispatch.task import execute_task
    from pipeline.runner.summarize import recorded_in
    from pipeline.workload import Task

    workload = MapWorkload(MapJob(function=f"{FN}:ends_its_process", grid={"x": list(range(8))}),
                           "m", output=str(tmp_path))  # fmt: skip
    workload.preflight()
    task, store = Task(3, 6, 8), LocalStore(tmp_path)
    first = execute_task(workload, str(tmp_path), task)
    again = execute_task(workload, str(tmp_path), task)
    assert not first.lost and again.lost and again.recorded is None and again.complete
    tasks = [Task(i, 2 * i, 2 * i + 2) for i in range(4)]
    for receipts in ([first], [again]):
        (failure,) = recorded_in(workload, store, tasks, receipts)
        assert (failure.unit, failure.error_type) == (6, "SystemExit")


def test_results_name_the_job_to_pick_or_say_there_is_none(tmp_path, client):
    with pytest.raises(InputError, match="no job output here"):
        results_table(str(tmp_path / "nothing"))
    for name in ("j1", "j2"):
        run(client, tmp_path / "two", job_id=name, function=f"{FN}:one_value", grid={"x": ["int"]})
    with pytest.raises(InputError, match=r"several jobs \(j1, j2\); name one with --job"):
        results_table(str(tmp_path / "two"))
    with pytest.raises(InputError, match=r"no job 'j3' \(found: j1, j2\)"):
        results_table(str(tmp_path / "two"), job="j3")
    assert results_table(str(tmp_path / "two"), job="j2").num_rows == 1
    # A job's own folder, as a run prints it ("results: .../two/j2"), names the job.
    assert results_table(str(tmp_path / "two" / "j2")).equals(
        results_table(str(tmp_path / "two"), job="j2")
    )
    (check,) = verify_output(f"{tmp_path}/two/j1/")
    assert check.job_id == "j1" and check.ok


def _pin_threads(cpus) -> list[int]:
    """Every thread of this (worker) process onto ``cpus``; the CPUs it had."""
    import os

    before = sorted(os.sched_getaffinity(0))
    for tid in os.listdir("/proc/self/task"):
        os.sched_setaffinity(int(tid), cpus)
    return before


#: A busy loop on one core, for at most a minute.
SPIN = "import os, sys, time\nos.sched_setaffinity(0, {int(sys.argv[1])})\n" \
       "end = time.time() + 60\nwhile time.time() < end:\n    pass\n"  # fmt: skip


def test_the_summary_tells_waiting_tasks_from_computing_ones(tmp_path, client):
    import dataclasses
    import os

    from pipeline.summary import bottleneck

    # Units long enough (8 x 0.4 s on 2 workers) that the run is neither overhead- nor
    # straggler-bound, even with a worker's task starting late on a loaded host.
    grid = {"x": ["wait"], "i": list(range(8)), "seconds": [0.4]}
    waited = run(client, tmp_path / "w", function=f"{FN}:waits", grid=grid, units_per_task=4)
    assert waited.cpu_seconds < 0.5 * waited.busy_seconds
    said = bottleneck(waited)
    assert said.startswith("wait-bound: 2 workers busy") and said.endswith(
        "; more workers (--workers, even beyond the cores) would overlap more waits"
    ), said
    # On a remote cluster --workers starts none: its workers' own count is the advice.
    remote = bottleneck(dataclasses.replace(waited, remote=True))
    assert "--workers" not in remote and "(dask worker --nworkers, even beyond" in remote
    # Work that computes, on a core taken by two busy loops: the workers are on the CPU
    # a quarter of the time and runnable the rest. That is CPU contention, not waiting:
    # more workers (the advice for waiting) would make it worse.
    core = max(os.sched_getaffinity(0))
    before = client.run(_pin_threads, {core})
    loops = [subprocess.Popen([sys.executable, "-c", SPIN, str(core)]) for _ in range(2)]
    try:
        grid = {"x": ["spin"], "i": list(range(8)), "seconds": [0.1]}
        spun = run(client, tmp_path / "s", function=f"{FN}:waits", grid=grid, units_per_task=4)
    finally:
        for loop in loops:
            loop.kill()
            loop.wait()
        for worker, cpus in before.items():
            client.run(_pin_threads, set(cpus), workers=[worker])
    said = bottleneck(spun)
    assert said.startswith("CPU-contended: 2 workers busy"), said
    assert "--workers" not in said and said.endswith("more workers would only wait longer")


def test_nested_columns_reach_a_csv_as_json_text(tmp_path, client):
    run(client, tmp_path / "o", function=f"{FN}:list_param", grid={"dims": [[1, 2], [3, 4, 5]]})
    write_results(str(tmp_path / "o"), None, str(tmp_path / "r.csv"))
    rows = pd.read_csv(tmp_path / "r.csv")
    assert rows["dims"].tolist() == ["[1, 2]", "[3, 4, 5]"]
    assert rows["first"].tolist() == ['{"k": 1}', '{"k": 3}'] and rows["n"].tolist() == [2, 3]


def test_a_unit_that_would_start_a_cluster_inside_its_worker_fails_naming_it(tmp_path, client):
    s = run(client, tmp_path, function=f"{FN}:nested_map", grid={"x": [1]})
    assert s.units_failed == 1 and s.failures[0]["error_type"] == "ClusterError"
    assert "would start an embedded cluster" in s.failures[0]["message"]


def test_a_deleted_task_entry_is_incomplete_for_verify_and_results(tmp_path, client):
    """A complete job whose task entry went missing (a partial copy of the output):
    the next run reruns that task, so verify and results say it is incomplete too,
    where verify said OK and results left its rows out silently."""
    s = run(client, tmp_path, function=f"{FN}:power", grid={"x": list(range(6))})
    assert s.complete
    (tmp_path / "m" / "manifest" / "part-000001.parquet").unlink()
    (check,) = verify_output(str(tmp_path))
    assert not check.ok and "manifest entries are missing" in check.incomplete, check
    assert "part-000001.parquet" in check.incomplete
    with pytest.warns(pipeline.IncompleteJob, match="4 of its 6 units"):
        assert results_table(str(tmp_path)).num_rows == 4
    assert run(client, tmp_path, function=f"{FN}:power", grid={"x": list(range(6))}).units_run == 2
    (check,) = verify_output(str(tmp_path))
    assert check.ok, check


def test_damaged_manifest_pages_and_missing_parts_are_named_not_tracebacks(tmp_path, client):
    s = run(client, tmp_path, function=f"{FN}:power", grid={"x": list(range(6))})
    assert s.complete
    # garbage inside the consolidated manifest's data, its footer intact
    manifest = tmp_path / "m" / "manifest.parquet"
    data = bytearray(manifest.read_bytes())
    data[4:11] = b"garbage"  # (its first page header)
    manifest.write_bytes(bytes(data))
    (check,) = verify_output(str(tmp_path))
    assert check.damaged_manifest and "not a readable table" in check.corrupt[0], check
    lost = part(tmp_path / "m" / "results", 2)
    lost.unlink()
    with pytest.raises(InputError, match=re.escape(lost.name) + ", listed in its job's manifest, "
                       "is missing: `pipeline verify .* --repair`"):  # fmt: skip
        results_table(str(tmp_path))


def test_bytes_reach_a_csv_as_base64(tmp_path, client):
    run(client, tmp_path / "o", function=f"{FN}:as_bytes", grid={"x": [0, 1, 2]})
    write_results(str(tmp_path / "o"), None, str(tmp_path / "r.csv"))
    rows = pd.read_csv(tmp_path / "r.csv", keep_default_na=False)
    assert rows["blob"].tolist() == ["", "AP8=", "AP8A/w=="]


def test_code_elsewhere_imports_on_the_driver_too(tmp_path, client):
    """`code = PATH` (a file or a package folder) is where the driver imports the
    function from too: it asked the user to see `code` while `code` was set."""
    lib = tmp_path / "lib"
    (lib / "pkg_elsewhere").mkdir(parents=True)
    (lib / "shipped_elsewhere.py").write_text("def f(x):\n    return {'v': 3 * x}\n")
    (lib / "pkg_elsewhere" / "__init__.py").write_text("")
    (lib / "pkg_elsewhere" / "mod.py").write_text("def g(x):\n    return {'v': 5 * x}\n")
    s = run(client, tmp_path / "a", function="shipped_elsewhere:f",
            code=str(lib / "shipped_elsewhere.py"), grid={"x": [1, 2]})  # fmt: skip
    assert s.complete and results_table(str(tmp_path / "a")).column("v").to_pylist() == [3, 6]
    s = run(client, tmp_path / "b", function="pkg_elsewhere.mod:g",
            code=str(lib / "pkg_elsewhere"), grid={"x": [1, 2]})  # fmt: skip
    assert s.complete and results_table(str(tmp_path / "b")).column("v").to_pylist() == [5, 10]


def test_code_that_is_not_shipped_is_not_the_jobs_code(tmp_path, client):
    """`code = "."` beside a `.venv`: its modules (never shipped) were hashed into the
    job's code, so that a package installed there refused the resume (and hashing them
    took seconds)."""
    project = tmp_path / "project"
    (project / ".venv" / "lib").mkdir(parents=True)
    (project / "project_fns.py").write_text("def f(x):\n    return {'v': 7 * x}\n")
    (project / ".venv" / "lib" / "installed.py").write_text("VERSION = 1\n")
    settings = {"function": "project_fns:f", "code": str(project), "grid": {"x": [1, 2]}}
    assert run(client, tmp_path / "o", **settings).complete
    (project / ".venv" / "lib" / "installed.py").write_text("VERSION = 2\n")
    again = run(client, tmp_path / "o", **settings)
    assert again.complete and again.units_run == 0


def _scaler(k):
    def scale(x):
        return {"y": x * k}

    return scale


def test_a_function_whose_captured_values_changed_does_not_resume(tmp_path, client):
    """The job's record hashes what the function captures (a closure's values, a
    partial's arguments) with its source: a resume with other values returned the
    old results as complete."""
    import functools

    out = str(tmp_path)
    assert pipeline.map(
        _scaler(2), grid={"x": [1, 2]}, output=out, client=client, progress=False
    ).complete
    assert (
        pipeline.map(
            _scaler(2), grid={"x": [1, 2]}, output=out, client=client, progress=False
        ).units_run
        == 0
    )
    with pytest.raises(ConfigError, match=r"other settings \(function_source\)"):
        pipeline.map(_scaler(5), grid={"x": [1, 2]}, output=out, client=client, progress=False)
    twice = functools.partial(userfns.power, p=2)
    assert pipeline.map(
        twice, grid={"x": [1, 2]}, output=out, name="pw", client=client, progress=False
    ).complete
    with pytest.raises(ConfigError, match=r"other settings \(function_source\)"):
        pipeline.map(functools.partial(userfns.power, p=3), grid={"x": [1, 2]}, output=out,
                     name="pw", client=client, progress=False)  # fmt: skip


@pytest.mark.parametrize("row_group_size", [None, 20])
def test_float_keys_zero_and_negative_zero_are_one_chunk(tmp_path, client, row_group_size):
    """-0.0 equals 0.0 (pandas groups them together): grouped by their bits, the rows
    of the second to appear were in no chunk, silently (whichever came first)."""
    rate = [0.0, -0.0] * 10 + [-0.0] * 10 + [0.0] * 10 + [0.5] * 20
    table = pa.table({"rate": rate, "x": np.arange(60.0)})
    pq.write_table(table, tmp_path / "d.parquet", row_group_size=row_group_size)
    s = run(client, tmp_path / "o", function=f"{FN}:rows_in", data=str(tmp_path / "d.parquet"),
            chunk_by="rate")  # fmt: skip
    assert s.complete and s.units == 2
    got = results_table(str(tmp_path / "o")).to_pydict()
    assert got["rate"] == [0.0, 0.5] and got["rows"] == [40, 20]


def test_shipped_code_is_named_by_its_content_and_kept_loaded_while_unchanged(tmp_path, client):
    """Each run registers `code` again: an unchanged version kept its digest whatever
    the files' times (a touched file made a new version), and its modules stay
    loaded on the workers; a changed one is imported afresh."""
    from pipeline.cluster.shipped_code import ShippedCode, ship_code

    lib = tmp_path / "keptlib"
    lib.mkdir()
    (lib / "kept_state.py").write_text("calls = []\n")
    first = ShippedCode(lib).digest
    os.utime(lib / "kept_state.py", (1_000_000_000, 1_000_000_000))
    assert ShippedCode(lib).digest == first

    def record_call():
        import kept_state

        kept_state.calls.append(1)
        return len(kept_state.calls)

    ship_code(client, lib)
    assert set(client.run(record_call).values()) == {1}
    ship_code(client, lib)  # the same version again: the module is not imported again
    assert set(client.run(record_call).values()) == {2}
    (lib / "kept_state.py").write_text("calls = [0, 0, 0]\n")
    assert ShippedCode(lib).digest != first
    ship_code(client, lib)
    assert set(client.run(record_call).values()) == {4}
