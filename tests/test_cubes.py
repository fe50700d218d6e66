"""Cube generation on a real embedded cluster: content, determinism, resume, failures."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
import xxhash
from support.cube_jobs import CubesFailingAShard, cube_job, load_manifest, run, shard_file
from support.stored import unnamed

from pipeline import ConfigError, InputError, load_jobs, read_shard, run_job
from pipeline.workloads.cubes import cube_columns


def frames(frames_dir):
    return [pd.read_parquet(p) for p in sorted(frames_dir.glob("*.parquet"))]


@pytest.mark.parametrize("per_layer", [False, True])
def test_cube_content_matches_the_definition(tmp_path, frames_dir, client, per_layer):
    out = tmp_path / "out"
    summary = run(cube_job(out, frames_dir, per_layer_columns=per_layer), client)
    assert summary.complete and summary.units_failed == 0
    manifest = load_manifest(out)
    assert manifest.cube_id.tolist() == list(range(40))
    dfs = frames(frames_dir)
    for row in manifest.itertuples():
        cube = read_shard((out / row.shard).read_bytes())[row.offset]
        assert cube.shape == (10, 10, 10)
        cols = np.asarray(row.columns).reshape((10, 10) if per_layer else (10,))
        assert ((cols >= 1) & (cols < 30)).all()
        for f in range(10):
            layer_cols = cols[f] if per_layer else cols
            assert len(set(layer_cols.tolist())) == 10  # without replacement
            expected = dfs[f].iloc[:10, layer_cols].to_numpy()
            np.testing.assert_array_equal(cube[f], expected)
        assert xxhash.xxh3_64_hexdigest(np.ascontiguousarray(cube.T)) == row.checksum
    if not per_layer:
        # The same columns in every layer, drawn from (seed, cube id) alone.
        np.testing.assert_array_equal(manifest["columns"][5], cube_columns(3, 5, 10, 30, False))


def test_frames_whose_first_column_is_a_date_build_cubes(tmp_path, client):
    # Column 0 is never drawn (a frame's date or index): its type does not matter.
    rng = np.random.default_rng(0)
    folder = tmp_path / "frames"
    folder.mkdir()
    for i in range(10):
        df = pd.DataFrame(
            rng.normal(size=(12, 14)).astype("float32"), columns=list("abcdefghijklmn")
        )
        df.insert(0, "date", pd.date_range("2024-01-01", periods=12))
        df.to_parquet(folder / f"day-{i:02d}.parquet")
    out = tmp_path / "out"
    assert run(cube_job(out, folder, cubes=8), client).complete
    dfs = frames(folder)
    for row in load_manifest(out).itertuples():
        cube = read_shard((out / row.shard).read_bytes())[row.offset]
        expected = [
            dfs[f].iloc[:10, np.asarray(row.columns)].to_numpy("float64") for f in range(10)
        ]
        np.testing.assert_array_equal(cube, np.stack(expected))
    # Elsewhere, a date is still refused, by name.
    df = pd.read_parquet(folder / "day-03.parquet")
    df["c"] = df["date"]
    df.to_parquet(folder / "day-03.parquet")
    with pytest.raises(InputError, match=r"day-03\.parquet: column 'c' has type timestamp"):
        run(cube_job(tmp_path / "out2", folder, cubes=8), client)


def test_a_pandas_index_stored_in_the_frames_is_never_drawn(tmp_path, client, caplog):
    # DataFrame.to_parquet keeps an index that is not a plain range as a last column,
    # __index_level_0__: it is not data, and no cube may draw from it.
    rng = np.random.default_rng(1)
    folder = tmp_path / "frames"
    folder.mkdir()
    for i in range(12):
        df = pd.DataFrame(rng.random((30, 12)), columns=[f"c{j}" for j in range(12)])
        df.index = np.arange(30) * 7 + 1000
        df.to_parquet(folder / f"f{i:03d}.parquet")
    out = tmp_path / "out"
    with caplog.at_level("INFO", logger="pipeline.workloads.cubes"):
        assert run(cube_job(out, folder, dim=11, cubes=50), client).complete
    assert "'__index_level_0__' are not data: left out" in caplog.text
    assert "column 0, 'c0', is not drawn either" in caplog.text
    dfs = frames(folder)  # as pandas reads them back: the index is no column
    for row in load_manifest(out).itertuples():
        cols = np.asarray(row.columns)
        assert ((cols >= 1) & (cols <= 11)).all()
        cube = read_shard((out / row.shard).read_bytes())[row.offset]
        expected = np.stack([dfs[f].iloc[:11, cols].to_numpy() for f in range(11)])
        np.testing.assert_array_equal(cube, expected)
        assert cube.max() < 1
    # Without its index, a frame of 12 columns is too narrow for cubes of 12.
    with pytest.raises(InputError, match=r"has 12 columns besides its pandas index "
                       r"\('__index_level_0__'\); .* needs at least 13"):  # fmt: skip
        run(cube_job(tmp_path / "out2", folder, dim=12), client)


def test_frames_in_subfolders_are_not_the_folders_frames(tmp_path, client, caplog):
    # A folder's frames are its own files: a subfolder's (2023-old/frame-*.parquet
    # sorts ahead of them) must not stand in for them.
    from pipeline.storage import LocalStore
    from pipeline.workloads.cubes.frames import write_frames

    folder = tmp_path / "frames"
    write_frames(LocalStore(folder), "", count=12, rows=30, cols=20, seed=5)
    write_frames(LocalStore(folder / "2023-old"), "", count=12, rows=30, cols=20, seed=6)
    out = tmp_path / "out"
    with caplog.at_level("INFO", logger="pipeline.workloads.cubes"):
        assert run(cube_job(out, folder, cubes=8), client).complete
    assert "the 12 .parquet files in its subfolders (2023-old/) are not frames" in caplog.text
    record = json.loads((out / "cubes" / "job.json").read_text())
    assert record["fingerprint"]["frames"] == [f"frame-{i:05d}.parquet" for i in range(10)]
    # Too few of its own, or none: the subfolder's files are said not to count.
    with pytest.raises(InputError, match=r"has 12 frames; a cube of dimension 13 needs at "
                       r"least 13 \(the 12 \.parquet files in its subfolders \(2023-old/\) "
                       r"are not frames\)"):  # fmt: skip
        run(cube_job(tmp_path / "o2", folder, dim=13), client)
    write_frames(LocalStore(tmp_path / "above" / "2024"), "", count=3, rows=5, cols=6, seed=5)
    with pytest.raises(InputError, match=r"has no \.parquet files of its own \(the 3 "
                       r"\.parquet files in its subfolders \(2024/\) are not frames"):  # fmt: skip
        run(cube_job(tmp_path / "o3", tmp_path / "above", dim=3), client)


def test_frames_in_s3_subfolders_are_not_the_prefixs_frames(s3, s3_bucket):
    from pipeline.storage import open_store
    from pipeline.workloads.cubes.frames import inspect_frames, write_frames

    write_frames(open_store(s3_bucket), "frames", count=3, rows=5, cols=6, seed=1)
    write_frames(open_store(s3_bucket), "frames/2023-old", count=3, rows=5, cols=6, seed=2)
    frames = inspect_frames(f"{s3_bucket}/frames", 3)
    assert frames.keys == ("frame-00000.parquet", "frame-00001.parquet", "frame-00002.parquet")


@pytest.mark.parametrize("sink", ["store", "none"])
def test_the_workers_busy_time_covers_loading_the_frames(tmp_path, frames_dir, client, sink):
    # A task's busy time starts before its frames are loaded: otherwise an input-bound
    # run's cost (worker-seconds) and its workers' busy share come out far too low.
    s = run(cube_job(tmp_path / "out", frames_dir, sink=sink), client)
    assert s.phases["inputs"] > 0
    assert s.busy_seconds >= sum(s.phases.values()) * 0.999 and s.worker_seconds == s.busy_seconds


def test_cube_columns_depend_on_seed_and_cube_id_only():
    expected = {k: cube_columns(3, k, 10, 30, True) for k in range(8)}
    # Whatever was drawn before, on whichever thread.
    with ThreadPoolExecutor(4) as pool:
        got = list(pool.map(lambda k: cube_columns(3, k % 8, 10, 30, True), range(400)))
    for k, cols in enumerate(got):
        np.testing.assert_array_equal(cols, expected[k % 8])
    assert not np.array_equal(cube_columns(4, 0, 10, 30, True), expected[0])
    assert len({cols.tobytes() for cols in expected.values()}) == 8


def test_same_job_twice_gives_identical_bytes_whatever_the_task_sizes(tmp_path, frames_dir, client):
    a, b = tmp_path / "a", tmp_path / "b"
    run(cube_job(a, frames_dir, units_per_task=4), client)
    run(cube_job(b, frames_dir, units_per_task=12), client)
    # Each shard's bytes, and the manifests but for the attempts naming the shards.
    for s in range(10):
        assert shard_file(a, s).read_bytes() == shard_file(b, s).read_bytes()
    assert len(list((a / "cubes" / "shards").iterdir())) == 10
    manifest_a, manifest_b = load_manifest(a), load_manifest(b)
    assert set(manifest_a.shard) != set(manifest_b.shard)  # named by their attempts
    for m in (manifest_a, manifest_b):
        m["shard"] = m["shard"].map(unnamed)
    pd.testing.assert_frame_equal(manifest_a, manifest_b)
    # A different seed gives different cubes.
    c = tmp_path / "c"
    run(cube_job(c, frames_dir, seed=4), client)
    assert shard_file(c, 0).read_bytes() != shard_file(a, 0).read_bytes()


def test_a_cube_regenerated_alone_equals_its_bytes_in_its_shard(tmp_path, frames_dir, client):
    out = tmp_path / "out"
    job = cube_job(out, frames_dir, dtype="float32")
    run(job, client)
    workload = job.build()
    workload.preflight()
    row = load_manifest(out).iloc[29]
    alone = workload.cube(29)
    assert alone.dtype == np.float32
    np.testing.assert_array_equal(alone, read_shard((out / row.shard).read_bytes())[row.offset])
    assert xxhash.xxh3_64_hexdigest(np.ascontiguousarray(alone.T)) == row.checksum


def test_failed_units_are_recorded_and_the_rerun_resumes(tmp_path, frames_dir, client):
    out = tmp_path / "out"
    job = cube_job(out, frames_dir, units_per_task=8)
    # Shard 3 (cubes 12-15, task 1) fails to be written while the file "block" exists.
    blocker = tmp_path / "block"
    blocker.write_text("x")
    failing = CubesFailingAShard.of(job.build(), shard=3, block=blocker)
    first = run_job(failing, job.options, client, echo=lambda m: None)
    assert not first.complete
    assert first.units_run == 40
    assert sorted(f["unit"] for f in first.failures) == [12, 13, 14, 15]
    assert {f["error_type"] for f in first.failures} == {"StorageError"}
    assert "shards/000003.a" in first.failures[0]["message"]
    parts = sorted(p.name for p in (out / "cubes" / "manifest").iterdir())
    assert parts == [f"part-{i:06d}.parquet" for i in (0, 2, 3, 4)]  # task 1 has no entry
    assert not (out / "cubes" / "manifest.parquet").exists()  # incomplete run, no manifest

    blocker.unlink()
    messages = []
    second = run_job(failing, job.options, client, echo=messages.append)
    assert second.complete and second.tasks_skipped == 4 and second.units_run == 8
    assert "resuming: 32 of 40 cubes already complete" in messages

    clean = tmp_path / "clean"
    run(cube_job(clean, frames_dir, units_per_task=8), client)
    resumed, fresh = load_manifest(out), load_manifest(clean)
    for m in (resumed, fresh):
        m["shard"] = m["shard"].map(unnamed)
    pd.testing.assert_frame_equal(resumed, fresh)
    for s in range(10):
        assert shard_file(out, s).read_bytes() == shard_file(clean, s).read_bytes()


def test_complete_job_run_again_skips_everything_and_overwrite_starts_over(
    tmp_path, frames_dir, client
):
    out = tmp_path / "out"
    job = cube_job(out, frames_dir, units_per_task=8)
    run(job, client)
    again = run(job, client)
    assert again.tasks_skipped == 5 and again.units_run == 0 and again.complete
    fresh = cube_job(out, frames_dir, units_per_task=8, overwrite=True)
    messages = []
    over = run(fresh, client, messages)
    assert over.tasks_skipped == 0 and over.units_run == 40
    assert any("--overwrite: removed" in m for m in messages)
    # A size that is not whole shards of 4 is rounded up, and a refusal names the size
    # the user gave, not the rounded one
    (out / "cubes" / "manifest.parquet").unlink()
    with pytest.raises(ConfigError, match=r"--units-per-task 9 \(rounded up to 12, whole groups "
                       r"of 4 units\): .* was planned with 8 units per task"):  # fmt: skip
        run(cube_job(out, frames_dir, units_per_task=9), client)


def test_resume_refuses_an_output_holding_other_settings(tmp_path, frames_dir, client):
    from pipeline import ConfigError

    out = tmp_path / "out"
    run(cube_job(out, frames_dir), client)
    with pytest.raises(ConfigError, match=r"other settings.*dim.*--overwrite"):
        run(cube_job(out, frames_dir, dim=8), client)


def test_resume_refuses_frames_rewritten_since_the_run(tmp_path, frames_dir, client):
    # The same frame names with other values: a resume must refuse them, or the rest of
    # the cubes would come from them beside the first run's from the old ones.
    import shutil

    from pipeline import ConfigError
    from pipeline.storage import LocalStore
    from pipeline.workloads.cubes.frames import write_frames

    frames, out = tmp_path / "frames", tmp_path / "out"
    shutil.copytree(frames_dir, frames)
    run(cube_job(out, frames), client)
    (out / "cubes" / "manifest.parquet").unlink()  # as a run killed before its end
    write_frames(LocalStore(frames), "", count=12, rows=40, cols=30, seed=8, overwrite=True)
    with pytest.raises(ConfigError, match=r"holds job 'cubes' whose input files changed since"):
        run(cube_job(out, frames), client)
    # Other frames, or another dim, change the versions too: the setting is named, and
    # the files are not said to have changed (they have not).
    with pytest.raises(ConfigError, match=r"with other settings \(dim, frames\); use --over"):
        run(cube_job(out, frames, dim=5), client)


def test_a_damaged_index_or_record_is_named_and_the_index_written_again(
    tmp_path, frames_dir, client
):
    # Garbage in manifest.parquet or job.json is an error that names the file, for verify
    # and for a run alike: never a traceback, and never a job taken as complete.
    from pipeline import InputError
    from pipeline.verify import verify_output

    out = tmp_path / "out"
    run(cube_job(out, frames_dir), client)
    index = out / "cubes" / "manifest.parquet"
    good = index.read_bytes()
    index.write_bytes(b"junk\n")
    (check,) = verify_output(str(out))
    assert not check.ok and check.damaged_manifest and check.units_ok == 40
    assert check.corrupt == [f"{index}: not a readable table (Parquet file size is 5 bytes, "
                             "smaller than the minimum file footer (8 bytes))"]  # fmt: skip
    again = run(cube_job(out, frames_dir), client)
    assert again.complete and again.units_run == 0 and index.read_bytes() == good
    shard = shard_file(out, 0)
    shard.write_bytes(b"short")  # np.load: "pickled"
    (check,) = verify_output(str(out))
    assert any(f"{shard.name}: not a readable .npy (it begins b'short', not with numpy's "
               "magic)" in c for c in check.corrupt), check.corrupt  # fmt: skip
    record = out / "cubes" / "job.json"
    record.write_text("{bad")
    with pytest.raises(InputError, match=r"job.json is not a job record \(damaged: Expecting"):
        verify_output(str(out))
    with pytest.raises(InputError, match=r"job.json is not a job record .* --overwrite"):
        run(cube_job(out, frames_dir), client)


def test_a_job_larger_than_its_disks_free_space_fails_before_any_task(tmp_path, frames_dir, client):
    from pipeline import StorageError

    out = tmp_path / "out"
    # 10^11 cubes of 10^3 float64: 800 TB, more than any disk this runs on has free.
    with pytest.raises(StorageError, match=rf"output {out}: 800.0 TB of 100,000,000,000 "
                       r"cubes still to write, [\d,.]+ [kMGT]B free on its disk"):  # fmt: skip
        run(cube_job(out, frames_dir, cubes=10**11), client)
    assert not (out / "cubes").exists()
    assert run(cube_job(out, frames_dir), client).complete  # 320 kB fit


def test_sink_none_builds_everything_and_writes_nothing(tmp_path, frames_dir, client):
    out = tmp_path / "out"
    a = run(cube_job(out, frames_dir, sink="none", cubes=50), client)
    b = run(cube_job(out, frames_dir, sink="none", cubes=50, units_per_task=7), client)
    c = run(cube_job(out, frames_dir, sink="none", cubes=50, seed=9), client)
    assert a.units_run == 50 and a.complete and not out.exists()
    assert a.details["fingerprint"] != c.details["fingerprint"]
    assert a.bytes_written == 0
    # the same however the job is cut into tasks (a digest of the units, not the tasks)
    assert b.details["fingerprint"] == a.details["fingerprint"]


def test_changed_frames_are_reloaded_not_served_from_the_layout_cache(tmp_path, client):
    import os

    from pipeline.storage import LocalStore
    from pipeline.workloads.cubes.frames import write_frames

    frames_dir = tmp_path / "frames"
    write_frames(LocalStore(frames_dir), "", count=10, rows=12, cols=15, seed=1)
    first = run(cube_job(tmp_path / "a", frames_dir, cubes=4), client)
    assert first.complete
    cache = os.environ["PIPELINE_CACHE_DIR"]
    before = set(os.listdir(os.path.join(cache, "layouts")))
    write_frames(LocalStore(frames_dir), "", count=10, rows=12, cols=15, seed=2, overwrite=True)
    run(cube_job(tmp_path / "b", frames_dir, cubes=4), client)
    assert len(set(os.listdir(os.path.join(cache, "layouts"))) - before) >= 1
    row = load_manifest(tmp_path / "b").iloc[0]
    cube = read_shard((tmp_path / "b" / row.shard).read_bytes())[row.offset]
    cols = np.asarray(row["columns"])
    np.testing.assert_array_equal(cube[3], frames(frames_dir)[3].iloc[:10, cols].to_numpy())


def test_iter_cubes_yields_every_cube_once_in_memory(tmp_path, frames_dir, client):
    from pipeline import CubeJob, iter_cubes

    job = CubeJob(frames=str(frames_dir), cubes=30, dim=10, seed=3)
    got = dict(iter_cubes(job, client=client, cubes_per_task=4))
    assert sorted(got) == list(range(30))
    out = tmp_path / "out"
    run(cube_job(out, frames_dir, cubes=30), client)  # the same job written to the store
    for row in load_manifest(out).itertuples():
        stored = read_shard((out / row.shard).read_bytes())[row.offset]
        np.testing.assert_array_equal(got[row.cube_id], stored)
    assert not (tmp_path / "results").exists()


def test_report_and_profile_files(tmp_path, frames_dir):
    import json
    import pstats

    from pipeline import run_jobs

    cli = {
        "output": str(tmp_path / "out"),
        "frames": str(frames_dir),
        "cubes": 12,
        "dim": 10,
        "workers": 1,
        "progress": False,
        "report": str(tmp_path / "report"),
        "profile": str(tmp_path / "driver.prof"),
    }
    (summary,) = run_jobs(load_jobs([], cli, environ={}), echo=lambda m: None)
    data = json.loads((tmp_path / "report" / "cubes-summary.json").read_text())
    assert data["units"] == 12 and data["complete"] and data["units_failed"] == 0
    assert data["units_per_second"] > 0 and data["bytes_written"] == summary.bytes_written > 0
    html = (tmp_path / "report" / "cubes-dask-report.html").read_text()
    assert "Dask Performance Report" in html
    stats = pstats.Stats(str(tmp_path / "driver.prof"))
    assert any(fn == "run_validated_job" for (_file, _line, fn) in stats.stats)  # the run itself


def test_a_frame_set_is_inspected_once_per_version(tmp_path, frames_dir):
    # An epoch's iter_cubes checks the frames again: 100 footers of 1,000 columns are
    # 1.8 s to read, so they are read once per version of the frames.
    import shutil

    from pipeline.workloads.cubes.frames import inspect_frames

    folder = tmp_path / "frames"
    shutil.copytree(frames_dir, folder)
    first = inspect_frames(str(folder), 10)
    assert inspect_frames(str(folder), 10) is first
    # A frame rewritten (another size) is inspected again.
    frame = sorted(folder.glob("*.parquet"))[3]
    pq.write_table(pq.read_table(frame).slice(0, 20), frame)
    again = inspect_frames(str(folder), 10)
    assert again is not first and again.n_rows == 20


def test_a_hosts_layout_read_in_threads_is_the_frames_in_order(tmp_path):
    from pipeline.storage import LocalStore
    from pipeline.workloads.cubes.frames import _read_layout, inspect_frames, write_frames

    write_frames(LocalStore(tmp_path), "", count=12, rows=20, cols=14, seed=4)
    fs = inspect_frames(str(tmp_path), 10)
    threaded = _read_layout(fs, 10, "float64", threads=3)
    np.testing.assert_array_equal(threaded, _read_layout(fs, 10, "float64"))
    # T[c - 1, r, f] = frame_f[r, c]
    f7 = frames(tmp_path)[7]
    np.testing.assert_array_equal(threaded[:, :, 7], f7.iloc[:10, 1:].to_numpy().T)


def test_a_damaged_layout_cache_file_is_built_again(tmp_path, monkeypatch):
    # A damaged cache file (8 bytes changed, truncated) or a cache folder that is a file
    # is detected and built again: never wrong cubes that verify, nor every cube failed.
    from pipeline.storage import LocalStore
    from pipeline.workloads.cubes.frames import inspect_frames, load_layout, write_frames

    monkeypatch.setenv("PIPELINE_CACHE_DIR", str(tmp_path / "cache"))
    write_frames(LocalStore(tmp_path / "frames"), "", count=6, rows=8, cols=9, seed=1)
    frame_set = inspect_frames(str(tmp_path / "frames"), 6)

    def layout() -> np.ndarray:
        load_layout.cache_clear()  # as a fresh process would
        return np.array(load_layout(frame_set, 6, "float64"))

    good = layout()
    (cached,) = (tmp_path / "cache" / "layouts").glob("*.npy")
    damaged = bytearray(cached.read_bytes())
    damaged[-8:] = bytes(8)
    cached.write_bytes(damaged)
    np.testing.assert_array_equal(layout(), good)
    assert cached.read_bytes() != damaged  # written again
    cached.write_bytes(cached.read_bytes()[:200])
    np.testing.assert_array_equal(layout(), good)
    (tmp_path / "a_file").write_text("x")
    monkeypatch.setenv("PIPELINE_CACHE_DIR", str(tmp_path / "a_file"))
    np.testing.assert_array_equal(layout(), good)
