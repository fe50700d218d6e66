"""The runner with small test workloads: failures as data, resume, task sizing, cluster faults."""

from __future__ import annotations

import pytest
from workloads import SquaresWorkload

from pipeline import RunOptions, connect, run_job
from pipeline.runner import size_tasks


def options(out, **kw):
    return RunOptions(output=str(out), progress=False, **kw)


def test_unit_failures_are_data_and_the_run_finishes(tmp_path, client):
    w = SquaresWorkload("sq", 30, fail={4, 17}, crash_task=5)
    s = run_job(w, options(tmp_path, units_per_task=3), client, echo=lambda m: None)
    assert s.units_run == 30 and not s.complete
    failed = sorted((f["unit"], f["error_type"]) for f in s.failures)
    assert failed == [
        (4, "ValueError"),
        (15, "RuntimeError"),
        (16, "RuntimeError"),
        (17, "RuntimeError"),
    ]
    assert "task 5 cannot start" in next(f["message"] for f in s.failures if f["unit"] == 15)
    values = sorted(p.name for p in (tmp_path / "sq" / "values").iterdir())
    assert len(values) == 30 - 4  # every other unit ran and wrote its output


def test_resume_runs_only_tasks_without_a_manifest_entry(tmp_path, client):
    run_job(
        SquaresWorkload("sq", 30, fail={4}),
        options(tmp_path, units_per_task=3),
        client,
        echo=lambda m: None,
    )
    s = run_job(
        SquaresWorkload("sq", 30), options(tmp_path, units_per_task=3), client, echo=lambda m: None
    )
    assert s.complete and s.tasks_skipped == 9 and s.units_run == 3


def test_calibration_sizes_tasks_and_keeps_workers_busy(tmp_path, client):
    s = run_job(SquaresWorkload("sq", 1000), options(tmp_path), client, echo=lambda m: None)
    # Trials take no time, so the balance limit decides: 4 tasks per worker.
    assert s.units_per_task == 125 and s.tasks == 8 and s.complete


@pytest.mark.parametrize(
    ("spu", "n", "workers", "granularity", "expected"),
    [
        (0.001, 1_000_000, 2, 1, 1000),  # 1 s tasks, 500 whole rounds
        (0.5, 1000, 2, 1, 2),  # slow units: 2 per task
        (2.0, 1000, 2, 1, 1),  # never fewer than 1
        (0.0001, 1000, 2, 1, 125),  # short job: 8 tasks for 2 workers
        # 1 s would be 96 cubes: 11 tasks, the last round half idle. 64 makes 16 tasks,
        # 8 whole rounds: the busiest worker does 512 cubes, not 576.
        (1 / 96, 1000, 2, 16, 64),
        (1 / 96, 1024, 2, 16, 64),
        (0.001, 10_000, 3, 1, 834),  # 12 tasks: 4 rounds of 3
    ],
)
def test_size_tasks(spu, n, workers, granularity, expected):
    assert size_tasks(spu, n, workers, 1.0, granularity) == expected
    assert expected % granularity == 0


@pytest.mark.slow
def test_a_unit_that_kills_every_worker_fails_its_task_not_the_run(tmp_path):
    # Each attempt of task 1 kills its worker; after distributed's allowed failures the
    # scheduler gives up on it. The run records that and still returns a summary.
    import dask

    with (
        dask.config.set({"distributed.scheduler.allowed-failures": 1}),
        connect(RunOptions(workers=2)) as c,
    ):
        s = run_job(
            SquaresWorkload("sq", 12, exit_unit=4),
            options(tmp_path, units_per_task=3),
            c,
            echo=lambda m: None,
        )
    assert not s.complete
    failed_units = {f["unit"] for f in s.failures}
    assert {3, 4, 5} <= failed_units
    assert any("KilledWorker" in f["error_type"] for f in s.failures)
