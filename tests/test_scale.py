"""A simulated fleet (benchmarks/fleet/scale-sim) and the loss of the scheduler.

Real processes throughout: a TLS ``dask scheduler``, HAProxy with the repository's
configuration, simulated workers (real ``distributed.Worker`` objects, many to a
process, benchmarks/fleet/sim_workers.py) joining through HAProxy with the worker
certificate, and ``pipeline run`` / ``verify`` / ``results`` as a user runs them.
The 1,000-worker run is the script's; its figures are in docs/scale.md.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from support.stored import unnamed
from support.venv_commands import pipeline_command
from support.waiting import wait_for

from benchmarks.fleet.scale_logs import scan_logs
from harness.cluster_procs import (
    ENCRYPTION_ENV,
    REPO_ROOT,
    ProcessManager,
    client_security,
    free_port,
    start_haproxy,
    start_scheduler,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]


def test_200_simulated_workers_run_a_sleep_job_through_the_load_balancer(tmp_path):
    out = tmp_path / "scale.json"
    argv = [
        sys.executable, "-m", "benchmarks.fleet.scale_sim",
        "--workers", "200", "--per-process", "100", "--task-seconds", "0.5",
        "--units", "400", "--idle-seconds", "3", "--kill-worker-process",
        "--workdir", str(tmp_path / "sim"), "--out", str(out),
    ]  # fmt: skip
    proc = subprocess.run(
        argv,
        capture_output=True,
        text=True,
        timeout=540,
        cwd=REPO_ROOT,  # the benchmark runs as a module from the repository's root
    )
    assert out.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    figures = json.loads(out.read_text())
    assert figures["workers_before_job"] == 200, figures
    # One worker process (100 workers) was killed a third of the way through.
    assert "killed_worker_process_after_parts" in figures, figures
    assert figures["driver_exit_code"] == 0, figures["logs"]
    assert figures["units_exactly_once"] == {
        "ok": True, "rows": 400, "distinct_units": 400, "missing": []
    }  # fmt: skip
    assert figures["verify_exit_code"] == 0, figures["verify_output"]
    # The scheduler's streams to the killed workers close (lost_worker_streams),
    # results they held are computed again (lost_results), a task sent to several of
    # them is given up by the scheduler and run again by the runner (killed_tasks;
    # the report's task-stream plugin cannot record it: unstreamed_killed_tasks),
    # its workers' TLS handshakes under way are reset (killed_handshakes);
    # nothing else in any log is
    # an error, a timeout or a stall's consequence.
    assert figures["logs"]["errors"] == 0, json.dumps(figures["logs"], indent=1)
    assert figures["scheduler_cpu_per_task_gross"] > 0
    assert figures["scheduler_cpu_per_worker_second"] > 0
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_100_simulated_workers_run_with_the_planners_task_sizes(tmp_path):
    # scale-sim --planned: no --units-per-task; the planner sizes the tasks for the
    # cluster (the scheduler's CPU for them at most a quarter of its core) in whole
    # rounds of one task per worker. Its efficiency is reported, not asserted: it is
    # this machine's load's as much as the planner's.
    out = tmp_path / "planned.json"
    argv = [
        sys.executable, "-m", "benchmarks.fleet.scale_sim",
        "--workers", "100", "--per-process", "50", "--planned", "--task-seconds", "0.1",
        "--ideal-seconds", "6", "--idle-seconds", "2",
        "--workdir", str(tmp_path / "sim"), "--out", str(out),
    ]  # fmt: skip
    proc = subprocess.run(
        argv, capture_output=True, text=True, timeout=540, cwd=REPO_ROOT
    )  # (the benchmark runs as a module from the repository's root)
    assert out.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    figures = json.loads(out.read_text())
    assert figures["driver_exit_code"] == 0, figures["logs"]
    assert figures["units_exactly_once"]["ok"], figures["units_exactly_once"]
    assert figures["verify_exit_code"] == 0, figures["verify_output"]
    assert figures["logs"]["errors"] == 0, json.dumps(figures["logs"], indent=1)
    assert figures["units"] == 100 * 60 and figures["tasks"] < figures["units"] / 2
    record = json.loads(next((tmp_path / "sim" / "out").glob("*/job.json")).read_text())
    assert len(record["stops"]) % 100 == 0  # whole rounds: the last one balanced
    # The scheduler's CPU for the job over the command, measured (its process's, less
    # the 100 workers' heartbeats at their idle rate, which go on whatever the tasks
    # are): at most the quarter of a core the planner sizes the tasks for.
    assert 0 < figures["scheduler_busy_net"] <= 0.25, figures
    assert figures["scheduler_busy_net"] < figures["scheduler_busy"], figures
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_the_log_scan_counts_a_killed_process_handshakes_apart(tmp_path):
    reset = (
        "{} - distributed.comm.tcp - WARNING - Listener on 'tls://127.0.0.1:51433': TLS "
        "handshake failed with remote 'tls://127.0.0.1:48150': [Errno 104] Connection "
        "reset by peer\n"
    )
    (tmp_path / "scheduler.log").write_text(
        reset.format("2026-11-23 05:30:57,905") + reset.format("2026-11-23 05:45:00,000")
    )
    killed_at = time.mktime(time.strptime("2026-11-23 05:30:56", "%Y-%m-%d %H:%M:%S"))
    logs = scan_logs(tmp_path, killed_at=killed_at)
    assert (logs["killed_handshakes"], logs["errors"]) == (1, 1)  # the later one: an error
    assert scan_logs(tmp_path)["errors"] == 2  # nothing killed: both errors


def test_the_log_scan_reads_asyncios_untimed_messages_as_records_of_their_own(tmp_path):
    # A harmless handshake warning, then asyncio's report of an exception in the
    # listener's accept callback, without a timestamp of its own: a record of its own.
    (tmp_path / "scheduler.log").write_text(
        "2026-11-23 07:15:13,490 - distributed.comm.tcp - WARNING - Listener on "
        "'tls://127.0.0.1:48985': TLS handshake failed with remote 'tls://127.0.0.1:49070': "
        "[SSL: UNEXPECTED_EOF_WHILE_READING] EOF occurred in violation of protocol\n"
        "Exception in callback BaseAsyncIOLoop._handle_events(7, 1)\n"
        "handle: <Handle BaseAsyncIOLoop._handle_events(7, 1)>\n"
        "Traceback (most recent call last):\n"
        + '  File "x.py", line 1, in f\n' * 6
        + "ConnectionResetError: [Errno 104] Connection reset by peer\n"
    )
    logs = scan_logs(tmp_path)
    assert logs["errors"] == 1, logs
    (record,) = logs["files"]["scheduler.log"]["error_records"]
    assert record.startswith("Exception in callback"), record
    assert record.endswith("Connection reset by peer"), record  # the exception is shown


# ---------------------------------------------------------------- scheduler loss


def _workers(address, certs) -> int:
    from distributed import Client

    with Client(address, security=client_security(certs), timeout=30) as c:
        return len(c.scheduler_info(n_workers=-1)["workers"])


def _checksums(output: Path) -> dict:
    """Each object's checksum by what it holds (its name without the attempt's id)."""
    (manifest,) = output.glob("*/manifest.parquet")
    table = pq.read_table(manifest).to_pandas()
    assert len(table) == 60
    return {
        (unnamed(row["object"]), row["unit_start"], row["unit_stop"]): row["checksum"]
        for _, row in table.iterrows()
    }


#: The job's function: each call takes a ticket (a file created once); the first 20
#: calls run at once and the others wait for the test's gate (at most 5 minutes), so
#: that the scheduler is lost at a known point whatever order the tasks run in.
GATED_NAP = """
import os, time


