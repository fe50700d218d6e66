"""Backup copies of slow tasks, the cap on copies, and a task whose copies are all lost.

A real ``LocalCluster`` (its single-thread workers in this process, over TCP). Slow
tasks are made so by a gate, not a clock: a unit's first attempt blocks on a gate file
the test opens after the run, and its later attempts (the backups) do not; each
start and end is logged in order, with the worker's address.
"""

from __future__ import annotations

import itertools
import logging
import re
from pathlib import Path

import pytest
from distributed import Client, LocalCluster
from mapfns import backupfns
from support.stored import unnamed
from support.waiting import wait_for
from support.workloads import SquaresWorkload

import pipeline
from pipeline import ClusterError, RunOptions, run_job
from pipeline.dispatch import stragglers

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


def _cluster(workers: int):
    return LocalCluster(n_workers=workers, threads_per_worker=1, processes=False,
                        dashboard_address=None, protocol="tcp://", host="127.0.0.1")  # fmt: skip


@pytest.fixture
def fast_backups(monkeypatch):
    """A task executing 0.5 s (3 x the median, at least 0.5 s) is slow here."""
    monkeypatch.setattr(stragglers, "BACKUP_MIN_SECONDS", 0.5)
    monkeypatch.setattr(stragglers, "BACKUP_MULTIPLE", 3.0)


def _calls(log: Path) -> list[tuple[str, int, str]]:
    lines = (log / "calls").read_text().splitlines()
    return [(what, int(x), worker) for what, x, worker in (line.split() for line in lines)]


def _gated_run(client, tmp_path: Path, units: int, slow: str, copy_seconds: float):
    log, gate, out = tmp_path / "log", tmp_path / "gate", tmp_path / "out"
    log.mkdir()
    grid = {"x": list(range(units)), "slow": [slow], "log": [str(log)], "gate": [str(gate)],
            "copy_seconds": [copy_seconds]}  # fmt: skip
    try:
        summary = pipeline.map(backupfns.gated, client=client, grid=grid, output=str(out),
                               name="b", units_per_task=1, progress=False)  # fmt: skip
    finally:
        gate.touch()  # the first attempts, ignored, end
    first_attempts = [int(x) for x in slow.split(",")]
    wait_for("the slow units' first attempts to end", lambda: all(
        sum(1 for what, x, _ in _calls(log) if what == "end" and x == u) >= 2
        for u in first_attempts), timeout=60)  # fmt: skip
    return summary, _calls(log), out


def test_a_slow_task_gets_one_backup_on_another_worker(tmp_path, fast_backups):
    with _cluster(2) as cluster, Client(cluster) as client:
        summary, calls, out = _gated_run(client, tmp_path, 10, "0", copy_seconds=0.0)
    assert summary.complete and summary.units_ok == 10, summary.failures[:2]
    starts = [(x, worker) for what, x, worker in calls if what == "start" and x == 0]
    assert len(starts) == 2, calls  # the first attempt, and exactly one backup
    assert starts[0][1] != starts[1][1], starts  # on another worker
    first_end = calls.index(("end", 0, starts[0][1]))
    assert calls.index(("start", 0, starts[1][1])) < first_end  # beside it, not after
    table = pipeline.results_table(str(out / "b")).to_pandas()
    assert sorted(table["x"]) == list(range(10))  # each unit once
    assert sorted(table["y"]) == [2 * x for x in range(10)]


def test_copies_in_flight_are_capped(tmp_path, fast_backups, monkeypatch, caplog):
    # Two slow tasks at once on a cluster of 4 threads: a cap of one copy (10 % of
    # the threads, at least one) has the second backup start after the first ended;
    # the driver's log tells the peak of copies in flight and the bound.
    monkeypatch.setattr(stragglers, "COPY_SHARE", 0.1)
    caplog.set_level(logging.INFO, logger="pipeline.dispatch.copies")
    with _cluster(4) as cluster, Client(cluster) as client:
        summary, calls, _ = _gated_run(client, tmp_path, 16, "0,1", copy_seconds=1.0)
    assert summary.complete and summary.units_ok == 16, summary.failures[:2]
    seen: dict[int, int] = {}
    copies = []  # (line of a unit's second start, that unit)
    for line, (what, x, _) in enumerate(calls):
        if what == "start":
            seen[x] = seen.get(x, 0) + 1
            if seen[x] == 2:
                copies.append((line, x))
    assert {0, 1} <= {x for _, x in copies}, calls
    for (start, x), (next_start, _) in itertools.pairwise(copies):
        ends = [i for i, (what, u, _) in enumerate(calls) if what == "end" and u == x and i > start]
        assert ends and ends[0] < next_start, (x, calls)  # one copy on the cluster at a time
    peaks = [r.getMessage() for r in caplog.records if "copies in flight" in r.getMessage()]
    assert peaks == ["copies in flight: 1, the most so far (bound: 1, 10 % of 4 worker threads)"]


def test_a_task_whose_copies_are_all_lost_ends_the_run_naming_it(tmp_path, monkeypatch):
    # Every worker drops the message that would run task 3, whichever copy it is: the
    # task, copied twice, ends the run with an error naming it, its units and the
    # workers it was sent to (it used to wait for ever).
    from distributed.diagnostics.plugin import WorkerPlugin

    monkeypatch.setattr(stragglers, "SECONDS", 1.0)

    class LosesTask3(WorkerPlugin):
        name = "loses-task-3"

        def setup(self, worker):
            from distributed.worker_state_machine import ComputeTaskEvent

            handle = worker.handle_stimulus

            def lost(stim) -> bool:
                return isinstance(stim, ComputeTaskEvent) and bool(
                    re.search(r"-3-c?\d+$", str(stim.key))
                )

            def dropping(*stims):
                kept = [s for s in stims if not lost(s)]
                return handle(*kept) if kept else None

            worker.handle_stimulus = dropping

    with _cluster(2) as cluster, Client(cluster) as client:
        client.register_plugin(LosesTask3())
        with pytest.raises(ClusterError) as caught:
            run_job(
                SquaresWorkload("sq", 8, unit_seconds=0.02),
                RunOptions(output=str(tmp_path), units_per_task=1, progress=False),
                client,
                echo=lambda m: None,
            )
        workers = sorted(w.address for w in cluster.workers.values())
    message = str(caught.value)
    assert "task 3 (units 3..3) was lost" in message, message
    assert "2 copies" in message, message
    assert any(w in message for w in workers), (workers, message)
    assert sorted(unnamed(p.name) for p in (tmp_path / "sq" / "values").iterdir()) == [
        f"{u:05d}" for u in range(8) if u != 3
    ]  # the others stored: a rerun resumes
