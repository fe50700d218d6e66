"""Map jobs of many units: a grid held as axes, per-task state on the driver, a resume
after a kill that reads no finished unit's input, and verify and results holding one
part at a time. (Sizes are small: what is tested is where the memory goes, by
structure, not how fast or how much.)"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import signal
import subprocess
import sys
import tracemalloc
from pathlib import Path

import cloudpickle
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import support.map_jobs as map_jobs
import support.stored as stored
from mapfns import bulk
from support.processes import descendants
from support.waiting import wait_for

import pipeline
from pipeline import ConfigError, MapJob, MapWorkload, RunOptions, run_job
from pipeline.coverage import UnitRanges, unit_coverage
from pipeline.layout import completed_tasks
from pipeline.results import results_table, write_results
from pipeline.verify import verify_output
from pipeline.workloads.map.grid import GridInput

BULK = "mapfns.bulk"
#: A map job run as the planner sizes its tasks.
run = functools.partial(map_jobs.run, units_per_task=None)


def test_a_range_in_a_job_file_is_the_job_of_its_listed_values(tmp_path, client):
    """`i = {start, stop, step}` (a TOML table) is a range: held as one, recorded as
    one, and the same job as the list of its values or Python's range."""
    from pipeline import load_jobs

    job = tmp_path / "grid.toml"
    job.write_text(f'workload = "map"\nfunction = "{BULK}:double"\n[grid]\n'
                   "i = {start = 10, stop = 6010, step = 2}\n")  # fmt: skip
    (loaded,) = load_jobs([str(job)], {}, environ={})
    w = MapWorkload(loaded.settings, "m")
    options = RunOptions(output=str(tmp_path / "out"), progress=False)
    s = run_job(w, options, client, echo=lambda m: None)
    assert s.complete and s.units == 3000
    record = json.loads((tmp_path / "out" / "m" / "job.json").read_text())
    assert record["fingerprint"]["grid"] == {"i": {"range": [10, 6010, 2]}}
    assert len(json.dumps(record)) < 4000  # a few lines, whatever the grid's size
    table = results_table(str(tmp_path / "out"))
    assert table.column("i").to_pylist() == list(range(10, 6010, 2))
    assert table.column("y").to_pylist() == [2 * i for i in range(10, 6010, 2)]
    # The same job given as a range or as its list: complete, nothing runs again
    for grid in ({"i": range(10, 6010, 2)}, {"i": list(range(10, 6010, 2))}):
        again = run(client, tmp_path / "out", function=f"{BULK}:double", grid=grid)
        assert again.complete and again.units_run == 0
    with pytest.raises(ConfigError, match=r"with other settings \(grid\)"):
        run(client, tmp_path / "out", function=f"{BULK}:double", grid={"i": range(10, 6012, 2)})


@pytest.mark.parametrize(
    "axis, said",
    [
        ({"start": 0}, r"grid: key 'i' is a table that has no stop; a table is a range: "),
        ({"stop": 5, "by": 2}, "grid: key 'i' is a table that has key.s. by; a table is a range"),
        ({"stop": 2.5}, r"grid: key 'i': stop = 2.5 is not an integer; a range's start, stop "),
        ({"stop": True}, r"grid: key 'i': stop = True is not an integer"),
        ({"stop": 5, "step": 0}, r"grid: key 'i': step = 0; a range's step is not zero"),
        ({"start": 5, "stop": 5}, r"grid: key 'i': range\(start=5, stop=5, step=1\) holds no "),
    ],
)
def test_a_bad_range_is_refused_naming_its_key(axis, said, client, tmp_path):
    with pytest.raises(ConfigError, match=said):
        run(client, tmp_path, function=f"{BULK}:double", grid={"i": axis})
    assert not (tmp_path / "m").exists()


def test_a_tasks_points_are_computed_from_its_units_numbers():
    """A task's points come from its units' numbers, not from walking the grid from
    its first point (the last task of a grid of 10**12 points would never start), and
    the workload a task carries holds the grid's axes, not its points."""
    grid = GridInput({"a": range(10**6), "b": {"start": 0, "stop": 3 * 10**6, "step": 3},
                      "c": ["x", "y"]})  # fmt: skip
    n = grid.n_units
    assert n == 2 * 10**12
    calls = list(grid.calls(n - 3, n))
    assert [(u, kw) for u, _, kw in calls] == [
        (n - 3, {"a": 10**6 - 1, "b": 3 * (10**6 - 2), "c": "y"}),
        (n - 2, {"a": 10**6 - 1, "b": 3 * (10**6 - 1), "c": "x"}),
        (n - 1, {"a": 10**6 - 1, "b": 3 * (10**6 - 1), "c": "y"}),
    ]
    assert [u for u, _, _ in grid.calls(0, 10**6, only={5, 999_999, 10**6 + 1})] == [5, 999_999]
    keys = grid.key_columns([n - 1, 7])
    assert [keys[k].to_pylist() for k in "abc"] == [
        [10**6 - 1, 0],
        [3 * (10**6 - 1), 9],
        ["y", "y"],
    ]
    w = MapWorkload(MapJob(function=f"{BULK}:double", grid={"i": range(10_000_000)}), "m")
    w.preflight()
    assert w.n_units == 10_000_000 and len(cloudpickle.dumps(w)) < 20_000


