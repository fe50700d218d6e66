"""What a run tells while it runs and at its end, wherever its output goes: progress
lines where standard error is no terminal, ``pipeline.map``'s output, the summary
printed from Python as the command line prints it, the report page named, the whole
command's wall time counted, and what Ctrl-C says at start-up and before the
finalization."""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mapfns import userfns
from support.processes import command_line, descendants
from support.waiting import wait_for

import pipeline
from pipeline.dispatch.progress import Progress
from pipeline.summary import RunSummary

TESTS = str(Path(__file__).parent)
#: The parts of a command's start-up, in order: the interpreter's start and imports,
#: building the jobs (default inputs written), the inputs checked while the cluster
#: starts, the rest of the cluster's start.
STARTUP_PARTS = ("python start", "job set-up", "inputs checked", "waited for the cluster")
#: A progress line: "LABEL: 12 of 40 points (30%) in 1.2 s, 9.6/s, 1 failed, ..."
LINE = re.compile(r"^(?P<label>.+?): (?P<done>[\d,]+) of (?P<total>[\d,]+) (?P<unit>\w+)s "
                  r"\((?P<share>\d+)%\) in .+?, .+?/s, (?P<failed>[\d,]+) failed, ")  # fmt: skip


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_lines_at_each_tenth_and_every_few_seconds_between():
    out, clock = io.StringIO(), Clock()
    progress = Progress(200, unit="fit", label="map job 'x'", every=5, stream=out, clock=clock)
    assert progress.mode == "lines"  # (a StringIO is no terminal)
    for i in range(200):
        clock.now += 0.1 if i < 100 else 0.01
        progress.update(1, failed=int(i == 50))
    lines = out.getvalue().splitlines()
    shares = [int(LINE.match(line)["share"]) for line in lines]
    # every tenth once, and lines 5 s apart between them (the first 10 % took 2 s)
    assert [s for s in shares if s % 10 == 0] == list(range(10, 101, 10)), lines
    assert len(lines) >= 10
    first = LINE.match(lines[0])
    assert first["label"] == "map job 'x'" and first["unit"] == "fit" and first["total"] == "200"
    assert lines[0].endswith("left") and "0 failed" in lines[0]
    assert "1 failed" in lines[-1] and lines[-1].endswith(", done"), lines[-1]


def test_seconds_between_lines_are_kept_and_zero_means_tenths_only():
    out, clock = io.StringIO(), Clock()
    timed = Progress(10_000, every=5, stream=out, clock=clock)
    for _ in range(60):  # 60 s for 6 % of the units: no tenth, a line every 5 s
        clock.now += 1
        timed.update(10)
    assert len(out.getvalue().splitlines()) == 12
    out, clock = io.StringIO(), Clock()
    tenths = Progress(1000, every=0, stream=out, clock=clock)
    for _ in range(1000):
        clock.now += 1
        tenths.update(1)
    assert len(out.getvalue().splitlines()) == 10
    off = io.StringIO()
    with Progress(10, show=False, stream=off) as quiet:
        quiet.update(10)
    assert off.getvalue() == "" and quiet.mode == "off"


def run_cli(*args, cwd, **kw) -> tuple[subprocess.CompletedProcess, float]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([TESTS, os.environ.get("PYTHONPATH", "")])}
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "pipeline", *map(str, args)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300,
                          stdin=subprocess.DEVNULL)  # fmt: skip
    return done, time.perf_counter() - t0


def grid_job(tmp_path: Path, units: int) -> Path:
    points = ", ".join(map(str, range(1, units + 1)))
    job = tmp_path / "grid.toml"
    job.write_text(
        f'workload = "map"\nfunction = "mapfns.userfns:power"\nunits_per_task = 1\n'
        f'output = "{tmp_path / "out"}"\n[grid]\nx = [{points}]\n'
    )
    return job


