"""A runner's tasks start in the order it submits them, across its batches: Dask
orders the tasks of one submission and puts submissions less than 100 ms apart
level, so the first task of every batch went before the second of any (at 500
simulated workers, a run's last, short tasks ran before some of its long ones, and
the run ended on them).

A real ``LocalCluster`` of one single-thread worker; order comes from a gate file,
not a clock: a blocker holds the thread until every task is on the scheduler."""

from __future__ import annotations

import os
import time

import pytest
from distributed import Client, LocalCluster
from support.call_tasks import call_task
from support.waiting import wait_for

from pipeline.dispatch import task_runner
from pipeline.joblib.call_runner import CallRunner
from pipeline.joblib.calls import CallsWorkload

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


def blocker(gate: str) -> None:
    """Hold the worker's thread until ``gate`` exists (a minute at most)."""
    deadline = time.monotonic() + 60
    while not os.path.exists(gate) and time.monotonic() < deadline:
        time.sleep(0.02)


def record(path: str, index: int) -> None:
    with open(path, "a") as f:
        f.write(f"{index}\n")


def test_tasks_start_in_the_order_submitted_across_batches(tmp_path, monkeypatch):
    monkeypatch.setattr(task_runner, "SUBMIT_BATCH", 3)  # 10 tasks: 4 batches
    gate, order = tmp_path / "gate", tmp_path / "order"
    with (
        LocalCluster(n_workers=1, threads_per_worker=1, processes=False,
                     dashboard_address=None) as cluster,
        Client(cluster) as client,
    ):  # fmt: skip
        held = client.submit(blocker, str(gate), pure=False)
        wait_for("the worker's thread held", lambda: client.processing() and any(
            client.processing().values()), timeout=60)  # fmt: skip
        runner = CallRunner(CallsWorkload(job_id="order"), client)
        try:
            runner.add([call_task(i, record, str(order), i) for i in range(10)])
            on_scheduler = lambda: client.run_on_scheduler(  # noqa: E731
                lambda dask_scheduler: sum(
                    1 for k in dask_scheduler.tasks if str(k).startswith("pipeline-")
                )
            )
            wait_for("every task on the scheduler", lambda: on_scheduler() == 10, timeout=60)
            gate.touch()
            held.result(timeout=60)

            def done() -> bool:
                runner.poll()
                return runner.pending == 0

            wait_for("every task's receipt", done, timeout=120)
        finally:
            runner.close()
    assert [int(x) for x in order.read_text().split()] == list(range(10))