def test_long_lists_of_numbers_are_arrays_the_function_gets_python_values(tmp_path, client):
    """A long listed grid of one numeric type travels as an array (8 bytes a value),
    and its points still reach the function as the Python values given."""
    points = [{"x": float(i) / 4} for i in range(100_000)]
    w = MapWorkload(MapJob(function=f"{BULK}:typed", grid=[{"i": i, **p} for i, p in
                                                           enumerate(points)]), "m")  # fmt: skip
    w.preflight()
    assert len(cloudpickle.dumps(w)) < 2_000_000  # (as lists of Python floats: 3.2 MB)
    mixed = [{"i": i, "x": i if i % 2 else float(i)} for i in range(2_000)]  # ints and floats
    for grid, name in ((points[:3000], "f"), (mixed, "mixed")):
        grid = [{"i": i, **p} for i, p in enumerate(grid)] if name == "f" else grid
        s = run(client, tmp_path / name, units_per_task=700, function=f"{BULK}:typed", grid=grid)
        assert s.complete
        table = results_table(str(tmp_path / name)).to_pydict()
        assert table["x_type"] == [type(p["x"]).__name__ for p in grid]
        assert table["x"] == [p["x"] for p in grid]


def test_coverage_is_worked_out_from_ranges():
    assert unit_coverage([[0, 5], [5, 10], [8, 12], [15, 20]], 25) == (
        [(12, 15), (20, 25)],  # missing
        [(8, 10)],  # twice
        [(0, 8), (10, 12), (15, 20)],  # once
    )
    assert unit_coverage([[0, 10**12]], 10**12) == ([], [], [(0, 10**12)])
    damaged = UnitRanges()
    for r in (range(5, 10), range(20, 30), range(8, 22)):
        damaged.update(r)
    assert repr(damaged) == "UnitRanges(5..29)" and 7 in damaged and 30 not in damaged
    assert damaged.overlap(0, 10) == 5 and len(damaged) == 25


def _peak(fn, *args, **kwargs) -> int:
    """The most memory Python objects (numpy arrays and bytes included) took during
    ``fn``, beyond what they took before."""
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        before = tracemalloc.get_traced_memory()[0]
        fn(*args, **kwargs)
        return tracemalloc.get_traced_memory()[1] - before
    finally:
        tracemalloc.stop()


@pytest.fixture(scope="module")
def big_parts(tmp_path_factory, client):
    """A job of 4 parts of about 1 MB of text no compression shrinks."""
    out = tmp_path_factory.mktemp("big")
    grid = {"i": range(200), "size": 20_000}
    assert run(client, out, units_per_task=50, function=f"{BULK}:text", grid=grid).complete
    parts = sorted((out / "m" / "results").glob("part-*.parquet"))
    assert len(parts) == 4 and all(p.stat().st_size > 900_000 for p in parts)
    return out


def test_verify_holds_one_block_of_one_part_at_a_time(big_parts, monkeypatch):
    from pipeline import manifest

    monkeypatch.setattr(manifest, "READ_BYTES", 64 * 1024)
    checks = []
    peak = _peak(lambda: checks.extend(verify_output(str(big_parts))))
    assert checks[0].ok and checks[0].units_ok == 200 and checks[0].objects_checked == 4
    # A part read whole (or all of them) would take 1 MB (4 MB)
    assert peak < 600_000, peak