@pytest.mark.integration
@pytest.mark.slow
def test_a_run_outside_a_terminal_prints_progress_lines_and_names_its_report(tmp_path):
    done, outside = run_cli("run", grid_job(tmp_path, 20), "--workers", 2, "--progress-seconds",
                            0, "--report", tmp_path / "report", cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stderr
    lines = [m for m in map(LINE.match, done.stderr.splitlines()) if m]
    # stderr is a pipe: a line at each tenth of the units (a receipt may carry two)
    assert {m["label"] for m in lines} == {"map job 'grid'"}
    assert [int(m["share"]) for m in lines][-1] == 100 and len(lines) >= 5, done.stderr
    assert all(m["total"] == "20" and m["unit"] == "point" for m in lines)
    # The summary the report holds prints as the command printed it, the page named
    saved = json.loads((tmp_path / "report" / "grid-summary.json").read_text())
    summary = RunSummary(**saved)
    page = tmp_path / "report" / "grid-report.html"
    assert page.is_file() and summary.report == str(page.resolve())
    assert done.stdout == str(summary) + "\n", (done.stdout, str(summary))
    assert f"  report: {page.resolve()}\n" in done.stdout
    # The whole command's time, parts that add up to no more than it, within the
    # command's wall time as seen from outside
    parts = sum(summary.startup.get(k, 0.0) for k in STARTUP_PARTS)
    parts += summary.wall_seconds + summary.shutdown_seconds
    assert parts <= summary.command_seconds <= outside
    assert summary.startup["python start"] > 0 and summary.shutdown_seconds > 0
    assert re.search(r"  time: [\d.]+ s in all: python start ", done.stdout), done.stdout
    # --no-progress: no line
    quiet, _ = run_cli("run", grid_job(tmp_path, 20), "--workers", 1, "--overwrite",
                       "--no-progress", cwd=tmp_path)  # fmt: skip
    assert quiet.returncode == 0 and not any(map(LINE.match, quiet.stderr.splitlines()))


@pytest.mark.integration
@pytest.mark.slow
def test_writing_default_inputs_is_counted_in_the_commands_time(tmp_path):
    # No --frames: the cubes workload writes its default frames first (6 of 1000 x 1000)
    done, outside = run_cli("run", "--dim", 6, "--cubes", 8, "--workers", 1, "--output",
                            tmp_path / "out", "--report", tmp_path / "report",
                            cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "no --frames given: writing 6 frames" in done.stdout
    summary = RunSummary(**json.loads((tmp_path / "report" / "cubes-summary.json").read_text()))
    setup = summary.startup["job set-up"]
    assert setup > 0 and f"job set-up {setup:.1f} s" in done.stdout, done.stdout
    parts = sum(summary.startup[k] for k in STARTUP_PARTS)
    assert parts + summary.wall_seconds + summary.shutdown_seconds <= summary.command_seconds
    assert summary.command_seconds <= outside


def test_pipeline_map_tells_its_run_as_pipeline_run_does(tmp_path, client, capfd):
    summary = pipeline.map(userfns.power, grid={"x": list(range(1, 11))}, output=str(tmp_path),
                           client=client, units_per_task=1, progress_seconds=0)  # fmt: skip
    out, err = capfd.readouterr()
    assert summary.complete and summary.units_run == 10
    # all on standard error: standard output is the calling program's
    assert out == "" and err.endswith(str(summary) + "\n"), (out, err)
    assert str(summary).startswith("map job 'power': 10 of 10 points in "), str(summary)
    assert err.splitlines()[0].startswith("map job 'power': ") and " on " in err
    lines = [m for m in map(LINE.match, err.splitlines()) if m]
    assert [int(m["share"]) for m in lines] == list(range(10, 101, 10)), err
    # IPython's and Jupyter's display (their printer's protocol): the same lines
    shown = []
    summary._repr_pretty_(type("Printer", (), {"text": lambda self, t: shown.append(t)})(), False)
    assert shown == [str(summary)]
    again = pipeline.map(userfns.power, grid={"x": list(range(1, 11))}, output=str(tmp_path),
                         client=client, verbose=0)  # fmt: skip
    assert capfd.readouterr() == ("", "") and again.complete
    verbose = pipeline.map(userfns.power, grid={"x": [1, 2]}, output=str(tmp_path / "v"),
                           client=client, verbose=2, progress=False)  # fmt: skip
    out, err = capfd.readouterr()
    assert out == "" and "  plan: " in err and err.endswith(verbose.text(verbose=True) + "\n")
    assert not any(map(LINE.match, err.splitlines()))


def start_cli(*args, cwd) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([TESTS, os.environ.get("PYTHONPATH", "")])}
    return subprocess.Popen([sys.executable, "-m", "pipeline", *map(str, args)], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, text=True,
                            start_new_session=True)  # fmt: skip


def _workers_ignoring_sigint(proc: subprocess.Popen) -> bool:
    """Whether the command has a worker process (multiprocessing's spawn) and every such
    process ignores SIGINT (its preload has run)."""
    spawned = [p for p in descendants(proc.pid) if "spawn_main" in command_line(p)]
    ignoring = []
    for pid in spawned:
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            return False
        mask = int(next(line.split()[1] for line in status.splitlines()
                        if line.startswith("SigIgn:")), 16)  # fmt: skip
        ignoring.append(bool(mask & (1 << (signal.SIGINT - 1))))
    return bool(ignoring) and all(ignoring)


def interrupt_at(proc: subprocess.Popen, gate: Path) -> tuple[str, str]:
    """Ctrl-C to the command's process group once it waits at ``gate``; its output."""
    try:
        wait_for(f"the run to reach {gate.name}", Path(str(gate) + ".reached").exists, 180)
        os.killpg(proc.pid, signal.SIGINT)
        return proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)


