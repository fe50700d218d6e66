"""A run that finishes on its own through a fleet's everyday faults: a worker that holds
results but does not serve them, a load balancer restarted mid-run, the driver's
connection cut once, a balancer with no scheduler behind it yet, and a worker asked to
leave (SIGTERM).

Real processes: a TLS ``dask scheduler``, ``dask worker`` processes, HAProxy with the
repository's configuration, a TCP forwarder that cuts connections, and ``pipeline run``
as a user runs it. The jobs' units wait on a gate file the test opens, so the faults
land while tasks are running whatever the machine's speed; each unit logs each time it
starts and ends, which is how "nothing computed twice" is checked.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from support.map_jobs import gated_job
from support.stored import unnamed
from support.tcp_cutter import TcpCutter
from support.venv_commands import pipeline_command
from support.waiting import wait_for
from support.workloads import SquaresWorkload

from harness.cluster_procs import (
    REPO_ROOT,
    ProcessManager,
    free_port,
    start_haproxy,
    start_scheduler,
    start_worker,
)
from pipeline import RunOptions, connect, run_job

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

UNITS = 6


class _Job:
    """A gated map job of ``UNITS`` units, its driver a ``pipeline run`` process."""

    def __init__(self, tmp: Path, certs: dict, address: str):
        self.tmp, self.certs, self.address = tmp, certs, address
        self.log, self.gate, self.out = tmp / "log", tmp / "gate", tmp / "out"
        self.log.mkdir()
        self.file = gated_job(tmp, f"x = {list(range(UNITS))}", self.gate, self.log)
        self.stderr = tmp / "driver.stderr"
        self.proc: subprocess.Popen | None = None

    def flags(self, address: str | None = None) -> list[str]:
        return [
            "--scheduler", address or self.address, "--tls-ca-file", str(self.certs["ca"]),
            "--tls-cert", str(self.certs["client"]), "--tls-key", str(self.certs["client-key"]),
            "--no-progress", "--units-per-task", "1", "--output", str(self.out),
        ]  # fmt: skip

    def start(self, env: dict | None = None, address: str | None = None) -> None:
        argv = [sys.executable, "-m", "pipeline", "run", str(self.file), *self.flags(address)]
        self.proc = subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=self.stderr.open("w"),
            text=True,
            env={**os.environ, "PYTHONPATH": str(REPO_ROOT), **(env or {})},
        )

    def said(self, text: str) -> bool:
        return text in self.stderr.read_text()

    def started(self) -> int:
        return len(list(self.log.glob("started-*")))

    def open_gate(self) -> None:
        self.gate.touch()

    def finish(self, timeout: float = 180) -> tuple[int, str, str]:
        stdout, _ = self.proc.communicate(timeout=timeout)
        return self.proc.returncode, stdout, self.stderr.read_text()

    def runs(self, what: str) -> dict[int, int]:
        """How many times each unit started (``what="started"``) or ended."""
        return {
            x: len((self.log / f"{what}-{x}").read_text().split())
            if (self.log / f"{what}-{x}").exists() else 0
            for x in range(UNITS)
        }  # fmt: skip

    def check_output(self) -> None:
        ok = pipeline_command("verify", self.out)
        assert ok.returncode == 0, ok.stdout + ok.stderr
        table = self.tmp / "results.parquet"
        shown = pipeline_command("results", self.out, "--out", table)
        assert shown.returncode == 0, shown.stderr
        rows = pq.read_table(table).to_pylist()
        assert sorted(r["x"] for r in rows) == list(range(UNITS))
        assert all(r["y"] == 2 * r["x"] for r in rows)


@pytest.fixture
def certs(tmp_path):
    from pipeline.cluster.tls import make_certificates

    return make_certificates(tmp_path / "certs")


def _cluster(pm, certs, workers=2):
    """A TLS scheduler, HAProxy in front of it, and workers connected to the scheduler
    itself (a balancer's failover cuts the driver's path only)."""
    port = free_port()
    scheduler = start_scheduler(pm, certs, port=port)
    lb = start_haproxy(pm, f"127.0.0.1:{port}")
    drain = ["--preload-nanny", "pipeline.cluster.drain"]
    procs = [
        start_worker(pm, scheduler.address, certs, name=f"w{i}", extra_args=drain)
        for i in range(workers)
    ]
    return scheduler, lb, procs


def test_a_load_balancer_restarted_mid_run_is_waited_out(tmp_path, certs):
    with ProcessManager(tmp_path / "logs") as pm:
        _scheduler, lb, _workers = _cluster(pm, certs)
        job = _Job(tmp_path, certs, lb.address)
        job.start()
        wait_for("two running units", lambda: job.started() >= 2)
        lb.kill()  # SIGKILL, as a balancer node lost
        lb = start_haproxy(pm, _scheduler.address.removeprefix("tls://"),
                           port=int(lb.address.rsplit(":", 1)[1]))  # fmt: skip
        wait_for("the driver to reconnect", lambda: job.said("reconnected to the scheduler"))
        job.open_gate()
        code, stdout, stderr = job.finish()
    assert code == 0, stdout + stderr
    assert f"{UNITS} of {UNITS} points" in stdout, stdout
    assert job.runs("started") == dict.fromkeys(range(UNITS), 1), job.runs("started")
    assert job.runs("ended") == dict.fromkeys(range(UNITS), 1)
    job.check_output()


def test_the_drivers_connection_cut_once_mid_run_is_waited_out(tmp_path, certs):
    with ProcessManager(tmp_path / "logs") as pm:
        _scheduler, lb, _workers = _cluster(pm, certs)
        with TcpCutter(int(lb.address.rsplit(":", 1)[1])) as cutter:
            job = _Job(tmp_path, certs, lb.address)
            job.start(address=f"tls://{cutter.address}")
            wait_for("two running units", lambda: job.started() >= 2)
            assert cutter.cut() >= 1  # the driver's connection, and any other it had
            wait_for("the driver to reconnect", lambda: job.said("reconnected to the scheduler"))
            job.open_gate()
            code, stdout, stderr = job.finish()
    assert code == 0, stdout + stderr
    assert job.runs("started") == dict.fromkeys(range(UNITS), 1), job.runs("started")
    assert job.runs("ended") == dict.fromkeys(range(UNITS), 1)
    job.check_output()


def test_a_balancer_with_no_scheduler_behind_it_is_waited_for(tmp_path, certs):
    with ProcessManager(tmp_path / "logs") as pm:
        port = free_port()
        lb = start_haproxy(pm, f"127.0.0.1:{port}")  # nothing listens there yet
        job = _Job(tmp_path, certs, lb.address)
        job.open_gate()
        job.start()
        wait_for("the driver to wait", lambda: job.said("no scheduler is behind it yet"))
        scheduler = start_scheduler(pm, certs, port=port)
        for i in range(2):
            start_worker(pm, scheduler.address, certs, name=f"w{i}")
        code, stdout, stderr = job.finish()
    assert code == 0, stdout + stderr
    job.check_output()


def test_a_balancer_with_no_scheduler_ever_is_named_in_one_line(tmp_path, certs):
    with ProcessManager(tmp_path / "logs") as pm:
        lb = start_haproxy(pm, f"127.0.0.1:{free_port()}")
        job = _Job(tmp_path, certs, lb.address)
        job.start(env={"DASK_DISTRIBUTED__COMM__TIMEOUTS__CONNECT": "3s"})
        code, _stdout, stderr = job.finish(timeout=60)
    assert code == 1, stderr
    last = stderr.strip().splitlines()[-1]
    assert last == (
        f"Error: the load balancer at {lb.address} answered but no scheduler is behind it "
        "(waited 3 s): start the scheduler, or check the balancer's health checks"
    ), stderr


def _statuses(certs, address: str) -> dict[int, tuple[str, int]]:
    """The scheduler's status of each worker and its count of tasks assigned, by the
    worker process's pid."""
    from distributed import Client

    from harness.cluster_procs import client_security

    with Client(address, security=client_security(certs), timeout=30) as client:
        return client.run_on_scheduler(
            lambda dask_scheduler: {
                w.pid: (w.status.name, len(w.processing)) for w in dask_scheduler.workers.values()
            }
        )


