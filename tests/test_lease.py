"""The lease on a driver's tasks (``pipeline.dispatch.lease``): held while the driver is
gone for its own grace, then let go of (and its shipped workload with them); let go of
at once by a rerun of the job; held again on a scheduler that replaced the one the
driver was connected to.

Real processes: a TLS ``dask scheduler``, a ``dask worker`` and ``pipeline run``
drivers killed with SIGKILL. The jobs' units wait on a gate file, so a driver is
killed while its tasks are queued and running; a driver's grace is its connect
timeout (``DASK_DISTRIBUTED__COMM__TIMEOUTS__CONNECT``) plus 15 s.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from support.map_jobs import gated_job
from support.waiting import wait_for
from support.workloads import KillsItsWorkerOnce

from harness.cluster_procs import (
    REPO_ROOT,
    ProcessManager,
    client_security,
    free_port,
    start_scheduler,
    start_worker,
)
from pipeline import RunOptions, connect, run_job
from pipeline.dispatch.lease import HOLDER_PREFIX, holder_of

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

UNITS = 6


#: ``pipeline`` with every workload shipped to the workers by a plug-in (as a large
#: one is), however small.
SHIPPING = (
    "import runpy, pipeline.dispatch.shipping as s; s.INLINE_BYTES = 0; "
    "runpy.run_module('pipeline', run_name='__main__', alter_sys=True)"
)


@pytest.fixture
def certs(tmp_path):
    from pipeline.cluster.tls import make_certificates

    return make_certificates(tmp_path / "certs")


class _Driver:
    """``pipeline run`` of a gated map job of ``UNITS`` units, as a process."""

    def __init__(self, tmp: Path, certs: dict, address: str, name: str = "driver"):
        self.tmp, self.certs, self.address = tmp, certs, address
        self.log, self.gate, self.out = tmp / "log", tmp / "gate", tmp / "out"
        self.log.mkdir(exist_ok=True)
        self.file = gated_job(tmp, f"x = {list(range(UNITS))}", self.gate, self.log)
        self.proc: subprocess.Popen | None = None
        self.stderr = tmp / f"{name}.stderr"

    def start(self, connect_seconds: int, *, shipping: bool = False) -> None:
        flags = [
            "run", str(self.file), "--scheduler", self.address,
            "--tls-ca-file", str(self.certs["ca"]), "--tls-cert", str(self.certs["client"]),
            "--tls-key", str(self.certs["client-key"]),
            "--no-progress", "--units-per-task", "1", "--output", str(self.out),
        ]  # fmt: skip
        python = [sys.executable, *(["-c", SHIPPING] if shipping else ["-m", "pipeline"])]
        self.proc = subprocess.Popen(
            [*python, *flags],
            stdout=subprocess.PIPE,
            stderr=self.stderr.open("w"),
            text=True,
            env={
                **os.environ,
                "PYTHONPATH": str(REPO_ROOT),
                "DASK_DISTRIBUTED__COMM__TIMEOUTS__CONNECT": f"{connect_seconds}s",
            },
        )

    def said(self, text: str) -> bool:
        return text in self.stderr.read_text()

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(timeout=30)


class _Scheduler:
    """What the scheduler at ``address`` holds, as a client connected to it sees."""

    def __init__(self, address: str, certs: dict):
        from distributed import Client

        self.client = Client(address, security=client_security(certs), timeout=30)

    def close(self) -> None:
        self.client.close()

    def held(self) -> dict[str, int]:
        """Each holder's count of tasks held, by the client id it holds for."""
        return self.client.run_on_scheduler(
            lambda dask_scheduler: {
                name.removeprefix(HOLDER_PREFIX): len(cs.wants_what)
                for name, cs in dask_scheduler.clients.items()
                if name.startswith(HOLDER_PREFIX)
            }
        )

    def clients(self) -> set[str]:
        return self.client.run_on_scheduler(lambda dask_scheduler: set(dask_scheduler.clients))

    def tasks(self) -> int:
        return self.client.run_on_scheduler(
            lambda dask_scheduler: sum(str(k).startswith("pipeline-") for k in dask_scheduler.tasks)
        )

    def worker_plugins(self) -> list[str]:
        return self.client.run_on_scheduler(
            lambda dask_scheduler: sorted(dask_scheduler.worker_plugins)
        )


def _holding(scheduler: _Scheduler, count: int, but: set[str] = frozenset()) -> str:
    """The client id of the one driver (not in ``but``) whose holder holds ``count``
    tasks, once one does."""
    found: list[str] = []

    def ready() -> bool:
        found[:] = [c for c, n in scheduler.held().items() if n == count and c not in but]
        return len(found) == 1

    wait_for(f"a driver's {count} tasks held", ready)
    return found[0]


def _cluster(pm, certs, port=None):
    scheduler = start_scheduler(pm, certs, port=port)
    start_worker(pm, scheduler.address, certs, name="w0")
    return scheduler


