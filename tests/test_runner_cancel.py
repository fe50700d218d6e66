"""A runner's cancelled tasks leave nothing of theirs on the cluster: their first
submissions and their copies (:mod:`pipeline.dispatch.copies`) are cancelled alike.

A real ``LocalCluster`` of single-thread workers in this process. Order comes from
gates, not a clock: two blockers hold the workers' threads until the test opens a
gate file, so the task the runner submits waits on a worker without executing, the
state in which the runner copies a run's last task once it has gone unheard long
enough (that bound lowered here, as test_stragglers.py lowers the backups').
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from distributed import Client, LocalCluster
from support.waiting import wait_for

from pipeline.dispatch import stragglers
from pipeline.joblib import PipelineBackend
from pipeline.joblib.call_runner import CallRunner
from pipeline.joblib.calls import CallBatch, CallsWorkload, CallTask, pickle_batch

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


def blocker(started: str, gate: str) -> None:
    """Hold a worker's thread until ``gate`` exists (a minute at most), once ``started``
    says so."""
    Path(started).touch()
    deadline = time.monotonic() + 60
    while not os.path.exists(gate) and time.monotonic() < deadline:
        time.sleep(0.02)


def _task(index: int, func, *args) -> CallTask:
    nested = PipelineBackend(nesting_level=0).get_nested_backend()
    payload = pickle_batch(CallBatch([(func, args, {})], nested))
    return CallTask.inline(index, index, index + 1, payload)


def test_a_cancelled_call_runner_task_has_its_copies_cancelled(tmp_path, monkeypatch):
    # (a run's last task unheard for 0.2 s gets a copy: the run's task lost, to the runner)
    monkeypatch.setattr(stragglers, "SECONDS", 0.2)
    gate = tmp_path / "gate"
    with (
        LocalCluster(n_workers=2, threads_per_worker=1, processes=False,
                     dashboard_address=None) as cluster,
        Client(cluster) as client,
    ):  # fmt: skip
        held = [
            client.submit(blocker, str(tmp_path / f"started-{i}"), str(gate), pure=False)
            for i in range(2)
        ]
        runner = CallRunner(CallsWorkload(job_id="cancel-copies"), client)
        try:
            wait_for("both workers' threads held", lambda: all(
                (tmp_path / f"started-{i}").exists() for i in range(2)), timeout=60)  # fmt: skip
            runner.add([_task(0, blocker, str(tmp_path / "started-task"), str(gate))])
            run = runner._run

            def copied() -> bool:
                runner.poll()
                return bool(run.extra.get(0))

            wait_for("a copy of the task waiting behind the blockers", copied, timeout=60)
            first, copies = run.futures[0], list(run.extra[0])
            runner.cancel([0])
            assert runner.pending == 0 and not run.extra
            assert first.status == "cancelled"
            assert [c.future.status for c in copies] == ["cancelled"] * len(copies)
            keys = {first.key, *(c.key for c in copies)}

            def left() -> dict:
                return client.run_on_scheduler(
                    lambda dask_scheduler, keys=keys: {
                        k: (ts.state, sorted(c.client_key for c in ts.who_wants))
                        for k, ts in dask_scheduler.tasks.items()
                        if k in keys
                    }
                )

            wait_for("the scheduler to forget them", lambda: not left(), timeout=60)
        finally:
            gate.touch()
            runner.close()
            client.gather(held)