def test_a_worker_sent_sigterm_starts_nothing_more_and_nothing_runs_twice(tmp_path, certs):
    # `dask worker` sets a memory limit by default, so its memory monitor runs: it used
    # to set the draining (paused) worker running again within 100 ms.
    import psutil

    with ProcessManager(tmp_path / "logs") as pm:
        scheduler, lb, workers = _cluster(pm, certs, workers=3)
        job = _Job(tmp_path, certs, lb.address)
        job.start()
        wait_for("three running units", lambda: job.started() >= 3)
        # The worker process running unit 0, and the `dask worker` command above it
        pid = int((job.log / "started-0").read_text().split()[0])
        leaving = next(w for w in workers if pid in {p.pid for p in
                       psutil.Process(w.pid).children(recursive=True)})  # fmt: skip
        leaving.terminate()  # SIGTERM to `dask worker`: a spot notice, a scale-in

        # The gate opens once the scheduler has heard the worker stopped taking tasks;
        # unit 0 then ends there, and what that worker had queued runs elsewhere.
        # It keeps only the unit it runs: those it had queued go back to the scheduler.
        def stopped() -> bool:
            status, assigned = _statuses(certs, scheduler.address).get(pid, ("gone", 0))
            return status != "running" and assigned <= 1

        wait_for("the worker to stop taking tasks", stopped)
        job.open_gate()
        code, stdout, stderr = job.finish()
        leaving.popen.wait(timeout=60)
    assert code == 0, stdout + stderr
    assert "failed" not in stdout, stdout
    assert job.runs("started") == dict.fromkeys(range(UNITS), 1), job.runs("started")
    assert job.runs("ended") == dict.fromkeys(range(UNITS), 1), job.runs("ended")
    on_leaving = [x for x in range(UNITS)
                  if str(pid) in (job.log / f"started-{x}").read_text().split()]  # fmt: skip
    assert on_leaving == [0], on_leaving  # nothing started there after the SIGTERM
    job.check_output()


