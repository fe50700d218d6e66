"""A cube task's shards are committed once, whatever runs it twice (issue 47).

As tests/test_commit_once.py for tables' parts: an embedded cluster's worker
processes, the attempts ordered by a gate file (tests/support/cube_jobs.py's GatedCubes: the
gated task's first attempt waits for it, its copy goes straight through), and the
output checked by ``pipeline verify`` as a user runs it.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from support.commit_once import idle, pipeline_command
from support.cube_jobs import GatedCubes, cube_digest, cube_job, load_manifest, run, shard_file
from support.waiting import wait_for

import pipeline.dispatch.stragglers
from pipeline import RunOptions, connect, run_job
from pipeline.dispatch.commit import leftovers
from pipeline.layout import manifest_key, shard_key
from pipeline.storage import LocalStore
from pipeline.torch import CubeShards

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

CUBES = 40  # 5 tasks of 8 cubes, 2 shards of 4 each


def _shards(out: Path) -> dict[str, tuple[int, int, bytes]]:
    """Each listed shard's file: (inode, mtime in ns, bytes)."""
    listed = set(load_manifest(out)["shard"])
    return {k: ((out / k).stat().st_ino, (out / k).stat().st_mtime_ns, (out / k).read_bytes())
            for k in listed}  # fmt: skip


@pytest.mark.parametrize("mode", ["other", "fails"])
def test_a_cube_tasks_original_finishing_after_its_copy_leaves_the_copys_shards(
    tmp_path, frames_dir, monkeypatch, mode
):
    # Task 1's first attempt waits before building its cubes; the run copies it once
    # slow, the copy commits and the run completes; then the original goes on and
    # builds other cubes ("other": a build that is not deterministic) or fails its
    # last shard ("fails"). Either way it loses and removes what it wrote: the shards
    # the entry lists are the copy's, not written over, and verify passes.
    monkeypatch.setattr(pipeline.dispatch.stragglers, "SECONDS", 1.0)
    out, log = tmp_path / "out", tmp_path / "log"
    log.mkdir()
    job = cube_job(out, frames_dir, cubes=CUBES, dim=6, units_per_task=8)
    workload = GatedCubes.of(job.build(), tmp_path / "gate", log, gated=1, mode=mode)
    with connect(RunOptions(workers=2)) as client:
        s = run_job(workload, job.options, client, echo=lambda m: None)
        assert s.complete and s.units_ok == CUBES and not s.failures
        assert workload.ended() == ["again"]  # the copy's; the original still waits
        listed = _shards(out)
        (tmp_path / "gate").touch()
        wait_for("the original attempt to end", lambda: len(workload.ended()) == 2)
        wait_for("the original attempt to finish", lambda: idle(client), timeout=60)
    assert _shards(out) == listed  # not one written over, nor touched
    ok = pipeline_command("verify", str(out))
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "leftovers" not in ok.stdout and "0 extra" in ok.stdout, ok.stdout
    assert leftovers(LocalStore(out), "cubes", set(listed)) == []
    assert {f"cubes/shards/{p.name}" for p in (out / "cubes" / "shards").iterdir()} == set(listed)
    # The cubes read are the job's, each as built alone.
    data = CubeShards(str(out), "cubes", verify=True)
    regenerated = job.build()
    regenerated.preflight()
    for k in range(CUBES):
        assert cube_digest(data[k]) == cube_digest(regenerated.cube(k)), k


def test_a_cube_output_with_unnamed_shards_resumes_and_reads(tmp_path, frames_dir, client):
    # An output as written before shards were named by their attempts (shards
    # NNNNNN.npy, listed so by the entries), interrupted: task 2 wrote shard 4 but
    # not its entry. The run resumes it: task 2 writes shards of its attempt's name,
    # the old shard 4 no entry lists is swept, and every cube reads as a clean run's.
    out = tmp_path / "out"
    job = cube_job(out, frames_dir, cubes=CUBES, dim=6, units_per_task=8)
    assert run(job, client).complete
    entries = out / "cubes" / "manifest"
    for entry in sorted(entries.iterdir()):
        table = pq.read_table(entry)
        keys = table["shard"].to_pylist()
        renamed = {key: _unnamed_shard(out, key) for key in set(keys)}
        shards = [renamed[key] for key in keys]
        column = table.schema.get_field_index("shard")
        pq.write_table(table.set_column(column, "shard", pa.array(shards, pa.string())), entry)
    (out / "cubes" / "manifest.parquet").unlink()
    (out / manifest_key("cubes", 2)).unlink()
    (out / shard_key("cubes", 5)).unlink()
    messages = []
    again = run(job, client, messages)
    assert again.complete and again.units_run == 8 and again.tasks_skipped == 4
    names = sorted(p.name for p in (out / "cubes" / "shards").iterdir())
    assert len(names) == 10 and sum(n.count(".") == 1 for n in names) == 8, names
    assert shard_file(out, 4).exists() and not (out / shard_key("cubes", 4)).exists()
    ok = pipeline_command("verify", str(out))
    assert ok.returncode == 0 and "0 extra" in ok.stdout, ok.stdout + ok.stderr
    clean = tmp_path / "clean"
    assert run(cube_job(clean, frames_dir, cubes=CUBES, dim=6), client).complete
    resumed, fresh = CubeShards(str(out), verify=True), CubeShards(str(clean))
    assert [cube_digest(c) for c in resumed] == [cube_digest(c) for c in fresh]


def _unnamed_shard(out: Path, key: str) -> str:
    """Rename the shard at ``key`` as written before attempts named shards
    (``NNNNNN.npy``); its new key."""
    folder, name = key.rsplit("/", 1)
    new = f"{folder}/{name.split('.')[0]}.npy"
    (out / key).rename(out / new)
    return new
