"""The runner with small test workloads: failures as data, resume, task sizing, cluster faults."""

from __future__ import annotations

import json
import shutil

import pytest
import support.stored as stored
from support.workloads import KillsItsWorkerOnce, SquaresWorkload, stopped_while_probing

from pipeline import RunOptions, connect, run_job
from pipeline.planning.plan import plan_tasks


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
    # Every other unit ran; a task with a failed unit (task 1: units 3-5) commits
    # nothing and removes what it wrote: its other units run again with it.
    assert len(values) == 30 - 4 - 2


def test_the_units_of_a_task_with_a_failed_unit_are_not_counted_as_stored(tmp_path, client):
    # A unit in TaskOutput.failures leaves its whole task to run again: none of that
    # task's units counts as stored, so the summary agrees with verify.
    from pipeline import verify_output
    from pipeline.summary import summary_lines

    s = run_job(SquaresWorkload("sq", 40, fail={5}), options(tmp_path, units_per_task=20),
                client, echo=lambda m: None)  # fmt: skip
    assert (s.units_run, s.units_ok, s.units_failed, s.units_not_kept) == (40, 20, 1, 19)
    lines = [line for line, _ in summary_lines(s)]
    assert lines[0].startswith("squares job 'sq': 20 of 40 squares in ")
    assert "  FAILED: 1 square (1 ValueError); run the same command again to retry" in lines[-3]
    assert lines[-1] == (
        "  not kept: 19 squares that succeeded in the tasks of failed ones, which run again whole"
    )
    (check,) = verify_output(str(tmp_path))
    assert check.units_ok == 20


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


def _values(out, job="sq"):
    """Each value's bytes by its name without the attempt that wrote it."""
    return stored.contents(out / job / "values")


def _manifest_parts(out, job="sq"):
    return sorted(p.name for p in (out / job / "manifest").iterdir())


def test_probe_tasks_measure_the_rate_and_size_the_rest(tmp_path, client):
    # At least 10 ms per unit. A first round of a warm-up unit per worker (left out of
    # the fit), then a task of 16 units per worker and one of 1 for every other; then rounds of one
    # large task per worker, two measured rounds at least, until the large one lasts
    # 0.1 s. The rest is cut into tasks of about 1 s, in whole rounds of 2 tasks.
    s = run_job(
        SquaresWorkload("sq", 300, unit_seconds=0.01), options(tmp_path), client, echo=print
    )
    record = json.loads((tmp_path / "sq" / "job.json").read_text())
    head, stops = record["head"], record["stops"]
    assert s.complete and s.units_run == 300 and s.units_failed == 0
    assert record["plan_format"] == 2 and record["units_per_task"] is None
    assert s.probe_tasks == len(head) and stops[-1] == 300 and stops == sorted(stops)
    assert head[:5] == [1, 1, 16, 16, 1]
    rounds = [head[2:4]] + [head[i : i + 2] for i in range(5, len(head), 2)]
    assert len(rounds) >= 2
    assert all(r[0] == r[-1] for r in rounds)
    assert [r[0] for r in rounds] == sorted(r[0] for r in rounds)
    sizes = [b - a for a, b in zip([sum(head), *stops], stops, strict=False)]
    assert len(sizes) % 2 == 0  # whole rounds of 2 workers
    model = record["cost_model"]
    assert model["per_unit"] >= 0.005  # measured, from sleeps of 10 ms per unit
    assert s.tasks == len(head) + len(stops) == len(_manifest_parts(tmp_path))
    values = _values(tmp_path)
    assert len(values) == 300 and values["00299"] == b"89401"


def test_the_rest_starts_once_a_probe_settles_the_cut_not_after_the_slowest(tmp_path, client):
    # 300 units of 10 ms on 2 workers: round 1 is [1, 1, 16, 16, 1], round 2 two probes of
    # 30-38 units (aimed at 0.4 s, at most a quarter of a worker's share), each with a
    # follower of its size queued behind it, and the first probe to finish settles the
    # cut. The other holds unit 80, 1.5 s slower: the followers and the rest's tasks
    # run on the free worker meanwhile, without waiting for it.
    s = run_job(
        SquaresWorkload("sq", 300, unit_seconds=0.01, slow=(80, 1.5)),
        options(tmp_path),
        client,
        echo=lambda m: None,
    )
    head = json.loads((tmp_path / "sq" / "job.json").read_text())["head"]
    assert s.complete and s.units_run == 300
    assert head[:5] == [1, 1, 16, 16, 1] and len(head) == 9 and 30 <= head[5] <= 38
    assert head[5] == head[6] == head[7] == head[8]
    timings = {t["index"]: t for t in s.task_timings}
    slow = timings[6]  # units 35 + head[5] .. 34 + 2 * head[5]: unit 80 among them
    slow_end = slow["start"] + slow["seconds"]
    assert slow["seconds"] > 1.5
    rest = [t for i, t in timings.items() if i >= len(head)]
    assert rest and min(t["start"] for t in rest) < slow_end - 0.5
    meanwhile = [t for i, t in timings.items() if i >= 7 and t["start"] < slow_end]
    assert sum(t["units"] for t in meanwhile) > 100
    assert _values(tmp_path) == {f"{u:05d}": b"%d" % (u * u) for u in range(300)}