def test_a_worker_that_cannot_serve_its_results_does_not_hold_up_the_run(tmp_path):
    # A worker that heartbeats but answers no request for the data it holds (a process
    # of many simulated workers, swamped): results fetched from it would be waited for,
    # rescheduled and fetched again, for ever. Receipts never need that fetch.
    from distributed.diagnostics.plugin import WorkerPlugin

    class Unserving(WorkerPlugin):
        name = "unserving"

        def setup(self, worker):
            if worker.name == 0:

                async def never(*args, **kwargs):
                    import asyncio

                    await asyncio.Event().wait()

                worker.handlers["get_data"] = never

    with connect(RunOptions(workers=2)) as client:
        client.register_plugin(Unserving())
        s = run_job(
            SquaresWorkload("sq", 24, unit_seconds=0.05),
            RunOptions(output=str(tmp_path), units_per_task=2, progress=False),
            client,
            echo=lambda m: None,
        )
        assert s.complete and s.units_ok == 24
        workers = {t["worker"] for t in s.task_timings}
        assert len(workers) == 2, workers  # the unserving worker ran tasks too
        # ... and answers no request for what it holds: its handler waits for ever
        handlers = client.run(lambda dask_worker: dask_worker.handlers["get_data"].__name__)
        assert sorted(handlers.values()) == ["get_data", "never"], handlers
    assert json.loads((tmp_path / "sq" / "job.json").read_text())["units"] == 24


def test_a_task_the_cluster_lost_track_of_is_run_again(tmp_path, monkeypatch, caplog):
    # A scheduler under load held a run's last task as running on a worker that never
    # got it (its message lost): the run waited for ever. Here a worker drops the
    # first message to run task 3; once the run is down to its last tasks, task 3 is
    # overdue and a copy of it runs.
    from distributed.diagnostics.plugin import WorkerPlugin

    import pipeline.dispatch.stragglers

    monkeypatch.setattr(pipeline.dispatch.stragglers, "SECONDS", 1.0)

    class LosesTask3(WorkerPlugin):
        name = "loses-task-3"

        def setup(self, worker):
            from distributed.worker_state_machine import ComputeTaskEvent

            handle = worker.handle_stimulus

            def dropping(*stims):
                kept = [s for s in stims if not (isinstance(s, ComputeTaskEvent)
                                                 and str(s.key).endswith("-3-0"))]  # fmt: skip
                return handle(*kept) if kept else None

            worker.handle_stimulus = dropping

    with connect(RunOptions(workers=2)) as client, caplog.at_level("WARNING", "pipeline"):
        client.register_plugin(LosesTask3())
        s = run_job(
            SquaresWorkload("sq", 24, unit_seconds=0.02),
            RunOptions(output=str(tmp_path), units_per_task=2, progress=False),
            client,
            echo=lambda m: None,
        )
        dropped = client.run(lambda dask_worker: dask_worker.handle_stimulus.__name__)
    assert sorted(dropped.values()) == ["dropping", "dropping"]
    assert "task 3 not heard from" in caplog.text  # the copy ran, not the lost task
    assert s.complete and s.units_ok == 24 and s.units_run == 24, s.failures[:2]
    assert sorted(unnamed(p.name) for p in (tmp_path / "sq" / "values").iterdir()) == [
        f"{u:05d}" for u in range(24)
    ]
