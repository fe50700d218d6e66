"""The command line as a user meets it: what a run prints, Ctrl-C, a killed driver,
a rerun of a finished job, a script without the ``__main__`` guard."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from support.cube_jobs import shard_file
from support.processes import alive, command_line, descendants, session_alive
from support.waiting import wait_for

import pipeline as pipeline_package

pytestmark = [pytest.mark.integration, pytest.mark.slow]
PACKAGE_DIR = str(Path(pipeline_package.__file__).parent) + os.sep


def pipeline(*args, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "pipeline", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=kw.pop("timeout", 240),
        stdin=subprocess.DEVNULL,
        **kw,
    )


def start(*args) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "pipeline", *map(str, args)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )


def long_cube_job(frames_dir, out) -> list:
    # Big enough to still be running seconds after its first task completes.
    return ["run", "--frames", frames_dir, "--dim", 10, "--cubes", 400_000, "--units-per-task", 64,
            "--output", out, "--workers", 2]  # fmt: skip


def interrupted(proc: subprocess.Popen, ready, what: str, *, group: bool = False) -> str:
    """Once ``ready()``, Ctrl-C to ``proc`` (to its process group with ``group``, as a
    terminal sends it); its standard error once it exits (killed if it does not)."""
    try:
        wait_for(what, ready, 120)
        if group:
            os.killpg(proc.pid, signal.SIGINT)
        else:
            proc.send_signal(signal.SIGINT)
        return proc.communicate(timeout=60)[1]
    finally:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)


def test_ctrl_c_prints_one_line_exits_130_and_stops_the_cluster(tmp_path, frames_dir):
    out = tmp_path / "out"
    proc = start(*long_cube_job(frames_dir, out))
    workers = set()

    def started() -> bool:
        workers.update(descendants(proc.pid))
        return bool(list(out.glob("cubes/manifest/part-*")))

    # to the process group, as a terminal's Ctrl-C: the workers must not print tracebacks
    stderr = interrupted(proc, started, "a first complete task", group=True)
    assert workers, "the embedded cluster runs worker processes"
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr and "Error" not in stderr, stderr
    last = stderr.strip().splitlines()[-1]
    assert last.startswith("interrupted: job 'cubes' has ") and last.endswith(
        "of 400,000 cubes complete; run the same command again to resume"
    ), stderr
    wait_for("the cluster's processes to exit", lambda: not alive(workers), 30)
    # Counted once the cluster has stopped: tasks running at the interrupt may complete
    # meanwhile, and the count is what a rerun finds.
    said = int(last.split(" has ")[1].split(" of ")[0].replace(",", ""))
    stored = sum(pq.read_metadata(p).num_rows for p in out.glob("cubes/manifest/part-*"))
    assert said == stored > 0, (said, stored)


def test_a_driver_killed_with_sigkill_leaves_no_warning(tmp_path, frames_dir):
    out = tmp_path / "out"
    proc = start(*long_cube_job(frames_dir, out))
    try:
        wait_for("a first complete task", lambda: list(out.glob("cubes/manifest/part-*")), 120)
        workers = descendants(proc.pid)
        trackers = {p for p in workers if "resource_tracker" in command_line(p)}
        proc.kill()
        proc.wait(timeout=30)
        # The resource tracker, a child of the driver, cleans up once the driver is
        # gone, and then exits (what it would warn of is on the driver's stderr).
        wait_for("the driver's resource tracker to exit", lambda: not alive(trackers), 60)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        wait_for("the orphaned processes to exit", lambda: not alive(workers), 30)
    stderr = proc.stderr.read()
    assert "leaked" not in stderr, stderr
    # A worker that was sending a result to the driver when it died logs that its peer
    # went away (Dask's own report, which is true); any other traceback is a defect.
    # (A record is one log line and its traceback, chained exceptions included.)
    records = re.split(r"\n(?=\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ - )", stderr)
    for report in [r for r in records if "Traceback (most recent call last):" in r]:
        assert "CommClosedError" in report and PACKAGE_DIR not in report, stderr


def test_a_finished_job_run_again_says_so_and_starts_no_cluster(tmp_path, frames_dir):
    args = ["run", "--frames", frames_dir, "--dim", 6, "--cubes", 40, "--output", tmp_path]
    first = pipeline(*args)
    assert first.returncode == 0, first.stderr
    assert "dashboard" not in first.stderr  # served on request only (--dashboard)
    assert "cubes job 'cubes': 40 cubes (69.1 kB of output) on tcp://127.0.0.1:" in first.stderr
    assert "cubes job 'cubes': 40 of 40 cubes in " in first.stdout
    assert re.search(r"  time: [\d.]+ s in all: python start [\d.]+ s, .*start-up ", first.stdout)
    assert "while the cluster started" in first.stdout
    assert "building" in first.stdout
    again = pipeline(*args, "--report", tmp_path / "report")
    assert again.returncode == 0, again.stderr
    assert again.stdout.startswith(
        "cubes job 'cubes' is complete: 40 cubes; nothing left to run"
    ), again.stdout
    # nothing ran to report on: said, so that the empty report folder is explained
    assert "no report for job 'cubes'" in again.stderr and "nothing ran" in again.stderr
    assert not (tmp_path / "report").exists()
    assert "dashboard" not in again.stderr and "worker threads" not in again.stderr
    # -v after the command, as users type it, counts as before it
    verbose = pipeline(*args, "--overwrite", "--dashboard", "-v")
    assert "  plan: " in verbose.stdout and "tasks of" in verbose.stdout, verbose.stdout
    assert "dashboard: http://127.0.0.1:" in verbose.stderr
    assert "plan:" not in first.stdout and "probe" not in first.stdout


def test_several_jobs_space_is_checked_before_any_and_each_summary_told_as_it_ends(
    tmp_path, frames_dir
):
    from support.lock_holders import lock_held_elsewhere

    def job(name: str, cubes: int) -> Path:
        path = tmp_path / f"{name}.toml"
        path.write_text(f'workload = "cubes"\nname = "{name}"\nframes = "{frames_dir}"\n'
                        f'dim = 6\ncubes = {cubes}\noutput = "{tmp_path / "out"}"\n')  # fmt: skip
        return path

    # Together more than the disk holds: refused before the first job writes anything,
    # every job's space checked before the first runs.
    too_much = pipeline("run", job("a", 40), job("b", 10**12))
    assert too_much.returncode == 1
    assert "still to write (jobs 'a' 69.1 kB, 'b' " in too_much.stderr, too_much.stderr
    assert not (tmp_path / "out" / "a").exists()
    # A later job failing after an earlier one ran: the earlier one's summary is told.
    with lock_held_elsewhere(str(tmp_path / "out"), "b", "another run"):
        proc = pipeline("run", job("a", 40), job("b", 40))
    assert proc.returncode == 1
    assert "cubes job 'a': 40 of 40 cubes in " in proc.stdout, proc.stdout
    assert "job 'b' in " in proc.stderr and "is already running" in proc.stderr


def test_a_damaged_output_is_repaired_by_verify_repair_and_a_rerun(tmp_path, frames_dir):
    args = ["run", "--frames", frames_dir, "--dim", 6, "--cubes", 40, "--cubes-per-shard", 8,
            "--units-per-task", 8, "--output", tmp_path]  # fmt: skip
    assert pipeline(*args).returncode == 0
    shard = shard_file(tmp_path, 2)
    original = shard.read_bytes()
    shard.unlink()
    found = pipeline("verify", tmp_path)
    assert found.returncode == 1 and "missing: " in found.stdout
    assert "`pipeline verify --repair` marks the damaged tasks to run again" in found.stdout
    marked = pipeline("verify", tmp_path, "--repair")
    assert marked.returncode == 1
    assert (
        "repair: 1 task(s) (units 16-23) marked to run again: run the job's command "
        "again (without --overwrite) to redo them" in marked.stdout
    ), marked.stdout
    again = pipeline(*args)
    assert again.returncode == 0 and "8 of 8 cubes" in again.stdout, again.stdout
    assert "resuming: 32 of 40 cubes already complete" in again.stderr
    assert not shard.exists() and shard_file(tmp_path, 2).read_bytes() == original
    assert pipeline("verify", tmp_path).returncode == 0


def test_recorded_chunk_failures_are_not_offered_a_rerun(tmp_path):
    data = tmp_path / "data"
    made = pipeline("data", "regressions", "--chunks", 4, "--rows", 30, "--out", data)
    assert made.returncode == 0, made.stderr
    # 120 rows in chunks of 58: the last has 4 rows for 9 parameters.
    formula = "y ~ x1 + x2 + x3 + x4 + x5 + C(sector)"
    args = ["run", "--workload", "regressions", "--data", data, "--chunk-rows", 58,
            "--formula", formula, "--output", tmp_path / "out"]  # fmt: skip
    first = pipeline(*args)
    assert first.returncode == 1, first.stderr
    assert "FAILED: 1 chunk (1 TooFewRows)" in first.stderr
    assert "a rerun would give the same answer" in first.stderr
    assert "run the same command again" not in first.stderr
    again = pipeline(*args, "--max-failures", 1)
    assert again.returncode == 0, again.stderr
    assert "is complete: 3 chunks (1 failed, recorded in the results)" in again.stdout
    assert "run the same command again" not in again.stdout + again.stderr
    assert "-" not in again.stdout.split("is complete")[1].split(";")[0]


def test_a_script_without_the_main_guard_runs_its_top_level_once(tmp_path, frames_dir):
    # Cubes from threads start no cluster: such a script just runs.
    plain = tmp_path / "plain.py"
    plain.write_text(
        "from pipeline import CubeJob, iter_cubes\n"
        f"job = CubeJob(frames={str(frames_dir)!r}, cubes=4, dim=5)\n"
        "print([cube_id for cube_id, cube in iter_cubes(job)])\n"
    )
    done = subprocess.run(
        [sys.executable, str(plain)], capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[0, 1, 2, 3]"
    # The embedded cluster from the top level: its spawned workers must not run the
    # script again (each would start a cluster of its own). A function of the
    # script's travels by value.
    script = tmp_path / "train.py"
    script.write_text(
        "import pipeline\n"
        "from pipeline import CubeJob, iter_cubes\n"
        "print('top level')\n"
        "def add(x, y):\n"
        "    return x + y\n"
        f"job = CubeJob(frames={str(frames_dir)!r}, cubes=4, dim=5)\n"
        "print(sorted(i for i, _ in iter_cubes(job, delivery='shared-memory')))\n"
        "s = pipeline.map(add, grid={'x': [1, 2], 'y': [10]}, output='out', workers=2)\n"
        "print(pipeline.results_table('out').to_pandas()['result'].tolist())\n"
    )
    proc = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=300, cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["top", "level", "[0,", "1,", "2,", "3]", "[11,", "12]"]
    assert "Traceback" not in proc.stderr, proc.stderr
    guarded = tmp_path / "guarded.py"
    guarded.write_text(
        "from pipeline import CubeJob, iter_cubes\n\n"
        "def main():\n"
        f"    job = CubeJob(frames={str(frames_dir)!r}, cubes=4, dim=5)\n"
        "    print(sorted(i for i, _ in iter_cubes(job, delivery='shared-memory')))\n\n"
        'if __name__ == "__main__":\n'
        "    main()\n"
    )
    ok = subprocess.run(
        [sys.executable, str(guarded)], capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.strip() == "[0, 1, 2, 3]"


def test_a_script_read_from_standard_input_runs_on_the_embedded_cluster(tmp_path):
    # `python - <<EOF`: __main__'s file is "<stdin>", which spawned workers cannot run.
    script = (
        "import pipeline\n"
        "def add(x, y):\n"
        "    return x + y\n"
        "s = pipeline.map(add, grid={'x': [1, 2], 'y': [10]}, output='out', workers=2)\n"
        "print(s.units_run, pipeline.results_table('out').column('result').to_pylist())\n"
    )
    proc = subprocess.run([sys.executable, "-"], input=script, capture_output=True, text=True,
                          timeout=120, cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "2 [11, 12]"


def test_the_example_plugin_runs_resumes_and_verifies_through_the_cli(tmp_path):
    texts = tmp_path / "texts"
    texts.mkdir()
    for i in range(5):
        (texts / f"t{i}.txt").write_text("the cat and the hat " * (i + 1))
    listed = pipeline("workloads")
    assert "wordcount  (wordcount:WordCountWorkload, from package pipeline-wordcount)" in (
        listed.stdout
    ), listed.stdout
    args = ["run", "--workload", "wordcount", "--folder", texts, "--output", tmp_path / "out",
            "--workers", 1, "--units-per-task", 2]  # fmt: skip
    first = pipeline(*args)
    assert first.returncode == 0, first.stderr
    assert "wordcount job 'wordcount': 5 of 5 files" in first.stdout
    (tmp_path / "out" / "wordcount" / "manifest" / "part-000001.parquet").unlink()
    (tmp_path / "out" / "wordcount" / "manifest.parquet").unlink()
    again = pipeline(*args)
    assert "resuming: 3 of 5 files already complete" in again.stderr, again.stderr
    assert "2 of 2 files" in again.stdout
    verified = pipeline("verify", tmp_path / "out")
    assert verified.returncode == 0 and "wordcount (wordcount): OK" in verified.stdout
    shown = pipeline("results", tmp_path / "out")
    assert "table 'counts'" in shown.stdout and "the" in shown.stdout


def test_an_input_error_found_while_the_cluster_starts_leaves_no_process(tmp_path):
    # The cluster starts while the inputs are checked; on an input error it is closed,
    # then the error reported: no process outlives the command, no traceback.
    proc = start(
        "run", "--workload", "regressions", "--data", tmp_path / "no-such-data",
        "--chunk-by", "chunk", "--formula", "y ~ x1", "--output", tmp_path / "out",
    )  # fmt: skip
    seen: set[int] = set()

    def ended() -> bool:
        seen.update(descendants(proc.pid))
        return proc.poll() is not None

    wait_for("the command to end", ended, 240, interval=0.05)
    stderr = proc.stderr.read()
    assert proc.returncode != 0
    assert "no-such-data" in stderr and "Traceback" not in stderr, stderr
    assert seen, "no cluster process was started while the inputs were checked"
    wait_for("the cluster's processes to exit", lambda: not alive(seen), 10)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, 0)
        raise AssertionError("a process of the run's session outlived it")


def test_an_interrupted_estimate_deletes_its_scratch_output(tmp_path):
    # Tasks still running at the interrupt must not write into the scratch folder once
    # it is deleted. The first unit to start returns at once (its task's part shows the
    # estimate under way); every other one waits for a file the test makes only after
    # the interrupt, so the estimate cannot finish first.
    first, release = tmp_path / "first", tmp_path / "release"
    (tmp_path / "gated.py").write_text(
        textwrap.dedent(f"""\
        import os
        import time


        def f(a):
            try:
                os.close(os.open({str(first)!r}, os.O_CREAT | os.O_EXCL))
            except FileExistsError:
                while not os.path.exists({str(release)!r}):
                    time.sleep(0.01)
            return {{"v": a}}
        """)
    )
    points = ", ".join(map(str, range(60)))
    (tmp_path / "gated.toml").write_text(
        f'workload = "map"\nfunction = "gated:f"\nunits_per_task = 1\n[grid]\na = [{points}]\n'
    )
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    proc = subprocess.Popen(
        [sys.executable, "-m", "pipeline", "estimate", "gated.toml"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
        start_new_session=True, cwd=tmp_path, env={**os.environ, "TMPDIR": str(scratch)},
    )  # fmt: skip
    parts = "pipeline-estimate-*/gated/results/part-*"
    try:
        wait_for("the first unit's part", lambda: list(scratch.glob(parts)), 120)
        proc.send_signal(signal.SIGINT)
        release.touch()  # the waiting units finish now, while the estimate stops
        stderr = proc.communicate(timeout=60)[1]
    finally:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, stderr
    assert stderr.strip().splitlines()[-1] == (
        "interrupted: no estimate; its scratch output is deleted"
    ), stderr
    # Once no process of the command's session is left, nothing can write any more.
    wait_for("the estimate's processes to exit", lambda: not session_alive(proc.pid), 30)
    assert not list(scratch.glob("pipeline-estimate-*")), list(scratch.rglob("*"))