def test_a_small_job_runs_in_one_round_unprobed(tmp_path, client):
    s = run_job(SquaresWorkload("sq", 50), options(tmp_path), client, echo=print)
    record = json.loads((tmp_path / "sq" / "job.json").read_text())
    assert (record["head"], record["stops"]) == ([], [25, 50])
    assert s.complete and (s.tasks, s.probe_tasks, s.units_per_task) == (2, 0, 25)


def test_the_client_sends_a_rounds_tasks_without_waiting_for_dasks_next_batch(tmp_path, client):
    # Dask's client batches its messages 10 ms apart; a probe round, submitted just
    # after the last round's results were released, must not wait for the next batch.
    run_job(SquaresWorkload("sq", 4), options(tmp_path), client, echo=lambda m: None)
    assert client.scheduler_comm.interval <= 0.001


def test_probes_interrupted_before_the_rest_was_sized_resume(tmp_path, client):
    full = tmp_path / "full"
    run_job(SquaresWorkload("sq", 300, unit_seconds=0.002), options(full), client, echo=print)
    out = tmp_path / "out"
    head = stopped_while_probing(full, out, "sq")
    shutil.rmtree(out / "sq" / "values")

    s = run_job(SquaresWorkload("sq", 300), options(out), client, echo=print)
    resumed = json.loads((out / "sq" / "job.json").read_text())
    assert s.complete and s.tasks_skipped == len(head) - 1
    assert resumed["head"][: len(head)] == head
    assert [sum(resumed["head"]), *resumed["stops"]][-1] == 300  # the probes may cover all
    # Only the units not already complete ran: the last probe and everything after it.
    assert s.units_run == 300 - sum(head[:-1])
    assert sorted(_values(out)) == [f"{u:05d}" for u in range(sum(head[:-1]), 300)]
    assert len(_manifest_parts(out)) == s.tasks


def test_units_per_task_flag_skips_the_probes(tmp_path, client):
    s = run_job(SquaresWorkload("sq", 100), options(tmp_path, units_per_task=7), client)
    record = json.loads((tmp_path / "sq" / "job.json").read_text())
    assert (s.probe_tasks, s.units_per_task, s.tasks) == (0, 7, 15)
    assert (record["head"], record["units_per_task"]) == ([], 7)


def test_plan_tasks_with_probes_first():
    tasks = plan_tasks(20, 6, head=[1, 1, 3])
    assert [(t.index, t.start, t.stop) for t in tasks] == [
        (0, 0, 1),
        (1, 1, 2),
        (2, 2, 5),
        (3, 5, 11),
        (4, 11, 17),
        (5, 17, 20),
    ]
    assert plan_tasks(20, None, head=[1, 1]) == tasks[:2]


@pytest.mark.slow
def test_a_unit_that_kills_every_worker_fails_its_task_not_the_run(tmp_path):
    # Each attempt of task 1 kills its worker; after distributed's allowed failures the
    # scheduler gives up on it. The run records that and still returns a summary.
    import dask
    import distributed  # noqa: F401  (its defaults first: set() would drop them on exit)

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


def test_probe_rounds_use_every_worker(tmp_path, client, monkeypatch):
    # A large workload held on the cluster by one worker would keep the scheduler's
    # short tasks where their data is: whole probe rounds on that one worker while the
    # other idles. Shipped to every worker, it holds no task.
    import pipeline.dispatch.shipping

    monkeypatch.setattr(pipeline.dispatch.shipping, "INLINE_BYTES", 1)  # ship any workload
    s = run_job(SquaresWorkload("sq", 300, unit_seconds=0.01), options(tmp_path), client)
    assert s.complete
    by_index = {t["index"]: t["worker"] for t in s.task_timings}
    head = json.loads((tmp_path / "sq" / "job.json").read_text())["head"]
    rounds = [range(0, 2)] + [range(i, i + 4) for i in range(2, len(head), 4)]
    for r in rounds:
        assert len({by_index[i] for i in r}) == 2, (list(r), by_index)