def _ticket(log):
    n = 0
    while True:
        try:
            os.close(os.open(os.path.join(log, f"ticket-{n}"), os.O_CREAT | os.O_EXCL))
            return n
        except FileExistsError:
            n += 1


def nap(x, gate, log):
    with open(os.path.join(log, f"called-{x}"), "a") as f:
        f.write("1\\n")
    if _ticket(log) >= 20:
        deadline = time.monotonic() + 300
        while not os.path.exists(gate) and time.monotonic() < deadline:
            time.sleep(0.05)
    return {"twice": 2 * x}
"""


def _write_gated_job(folder: Path, units: int) -> tuple[Path, Path, Path]:
    """The job file, its gate and the folder of its calls' log."""
    gate, log = folder / "gate", folder / "calls"
    log.mkdir()
    (folder / "naps.py").write_text(GATED_NAP)
    job = folder / "naps.toml"
    job.write_text(
        f'workload = "map"\nfunction = "naps:nap"\ncode = "{folder / "naps.py"}"\n'
        f'[grid]\nx = {list(range(units))}\ngate = ["{gate}"]\nlog = ["{log}"]\n'
    )
    return job, gate, log


def test_scheduler_killed_mid_run_is_replaced_behind_the_same_address_and_the_run_completes(
    tmp_path,
):
    # The run waits out the lost connection (up to Dask's connect timeout), reaches the
    # new scheduler, holds its tasks there again and submits those not heard from:
    # the run completes, with nothing lost or run twice, and needs no rerun.
    from pipeline.cluster.tls import make_certificates

    certs = make_certificates(tmp_path / "certs")
    job, gate, log = _write_gated_job(tmp_path, units=60)
    with ProcessManager(tmp_path / "logs") as pm:
        port = free_port()
        scheduler = start_scheduler(pm, certs, port=port)
        lb = start_haproxy(pm, f"127.0.0.1:{port}")
        for p in range(2):  # 2 processes of 3 workers; they restart workers that close
            argv = [
                sys.executable, "-m", "benchmarks.fleet.sim_workers", lb.address,
                "--count", "3", "--prefix", f"sim{p}", "--restart-seconds", "1",
                "--ca", str(certs["ca"]), "--cert", str(certs["worker"]),
                "--key", str(certs["worker-key"]),
                "--local-directory", str(tmp_path / "scratch" / str(p)),
            ]  # fmt: skip
            pm.start(f"workers-{p}", argv, ENCRYPTION_ENV)
        wait_for("6 workers", lambda: _workers(lb.address, certs) >= 6)
        flags = [
            "--scheduler", lb.address, "--tls-ca-file", certs["ca"],
            "--tls-cert", certs["client"], "--tls-key", certs["client-key"],
            "--no-progress", "--units-per-task", 1,
        ]  # fmt: skip

        gate.touch()
        clean = pipeline_command("run", job, "--output", tmp_path / "clean", *flags, timeout=240)
        assert clean.returncode == 0, clean.stdout + clean.stderr
        gate.unlink()
        for f in log.iterdir():
            f.unlink()

        lost = tmp_path / "lost"
        driver = subprocess.Popen(
            [sys.executable, "-m", "pipeline", *map(str, ["run", job, "--output", lost, *flags])],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        )

        def stored() -> int:
            return len(list(lost.glob("*/manifest/*")))

        def tickets() -> int:
            return len(list(log.glob("ticket-*")))

        # 20 units stored and every worker in a call that waits on the gate: no task can
        # end before the gate opens.
        wait_for("20 units stored, 6 waiting", lambda: stored() == 20 and tickets() == 26)
        scheduler.kill()  # SIGKILL, as a crashed or replaced instance
        gate.touch()  # the 6 calls running end, on workers that lost their scheduler
        wait_for("the 6 tasks running at the loss to store their output", lambda: stored() == 26)
        # The auto-scaling group of one starts a new scheduler behind the same address.
        start_scheduler(pm, certs, port=port)
        stdout, stderr = driver.communicate(timeout=240)
    print(f"driver after the scheduler's loss: exit {driver.returncode}\n{stdout}\n{stderr}")
    assert driver.returncode == 0, stdout + stderr
    assert "60 of 60 points" in stdout, stdout + stderr
    assert "reconnected to the scheduler" in stderr, stderr
    # Each unit called once: the tasks submitted again whose calls ended at the loss
    # found their stored output.
    calls = {int(f.name.split("-")[1]): f.read_text().count("1") for f in log.glob("called-*")}
    assert calls == dict.fromkeys(range(60), 1), calls
    ok = pipeline_command("verify", lost)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert _checksums(lost) == _checksums(tmp_path / "clean")
    table = tmp_path / "lost.parquet"
    shown = pipeline_command("results", lost, "--out", table)
    assert shown.returncode == 0, shown.stderr
    assert sorted(pq.read_table(table).column("unit").to_pylist()) == list(range(60))