def test_a_killed_drivers_tasks_and_workload_are_let_go_of_after_its_own_grace(tmp_path, certs):
    with ProcessManager(tmp_path / "logs") as pm:
        proc = _cluster(pm, certs)
        scheduler = _Scheduler(proc.address, certs)
        try:
            # A driver with a long grace (135 s) registers the lease first and finishes.
            (tmp_path / "first").mkdir()
            first = _Driver(tmp_path / "first", certs, proc.address)
            first.gate.touch()
            first.start(connect_seconds=120)
            assert first.proc.wait(timeout=120) == 0, first.stderr.read_text()
            # The killed driver's grace is its own: 2 s + 15 s.
            (tmp_path / "killed").mkdir()
            job = _Driver(tmp_path / "killed", certs, proc.address)
            job.start(connect_seconds=2, shipping=True)
            driver = _holding(scheduler, UNITS)
            shipped = [p for p in scheduler.worker_plugins() if p.startswith("pipeline-workload-")]
            assert len(shipped) == 1 and shipped[0].endswith(driver), shipped
            wait_for("a running unit", lambda: any(job.log.iterdir()))
            job.kill()
            wait_for("the scheduler to see the driver gone",
                     lambda: driver not in scheduler.clients())  # fmt: skip
            assert scheduler.held().get(driver) == UNITS  # held while the driver is gone
            wait_for("the lease to expire", lambda: driver not in scheduler.held(), timeout=60)
            wait_for("the tasks to be forgotten", lambda: scheduler.tasks() == 0)
            wait_for("the workload to be unregistered",
                     lambda: shipped[0] not in scheduler.worker_plugins())  # fmt: skip
            # ... and a worker joining later is not sent it
            start_worker(pm, proc.address, certs, name="w1")
            scheduler.client.wait_for_workers(2, timeout=60)
            plugins = scheduler.client.run(lambda dask_worker: sorted(dask_worker.plugins))
            assert not any(p.startswith("pipeline-workload-") for ps in plugins.values()
                           for p in ps), plugins  # fmt: skip
        finally:
            scheduler.close()
        assert f"client {driver} gone for 17 s: releasing the {UNITS} tasks" in proc.tail(200)


def test_a_rerun_of_the_job_lets_go_of_a_killed_drivers_tasks_at_once(tmp_path, certs):
    with ProcessManager(tmp_path / "logs") as pm:
        proc = _cluster(pm, certs)
        scheduler = _Scheduler(proc.address, certs)
        try:
            job = _Driver(tmp_path, certs, proc.address)
            job.start(connect_seconds=60)  # a grace of 75 s
            killed = _holding(scheduler, UNITS)
            job.kill()
            wait_for("the scheduler to see the driver gone",
                     lambda: killed not in scheduler.clients())  # fmt: skip
            assert scheduler.held().get(killed) == UNITS
            rerun = _Driver(tmp_path, certs, proc.address, name="rerun")
            rerun.start(connect_seconds=60)
            # Let go of as the rerun starts, well within the killed driver's grace.
            _holding(scheduler, UNITS, but={killed})
            assert scheduler.held().get(killed) == 0
            job.gate.touch()
            stdout, _ = rerun.proc.communicate(timeout=120)
            assert rerun.proc.returncode == 0, stdout + rerun.stderr.read_text()
        finally:
            scheduler.close()


def test_a_driver_reconnected_to_a_replaced_scheduler_has_its_tasks_held_there(tmp_path, certs):
    port = free_port()
    with ProcessManager(tmp_path / "logs") as pm:
        first = _cluster(pm, certs, port=port)
        scheduler = _Scheduler(first.address, certs)
        job = _Driver(tmp_path, certs, first.address)
        job.start(connect_seconds=20)  # a grace of 35 s
        try:
            driver = _holding(scheduler, UNITS)
        finally:
            scheduler.close()
        for p in pm.procs:  # the scheduler and its worker lost, as a machine is
            p.kill()
        second = _cluster(pm, certs, port=port)  # the same address
        scheduler = _Scheduler(second.address, certs)
        try:
            wait_for("the driver to reconnect", lambda: job.said("reconnected to the scheduler"))
            assert _holding(scheduler, UNITS) == driver  # held on the new scheduler
            job.kill()
            wait_for("the scheduler to see the driver gone",
                     lambda: driver not in scheduler.clients())  # fmt: skip
            wait_for("the lease to expire", lambda: driver not in scheduler.held(), timeout=90)
            wait_for("the tasks to be forgotten", lambda: scheduler.tasks() == 0)
        finally:
            scheduler.close()


def test_a_task_submitted_again_under_a_new_key_is_held_under_that_key_only(tmp_path):
    # Dask gives up on a task whose worker died (allowed-failures 0): the runner runs
    # it again under a new key, and lets go of the old one.
    import dask
    import distributed  # noqa: F401  (its defaults first: set() would drop them on exit)

    with (
        dask.config.set({"distributed.scheduler.allowed-failures": 0}),
        connect(RunOptions(workers=2)) as client,
    ):
        s = run_job(
            KillsItsWorkerOnce("sq", 12, kill_unit=4, marker=tmp_path / "killed-once"),
            RunOptions(output=str(tmp_path / "out"), progress=False, units_per_task=3),
            client,
            echo=lambda m: None,
        )
        assert (tmp_path / "killed-once").exists() and s.complete

        holder = holder_of(client.id)

        def held(dask_scheduler):
            held = dask_scheduler.clients.get(holder)
            return sorted(ts.key for ts in held.wants_what) if held is not None else []

        wait_for("nothing held", lambda: client.run_on_scheduler(held) == [])