def test_a_task_given_up_at_the_dask_level_runs_again(tmp_path):
    # The scheduler gives up on a task at its first worker death (allowed-failures 0),
    # which makes joblib abandon every task in flight; the runner runs the tasks not
    # heard from again, and the job completes in this run.
    import dask
    import distributed  # noqa: F401  (its defaults first: set() would drop them on exit)

    with (
        dask.config.set({"distributed.scheduler.allowed-failures": 0}),
        connect(RunOptions(workers=2)) as c,
    ):
        s = run_job(
            KillsItsWorkerOnce("sq", 12, kill_unit=4, marker=tmp_path / "killed-once"),
            options(tmp_path / "out", units_per_task=3),
            c,
            echo=lambda m: None,
        )
    assert (tmp_path / "killed-once").exists()
    assert s.complete and s.units_failed == 0, s.failures[:2]
    assert len(_values(tmp_path / "out")) == 12


def test_one_worker_runs_the_tasks_not_the_driver(tmp_path):
    # joblib runs a call in the calling process when its backend has one worker.
    import os

    with connect(RunOptions(workers=1)) as c:
        s = run_job(SquaresWorkload("sq", 100), options(tmp_path, units_per_task=10), c)
    assert s.complete
    pids = {t["worker"].rsplit(":", 1)[1] for t in s.task_timings}
    assert str(os.getpid()) not in pids, pids


def test_a_second_run_of_a_running_job_is_refused_and_a_killed_one_lets_go(tmp_path, client):
    # Two runs of one job into one output would plan, write and consolidate the same
    # tasks at once: units lost and duplicated, both saying complete. The lock is the
    # run's, held from a separate process here, then killed as a user's run would be.
    from support.lock_holders import lock_held_elsewhere

    from pipeline import JobRunning

    with lock_held_elsewhere(str(tmp_path), "sq", "pid 1 on elsewhere") as holder:
        with pytest.raises(JobRunning, match=r"job 'sq' in .* is already running \(pid 1 on"):
            run_job(SquaresWorkload("sq", 6), options(tmp_path, overwrite=True), client)
        assert not (tmp_path / "sq").exists()  # --overwrite waits for the lock too
        holder.kill()  # SIGKILL
        holder.wait(10)
    s = run_job(SquaresWorkload("sq", 6), options(tmp_path), client, echo=lambda m: None)
    assert s.complete and s.units_ok == 6


def test_a_scheduler_without_workers_is_an_error_before_any_task(tmp_path, monkeypatch):
    # An error at once, not a wait on every task, every unit failed minutes later and
    # a run costed for them.
    from distributed import Client, LocalCluster

    import pipeline.runner.run
    from pipeline import ClusterError

    monkeypatch.setattr(pipeline.runner.run, "WAIT_FOR_WORKERS", 1)
    with (
        LocalCluster(n_workers=0, processes=False, dashboard_address=None) as cluster,
        Client(cluster) as empty,
        pytest.raises(ClusterError, match=r"no worker joined the scheduler at .* within 1 s"),
    ):
        run_job(SquaresWorkload("sq", 40), options(tmp_path), empty, echo=lambda m: None)
    assert not (tmp_path / "sq" / "manifest").exists()


def test_a_cluster_left_without_workers_mid_run_ends_the_run(tmp_path, monkeypatch):
    # Every worker gone, none restarted: the driver waited, silent, for ever.
    import threading

    from distributed import Client, LocalCluster

    import pipeline.dispatch.task_runner
    from pipeline import ClusterError

    monkeypatch.setattr(pipeline.dispatch.task_runner, "WORKERLESS_SECONDS", 1)
    with (
        LocalCluster(n_workers=1, processes=False, dashboard_address=None) as cluster,
        Client(cluster) as client,
    ):
        gone = threading.Timer(1.0, lambda: cluster.scale(0))  # none restarted
        gone.start()
        try:
            with pytest.raises(ClusterError, match=r"has had no worker for 1 s, in the middle"):
                run_job(SquaresWorkload("sq", 200, unit_seconds=0.02), options(tmp_path),
                        client, echo=lambda m: None)  # fmt: skip
        finally:
            gone.join()


