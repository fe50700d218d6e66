"""Prices, what a run cost, and `pipeline estimate`'s projection against a real run."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest
from support.workloads import SquaresWorkload

from pipeline import RunOptions, run_job
from pipeline.config import resolve
from pipeline.config.jobfile import JobFile
from pipeline.costs.estimate import estimate, estimate_lines
from pipeline.costs.prices import load_prices, worker_price
from pipeline.costs.run_cost import Fleet, JobSample, parse_fleet, project, projection_lines
from pipeline.errors import ConfigError
from pipeline.planning.sizing import SCHEDULER_SECONDS_PER_TASK, CostModel, make_layout
from pipeline.summary import TaskTime, summary_lines, usd


def options(out, **kw):
    return RunOptions(output=str(out), progress=False, **kw)


def test_the_packaged_table_covers_the_terraform_defaults():
    import hcl2

    with open(Path(__file__).resolve().parents[1] / "terraform" / "variables.tf") as f:
        # python-hcl2 >= 7 keeps the quotes of labels and string literals.
        variables = {k.strip('"'): v for d in hcl2.load(f)["variable"] for k, v in d.items()}
    table = load_prices()
    worker = table.instance(variables["worker_instance_type"]["default"].strip('"'))
    scheduler = table.instance(variables["scheduler_instance_type"]["default"].strip('"'))
    assert (worker.name, worker.vcpus, worker.memory_gib) == ("c5.24xlarge", 96, 192)
    assert (worker.network_gbps, worker.usd_per_hour) == (25, 4.08)
    assert scheduler.name == "m5.2xlarge" and scheduler.usd_per_hour > 0
    assert table.load_balancer_per_hour > 0 and table.as_of and table.region == "us-east-1"


def test_a_worker_hour_is_the_instance_price_over_its_vcpus_unless_overridden(tmp_path):
    assert worker_price(RunOptions()).usd_per_hour == pytest.approx(4.08 / 96)
    own = resolve(RunOptions, None, {}, {"PIPELINE_PRICE_PER_WORKER_HOUR": "0.5"})
    assert worker_price(own).usd_per_hour == 0.5
    prices = tmp_path / "prices.toml"
    prices.write_text(
        'as_of = "2030-01-01"\n[instances."x1.big"]\n'
        "vcpus = 10\nmemory_gib = 20\nnetwork_gbps = 5\nusd_per_hour = 2.0\n"
    )
    job = JobFile(tmp_path / "job.toml", "map", {"instance_type": "x1.big"})
    custom = resolve(RunOptions, job, {"price_file": str(prices)}, {})
    price = worker_price(custom)
    assert price.usd_per_hour == pytest.approx(0.2) and "2030-01-01" in price.source


def test_a_cost_line_says_which_price_it_uses_and_the_default_how_to_change_it(tmp_path):
    # Every run is priced, a laptop's too: the default instance type is named as the
    # default, with the settings that change it; a price chosen is named as chosen.
    from pipeline.costs.run_cost import add_run_cost
    from pipeline.summary import RunSummary, cost_line

    def line(opts: RunOptions) -> str:
        s = RunSummary("j", "map", None, 10, 2, 5, 0, units_run=10, workers=2, wall_seconds=9.0)
        s.busy_seconds = 18.0
        add_run_cost(s, worker_price(opts), remote=False)
        return cost_line(s)

    default = line(RunOptions())
    assert "at $0.0425/worker-hour (priced as c5.24xlarge (the default instance_type): " in default
    assert "set instance_type or price_per_worker_hour to change it)" in default
    chosen = line(RunOptions(instance_type="c5.4xlarge"))
    assert "(priced as c5.4xlarge (instance_type): $0.68/h over 16 workers" in chosen
    assert "default" not in chosen
    assert "(price_per_worker_hour)" in line(RunOptions(price_per_worker_hour=0.5))
    prices = tmp_path / "prices.toml"
    prices.write_text(
        'as_of = "2030-01-01"\n[instances."c5.24xlarge"]\n'
        "vcpus = 10\nmemory_gib = 20\nnetwork_gbps = 5\nusd_per_hour = 2.0\n"
    )
    own_table = line(RunOptions(price_file=str(prices)))
    assert f"prices of 2030-01-01 from {prices}; set instance_type" in own_table


def test_bad_prices_are_refused_naming_the_setting(tmp_path):
    with pytest.raises(ConfigError, match=r"instance_type 'c5\.huge'.*c5\.24xlarge"):
        worker_price(RunOptions(instance_type="c5.huge"))
    bad = tmp_path / "prices.toml"
    bad.write_text('[instances."a.b"]\nvcpus = 0\nmemory_gib = 1\nnetwork_gbps = 1\n')
    with pytest.raises(ConfigError, match=r"prices\.toml: instances\.'a\.b'\.vcpus: expected"):
        worker_price(RunOptions(instance_type="a.b", price_file=str(bad)))
    with pytest.raises(ConfigError, match=r"--fleet 'c5\.24xlarge:none'"):
        parse_fleet("c5.24xlarge:none", load_prices())


def test_a_bad_instance_type_fails_before_any_task(tmp_path, client):
    w = SquaresWorkload("sq", 10)
    with pytest.raises(ConfigError, match="instance_type"):
        run_job(w, options(tmp_path, instance_type="nope"), client, echo=lambda m: None)
    assert not (tmp_path / "sq").exists()


def test_a_run_says_what_it_cost_and_its_runs_per_day(tmp_path, client):
    s = run_job(
        SquaresWorkload("sq", 40, unit_seconds=0.01),
        options(tmp_path, price_per_worker_hour=3.6),
        client,
        echo=lambda m: None,
    )
    # The embedded cluster: the worker-seconds the tasks were busy, at $3.60/h = $0.001/s.
    assert s.worker_seconds == s.busy_seconds >= 0.4
    assert s.cost_usd == pytest.approx(s.worker_seconds * 0.001)
    # A day over the whole command's wall time: here run_job's, planning to finalize
    assert s.command_seconds >= s.wall_seconds > 0
    assert s.runs_per_day == pytest.approx(86_400 / s.command_seconds)
    line = next(line for line, _ in summary_lines(s) if line.strip().startswith("cost:"))
    assert usd(s.cost_usd) in line and "(price_per_worker_hour)" in line
    report = json.loads(s.to_json())
    assert report["cost_usd"] == s.cost_usd and report["worker_seconds"] == s.worker_seconds
    # Every task this run ran is on the timeline, on one of the 2 worker processes.
    assert sorted(t["index"] for t in s.task_timings) == list(range(s.tasks))
    assert sum(t["units"] for t in s.task_timings) == 40
    assert len({t["worker"] for t in s.task_timings}) <= 2
    assert all(t["start"] >= 0 and t["seconds"] >= 0.01 for t in s.task_timings)


def test_runs_per_day_count_the_whole_commands_wall_time_start_up_included(tmp_path):
    """A batch of `pipeline run` commands runs at the pace of each command's whole wall
    time: runs per day divided a day by the run alone, leaving out the cluster's
    start-up (and the end of the run, after its wall time was taken)."""
    from pipeline import load_jobs, run_jobs

    cli = {"function": "mapfns.userfns:power", "grid": '{"x": [1, 2, 3], "p": 2}',
           "output": str(tmp_path), "workers": 1, "progress": False}  # fmt: skip
    (s,) = run_jobs(load_jobs([], cli, workload="map", environ={}), echo=lambda m: None)
    assert s.complete and s.units_run == 3
    start_up = s.startup["inputs checked"] + s.startup["waited for the cluster"]
    assert start_up > 0 and s.wall_seconds > 0
    assert s.command_seconds >= start_up + s.wall_seconds
    assert s.runs_per_day == pytest.approx(86_400 / s.command_seconds)
    assert json.loads(s.to_json())["command_seconds"] == s.command_seconds
    line = next(line for line, _ in summary_lines(s) if line.strip().startswith("cost:"))
    assert f"{86_400 / s.command_seconds:,.0f} runs/day at this pace" in line


def test_pipeline_map_counts_its_clusters_start_up_in_runs_per_day(tmp_path):
    from mapfns import userfns

    import pipeline

    s = pipeline.map(userfns.power, grid={"x": [1, 2], "p": 2}, output=str(tmp_path),
                     workers=1, progress=False)  # fmt: skip
    assert s.complete and s.command_seconds > s.wall_seconds > 0
    assert s.runs_per_day == pytest.approx(86_400 / s.command_seconds)


def test_a_remote_run_is_charged_every_worker_for_the_whole_run():
    from pipeline.costs.prices import WorkerPrice
    from pipeline.costs.run_cost import add_run_cost
    from pipeline.summary import RunSummary

    s = RunSummary("j", "map", None, 10, 2, 5, 0, units_run=10, workers=4, wall_seconds=90.0)
    s.busy_seconds = 100.0
    add_run_cost(s, WorkerPrice(0.04, "test"), remote=True)
    assert s.worker_seconds == 360.0 and s.cost_usd == pytest.approx(0.004)
    add_run_cost(s, WorkerPrice(0.04, "test"), remote=False)
    assert s.worker_seconds == 100.0


def _sample(per_unit=0.01, fixed=0.05, written=0.0, objects=0.0):
    return JobSample(CostModel(fixed, per_unit, 0.0, 0.002), 100, 1.0, written, 0.0, objects, 2)


def test_the_projection_names_the_limit_that_binds():
    fleet = parse_fleet("c5.24xlarge:5", load_prices())
    assert fleet.workers == 480
    assert fleet.usd_per_hour == pytest.approx(5 * 4.08 + 0.384 + 0.0225)
    layout = make_layout(1_000_000)
    # 10 ms of CPU per unit, nothing written: 10,000 worker-seconds on 480 workers.
    cpu = project(layout, _sample(), fleet)
    assert cpu.binding == "tasks" and cpu.wall_seconds >= 10_000 / 480
    assert cpu.cost_usd == pytest.approx(cpu.wall_seconds / 3600 * fleet.usd_per_hour)
    assert any("480" in note for note in cpu.notes) is False
    # A cube job storing 8 MB per unit at 1 ms each: 8 TB through 5 NICs of 25 Gbps.
    cubes = project(layout, _sample(per_unit=0.001, written=8e6, objects=0.01), fleet)
    assert cubes.binding == "network"
    assert cubes.wall_seconds == pytest.approx(1e6 * 8e6 / 5 * 8 / 25e9)
    # One small object per unit, 0.1 ms each: 1M PUTs at 3,500/s.
    puts = project(layout, _sample(per_unit=1e-4, written=100, objects=1.0), fleet)
    assert puts.binding == "s3" and puts.wall_seconds >= 1e6 / 3500
    # Tasks of one unit each (--units-per-task 1): a millisecond of the scheduler each.
    many = project(layout, _sample(per_unit=1e-4, fixed=0.0), fleet, units_per_task=1)
    assert many.binding == "scheduler" and many.tasks == 1_000_000
    assert many.wall_seconds == pytest.approx(1_000_000 * SCHEDULER_SECONDS_PER_TASK)
    # The planner's own cut of that job: one task per worker, 480 tasks.
    planned = project(layout, _sample(per_unit=1e-4, fixed=0.0), fleet)
    assert planned.tasks == 480 and planned.wall_seconds < many.wall_seconds / 100
    big = parse_fleet("c5.24xlarge:6", load_prices())
    assert any("480" in note for note in project(layout, _sample(), big).notes)
    # 200 units of 0.2 s, whose probes took 13.5 s on 2 workers: on 480 workers the
    # runner does not probe so small a job; it runs in one round of one unit a task.
    sample = JobSample(CostModel(0.0015, 0.2, 0.0, 0.002), 119, 13.5, workers=2)
    small = project(make_layout(200), sample, fleet)
    assert small.tasks == 200 and small.wall_seconds == pytest.approx(0.2015, abs=0.01)


def test_a_projection_of_waiting_tasks_says_the_cores_are_not_what_binds():
    here = Fleet(None, 1, 2, 0.085, "this cluster")
    waited = TaskTime(10.0, {"compute": 10.0}, cpu=0.8)
    p = project(make_layout(200), dataclasses.replace(_sample(per_unit=0.2), spent=waited), here)
    assert projection_lines(p)[0].endswith(
        "bound by the tasks' waits (wait-bound: on the CPU 8% of the probes' tasks' time)"
    )
    (note,) = p.notes
    assert note.startswith("the tasks waited (sleep, network, disk")
    computed = dataclasses.replace(waited, cpu=9.5)
    p = project(make_layout(200), dataclasses.replace(_sample(per_unit=0.2), spent=computed), here)
    assert p.notes == [] and projection_lines(p)[0].endswith("bound by CPU")
    # Not on the CPU, but runnable: the machine's cores were busy with other work, which
    # more workers would not overlap, so no note says they would.
    queued = dataclasses.replace(waited, cpu=2.5, runq=7.0)
    p = project(make_layout(200), dataclasses.replace(_sample(per_unit=0.2), spent=queued), here)
    assert projection_lines(p)[0].endswith(
        "bound by CPU, contended (CPU-contended: waiting for a core 70% of the probes' tasks' time)"
    )
    (note,) = p.notes
    assert "this machine's cores were busy with other work" in note
    assert note.endswith("more workers would only wait longer")


def test_the_tasks_floor_is_named_by_the_tasks_that_make_most_of_it():
    # Probes that loaded a cube job's frames cold, then full-size tasks that wrote
    cold = TaskTime(4.0, {"inputs": 3.0, "compute": 0.5, "writing": 0.5}, 3.5, 10**6)
    warm = TaskTime(4.0, {"compute": 1.0, "writing": 3.0}, 1.5, 10**8)
    sample = dataclasses.replace(_sample(per_unit=0.001), spent=cold, steady=warm)
    here = Fleet(None, 1, 2, 0.085, "this cluster", s3=False)
    big = project(make_layout(100_000), sample, here)  # the probing phase a second of 50
    assert (big.binding, big.task_bound, big.notes) == ("tasks", "disk-bound", [])
    assert projection_lines(big)[0].endswith(
        "bound by writing to disk (disk-bound: writing was 75% of the full-size tasks' time)"
    )
    small = project(make_layout(200), sample, here)  # mostly the probing phase
    assert projection_lines(small)[0].endswith(
        "bound by loading inputs (input-bound: loading inputs was 75% of the probes' tasks' time)"
    )
    # A fleet writes to S3 while the writes here were timed to a disk: the projection
    # says so.
    fleet = project(make_layout(10**6), sample, parse_fleet("c5.24xlarge:1", load_prices()))
    assert fleet.task_bound == "disk-bound"
    assert "the tasks' writes were timed to a disk (this estimate's output)" in fleet.notes[0]


def test_an_estimate_without_a_full_size_round_keeps_the_probes_model(tmp_path, client):
    # 300 units of 0.5 ms and a small file written each (2-3 ms in all on this VM's
    # disk): the run's tasks would be a third of the job or more, so no round of them
    # is run. Unit 0, in a worker's first task, is 3 s slower (a cold start): the
    # probes leave that task out of their fit, and so must the estimate (taking it in
    # adds about 17 ms a unit).
    est = estimate(
        lambda opts: SquaresWorkload("sq", 300, unit_seconds=0.0005, slow=(0, 3.0)),
        options(tmp_path / "out"),
        client,
        [],
    )
    assert est.sampled == est.sample.units  # no full-size tasks
    assert 0.0003 < est.sample.model.per_unit < 0.008, est.sample.model


def test_an_estimate_says_when_the_units_it_ran_failed(tmp_path, client):
    # Units that raise are not work to project: an estimate whose every unit failed is
    # an error, and one where some failed says how many.
    from pipeline import MapJob, MapWorkload
    from pipeline.errors import PipelineError

    def job(grid):
        return lambda opts: MapWorkload(MapJob(function="mapfns.userfns:odd_fails", grid=grid), "m")

    with pytest.raises(PipelineError, match=r"every point the probes ran failed \(4 of 4\), "
                       r"e\.g\. point 0 \(x=1\): ValueError: x = 1 is odd"):  # fmt: skip
        estimate(job({"x": [1, 3, 5, 7]}), options(tmp_path / "a"), client, [])
    est = estimate(job({"x": list(range(8))}), options(tmp_path / "b"), client, [])
    assert est.failed == 4 and est.failure.startswith("point 1 (x=1): ValueError: x = 1 is odd")
    (warning,) = [line for line in estimate_lines(est) if "warning" in line]
    assert "4 of the 8 points it ran failed" in warning


class _LaterUnitsCostMore(SquaresWorkload):
    """unit_seconds for the first three quarters, then up to 13x: 2.5x on average."""

    def seconds_of(self, unit: int) -> float:
        return self.unit_seconds * (1 + 48 * max(0.0, unit / self.n_units - 0.75))


def test_an_estimate_samples_the_whole_job_not_only_its_first_units(tmp_path, client):
    # The probes run the job's first units; the full-size tasks are spread
    # over the job, so a job whose later units cost more (a grid's larger sizes) is
    # not projected at the cost of the units right after the probes (here 1x
    # unit_seconds, against 2.5x on average).
    est = estimate(
        lambda opts: _LaterUnitsCostMore("sq", 600, unit_seconds=0.01),
        options(tmp_path / "out"),
        client,
        [],
    )
    assert est.sampled > est.sample.units  # full-size tasks ran
    assert 1.9 * 0.01 < est.sample.model.per_unit < 3.5 * 0.01, est.sample.model


def test_an_estimate_stops_probing_once_a_round_measured_enough(tmp_path, client):
    # 50 ms a unit: the first round's 16-unit probes last 0.8 s, enough to measure. A
    # run probes a second round (its probes' work is kept); an estimate, whose work
    # is thrown away, stops: the warm-ups, a 16-unit probe a worker, one small one.
    est = estimate(
        lambda opts: SquaresWorkload("sq", 400, unit_seconds=0.05),
        options(tmp_path / "out"),
        client,
        [],
    )
    assert est.sample.units == 1 + 1 + 16 + 16 + 1, est.sample
    assert 0.045 < est.sample.model.per_unit < 0.07, est.sample.model


def test_an_estimate_of_units_per_task_cuts_whole_shards_as_the_run_does(
    tmp_path, client, frames_dir
):
    # --units-per-task 20 on shards of 16 cubes: the run's tasks are of 32 cubes (7 for
    # 200 cubes); the projection cut tasks of 20 (10), as 30 for 27 of 3,000 cubes.
    from pipeline import load_jobs

    (job,) = load_jobs([], {"output": str(tmp_path / "out"), "frames": str(frames_dir),
                            "cubes": 200, "dim": 10, "units_per_task": 20,
                            "progress": False}, environ={})  # fmt: skip
    est = estimate(lambda o: dataclasses.replace(job, options=o).build(), job.options, client, [])
    s = run_job(job.build(), job.options, client, echo=lambda m: None)
    assert s.complete and (s.tasks, s.units_per_task) == (7, 32)
    assert est.projections[0].tasks == s.tasks
    sample = _sample(per_unit=0.001)
    assert project(make_layout(3000, granularity=16), sample, est.projections[0].fleet,
                   units_per_task=100).tasks == 27  # fmt: skip


def test_an_estimate_of_a_job_that_writes_nothing_has_no_s3_floor(tmp_path, client, frames_dir):
    # --sink none writes nothing, no manifest entry either: a fleet's floor counted one
    # PUT per task all the same ("S3 request rate 0.137 s" beside 0.00 objects a cube).
    from pipeline import load_jobs

    (job,) = load_jobs([], {"output": str(tmp_path / "out"), "frames": str(frames_dir),
                            "cubes": 300, "dim": 10, "sink": "none",
                            "progress": False}, environ={})  # fmt: skip
    fleet = parse_fleet("c5.24xlarge:5", load_prices())
    est = estimate(lambda o: dataclasses.replace(job, options=o).build(), job.options, client,
                   [fleet])  # fmt: skip
    assert est.sample.objects_per_unit == 0
    assert [p.limits["s3"] for p in est.projections] == [None, None]
    assert "S3 request rate" not in "\n".join(estimate_lines(est))


def test_spread_takes_the_middles_of_equal_stretches():
    from pipeline.costs.estimate import _spread
    from pipeline.workload import Task

    tasks = [Task(i, 10 * i, 10 * i + 10) for i in range(10)]  # units 0..99
    assert _spread(tasks, 2) == [tasks[2], tasks[7]]  # units 25 and 75
    assert _spread(tasks, 4) == [tasks[1], tasks[3], tasks[6], tasks[8]]
    assert _spread(tasks[6:], 2) == [tasks[7], tasks[9]]  # units 70 and 90
    assert _spread(tasks[9:], 3) == [tasks[9]]
    assert _spread([], 2) == []


@pytest.mark.slow
def test_the_projection_matches_a_real_run_on_two_workers(tmp_path, client):
    """A job of about 22 s on the embedded cluster's 2 workers: the estimate (its
    probes only, into a scratch folder) projects its wall time within 30 %."""
    n, unit_seconds = 2200, 0.02
    out = tmp_path / "out"
    est = estimate(
        lambda opts: SquaresWorkload("sq", n, unit_seconds=unit_seconds),
        options(out),
        client,
        [parse_fleet("c5.24xlarge:1", load_prices())],
    )
    assert not out.exists()  # none of the job's output was written
    assert est.sample.units <= est.sampled < n / 4  # a sample, not the job
    here, fleet = est.projections
    assert here.fleet.workers == 2 and here.binding == "tasks"
    assert fleet.fleet.workers == 96 and fleet.wall_seconds < here.wall_seconds
    s = run_job(SquaresWorkload("sq", n, unit_seconds=unit_seconds), options(out), client,
                echo=lambda m: None)  # fmt: skip
    assert s.complete and s.wall_seconds >= 20
    print(f"projected {here.wall_seconds:.1f} s, measured {s.wall_seconds:.1f} s")
    assert here.wall_seconds == pytest.approx(s.wall_seconds, rel=0.30)


@pytest.mark.integration
def test_pipeline_estimate_on_the_command_line(tmp_path):
    (tmp_path / "mine.py").write_text(
        "import time\n\ndef slow(x):\n    time.sleep(0.002)\n    return {'y': 2 * x}\n"
    )
    job = tmp_path / "grid.toml"
    grid = list(range(300))
    job.write_text(f'workload = "map"\nfunction = "mine:slow"\n[grid]\nx = {grid}\n')
    cmd = [sys.executable, "-m", "pipeline", "estimate", str(job), "--output",
           str(tmp_path / "out"), "--workers", "2", "--fleet", "c5.24xlarge:2"]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("estimate of map job 'grid': 300 points"), proc.stdout
    here = "  this cluster (2 workers at $0.0425/worker-hour, priced as c5.24xlarge (the default "
    assert any(line.startswith(here + "instance_type))") for line in lines), proc.stdout
    fleet = next(line for line in lines if "2 x c5.24xlarge (192 workers)" in line)
    assert "bound by" in fleet and "runs/day" in fleet
    assert not (tmp_path / "out").exists()
    bad = subprocess.run([*cmd[:-1], "c9.mega:2"], capture_output=True, text=True, timeout=120)
    assert bad.returncode != 0 and "--fleet 'c9.mega'" in bad.stderr
    # A job given by flags alone, as `pipeline run --workload ...` takes it.
    flags = [sys.executable, "-m", "pipeline", "estimate", "--workload", "map", "--function",
             "mine:slow", "--grid", json.dumps({"x": grid}), "--output", str(tmp_path / "out"),
             "--workers", "2"]  # fmt: skip
    proc = subprocess.run(flags, capture_output=True, text=True, timeout=240, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("estimate of map job 'map': 300 points"), proc.stdout


@pytest.mark.integration
def test_an_estimate_for_an_s3_output_leaves_nothing_in_the_bucket(s3, s3_bucket):
    from pipeline import connect
    from pipeline.storage import open_store

    bucket = open_store(s3_bucket.rsplit("/", 1)[0])
    bucket.write_bytes("root/other-job/keep.txt", b"not ours")
    opts = options(s3_bucket, workers=2)
    # Workers started now, with the S3 endpoint in their environment.
    with connect(opts) as c:
        est = estimate(lambda o: SquaresWorkload("sq", 200), opts, c, [])
    assert est.sample.objects_per_unit == pytest.approx(1.0)  # one value object per square
    here = est.projections[0]
    assert here.limits["s3"] is not None and here.limits["s3"] >= 200 / 3500
    assert bucket.list("root") == ["root/other-job/keep.txt"]


@pytest.mark.integration
def test_an_estimate_names_the_bound_as_the_runs_summary_does(s3, s3_bucket, frames_dir):
    # Shards to S3 (here SeaweedFS): the run and its estimate name the bound from the same
    # phases, so an S3-bound run is not estimated as bound by CPU.
    from pipeline import connect, load_jobs
    from pipeline.summary import bottleneck

    (job,) = load_jobs([], {"output": s3_bucket, "frames": str(frames_dir), "cubes": 1600,
                            "dim": 12, "progress": False, "workers": 2}, environ={})  # fmt: skip
    with connect(job.options) as c:
        est = estimate(lambda o: dataclasses.replace(job, options=o).build(), job.options, c, [])
        s = run_job(job.build(), job.options, c, echo=lambda m: None)
    assert s.complete and bottleneck(s).startswith("S3-bound: "), bottleneck(s)
    here = est.projections[0]
    assert (here.binding, here.task_bound) == ("tasks", "S3-bound"), projection_lines(here)
    assert "bound by writing to S3 (S3-bound: writing was " in projection_lines(here)[0]


def test_the_summary_names_what_bound_the_run_and_reads_short_times():
    from pipeline.summary import RunSummary, bottleneck, seconds

    assert [seconds(x) for x in (9000, 750, 12.34, 0.1, 0.04, 0.0042)] == [
        "2.5 h",
        "12.5 min",
        "12.3 s",
        "0.1 s",
        "40 ms",
        "4.2 ms",
    ]

    def run(wall, busy, **phases):
        s = RunSummary("j", "regressions", "/out", 4000, 8, 1491, 0, units_run=4000, workers=2)
        s.wall_seconds, s.busy_seconds, s.bytes_written = wall, busy, 10**6
        s.parallel_efficiency, s.phases = busy / (2 * wall), phases
        return s

    # A tiny run: reading took most of a little busy time, but the workers mostly idled.
    tiny = bottleneck(run(0.24, 0.1, inputs=0.06, compute=0.03, writing=0.01))
    assert tiny.startswith("overhead-bound: the workers were busy 21% of the run")
    # Reading that fills the run binds it, however busy the workers were.
    slow_reads = bottleneck(run(10.0, 9.0, inputs=6.0, compute=2.0, writing=1.0))
    assert slow_reads == "input-bound: loading inputs took 3.0 s of each worker's time"
    assert bottleneck(run(10.0, 19.0, compute=18.0, writing=1.0)).startswith("CPU-bound")
    contended = run(10.0, 19.0, compute=19.0)
    contended.cpu_seconds, contended.runq_seconds = 12.0, 6.0
    assert bottleneck(contended) == (
        "CPU-bound: 2 workers busy 95% of the run, waiting for a core 32% of that time (other "
        "processes, or more workers than cores)"
    )
    # (small figures keep their digits, never "wrote 0.00 GB at 0.00 GB/s")
    assert bottleneck(run(10.0, 19.0, compute=4.0, writing=15.0)) == (
        "disk-bound: wrote 1.0 MB at 100.0 kB/s; units were built at 2,000/s"
    )
    # One unit of 20 s beside five quick ones: not "overhead-bound"
    slow_unit = run(20.1, 20.2, compute=20.2)
    slow_unit.task_timings = [{"index": 0, "seconds": 20.0, "units": 1},
                              {"index": 1, "seconds": 0.2, "units": 5}]  # fmt: skip
    assert bottleneck(slow_unit) == (
        "straggler-bound: task 0 (1 unit) ran 20.0 s of the run's 20.1 s while the other "
        "workers had no work left; smaller tasks (--units-per-task) spread it, unless one unit "
        "is that long"
    )


def test_slow_rates_and_single_units_read_right():
    # "6 of 6 points in 20.09 s = 0/s", "estimate of ... 1 points", "(1 tasks)"
    from pipeline.summary import count, rate

    assert [rate(r) for r in (42_274.3, 35.4, 2.5, 0.2987, 0.0)] == [
        "42,274",
        "35",
        "2.5",
        "0.3",
        "0",
    ]
    assert (count(1, "point"), count(2, "task"), count(1000, "chunk")) == (
        "1 point", "2 tasks", "1,000 chunks",
    )  # fmt: skip


def test_an_estimate_refuses_the_flags_of_a_run_it_would_ignore(tmp_path):
    # --report, --profile, --overwrite...: an estimate runs no job, so they are
    # refused rather than silently ignored.
    from click.testing import CliRunner

    from pipeline.cli import main

    for flag in (["--report", str(tmp_path / "r")], ["--overwrite"], ["--max-failures", "3"]):
        result = CliRunner().invoke(main, ["estimate", *flag])
        assert result.exit_code == 2, result.output
        assert f"{flag[0]} does not apply to `pipeline estimate`" in result.output
    assert not (tmp_path / "r").exists()


def test_a_price_file_without_the_fleets_scheduler_or_load_balancer(tmp_path):
    # A missing scheduler price is refused with the price file as the fix (not
    # --price-per-worker-hour, which prices no fleet), and a missing NLB price too,
    # never a silent $0.
    from pipeline import ConfigError
    from pipeline.costs.prices import load_prices

    box = (
        '[instances."big.box"]\nvcpus = 4\nmemory_gib = 8\nnetwork_gbps = 10\nusd_per_hour = 1.0\n'
    )
    prices = tmp_path / "p.toml"
    prices.write_text(box)
    with pytest.raises(
        ConfigError,
        match=r"scheduler instance \(the Terraform module's\) "
        r"'m5.2xlarge': not in the price table .*\(or give a --price-file",
    ) as e:
        parse_fleet("big.box:3", load_prices(str(prices)))
    assert "--price-per-worker-hour" not in str(e.value)
    prices.write_text(box + box.replace("big.box", "m5.2xlarge").replace("1.0", "0.4"))
    fleet = parse_fleet("big.box:3", load_prices(str(prices)))
    assert fleet.label.endswith("(no NLB price in the price file) at $3.40/h"), fleet.label


def test_small_costs_and_times_read_as_figures():
    # "$7.27e-07 for 0.0 worker-seconds"
    from pipeline.figures import figure
    from pipeline.summary import usd

    assert [usd(7.27e-7), usd(7.53e-5), usd(0.0123), usd(0.0), usd(12.345)] == [
        "$0.000000727", "$0.0000753", "$0.0123", "$0", "$12.35"
    ]  # fmt: skip
    assert [figure(0.04), figure(3.14159), figure(123.45), figure(0.0)] == [
        "0.04", "3.14", "123.5", "0.0"
    ]  # fmt: skip
