"""pipeline.torch in real DataLoader loops: CubeStream (cubes built in the loader
workers) and CubeShards (a stored job, local or on S3 (SeaweedFS))."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from support.cube_jobs import cube_digest, shard_file

torch = pytest.importorskip("torch")
from torch.utils.data import DataLoader  # noqa: E402

from pipeline import CubeJob, CubeWorkload, load_jobs, read_shard, run_job, run_jobs  # noqa: E402
from pipeline.errors import InputError, StorageError  # noqa: E402
from pipeline.torch import CubeShards, CubeStream  # noqa: E402


def expected(job: CubeJob) -> dict[int, str]:
    workload = CubeWorkload(job, "cubes", job.frames)
    workload.preflight()
    return {k: cube_digest(workload.cube(k)) for k in range(job.cubes)}


def stream_digests(job: CubeJob, num_workers: int) -> dict[int, str]:
    loader = DataLoader(CubeStream(job, with_ids=True), batch_size=4, num_workers=num_workers)
    got: dict[int, str] = {}
    for ids, cubes in loader:
        assert cubes.shape[1:] == (job.dim,) * 3 and cubes.dtype == torch.float64
        for cube_id, cube in zip(ids.tolist(), cubes, strict=True):
            assert cube_id not in got, f"cube {cube_id} delivered twice"
            got[cube_id] = cube_digest(cube)
    return got


def test_cube_stream_gives_the_same_cubes_whatever_the_loader_workers(frames_dir):
    job = CubeJob(frames=str(frames_dir), cubes=30, dim=10, seed=5)
    want = expected(job)
    assert stream_digests(job, 0) == want
    assert stream_digests(job, 2) == want  # disjoint shares, each cube once
    assert len(CubeStream(job)) == 30


def test_cube_stream_batches_built_in_place_equal_the_cubes(frames_dir):
    job = CubeJob(frames=str(frames_dir), cubes=23, dim=10, seed=5)
    want = expected(job)
    for workers in (0, 2):
        stream = CubeStream(job, with_ids=True, batch_size=4)
        got: dict[int, str] = {}
        batches = []
        for ids, batch in DataLoader(stream, batch_size=None, num_workers=workers):
            batches.append(ids.tolist())
            assert batch.shape[1:] == (10, 10, 10)
            for cube_id, cube in zip(ids.tolist(), batch, strict=True):
                assert cube_id not in got
                got[cube_id] = cube_digest(cube)
        assert got == want
        # len() batches, all full but the last, the same whatever the workers (not each
        # worker's share batched apart: a short batch per worker, more than len())
        assert batches == [list(range(i, min(23, i + 4))) for i in range(0, 23, 4)], batches
    assert len(CubeStream(job, batch_size=4)) == 6
    with pytest.raises(ValueError, match="batch_size=0"):
        CubeStream(job, batch_size=0)
    with pytest.raises(ValueError, match="batch_size='4'; expected an integer"):
        CubeStream(job, batch_size="4")


def test_cube_stream_from_the_cluster_hands_over_shared_memory_batches(frames_dir, client):
    job = CubeJob(frames=str(frames_dir), cubes=22, dim=10, seed=5)
    want = expected(job)
    stream = CubeStream(job, with_ids=True, batch_size=4, cluster=client)
    got: dict[int, str] = {}
    for ids, batch in DataLoader(stream, batch_size=None, num_workers=0):
        assert batch.shape[1:] == (10, 10, 10) and len(batch) <= 4
        for cube_id, cube in zip(ids.tolist(), batch, strict=True):
            assert cube_id not in got
            got[cube_id] = cube_digest(cube)
    assert got == want
    single = {k: cube_digest(c) for k, c in CubeStream(job, with_ids=True, cluster=client)}
    assert single == want
    with pytest.raises(RuntimeError, match="num_workers=0"):
        next(iter(DataLoader(CubeStream(job, cluster=client), num_workers=1)))


def test_cube_stream_without_ids_yields_cube_tensors(frames_dir):
    job = CubeJob(frames=str(frames_dir), cubes=5, dim=6, seed=1, dtype="float32")
    cubes = list(CubeStream(job))
    assert [c.dtype for c in cubes] == [torch.float32] * 5
    assert [cube_digest(c) for c in cubes] == list(expected(job).values())


def test_cube_stream_refuses_bad_frames_before_any_loader_starts(tmp_path):
    with pytest.raises(InputError, match="missing or empty"):
        CubeStream(CubeJob(frames=str(tmp_path / "none"), cubes=3, dim=4))


def stored_job(output, frames_dir, client, **settings):
    cli = {
        "output": str(output),
        "frames": str(frames_dir),
        "cubes": 22,
        "dim": 9,
        "seed": 7,
        "cubes_per_shard": 4,  # the last shard holds 2: its header differs
        "progress": False,
        **settings,
    }
    if client is None:  # a fresh embedded cluster, whose workers see this environment
        (summary,) = run_jobs(load_jobs([], {**cli, "workers": 2}, environ={}), echo=print)
    else:
        (job,) = load_jobs([], cli, environ={})
        summary = run_job(job.build(), job.options, client, echo=lambda m: None)
    assert summary.complete


def test_cube_shards_local_in_a_shuffling_loader_equal_the_stored_cubes(
    tmp_path, frames_dir, client
):
    stored_job(tmp_path, frames_dir, client)
    ds = CubeShards(str(tmp_path), "cubes", verify=True)
    assert len(ds) == 22
    manifest = pd.read_parquet(tmp_path / "cubes" / "manifest.parquet")
    want = {
        int(row.cube_id): cube_digest(read_shard((tmp_path / row.shard).read_bytes())[row.offset])
        for row in manifest.itertuples()
    }
    loader = DataLoader(
        ds, batch_size=5, shuffle=True, num_workers=2, generator=torch.Generator().manual_seed(0)
    )
    seen = sorted(cube_digest(c) for batch in loader for c in batch)
    assert seen == sorted(want.values())
    assert {k: cube_digest(ds[k]) for k in range(22)} == want
    assert cube_digest(ds[-1]) == want[21]
    with pytest.raises(IndexError, match="cube 22 out of range"):
        ds[22]
    # Without a job name: the one job under the output, or the job's own folder.
    for where in (tmp_path, tmp_path / "cubes", f"{tmp_path}/cubes/"):
        found = CubeShards(where)
        assert (found.output.rstrip("/"), found.job, len(found)) == (str(tmp_path), "cubes", 22)


def test_cube_shards_verify_names_a_corrupt_cube(tmp_path, frames_dir, client):
    stored_job(tmp_path, frames_dir, client)
    shard = shard_file(tmp_path, 1)
    data = bytearray(shard.read_bytes())
    data[-8] ^= 0xFF  # the last cube of shard 1 (cube 7)
    shard.write_bytes(bytes(data))
    unchecked = CubeShards(str(tmp_path), "cubes")
    unchecked[7]  # reads without checking
    ds = CubeShards(str(tmp_path), "cubes", verify=True)
    ds[6]
    with pytest.raises(StorageError, match=rf"{shard.name}\[3\] \(cube 7\): checksum"):
        ds[7]


def test_a_cube_changed_in_place_is_read_again_as_stored(tmp_path, frames_dir, client):
    # Each read gets its own cube: an in-place augmentation of one must not be what the
    # next epoch reads (as one mapping of a shard serving every read would make it).
    stored_job(tmp_path, frames_dir, client)
    ds = CubeShards(str(tmp_path), "cubes")
    want = cube_digest(ds[5])
    ds[5].mul_(0).add_(1)
    cube = ds[5]
    assert cube_digest(cube) == want
    assert cube_digest(next(iter(DataLoader(ds, batch_size=1, sampler=[5])))[0]) == want
    with pytest.raises(TypeError, match="a cube's index is an integer, not float"):
        ds[2.7]
    with pytest.raises(TypeError, match="not slice"):
        ds[1:3]
    assert cube_digest(ds[torch.tensor(5)]) == cube_digest(ds[np.int64(5)]) == want
    # A truncated shard is named, with the way to mend it.
    shard = shard_file(tmp_path, 5)
    shard.write_bytes(shard.read_bytes()[:-100])
    fresh = CubeShards(str(tmp_path), "cubes")  # (a shard is mapped when first read)
    with pytest.raises(StorageError, match=rf"{shard.name}: not a whole shard .*--repair"):
        fresh[21]
    assert cube_digest(ds[np.array(5)]) == want


def test_cube_shards_name_a_shard_that_is_not_the_listed_one(tmp_path, frames_dir, client):
    # A shard replaced by another (valid, fewer cubes) or deleted is an error naming it,
    # never an iteration ended early without a word, nor a bare FileNotFoundError.
    stored_job(tmp_path, frames_dir, client)
    last = sorted((tmp_path / "cubes" / "shards").iterdir())[-1]
    one, two = shard_file(tmp_path, 1), shard_file(tmp_path, 2)
    one.write_bytes(last.read_bytes())
    ds = CubeShards(str(tmp_path), "cubes")
    assert sum(1 for _ in zip(range(4), ds, strict=False)) == 4  # shard 0 reads
    with pytest.raises(StorageError, match=rf"{one.name}: holds float64 cubes of shape .* not "
                       r"the 4 float64 cubes of 9\^3 the manifest lists: .*--repair"):  # fmt: skip
        list(ds)
    two.unlink()
    with pytest.raises(StorageError, match=rf"{two.name}: cannot be read .*--repair"):
        CubeShards(str(tmp_path), "cubes")[9]


def test_cube_shards_refuses_an_incomplete_or_absent_job(tmp_path):
    with pytest.raises(InputError, match="no complete cube job 'cubes'"):
        CubeShards(str(tmp_path), "cubes")


@pytest.mark.integration
def test_cube_shards_on_s3_read_by_ranged_gets_equal_the_local_job(
    s3, s3_bucket, tmp_path, frames_dir, client
):
    stored_job(s3_bucket, frames_dir, None, cubes=13)
    local = tmp_path / "local"
    stored_job(local, frames_dir, client, cubes=13)  # the same job, for reference
    want = [cube_digest(c) for c in CubeShards(str(local), "cubes")]
    ds = CubeShards(s3_bucket, "cubes", verify=True)
    assert len(ds) == 13
    loader = DataLoader(ds, batch_size=4, num_workers=2)
    got = [cube_digest(c) for batch in loader for c in batch]
    assert got == want


@pytest.mark.parametrize("dtype, per_layer", [("float64", False), ("float32", True)])
def test_every_cpu_path_yields_the_training_layout_with_the_builders_bytes(
    frames_dir, client, dtype, per_layer
):
    from support.torch_cubes import collect, cpu_cubes, same_bytes

    job = CubeJob(
        frames=str(frames_dir), cubes=13, dim=10, seed=3, dtype=dtype, per_layer_columns=per_layer
    )
    want = cpu_cubes(job)
    for batch_size in (None, 4):
        paths = {  # name: (stream, loader workers)
            "threads": (CubeStream(job, with_ids=True, batch_size=batch_size), 0),
            "loader workers": (CubeStream(job, with_ids=True, batch_size=batch_size), 2),
            "cluster": (
                CubeStream(job, with_ids=True, batch_size=batch_size, cluster=client),
                0,
            ),
        }
        for name, (stream, workers) in paths.items():
            loader = DataLoader(stream, batch_size=None, num_workers=workers)
            items = list(loader)
            # collect checks every item is C-contiguous, (d, d, d) or (n, d, d, d)
            assert same_bytes(collect(items, batch_size is not None), want), (name, batch_size)
            x = items[0][1]
            assert x.dtype == getattr(torch, dtype) and x.shape[-3:] == (10, 10, 10)
            if batch_size is not None:  # what a training loop does with a batch
                assert x.view(len(x), -1).shape == (len(x), 1000), name
            del items, x, loader
    # As built (contiguous=False): Fortran-ordered views, the same cubes
    stream = CubeStream(job, with_ids=True, batch_size=4, contiguous=False)
    ids, batch = next(iter(stream))
    assert not batch.is_contiguous() and batch.stride() == (1000, 1, 10, 100)
    assert all(torch.equal(c, want[k]) for k, c in zip(ids.tolist(), batch, strict=True))
    with pytest.raises(ValueError, match="contiguous='yes'; expected True or False"):
        CubeStream(job, contiguous="yes")