def test_probes_leave_each_workers_cold_first_task_out_and_measure_the_hand_over(tmp_path):
    # Two workers in one process (a LocalCluster of threads, as the fleet simulation
    # runs hundreds): each one's first task is 0.5 s slower. Both are told apart as
    # cold and left out of the fit, whose fixed part stays near the 10 ms units'
    # nothing; a worker's wait between one task and its next is measured.
    from distributed import Client, LocalCluster

    with (
        LocalCluster(
            n_workers=2, threads_per_worker=1, processes=False, dashboard_address=None
        ) as cluster,
        Client(cluster) as client,
    ):
        w = SquaresWorkload("sq", 300, unit_seconds=0.01, cold_seconds=0.5)
        s = run_job(w, options(tmp_path), client, echo=lambda m: None)
    assert s.complete and s.units_run == 300
    record = json.loads((tmp_path / "sq" / "job.json").read_text())
    assert record["head"][:5] == [1, 1, 16, 16, 1]
    timings = sorted(s.task_timings, key=lambda t: t["start"])
    assert len({t["worker"] for t in timings}) == 1  # one process
    firsts = {}
    for t in timings:
        firsts.setdefault(t["address"], t)
    assert len(firsts) == 2 and all(t["seconds"] >= 0.5 for t in firsts.values())
    model = record["cost_model"]
    assert model["fixed"] < 0.1, model
    assert model["handover"] > 0, model


def test_on_many_workers_the_rest_starts_without_waiting_for_the_first_rounds_slowest(
    tmp_path, monkeypatch
):
    # A first round with twice MANY_SAMPLES probes of each size is read as it comes
    # (hundreds of workers; here 8 worker processes, and 2 samples a size): a
    # 15-unit probe each (its worker's first task: no warm-up before it), a 1-unit
    # probe for every other (twice MANY_SAMPLES at most) and a 7-unit follower each;
    # once 2 of each size run warm and half the 15-unit probes reported, the rest is
    # cut and started. The probe holding unit 30
    # is 3 s slower (and a 1-unit probe may wait behind it): the rest's tasks run
    # meanwhile instead of after it.
    import pipeline.planning.probes

    monkeypatch.setattr(pipeline.planning.probes, "MANY_SAMPLES", 2)
    with connect(RunOptions(workers=8)) as client:
        w = SquaresWorkload("sq", 8 * 60, unit_seconds=0.002, slow=(30, 3.0))
        s = run_job(w, options(tmp_path), client, echo=lambda m: None)
    assert s.complete and s.units_run == 8 * 60
    head = json.loads((tmp_path / "sq" / "job.json").read_text())["head"]
    assert head == [15] * 8 + [1] * 4 + [7] * 8  # the followers last
    timings = {t["index"]: t for t in s.task_timings}
    slow = timings[30 // 15]
    slow_end = slow["start"] + slow["seconds"]
    assert slow["seconds"] >= 3.0
    rest = [t for i, t in timings.items() if i >= len(head)]
    assert sum(t["units"] for t in rest if t["start"] < slow_end - 1.0) > 0
    assert len(_values(tmp_path)) == 8 * 60


def test_each_job_is_validated_once_a_command(tmp_path, client):
    # The driver validated each job, then run_job did again: a workload's preflight
    # had to be idempotent (and the output store was probed twice).
    from pipeline import ConfigError, Job, load_jobs, run_jobs
    from pipeline.driver import run_workload

    log = tmp_path / "preflights"
    paths = []
    for name in ("a", "b"):
        paths.append(tmp_path / f"{name}.toml")
        paths[-1].write_text(f'workload = "squares"\nn_units = 4\npreflights = "{log}"\n')
    cli = {"output": str(tmp_path / "out"), "scheduler": client.scheduler.address,
           "progress": False}  # fmt: skip
    jobs = load_jobs([str(p) for p in paths], cli, environ={})
    assert all(s.complete for s in run_jobs(jobs, echo=lambda m: None))
    assert log.read_text().split() == ["a", "b"]
    # Found complete: validated, and nothing run
    assert all(s.complete for s in run_jobs(jobs, echo=lambda m: None))
    assert log.read_text().split() == ["a", "b", "a", "b"]
    log.unlink()
    w = SquaresWorkload("c", 4, preflights=str(log))
    assert run_job(w, options(tmp_path / "out"), client, echo=lambda m: None).complete
    w = SquaresWorkload("d", 4, preflights=str(log))
    assert run_workload(w, options(tmp_path / "out"), client=client).complete
    assert log.read_text().split() == ["c", "d"]
    # A job's name is checked where it is made, and by each way to run a workload
    with pytest.raises(ConfigError, match=r"^job name 'x/y': a job's name is one folder"):
        Job("squares", jobs[0].options, jobs[0].settings, "x/y", None)
    for run in (run_workload, lambda w, o: run_job(w, o, client)):
        with pytest.raises(ConfigError, match=r"^job name 'x/y'"):
            run(SquaresWorkload("x/y", 4, preflights=str(log)), options(tmp_path / "out"))
    assert log.read_text().split() == ["c", "d"]