def test_the_log_scan_counts_the_task_stream_plugins_killed_task_record_apart(tmp_path):
    # With --report, distributed's task-stream plugin fails on a task the scheduler
    # gave up on (it has no timings): expected when a worker process is killed, and
    # told apart from another plugin's failure, which is an error.
    record = (
        "2026-11-28 18:22:19,915 - distributed.scheduler - INFO - Plugin failed with "
        "exception\nTraceback (most recent call last):\n"
        '  File "/x/distributed/scheduler.py", line 2065, in _transition\n'
        "    plugin.transition(\n"
        '  File "/x/distributed/diagnostics/task_stream.py", line 37, in transition\n'
        '    assert kwargs["startstops"]\n'
        "{}\n"
    )
    (tmp_path / "scheduler.log").write_text(
        record.format("KeyError: 'startstops'") + record.format("KeyError: 'worker'")
    )
    logs = scan_logs(tmp_path)
    assert (logs["unstreamed_killed_tasks"], logs["errors"]) == (1, 1), logs


def test_the_gpu_hosts_harness_path_runs_the_simulation(tmp_path):
    # The GPU host's harness (bench.sh) runs `python3 scripts/scale_sim.py` from the root.
    proc = subprocess.run(
        [sys.executable, str(REPO_ROOT / "scripts" / "scale_sim.py"), "--help"],
        capture_output=True, text=True, timeout=60, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "--planned" in proc.stdout and "--per-process" in proc.stdout
