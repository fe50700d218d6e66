"""Faults on the embedded cluster: a worker process killed with SIGKILL mid-run."""

from __future__ import annotations

import os
import signal
import threading

import pytest
from support.cube_jobs import cube_job, load_manifest, run
from support.stored import unnamed

from pipeline import RunOptions, connect, run_job


@pytest.mark.slow
def test_worker_killed_mid_run_loses_and_duplicates_nothing(tmp_path, frames_dir, client):
    out, clean = tmp_path / "out", tmp_path / "clean"
    run(cube_job(clean, frames_dir, cubes=1200, units_per_task=4), client)
    with connect(RunOptions(workers=2)) as c:
        job = cube_job(out, frames_dir, cubes=1200, units_per_task=4)
        pids = c.run(os.getpid)
        victim = next(iter(pids.values()))
        manifest_dir = out / "cubes" / "manifest"

        parts_at_kill = []

        def kill_when_started():
            # Kill once a few tasks are complete, while many are still to run.
            while not (manifest_dir.exists() and len(list(manifest_dir.iterdir())) >= 5):
                threading.Event().wait(0.005)
            os.kill(victim, signal.SIGKILL)
            parts_at_kill.append(len(list(manifest_dir.iterdir())))

        killer = threading.Thread(target=kill_when_started, daemon=True)
        killer.start()
        summary = run_job(job.build(), job.options, c, echo=lambda m: None)
        killer.join(5)
        assert not killer.is_alive()
        assert victim not in c.run(os.getpid).values()  # it really died
    assert 5 <= parts_at_kill[0] < 200  # killed mid-run
    assert summary.complete and summary.units_failed == 0
    assert len(list(manifest_dir.iterdir())) == summary.tasks == 300
    # The same cubes (their checksums) in the same shards, whichever attempts wrote them
    killed, fresh = load_manifest(out), load_manifest(clean)
    for manifest in (killed, fresh):
        manifest["shard"] = manifest["shard"].map(unnamed)
    assert killed.equals(fresh)