def test_results_are_written_a_part_at_a_time_with_the_same_bytes(big_parts, tmp_path,
                                                                  monkeypatch):  # fmt: skip
    from pipeline import table_parts

    monkeypatch.setattr(table_parts, "ROW_GROUP_ROWS", 30)  # groups across the parts' ends
    peak = _peak(write_results, str(big_parts), None, str(tmp_path / "r.parquet"))
    whole = results_table(str(big_parts))
    expected = pa.BufferOutputStream()
    pq.write_table(whole, expected, row_group_size=30)
    assert (tmp_path / "r.parquet").read_bytes() == expected.getvalue().to_pybytes()
    # The whole file at once would take its 4 MB
    assert peak < 2_500_000, peak
    summary = pipeline.results.summarize(str(big_parts))
    assert "table 'results', 200 rows" in summary and summary.count("\n") == 11


def test_columns_that_differ_between_parts_are_written_as_a_whole_table_writes_them(
    tmp_path, client, monkeypatch
):
    import pyarrow.csv as pcsv

    from pipeline import table_parts
    from pipeline.results import _as_csv_cells

    s = run(client, tmp_path, units_per_task=2, function=f"{BULK}:uneven", grid={"x": range(9)})
    assert s.complete
    monkeypatch.setattr(table_parts, "ROW_GROUP_ROWS", 3)
    whole = results_table(str(tmp_path))
    assert whole.column_names == ["unit", "x", "a", "b", "d", "c"]
    parquet, csv = pa.BufferOutputStream(), pa.BufferOutputStream()
    pq.write_table(whole, parquet, row_group_size=3)
    pcsv.write_csv(_as_csv_cells(whole), csv)
    for suffix, expected in ((".parquet", parquet), (".csv", csv)):
        assert write_results(str(tmp_path), None, str(tmp_path / f"r{suffix}")) == 9
        assert (tmp_path / f"r{suffix}").read_bytes() == expected.getvalue().to_pybytes()


def _write_dataset(folder: Path, files: int, rows: int) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for f in range(files):
        rng = np.random.default_rng(f)
        table = pa.table({"g": np.full(rows, f, dtype=np.int64), "y": rng.random(rows)})
        paths.append(folder / f"part-{f:02d}.parquet")
        pq.write_table(table, paths[-1])
    return paths


def _group_bytes(path: Path, group: int = 0) -> int:
    """Compressed bytes of a row group's columns: what reading it counts."""
    rg = pq.read_metadata(path).row_group(group)
    return sum(rg.column(c).total_compressed_size for c in range(rg.num_columns))


def test_a_task_rerun_for_its_failed_units_reads_and_calls_only_theirs(tmp_path, client):
    """A task run again for the units that raised reads their row groups alone (the
    read counters its receipt carries say so) and keeps the others' rows: the part
    holds the bytes of a clean run."""
    data = tmp_path / "data.parquet"
    rng = np.random.default_rng(0)
    pq.write_table(pa.table({"g": np.repeat(np.arange(6), 50), "y": rng.random(300)}), data,
                   row_group_size=50)  # fmt: skip
    flag, log = tmp_path / "flag", tmp_path / "calls.log"
    flag.write_text("refuse")
    fn = functools.partial(bulk.refuse_while_flagged, flag=str(flag), refused=1, log=str(log))

    def mapped(out):
        return pipeline.map(fn, data=str(data), chunk_rows=50, output=str(out), name="m",
                            client=client, units_per_task=3, progress=False)  # fmt: skip

    first = mapped(tmp_path / "out")
    assert first.units_failed == 1 and first.bytes_read == sum(_group_bytes(data, g)
                                                               for g in range(6))  # fmt: skip
    flag.unlink()
    log.unlink()
    again = mapped(tmp_path / "out")
    assert again.complete and again.units_failed == 0
    assert log.read_text().split() == ["1"]  # called again: the unit that raised, alone
    assert again.bytes_read == _group_bytes(data, 1)  # read again: its row group alone
    mapped(tmp_path / "clean")
    for task in (0, 1):  # the same bytes, under names of other attempts
        assert stored.part(tmp_path / "out" / "m" / "results", task).read_bytes() == (
            stored.part(tmp_path / "clean" / "m" / "results", task).read_bytes()
        )