@pytest.mark.integration
@pytest.mark.slow
def test_ctrl_c_at_start_up_says_no_task_ran(tmp_path):
    gate = tmp_path / "preflight"
    proc = start_cli("run", "--workload", "squares", "--n-units", 8, "--workers", 1,
                     "--preflight-gate", gate, "--output", tmp_path / "out",
                     cwd=tmp_path)  # fmt: skip
    # The Ctrl-C once the cluster's worker has started (it ignores SIGINT from its
    # preload on): one still importing would be ended mid-import, with a traceback.
    wait_for("the embedded cluster's worker to start", lambda: _workers_ignoring_sigint(proc), 180)
    _, err = interrupt_at(proc, gate)
    assert proc.returncode == 130, err
    assert err.strip().splitlines()[-1] == (
        "interrupted while checking the inputs: no task ran; run the same command again "
        "(what earlier runs completed is kept)"
    ), err
    assert "Traceback" not in err and not list(tmp_path.glob("out/*/manifest/part-*"))


@pytest.mark.integration
@pytest.mark.slow
def test_ctrl_c_before_the_finalization_says_so_and_the_rerun_only_finalizes(tmp_path):
    gate, out = tmp_path / "finalize", tmp_path / "out"
    args = ["run", "--workload", "squares", "--n-units", 12, "--units-per-task", 3,
            "--workers", 1, "--output", out]  # fmt: skip
    proc = start_cli(*args, "--finalize-gate", gate, cwd=tmp_path)
    _, err = interrupt_at(proc, gate)
    assert proc.returncode == 130, err
    assert err.strip().splitlines()[-1] == (
        "interrupted: job 'squares' has all 12 squares done, its manifest not yet "
        "consolidated; run the same command again to finalize it (it runs no task and "
        "starts no cluster)"
    ), err
    assert not (out / "squares" / "manifest.parquet").exists()
    again, _ = run_cli(*args, cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert again.stdout.startswith(
        "squares job 'squares' is complete: 12 squares; its tasks were all done and this "
        "run finalized it in "
    ) and again.stdout.splitlines()[0].endswith(", with no cluster"), again.stdout
    assert "worker threads" not in again.stderr, again.stderr  # (no cluster's first line)
    assert (out / "squares" / "manifest.parquet").is_file()


def test_a_total_not_known_yet_gives_timed_lines_until_it_is_set():
    out, clock = io.StringIO(), Clock()
    progress = Progress(None, unit="call", every=5, stream=out, clock=clock)
    for _ in range(10):
        clock.now += 1
        progress.update(3)
    assert out.getvalue().splitlines() == [
        "15 calls in 5.0 s, 3/s, 0 failed",
        "30 calls in 10.0 s, 3/s, 0 failed",
    ]
    progress.total = 60  # (learnt: the tenths from here on)
    clock.now += 1
    progress.update(3)
    assert out.getvalue().splitlines()[-1] == (
        "33 of 60 calls (55%) in 11.0 s, 3/s, 0 failed, about 9.0 s left"
    )
