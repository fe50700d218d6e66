"""A task's outputs are committed once, whatever runs it twice (issue 47).

Each interleaving runs with real processes: an embedded cluster's worker processes,
a driver killed with SIGKILL, and the output checked by ``pipeline verify`` as a user
runs it. The attempts are ordered by gate files the map function waits on
(tests/mapfns/attempts.py): the first call of the gated unit waits, every later call
(its task's copy, a rerun) goes straight through.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from support.commit_once import REPO, idle, pipeline_command
from support.commit_workloads import GatedSquares
from support.tcp_cutter import TcpCutter
from support.waiting import wait_for

import pipeline.dispatch.stragglers
from pipeline import MapJob, MapWorkload, RunOptions, connect, run_job
from pipeline.dispatch.commit import leftovers
from pipeline.storage import LocalStore

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

FN = "mapfns.attempts:gated"
UNITS = 6


def _workload(tmp: Path, mode: str) -> MapWorkload:
    grid = {"x": list(range(UNITS)), "gate": [str(tmp / "gate")], "log": [str(tmp / "log")],
            "mode": [mode]}  # fmt: skip
    return MapWorkload(MapJob(function=FN, grid=grid, retries=0), "m")


def _options(tmp: Path) -> RunOptions:
    return RunOptions(output=str(tmp / "out"), units_per_task=2, progress=False)


def _check(tmp: Path) -> list[dict]:
    """``pipeline verify`` passes, no object of a losing attempt is left, and the
    results' rows, by unit."""
    ok = pipeline_command("verify", str(tmp / "out"))
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "leftovers" not in ok.stdout, ok.stdout
    store = LocalStore(tmp / "out")
    listed = set(pq.read_table(tmp / "out" / "m" / "manifest.parquet")["object"].to_pylist())
    assert leftovers(store, "m", listed) == []
    shown = pipeline_command("results", str(tmp / "out"), "--out", str(tmp / "rows.parquet"))
    assert shown.returncode == 0, shown.stderr
    return sorted(pq.read_table(tmp / "rows.parquet").to_pylist(), key=lambda r: r["unit"])


def _ended(tmp: Path, x: int) -> list[str]:
    path = tmp / "log" / f"ended-{x}"
    return path.read_text().split() if path.exists() else []


@pytest.mark.parametrize("mode", ["fails", "clock"])
def test_an_original_finishing_after_its_copy_leaves_the_copys_output(tmp_path, monkeypatch, mode):
    # Task 1's first attempt waits in unit 2; the run copies it once overdue, the copy
    # commits and the run completes; then the original goes on: it fails unit 2
    # ("fails") or returns another value for it ("clock": a function that is not
    # deterministic). Either way it loses, removes what it wrote, and the copy's
    # output stands.
    monkeypatch.setattr(pipeline.dispatch.stragglers, "SECONDS", 1.0)
    (tmp_path / "log").mkdir()
    with connect(RunOptions(workers=2)) as client:
        s = run_job(_workload(tmp_path, mode), _options(tmp_path), client, echo=lambda m: None)
        assert s.complete and s.units_ok == UNITS and not s.failures
        assert len(_ended(tmp_path, 2)) == 1  # the copy's; the original still waits
        (tmp_path / "gate").touch()
        wait_for("the original attempt to end", lambda: len(_ended(tmp_path, 2)) == 2)
        wait_for("the original attempt to finish", lambda: idle(client), timeout=60)
    rows = _check(tmp_path)
    copy_value = _ended(tmp_path, 2)[0]
    assert [r["unit"] for r in rows] == list(range(UNITS))
    assert str(rows[2]["v"]) == copy_value  # the first to commit, not the last to write


DRIVER = """
import sys
sys.path[:0] = {paths!r}
from distributed import Client
from pipeline import MapJob, MapWorkload, RunOptions, run_job
grid = {grid!r}
with Client({address!r}) as client:
    run_job(MapWorkload(MapJob(function={fn!r}, grid=grid, retries=0), "m"),
            RunOptions(output={out!r}, units_per_task=2, progress=False), client)
"""