def test_the_drivers_memory_does_not_grow_with_the_units_done(tmp_path, client):
    """The driver holds per-task state: a job's record, its plan, a receipt per task,
    completed tasks from the names of their manifest entries. Resuming a job of
    2,000,000 units takes the memory that resuming one of 20,000 does (per-unit state,
    even an array of int64, would be 16 MB more)."""
    peaks = {}
    for n in (20_000, 2_000_000):
        out = tmp_path / f"n{n}"
        settings = {"function": f"{BULK}:double", "grid": {"i": range(n)}}
        assert run(client, out, units_per_task=n // 8, **settings).complete
        # A run killed before its last two tasks wrote their entries
        for task in (6, 7):
            (out / "m" / "manifest" / f"part-{task:06d}.parquet").unlink()
        (out / "m" / "manifest.parquet").unlink()
        summaries: list = []
        peaks[n] = _peak(
            lambda out=out, s=settings, into=summaries: into.append(run(client, out, **s))
        )
        assert summaries[0].complete and summaries[0].units_run == n // 4
        assert completed_tasks(pipeline.open_store(str(out)), "m") == set(range(8))
    assert peaks[2_000_000] < peaks[20_000] + 4_000_000, peaks


@pytest.mark.integration
@pytest.mark.slow
def test_a_killed_driver_resumes_reading_no_finished_chunk_to_the_same_bytes(tmp_path):
    """`pipeline run` killed (SIGKILL, its cluster with it) while a task is held: the
    same command completes the job, calling and reading only the chunks of the tasks
    that had not completed (the read counters its receipts carry, in its report), and
    the output holds the bytes of a run never interrupted."""
    files = _write_dataset(tmp_path / "data", files=12, rows=50)
    gate, marker, log = tmp_path / "gate", tmp_path / "held", tmp_path / "calls.log"
    (tmp_path / "heldfns.py").write_text(
        "import time\nfrom pathlib import Path\n\nfrom mapfns.bulk import first_in_chunk\n\n\n"
        "def rows(chunk):\n"
        f"    row = first_in_chunk(chunk, {str(log)!r})\n"
        f"    if row['g0'] == 9 and not Path({str(gate)!r}).exists():\n"
        f"        Path({str(marker)!r}).write_text('held')  # the test kills the run now\n"
        "        deadline = time.monotonic() + 120\n"
        f"        while not Path({str(gate)!r}).exists():\n"
        "            if time.monotonic() > deadline:\n"
        "                raise TimeoutError('the test did not kill the run')\n"
        "            time.sleep(0.05)\n"
        "    return row\n"
    )  # fmt: skip
    job = tmp_path / "job.toml"
    job.write_text(f'workload = "map"\nfunction = "heldfns:rows"\ndata = "{tmp_path}/data"\n'
                   "chunk_rows = 50\nunits_per_task = 1\nworkers = 2\n")  # fmt: skip
    tests = str(Path(bulk.__file__).parents[1])  # (mapfns, for the workers too)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([tests, os.environ.get("PYTHONPATH", "")])}

    def command(out: Path, *more) -> list[str]:
        return [sys.executable, "-m", "pipeline", "run", str(job), "--name", "m", "--output",
                str(out), *more]  # fmt: skip

    proc = subprocess.Popen(command(tmp_path / "out"), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, env=env,
                            start_new_session=True, cwd=tmp_path)  # fmt: skip
    group: set[int] = set()
    try:
        wait_for("the held task", lambda: marker.exists() or proc.poll() is not None, 180)
        assert proc.poll() is None, proc.communicate()[1]
        group = descendants(proc.pid)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
    wait_for("the cluster", lambda: not any(Path(f"/proc/{p}").exists() for p in group), 60)
    store = pipeline.open_store(str(tmp_path / "out"))
    done = completed_tasks(store, "m")
    assert 9 not in done and not (tmp_path / "out" / "m" / "manifest.parquet").exists()
    log.unlink()
    gate.write_text("go")
    report = tmp_path / "report"
    resumed = subprocess.run(command(tmp_path / "out", "--report", str(report)), env=env,
                             capture_output=True, text=True, timeout=240, cwd=tmp_path)  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr
    left = sorted(set(range(12)) - done)
    assert sorted(int(g) for g in log.read_text().split()) == left
    summary = json.loads((report / "m-summary.json").read_text())
    assert summary["units_skipped"] == len(done) and summary["units_run"] == len(left)
    assert summary["bytes_read"] == sum(_group_bytes(files[g]) for g in left)
    never = subprocess.run(command(tmp_path / "never"), env=env, capture_output=True, text=True,
                           timeout=240, cwd=tmp_path)  # fmt: skip
    assert never.returncode == 0, never.stderr
    for name in ("out", "never"):
        write_results(str(tmp_path / name), None, str(tmp_path / f"{name}.parquet"))
    assert (tmp_path / "out.parquet").read_bytes() == (tmp_path / "never.parquet").read_bytes()
    assert stored.contents(tmp_path / "out" / "m" / "results") == stored.contents(
        tmp_path / "never" / "m" / "results"
    )  # the same bytes, under names of other attempts
    (check,) = verify_output(str(tmp_path / "out"))
    assert check.ok and check.units_ok == 12, check
