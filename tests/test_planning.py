"""Task planning: the cost model, cuts on natural boundaries, cluster size, the record."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from support.workloads import SquaresWorkload

from pipeline import RunOptions, run_job
from pipeline.errors import ConfigError
from pipeline.inputs.chunks import chunk_boundaries, plan_chunks
from pipeline.inputs.dataset import WHOLE_FILE_BYTES, discover
from pipeline.inputs.task_rows import read_task_rows
from pipeline.planning.plan import Plan, load_plan, save_plan
from pipeline.planning.probe_sizes import (
    aligned_probes,
    cut_is_settled,
    is_small_job,
    next_large_probe,
    probe_round,
)
from pipeline.planning.scheduler_cpu import cpu_per_task
from pipeline.planning.sizing import (
    SCHEDULER_SECONDS_PER_TASK,
    SCHEDULER_SHARE,
    CostModel,
    ProbeSample,
    cut_tasks,
    fit_costs,
    longest_first,
    make_layout,
    makespan,
    overhead_can_bind,
    target_seconds,
)
from pipeline.storage import LocalStore
from pipeline.workload import Task
from pipeline.workloads.regressions import RegressionJob, RegressionWorkload, write_regression_data


def _sizes(start: int, stops: list[int]) -> np.ndarray:
    return np.diff([start, *stops])


def _task_seconds(layout, start, stops, model) -> list[float]:
    bounds = [start, *stops]
    return [
        model.seconds(layout.weight(a, b), layout.bytes(a, b))
        for a, b in itertools.pairwise(bounds)
    ]


# -- the cost model -----------------------------------------------------------------------


def test_fit_separates_the_fixed_part_from_the_part_per_unit():
    # 0.2 s a task (opening and writing) + 1 ms a unit, + reading at 10 ms per MB.
    samples = [
        ProbeSample(u, 0.2 + 0.001 * u + 0.04, read_seconds=0.04, bytes_read=4_000_000)
        for u in (1, 16, 1, 400)
    ]
    model = fit_costs(samples, overhead=0.002)
    assert model.fixed == pytest.approx(0.2)
    assert model.per_unit == pytest.approx(0.001)
    assert model.per_byte == pytest.approx(1e-8)
    assert model.overhead == 0.002


def test_a_reads_cost_per_request_is_part_of_the_fixed_part():
    # Each task's read: 50 ms a request (S3's first byte; moto copying the object) +
    # 20 ms per MB; tasks of 1 unit read a 4 MB row group, larger ones 16 kB a unit.
    def sample(units: int, nbytes: int) -> ProbeSample:
        read = 0.05 + 2e-8 * nbytes
        return ProbeSample(units, 0.01 + 0.0005 * units + read, read, nbytes)

    model = fit_costs([sample(1, 4_000_000), sample(16, 4_000_000), sample(800, 12_800_000),
                       sample(1, 4_000_000), sample(2000, 32_000_000)])  # fmt: skip
    assert (model.fixed, model.read_fixed) == (pytest.approx(0.06), pytest.approx(0.05))
    assert model.per_byte == pytest.approx(2e-8)
    assert model.seconds(1000, 16_000_000) == pytest.approx(0.01 + 0.5 + 0.05 + 0.32)


def test_fit_with_one_size_only_is_all_per_unit():
    model = fit_costs([ProbeSample(10, 0.5), ProbeSample(10, 0.7)])
    assert (model.fixed, model.per_unit) == (0.0, pytest.approx(0.06))


@pytest.mark.parametrize("fixed", [0.0, 0.05, 0.2])
def test_tasks_last_about_task_seconds_whatever_a_fixed_cost_under_a_fifth(fixed):
    layout = make_layout(100_000)
    model = CostModel(fixed, 0.0005, overhead=0.001)
    stops = cut_tasks(layout, 0, model, 2, 1.0)
    seconds = _task_seconds(layout, 0, stops, model)
    assert stops[-1] == 100_000
    assert min(seconds) >= 0.5 and max(seconds) <= 2.0
    assert len(stops) % 2 == 0  # whole rounds of 2 workers


@pytest.mark.parametrize(("fixed", "handover"), [(0.6, 0.0), (3.0, 0.0), (0.0, 0.5), (0.3, 0.3)])
def test_what_every_task_costs_is_at_most_a_tenth_of_it(fixed, handover):
    # A fixed part, and a worker's wait between one task and its next (the hand-over):
    # tasks grow so that they take at most a tenth of the workers' time.
    layout = make_layout(1_000_000)
    model = CostModel(fixed, 0.001, handover=handover)
    stops = cut_tasks(layout, 0, model, 2, 1.0)
    seconds = _task_seconds(layout, 0, stops, model)
    assert min(seconds) >= (fixed + handover) / 0.1 * 0.9
    # and the makespan counts the hand-overs: one per task on each worker
    work = sum(seconds) + len(stops) * handover
    assert makespan(layout, 0, stops, model, 2) == pytest.approx(work / 2, rel=0.01)


def test_many_workers_lengthen_tasks_to_keep_the_scheduler_share_small():
    # 1 ms of scheduling a task: 2 workers may have 1 s tasks, 1,000 workers need
    # tasks of 4 s so that the scheduler spends at most 25 % of its core.
    model = CostModel(0.01, 0.01, overhead=0.001)
    assert target_seconds(model, 2, 1.0) == 1.0
    assert target_seconds(model, 1000, 1.0) == pytest.approx(4.0)
    layout = make_layout(5_000_000)
    for workers in (2, 100, 1000):
        stops = cut_tasks(layout, 0, model, workers, 1.0)
        mean_seconds = float(np.mean(_task_seconds(layout, 0, stops, model)))
        tasks_per_second = workers / mean_seconds
        assert model.overhead * tasks_per_second <= SCHEDULER_SHARE * 1.05
        assert len(stops) >= 4 * workers  # a job this big still gives each several tasks


def test_the_overhead_is_measured_only_where_it_could_lengthen_tasks(tmp_path, client):
    # At 25 ms a task, beyond any measured, 2 workers with 1 s tasks would take 5 % of
    # the scheduler, 1,000 workers 25 times its core: it is measured on large clusters
    # (or with short tasks) and on 2 workers the model assumes Dask's 1 ms a task.
    assert not overhead_can_bind(2, 1.0) and not overhead_can_bind(10, 1.0)
    assert overhead_can_bind(11, 1.0) and overhead_can_bind(1000, 1.0)
    assert overhead_can_bind(2, 0.15)
    from distributed import get_task_stream

    overheads = {}
    for task_seconds in (1.0, 0.15):
        out = tmp_path / str(task_seconds)
        opts = RunOptions(output=str(out), progress=False, task_seconds=task_seconds)
        with get_task_stream(client) as stream:
            s = run_job(SquaresWorkload("sq", 300, unit_seconds=0.002), opts, client)
        assert s.complete and s.probe_tasks > 0
        # Read while the probes ran: no task of its own (a burst of no-op tasks held
        # every worker for seconds before the first unit on a loaded fleet)
        keys = [t["key"] for t in stream.data]
        assert keys and all(k.startswith("pipeline-squares-") for k in keys), keys
        overheads[task_seconds] = json.loads((out / "sq" / "job.json").read_text())["cost_model"][
            "overhead"
        ]
    assert overheads[1.0] == SCHEDULER_SECONDS_PER_TASK
    assert overheads[0.15] != SCHEDULER_SECONDS_PER_TASK and overheads[0.15] > 0


def test_the_scheduler_cpu_per_task_is_told_apart_from_its_heartbeats():
    # Read while the probes run: the heartbeats cost 0.1 s a second however the tasks
    # come, the tasks 2 ms each, and they come in bursts (the warm-ups, then the
    # large probes) while the time runs evenly. The CPU over the tasks counts the
    # heartbeats as the tasks' (3.4 ms); the line on time and tasks does not.
    t = np.arange(0.0, 20.0, 0.5)
    tasks = np.where(t < 2, 250 * t, np.where(t < 16, 500, 500 + 250 * (t - 16)))
    cpu = 3.0 + 0.1 * t + 0.002 * tasks
    readings = list(zip(t, tasks, cpu, strict=True))
    assert cpu_per_task(readings) == pytest.approx(0.002)
    gross = (cpu[-1] - cpu[0]) / (tasks[-1] - tasks[0])
    assert gross > 0.0033
    # Too few readings to fit a line: the gross figure, an overestimate (longer tasks)
    assert cpu_per_task([readings[0], readings[20], readings[-1]]) == pytest.approx(gross)
    assert cpu_per_task(readings[:1]) is None


def test_a_job_too_small_for_several_tasks_per_worker_is_one_round():
    assert is_small_job(50, 2) and not is_small_job(300, 2)
    layout = make_layout(50)
    assert cut_tasks(layout, 0, CostModel(0.0, 1.0), 2, 1.0, rounds=1) == [25, 50]
    # Measured: 3,000 units of 0.1 ms are 0.15 s a worker, well under a 1 s task.
    stops = cut_tasks(make_layout(3000), 0, CostModel(0.01, 0.0001), 2, 1.0)
    assert stops == [1500, 3000]


def test_a_small_job_gets_short_tasks_for_balance_but_not_below_their_fixed_cost():
    # 0.45 s of work a worker: four rounds of 0.11 s tasks (a worker that runs slow
    # holds up the end by a fraction of one), not one round of 0.45 s.
    layout = make_layout(9000)
    stops = cut_tasks(layout, 0, CostModel(0.01, 0.0001), 2, 1.0)
    assert len(stops) == 8 and max(_sizes(0, stops)) - min(_sizes(0, stops)) <= 1
    # A fixed part of 50 ms: tasks of at least 4x that, so two rounds.
    stops = cut_tasks(layout, 0, CostModel(0.05, 0.0001), 2, 1.0)
    assert len(stops) == 4
    # With a target of 0.1 s, the tasks are not cut below half of it.
    seconds = _task_seconds(
        layout, 0, cut_tasks(layout, 0, CostModel(0.0, 0.0001), 2, 0.1), CostModel(0.0, 0.0001)
    )
    assert min(seconds) >= 0.05


def test_units_of_uneven_cost_get_tasks_of_even_cost():
    # The first 1,000 units have 10x the rows of the others.
    weights = np.r_[np.full(1000, 10.0), np.ones(9000)]
    layout = make_layout(10_000, weights=weights)
    model = CostModel(0.01, 0.0005)
    stops = cut_tasks(layout, 0, model, 2, 1.0)
    seconds = _task_seconds(layout, 0, stops, model)
    sizes = _sizes(0, stops)
    assert max(seconds) / min(seconds) < 1.3
    assert sizes[0] < sizes[-1] / 3  # fewer of the heavy units in a task


# -- natural boundaries -------------------------------------------------------------------


def test_cuts_fall_on_row_group_boundaries_when_groups_are_smaller_than_tasks():
    groups = np.arange(0, 30_000, 262)
    layout = make_layout(30_000, boundaries=groups, read_bytes=lambda a, b: 0)
    stops = cut_tasks(layout, 147, CostModel(0.2, 0.0005, overhead=0.005), 2, 1.0)
    assert set(stops[:-1]) <= set(groups.tolist()) and stops[-1] == 30_000
    assert _sizes(147, stops)[1:].min() >= 262  # hundreds of chunks, whole row groups


def _groups_read_bytes(group: int, group_bytes: int):
    def read_bytes(start: int, stop: int) -> int:
        return (((stop - 1) // group) - (start // group) + 1) * group_bytes

    return read_bytes


def test_a_row_group_is_split_only_when_one_task_would_leave_a_worker_idle():
    # One row group of 50 chunks and 2 workers: both work on it, each reading it.
    one = make_layout(50, boundaries=[0, 50], read_bytes=_groups_read_bytes(50, 1000))
    assert cut_tasks(one, 0, CostModel(0.0, 1.0), 2, 1.0, rounds=1) == [25, 50]
    # Row groups of 262 chunks, slow reads, tasks of ~100 chunks: whole groups instead.
    many = make_layout(
        10_000, boundaries=np.arange(0, 10_000, 262), read_bytes=_groups_read_bytes(262, 4e6)
    )
    model = CostModel(0.01, 0.01, per_byte=1e-7)
    stops = cut_tasks(many, 0, model, 2, 1.0)
    assert all(s % 262 == 0 for s in stops[:-1])


def test_small_files_are_grouped_into_tasks():
    files = np.cumsum([0] + [1, 2, 3] * 1000)[:-1]  # 3,000 files of 1-3 chunks
    layout = make_layout(6000, boundaries=files)
    stops = cut_tasks(layout, 0, CostModel(0.01, 0.001), 2, 1.0)
    assert len(stops) <= 16 and set(stops[:-1]) <= set(files.tolist())


def test_shards_are_never_split():
    layout = make_layout(1000, granularity=32)
    stops = cut_tasks(layout, 64, CostModel(0.05, 1 / 96, overhead=0.002), 2, 1.0)
    assert all(s % 32 == 0 for s in stops[:-1]) and stops[-1] == 1000


def test_tasks_run_longest_first_so_workers_finish_together():
    # Cut on far-apart boundaries (layout iii): 925 and 1,449 units, then 6 of 1,187.
    layout = make_layout(10_000)
    stops = list(np.cumsum([925, 1449, *[1187] * 6]))
    tasks = [Task(i, a, b) for i, (a, b) in enumerate(zip([0, *stops], stops, strict=False))]
    order = [t.stop - t.start for t in longest_first(layout, tasks)]
    assert order == [1449, *[1187] * 6, 925]
    # Handed out in that order to 2 workers, each gets 4,748 units (in unit order,
    # 4,486 and 5,010).
    assert makespan(layout, 0, stops, CostModel(0.0, 0.001), 2) == pytest.approx(4.748)


def test_probe_sizes():
    assert probe_round(1, 16, 2, 1000) == [16, 16, 1, 1]  # one of each per worker
    assert probe_round(1, 16, 1, 1000) == [16, 1]
    assert probe_round(32, 512, 2, 600) == [512, 88]  # cut to the units left
    assert probe_round(None, 512, 2, 2000) == [512, 512]  # large ones only
    # Aimed at 4x the larger of 0.1 s and the fixed part, 2x-100x the last, whole shards.
    assert next_large_probe(0.001, 0.0, 16, 10_000, 1) == 400
    assert next_large_probe(0.0005, 0.2, 16, 10_000, 1) == 1600
    assert next_large_probe(1e-7, 0.0, 16, 10_000, 1) == 1600
    assert next_large_probe(0.001, 0.0, 16, 100, 1) == 100
    assert next_large_probe(0.01, 0.0, 16, 10_000, 16) == 48
    assert next_large_probe(0.1, 0.0, 16, 10_000, 16) == 32
    # A last probe mostly fixed part (16 x 0.5 ms < 15 ms): its slope is noise, 100x.
    assert next_large_probe(0.0005, 0.015, 16, 10_000, 1) == 1600
    assert next_large_probe(0.0005, 0.015, 16, 1000, 1) == 1000


def test_probing_stops_when_a_closer_slope_would_not_change_the_cut():
    # The 10,000-chunk job of the layouts benchmark after its second probe round:
    # the 7,400 chunks left are 0.27 s a worker, a small job at half or twice that
    # slope (a few short tasks a worker: two rounds here, one or four there), so a
    # third round would only add a barrier.
    layout = make_layout(10_000, boundaries=range(0, 10_000, 262))
    model = CostModel(0.012, 7.3e-5, overhead=0.002)
    assert cut_is_settled(layout, 2_600, model, 2, 1.0)
    assert len(cut_tasks(layout, 2_600, model, 2, 1.0)) == 4
    # A hundred times the chunks: the count of tasks follows the slope, so probing
    # goes on until the probes measure it.
    layout = make_layout(1_000_000, boundaries=range(0, 1_000_000, 262))
    assert not cut_is_settled(layout, 2_600, model, 2, 1.0)


def test_large_probes_end_on_row_group_boundaries():
    group = 262
    layout = make_layout(10 * group, boundaries=range(0, 10 * group + 1, group))
    got = aligned_probes(layout, 34, [800, 800])
    assert np.cumsum([34, *got])[1:].tolist() == [786, 1572], got  # 3 and 6 groups
    # No boundary within half the wanted size: as wanted.
    assert aligned_probes(layout, 34, [100, 40]) == [100, 40]
    # Cut to the units left.
    assert aligned_probes(layout, 2000, [800, 800]) == [620]


# -- the dataset's boundaries and bytes ---------------------------------------------------


def _write(path, tables: list[pa.Table], group_rows: int) -> None:
    pq.write_table(pa.concat_tables(tables), path, row_group_size=group_rows)


def _chunks(ids, rows: int) -> list[pa.Table]:
    return [pa.table({"chunk": np.full(rows, c), "x": np.arange(rows, dtype=float)}) for c in ids]


def test_small_files_read_once_plan_as_files_read_twice(tmp_path):
    # Small files are read whole with their chunk column when discovered; a large one
    # (over WHOLE_FILE_BYTES) and one with its columns in another order are not.
    rng = np.random.default_rng(0)
    for f in range(6):
        ids = np.sort(rng.integers(0, 40, 30))
        t = pa.table({"chunk": ids, "x": rng.normal(size=30)})
        pq.write_table(t.select(["x", "chunk"]) if f == 2 else t, tmp_path / f"p{f}.parquet",
                       row_group_size=10)  # fmt: skip
    big = 200_000
    pq.write_table(pa.table({"chunk": np.repeat(np.arange(40, 50), big // 10),
                             "x": rng.normal(size=big)}), tmp_path / "p9.parquet")  # fmt: skip
    once = discover(str(tmp_path), ("chunk",))
    twice = discover(str(tmp_path))
    assert once.file_size(6) > WHOLE_FILE_BYTES >= once.file_size(0)
    np.testing.assert_array_equal(once.rg_col_bytes, twice.rg_col_bytes)
    meta = pq.ParquetFile(tmp_path / "p2.parquet").metadata  # x first, then chunk
    assert once.rg_col_bytes[once.rg_file == 2].tolist() == [
        [meta.row_group(g).column(1).total_compressed_size,
         meta.row_group(g).column(0).total_compressed_size] for g in range(3)
    ]  # fmt: skip
    a, b = plan_chunks(once, ("chunk",), None), plan_chunks(twice, ("chunk",), None)
    assert a.keys.equals(b.keys)
    np.testing.assert_array_equal(a.rg_offsets, b.rg_offsets)
    np.testing.assert_array_equal(a.rg_ids, b.rg_ids)
    assert a.n_chunks == len(np.unique(np.concatenate(
        [pq.read_table(p).column("chunk").to_numpy() for p in tmp_path.iterdir()])))  # fmt: skip


def test_the_chunk_index_of_large_files_read_in_threads_is_the_one_read_in_turn(
    tmp_path, monkeypatch
):
    from pipeline.inputs import chunks

    rng = np.random.default_rng(3)
    for f in range(3):  # 120,000 rows a file, chunks spanning files and row groups
        ids = np.sort(rng.integers(f * 40, f * 40 + 60, size=120_000))
        pq.write_table(pa.table({"chunk": ids, "x": rng.normal(size=ids.size)}),
                       tmp_path / f"p{f}.parquet", row_group_size=50_000)  # fmt: skip
    ds = discover(str(tmp_path), ("chunk",))
    assert ds.num_rows >= chunks.HEAVY_FILE_ROWS * len(ds.keys)  # read in threads
    threaded = plan_chunks(ds, ("chunk",), None)
    monkeypatch.setattr(chunks, "HEAVY_FILE_ROWS", 10**9)
    in_turn = plan_chunks(ds, ("chunk",), None)
    assert threaded.keys.equals(in_turn.keys) and threaded.n_chunks == 140
    np.testing.assert_array_equal(threaded.rg_offsets, in_turn.rg_offsets)
    np.testing.assert_array_equal(threaded.rg_ids, in_turn.rg_ids)
    np.testing.assert_array_equal(threaded.rows, in_turn.rows)


def test_dataset_boundaries_are_row_group_and_file_starts(tmp_path):
    # File a: chunks 0-5 of 10 rows in row groups of 20 (2 chunks each); file b: chunks
    # 6-8 in row groups of 15 rows, so chunk 7 spans two row groups.
    _write(tmp_path / "a.parquet", _chunks(range(6), 10), 20)
    _write(tmp_path / "b.parquet", _chunks(range(6, 9), 10), 15)
    ds = discover(str(tmp_path))
    index = plan_chunks(ds, ("chunk",), None)
    assert chunk_boundaries(ds, index).tolist() == [0, 2, 4, 6, 9]
    by_rows = plan_chunks(ds, (), 10)
    assert chunk_boundaries(ds, by_rows).tolist() == [0, 2, 4, 6, 9]
    # A task of chunks 2-3 reads one row group and holds all of it; chunk 7 alone reads
    # two row groups of 15 rows and holds 10 of their 30.
    rows = read_task_rows(ds, index, 2, 4, ["x"])
    assert rows.bytes_read == rows.bytes_needed > 0
    rows = read_task_rows(ds, index, 7, 8, ["x"])
    assert rows.bytes_read > rows.bytes_needed > 0
    assert rows.bytes_needed == pytest.approx(rows.bytes_read / 3, rel=0.35)


def test_a_row_group_read_alone_is_not_read_again_by_the_next_task(tmp_path):
    # Chunks 0-5 of 10 rows in row groups of 20: tasks 2-3 and 3-4 both need row group 1;
    # the second reads nothing (a job's first probes all fall in its first group, and
    # on S3 each read it again); 3-6 reads only row group 2. The rows are the same.
    from pipeline.inputs import task_rows

    _write(tmp_path / "a.parquet", _chunks(range(6), 10), 20)
    ds = discover(str(tmp_path))
    index = plan_chunks(ds, ("chunk",), None)
    first = read_task_rows(ds, index, 2, 3, ["x"])
    again = read_task_rows(ds, index, 3, 4, ["x"])
    assert first.bytes_read > 0 and again.bytes_read == 0 and again.bytes_needed > 0
    on = read_task_rows(ds, index, 3, 6, ["x"])
    task_rows._LAST_GROUP.clear()
    fresh = read_task_rows(ds, index, 3, 6, ["x"])
    assert on.table.equals(fresh.table) and on.offsets.tolist() == fresh.offsets.tolist()
    assert 0 < on.bytes_read < fresh.bytes_read
    assert again.table.equals(read_task_rows(ds, index, 3, 4, ["x"]).table)


def test_a_tasks_rows_come_by_chunk_whatever_the_files_row_order(tmp_path):
    # Chunks 3, 1, 2 interleaved with rows of chunk 0 (another task's) in one row group;
    # then chunks 4-5 in order: the task of chunks 1-3 gets its rows sorted by chunk,
    # in their file order within a chunk; the task of 4-5 a slice of its row group.
    def rows_of(ids):
        return pa.table({"chunk": np.array(ids), "x": np.arange(len(ids), dtype=float)})

    mixed = [3, 0, 1, 3, 2, 0, 1, 2, 3, 1]
    _write(tmp_path / "a.parquet", [rows_of(mixed), rows_of([4, 4, 5, 5, 5])], 10)
    ds = discover(str(tmp_path))
    index = plan_chunks(ds, ("chunk",), None)
    rows = read_task_rows(ds, index, 1, 4, ["x"])
    assert rows.offsets.tolist() == [0, 3, 5, 8]
    expected = [2, 6, 9, 4, 7, 0, 3, 8]  # positions in the file of chunks 1, 2, 3
    assert rows.table.column("x").to_pylist() == [float(i) for i in expected]
    assert rows.bytes_needed == pytest.approx(rows.bytes_read * 8 / 10, rel=0.05)
    rows = read_task_rows(ds, index, 4, 6, ["x"])
    assert rows.offsets.tolist() == [0, 2, 5]
    assert rows.table.column("x").to_pylist() == [0.0, 1.0, 2.0, 3.0, 4.0]
    assert rows.bytes_needed == rows.bytes_read


def test_chunk_rows_are_weights_when_chunks_differ(tmp_path):
    tables = [*_chunks([0], 10), *_chunks([1], 30), *_chunks([2], 20)]
    _write(tmp_path / "a.parquet", tables, 100)
    ds = discover(str(tmp_path))
    assert plan_chunks(ds, ("chunk",), None).rows.tolist() == [10, 30, 20]
    _write(tmp_path / "a.parquet", _chunks(range(3), 10), 100)
    assert plan_chunks(discover(str(tmp_path)), ("chunk",), None).rows is None


# -- the record ---------------------------------------------------------------------------


def test_a_plan_of_format_1_is_replayed_and_a_newer_one_refused(tmp_path):
    store = LocalStore(tmp_path)
    w = SquaresWorkload("sq", 100)
    old = {"fingerprint": w.fingerprint(), "head": [1, 1, 5], "units_per_task": 20}
    store.write_bytes("sq/job.json", json.dumps(old).encode())
    plan = load_plan(w, None, store)
    assert [(t.start, t.stop) for t in plan.tasks][:4] == [(0, 1), (1, 2), (2, 7), (7, 27)]
    assert plan.tasks[-1].stop == 100
    store.write_bytes("sq/job.json", json.dumps({**old, "plan_format": 3}).encode())
    with pytest.raises(ConfigError, match="plan format 3"):
        load_plan(w, None, store)


def test_a_measured_plan_is_replayed_and_a_different_size_refused(tmp_path):
    store = LocalStore(tmp_path)
    w = SquaresWorkload("sq", 100)
    plan = Plan([1, 1], stops=[40, 70, 100], model={"fixed": 0.1}, fingerprint=w.fingerprint())
    save_plan(w, store, plan)
    plan = load_plan(w, None, store)
    assert [(t.start, t.stop) for t in plan.tasks] == [(0, 1), (1, 2), (2, 40), (40, 70),
                                                            (70, 100)]  # fmt: skip
    with pytest.raises(ConfigError, match="measured task sizes"):
        load_plan(w, 10, store)
    with pytest.raises(ConfigError, match="100 units"):
        load_plan(SquaresWorkload("sq", 100), None, _with_units(store, 120))


def _with_units(store: LocalStore, n: int) -> LocalStore:
    record = json.loads(store.read_bytes("sq/job.json"))
    record["stops"][-1] = n
    store.write_bytes("sq/job.json", json.dumps(record).encode())
    return store


# -- a real run ---------------------------------------------------------------------------


def test_row_groups_of_hundreds_of_chunks_get_tasks_of_hundreds(tmp_path, client):
    # Layout (i): row groups of 262 chunks of 250 rows. Tasks of a few chunks would
    # each read a whole row group; the planner gives whole row groups.
    data = tmp_path / "data"
    write_regression_data(LocalStore(data), chunks=3000, rows=250, features=2, seed=1)
    job = RegressionJob(data=str(data), formula="y ~ x1 + x2", chunk_by="chunk", cov_type="HC1")
    w = RegressionWorkload(job, "reg")
    s = run_job(w, RunOptions(output=str(tmp_path / "out"), progress=False), client)
    record = json.loads((tmp_path / "out" / "reg" / "job.json").read_text())
    head, stops = record["head"], record["stops"]
    assert s.complete and s.units_run == 3000 and stops[-1] == 3000
    sizes = _sizes(sum(head), stops)
    assert sizes[1:].min() >= 100, sizes  # the first ends the probes' row group
    assert all(stop % 262 == 0 for stop in stops[:-1])  # on row-group boundaries
    # Aligned tasks read only their own row groups; the probes (a small task reads a
    # whole row group) add a share that depends on how many rounds the load needed.
    assert 1.0 <= s.bytes_read_ratio < 1.0 + len(head) and s.bytes_read > 0
    assert {"fixed", "per_unit", "per_byte", "overhead"} <= record["cost_model"].keys()


def test_far_apart_boundaries_do_not_make_long_tasks():
    # Chunks spanning row groups leave few boundaries: here those of 30,000 chunks
    # of 250 rows in row groups of 9,999 rows (benchmarks/regression_layouts.py, layout
    # iii), with the model its probes measured. Cutting inside such a stretch
    # re-reads one row group, so tasks stay near 1 s (~1,600 chunks): none of them a
    # whole stretch of 10,000 chunks or more (7-8 s).
    layout = make_layout(
        30_000,
        boundaries=[0, 1429, 12_862, 25_724],
        read_bytes=_groups_read_bytes(40, 967_000),
    )
    model = CostModel(0.014, 0.000459, per_byte=12.4e-9, overhead=0.00221)
    stops = cut_tasks(layout, 438, model, 2, 1.0)
    sizes = np.diff([438, *stops])
    assert sizes.max() <= 2 * (30_000 - 438) / len(stops), sizes
    assert len(stops) >= 8