def test_a_killed_drivers_task_finishing_after_the_reruns_loses(tmp_path):
    # Driver 1 is killed while its task 1 waits in unit 2 on a worker; driver 2 reruns
    # the job: task 1 runs again and commits; then driver 1's attempt, released but
    # still running (a thread cannot be stopped), fails unit 2 and loses.
    (tmp_path / "log").mkdir()
    w = _workload(tmp_path, "fails")
    with connect(RunOptions(workers=2)) as client:
        script = DRIVER.format(paths=[str(REPO), str(REPO / "tests")], grid=w.job.grid,
                               address=client.scheduler.address, fn=FN,
                               out=str(tmp_path / "out"))  # fmt: skip
        first = subprocess.Popen([sys.executable, "-c", script], stderr=subprocess.PIPE)
        try:
            wait_for("unit 2 to start", lambda: (tmp_path / "log" / "started-2").exists())
        finally:
            first.send_signal(signal.SIGKILL)
            first.wait(timeout=30)
        s = run_job(_workload(tmp_path, "fails"), _options(tmp_path), client, echo=lambda m: None)
        assert s.complete and not s.failures  # (driver 1 may have completed tasks 0, 2)
        assert len(_ended(tmp_path, 2)) == 1
        (tmp_path / "gate").touch()
        wait_for("driver 1's attempt to end", lambda: len(_ended(tmp_path, 2)) == 2)
        wait_for("driver 1's attempt to finish", lambda: idle(client), timeout=60)
    assert _ended(tmp_path, 2)[1] == "raised"
    rows = _check(tmp_path)
    assert [r["v"] for r in rows] == [x * x for x in range(UNITS)]


def test_a_deterministic_jobs_bytes_do_not_depend_on_its_attempts(tmp_path, client):
    # The same job twice: the objects' names carry their attempts, their bytes do not.
    def contents(out: Path) -> dict[str, bytes]:
        files = {}
        for p in sorted((out / "m").rglob("*.parquet")):
            if "manifest" not in p.parts and p.name != "manifest.parquet":
                name = p.name.split(".")[0]
                files[f"{p.parent.name}/{name}"] = p.read_bytes()
        return files

    ran = []
    (tmp_path / "log").mkdir()
    (tmp_path / "gate").touch()
    for run in ("a", "b"):  # (the rows hold the gate's and log's paths: the same)
        run_job(_workload(tmp_path, "same"), _options(tmp_path / run), client,
                echo=lambda m: None)  # fmt: skip
        ran.append(contents(tmp_path / run / "out"))
    assert ran[0] and ran[0] == ran[1]
    a, b = (sorted(p.name for p in (tmp_path / r / "out" / "m" / "results").iterdir())
            for r in "ab")  # fmt: skip
    assert a != b  # named by attempt


def test_an_output_of_0_2_0_resumes(tmp_path, client):
    # 0.2.0's layout (parts without an attempt's name): a task with a unit recorded as
    # failed is rerun (its round-1 entry supersedes the old), an incomplete one runs.
    out = tmp_path / "out"
    shutil.copytree(REPO / "tests" / "data" / "format-0.2.0" / "grid", out / "grid")
    (out / "grid" / "manifest.parquet").unlink()
    (out / "grid" / "manifest" / "part-000002.parquet").unlink()
    job = REPO / "tests" / "data" / "format-0.2.0" / "grid.toml"
    env_paths = os.pathsep.join([str(REPO), str(REPO / "tests")])
    ran = subprocess.run(
        [sys.executable, "-m", "pipeline", "run", str(job), "--output", str(out),
         "--workers", "1", "--no-progress"],
        capture_output=True, text=True, timeout=240, cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": env_paths},
    )  # fmt: skip
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert "resuming: 3 of 6" in ran.stderr, ran.stderr  # task 0, and task 1 but x=3
    ok = pipeline_command("verify", str(out))
    assert ok.returncode == 0 and "0 extra" in ok.stdout, ok.stdout + ok.stderr
    names = sorted(p.name for p in (out / "grid" / "manifest").iterdir())
    assert names == ["part-000000.parquet", "part-000001.r1.parquet", "part-000002.parquet"]
    assert not list((out / "grid").glob("failures/*"))
    rows = pq.read_table(out / "grid" / "results").to_pylist()
    assert sorted((r["x"], r["value"]) for r in rows) == [(x, x * x) for x in range(1, 7)]


