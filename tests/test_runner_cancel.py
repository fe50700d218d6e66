"""A runner's cancelled tasks leave nothing of theirs on the cluster: their first
submissions and their copies (:mod:`pipeline.dispatch.copies`) are cancelled alike.
A runner copies no task whose receipt is in, and a closing runner submits nothing.

A real ``LocalCluster`` of single-thread workers in this process. Order comes from
gates, not a clock: two blockers hold the workers' threads until the test opens a
gate file, so the task the runner submits waits on a worker without executing, the
state in which the runner copies a run's last task once it has gone unheard long
enough (that bound lowered here, as test_stragglers.py lowers the backups'). The
tests of backups hold a slow task the same way, and read what the runner decided
from its own record of the copies it made, or the scheduler's of what it received.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from distributed import Client, LocalCluster
from distributed.diagnostics.plugin import SchedulerPlugin
from support.call_tasks import call_task
from support.waiting import wait_for

from pipeline.dispatch import stragglers, task_runner
from pipeline.dispatch.survey import take_survey
from pipeline.joblib.call_runner import CallRunner
from pipeline.joblib.calls import CallsWorkload

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


def blocker(started: str, gate: str) -> None:
    """Hold a worker's thread until ``gate`` exists (a minute at most), once ``started``
    says so."""
    Path(started).touch()
    deadline = time.monotonic() + 60
    while not os.path.exists(gate) and time.monotonic() < deadline:
        time.sleep(0.02)


@pytest.fixture
def client():
    """A client of two single-thread workers in this process."""
    with (
        LocalCluster(n_workers=2, threads_per_worker=1, processes=False,
                     dashboard_address=None) as cluster,
        Client(cluster) as client,
    ):  # fmt: skip
        yield client


def _second_task_running(runner: CallRunner, tmp_path: Path, gate: Path) -> str:
    """Of a run of two tasks (known whole, as a job's launch is), task 0 run and
    reported, so that backups are due, then task 1 submitted, held by ``gate``: its key."""
    run = runner._run
    run.size = 2
    runner.add([call_task(0, blocker, str(tmp_path / "started-0"), str(tmp_path))])
    receipts: list = []
    wait_for("task 0's receipt", lambda: bool(receipts.extend(runner.poll()) or receipts))
    runner.add([call_task(1, blocker, str(tmp_path / "started-1"), str(gate))])
    return run.keys[1]


def test_a_cancelled_call_runner_task_has_its_copies_cancelled(client, tmp_path, monkeypatch):
    # (a run's last task unheard for 0.2 s gets a copy: the run's task lost, to the runner)
    monkeypatch.setattr(stragglers, "SECONDS", 0.2)
    gate = tmp_path / "gate"
    held = [
        client.submit(blocker, str(tmp_path / f"started-{i}"), str(gate), pure=False)
        for i in range(2)
    ]
    runner = CallRunner(CallsWorkload(job_id="cancel-copies"), client)
    try:
        wait_for("both workers' threads held", lambda: all(
            (tmp_path / f"started-{i}").exists() for i in range(2)), timeout=60)  # fmt: skip
        runner.add([call_task(0, blocker, str(tmp_path / "started-task"), str(gate))])
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


def test_no_backup_of_a_task_whose_receipt_is_in(client, tmp_path, monkeypatch):
    # The scheduler knows what a worker executes from its heartbeats (seconds apart on
    # a large fleet), so its survey can name a task slow after the task reported. Here
    # the heartbeats of the worker running task 1 stop while the task runs; its gate
    # then opens, and its receipt is in the runner's inbox behind a wake-up message when
    # the runner next looks: the runner, which takes one message and then looks at its
    # copies, must take the receipts already in before it decides on a backup.
    monkeypatch.setattr(stragglers, "BACKUP_MIN_SECONDS", 0.2)
    monkeypatch.setattr(task_runner, "CHECK_SECONDS", 0.0)  # each poll looks (the test's)
    gate = tmp_path / "gate"
    runner = CallRunner(CallsWorkload(job_id="backup-after-receipt"), client)
    run = runner._run
    try:
        key = _second_task_running(runner, tmp_path, gate)

        def running_on() -> str | None:
            return client.run_on_scheduler(lambda dask_scheduler, key=key: next(
                (ws.address for ws in dask_scheduler.workers.values()
                 if any(ts.key == key for ts in ws.executing)), None))  # fmt: skip

        wait_for("a heartbeat telling task 1 executes", lambda: running_on() is not None)
        worker = running_on()
        client.run(lambda dask_worker: dask_worker.periodic_callbacks["heartbeat"].stop(),
                   workers=[worker])  # fmt: skip
        over = stragglers.backup_after(run)
        prefix = runner._copies.prefix

        def slow() -> bool:
            survey = take_survey(client, prefix, over, [], 2)
            return key in survey.slow and any(w != worker for w in survey.spare)

        wait_for("the scheduler to count task 1 slow, a worker spare", slow)
        runner.wake()
        gate.touch()
        wait_for("task 1's receipt in the inbox", lambda: runner._inbox.qsize() >= 2)
        assert slow()  # (as the runner's next survey says: a backup, but for the receipt)
        receipts = runner.poll()
        assert [r.index for r in receipts] == [1]
        assert run.copies[1] == 0 and not run.extra, run.copies
    finally:
        gate.touch()
        runner.close()


class Submissions(SchedulerPlugin):
    """Scheduler: the keys of every graph submitted, in the order received."""

    name = "test-submissions"

    def __init__(self):
        self.keys: list[str] = []

    def update_graph(self, scheduler, *, keys, **kwargs) -> None:
        self.keys.extend(str(k) for k in keys)


def _submitted(client, prefix: str) -> list[str]:
    """The keys starting with ``prefix`` the scheduler has received, once it has
    processed every submission sent so far (a client's submissions are processed in
    order: a task's result is back once those before it are in)."""
    client.submit(int, pure=False).result()
    keys = client.run_on_scheduler(
        lambda dask_scheduler: dask_scheduler.plugins[Submissions.name].keys
    )
    return [k for k in keys if k.startswith(prefix)]


def test_a_closing_runner_submits_nothing(client, tmp_path, monkeypatch):
    # A backup of task 1 is due (executing, slow, a worker spare) as the runner closes:
    # the thread that polls it may still be polling (a job's runner closes while its
    # session's thread ends its last poll), and nothing more reaches the scheduler.
    monkeypatch.setattr(stragglers, "BACKUP_MIN_SECONDS", 0.2)
    monkeypatch.setattr(task_runner, "CHECK_SECONDS", 0.0)
    gate = tmp_path / "gate"
    client.register_plugin(Submissions())
    runner = CallRunner(CallsWorkload(job_id="copy-while-closing"), client)
    run = runner._run
    try:
        key = _second_task_running(runner, tmp_path, gate)
        over, prefix = stragglers.backup_after(run), runner._copies.prefix

        def due() -> bool:
            survey = take_survey(client, prefix, over, [], 2)
            return key in survey.slow and len(survey.spare) > 0

        wait_for("task 1 slow, a worker spare", due)
        before = _submitted(client, prefix)
        assert len(before) == 2, before  # the two tasks, no copy yet
        runner.close()
        assert runner.poll() == []
        gate.touch()  # (task 1's thread, cancelled, runs on: its worker free again)
        assert _submitted(client, prefix) == before
        assert run.copies[1] == 0, run.copies
    finally:
        gate.touch()
        runner.close()