def test_a_blip_longer_than_the_schedulers_event_log_runs_no_task_twice(tmp_path):
    # The scheduler keeps a topic's last 50 events; 60 tasks end while the driver is
    # cut off, a third of them with a failed unit (no entry). After the reconnect the
    # driver learns the rest from the store: each task started once.
    import dask

    tasks, log, gate = 60, tmp_path / "log", tmp_path / "gate"
    log.mkdir()
    w = GatedSquares("sq", tasks, gate, log, fail=range(0, tasks, 3))
    options = RunOptions(output=str(tmp_path / "out"), units_per_task=1, progress=False)
    with (
        dask.config.set({"distributed.admin.low-level-log-length": 50}),
        connect(RunOptions(workers=2)) as cluster,
        TcpCutter(int(cluster.scheduler.address.rsplit(":", 1)[1])) as cutter,
    ):
        import threading

        from distributed import Client

        with Client(f"tcp://{cutter.address}", timeout="60s") as client:
            result = {}
            driver = threading.Thread(
                target=lambda: result.update(s=run_job(w, options, client, echo=lambda m: None))
            )
            driver.start()
            wait_for("two running tasks", lambda: len(w.started()) >= 2)
            cutter.hold()  # the driver's connection cut, and no new one let through
            gate.touch()
            wait_for("every task to end", lambda: len(w.started()) == tasks and
                     idle(cluster), timeout=120)  # fmt: skip
            cutter.release()
            driver.join(timeout=180)
    s = result["s"]
    assert w.started() == dict.fromkeys(range(tasks), 1), w.started()
    assert s.units_failed == len(range(0, tasks, 3))
    assert s.units_ok == tasks - s.units_failed
    assert not (tmp_path / "out" / "_receipts" / "sq").exists() or not list(
        (tmp_path / "out" / "_receipts" / "sq").rglob("*.json")
    )


def test_leftovers_of_an_attempt_killed_before_cleaning_up_are_named_then_swept(tmp_path, client):
    # An attempt that lost (or failed units) and was killed before removing what it
    # wrote leaves objects no entry lists: verify names them, not as damage; the job's
    # next run that completes it removes them.
    (tmp_path / "log").mkdir()
    (tmp_path / "gate").touch()
    run_job(_workload(tmp_path, "same"), _options(tmp_path), client, echo=lambda m: None)
    results = tmp_path / "out" / "m" / "results"
    (stray,) = results.glob("part-000001.*parquet")
    left = results / "part-000001.adeadbeef.parquet"
    left.write_bytes(b"what a killed attempt wrote")
    shown = pipeline_command("verify", str(tmp_path / "out"))
    assert shown.returncode == 0, shown.stdout + shown.stderr
    assert "0 extra" in shown.stdout and "leftovers: 1 object" in shown.stdout, shown.stdout
    (tmp_path / "out" / "m" / "manifest.parquet").unlink()
    (tmp_path / "out" / "m" / "manifest" / "part-000002.parquet").unlink()
    s = run_job(_workload(tmp_path, "same"), _options(tmp_path), client, echo=lambda m: None)
    assert s.complete and s.units_run == 2
    assert not left.exists() and stray.exists()
    assert _check(tmp_path)[2]["v"] == 4
