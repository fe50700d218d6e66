"""Batches built by CPUs and moved to a device (pipeline.torch.to_device): on the CPU
device here (contiguous in the training layout, off the consumer's thread), on a
GPU where there is one (page-locked, asynchronous); the CPU paths behind it
(threads, loader workers, the cluster's shared memory and Dask results, stored
shards), each delivering every cube of its share once with the CPU builder's bytes."""

from __future__ import annotations

import mmap
import threading

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from torch.utils.data import DataLoader  # noqa: E402
from torch_cubes import collect, cpu_cubes, needs_cuda, same_bytes  # noqa: E402

from pipeline import CubeJob, CubeWorkload, load_jobs, run_jobs  # noqa: E402
from pipeline.errors import ConfigError  # noqa: E402
from pipeline.torch import CubeShards, CubeStream, to_device  # noqa: E402
from pipeline.workloads.cubes import feed, host_memory  # noqa: E402
from pipeline.workloads.cubes.delivery import iter_cube_batches  # noqa: E402


def feeder_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "pipeline-cubes-feed"]


@pytest.mark.parametrize("batch_size, workers", [(None, 0), (4, 0), (5, 2)])
def test_cpu_built_batches_reach_the_device_contiguous_with_the_builders_bytes(
    frames_dir, batch_size, workers
):
    job = CubeJob(frames=str(frames_dir), cubes=21, dim=10, seed=8, dtype="float32")
    stream = CubeStream(job, device="cpu", build="cpu", batch_size=batch_size, with_ids=True)
    loader = DataLoader(stream, batch_size=None, num_workers=workers)
    assert same_bytes(collect(loader, batch_size is not None, "cpu"), cpu_cubes(job))
    assert not feeder_threads()


def test_a_loaders_batches_wrapped_in_to_device_are_the_same_cubes(frames_dir):
    job = CubeJob(frames=str(frames_dir), cubes=13, dim=8, seed=1)
    loader = DataLoader(
        CubeStream(job, batch_size=3, with_ids=True), batch_size=None, num_workers=2
    )
    assert same_bytes(collect(to_device(loader, "cpu"), batched=True, device="cpu"), cpu_cubes(job))


@pytest.mark.filterwarnings(
    "ignore::pipeline.workloads.cubes.delivery.RelayedThroughSchedulerWarning"
)
def test_the_clusters_batches_reach_the_device_and_each_rank_share_is_disjoint(frames_dir, client):
    job = CubeJob(frames=str(frames_dir), cubes=22, dim=10, seed=5)
    want = cpu_cubes(job)
    stream = CubeStream(job, device="cpu", batch_size=4, cluster=client, with_ids=True)
    assert stream.build == "cpu"
    assert same_bytes(collect(stream, batched=True, device="cpu"), want)
    # The shares a rank takes (shard=(i, k)) by shared memory and as Dask results
    # (relayed by the scheduler here, which iter_cubes warns of)
    for delivery in ("shared-memory", "dask"):
        got: dict[int, torch.Tensor] = {}
        for i in range(3):
            batches = iter_cube_batches(
                job, client=client, cubes_per_task=4, delivery=delivery, shard=(i, 3)
            )
            for ids, batch in batches:
                assert all((k // 4) % 3 == i for k in ids)  # batches i, i + 3, ...
                for j, k in enumerate(ids):
                    assert k not in got
                    got[k] = torch.from_numpy(np.ascontiguousarray(batch[..., j]))
        assert same_bytes(got, want), delivery
    for bad in ((2, 2), (0, 0), (1,), (0.5, 2), [0, 2]):
        with pytest.raises(ConfigError, match=r"shard=.*expected \(i, k\), integers"):
            next(iter_cube_batches(job, shard=bad))


def test_to_device_runs_a_bounded_number_of_batches_ahead(frames_dir):
    pulled = []
    far_ahead = threading.Event()

    def source():
        for k in range(40):
            pulled.append(k)
            if len(pulled) > feed.DEPTH + 3:
                far_ahead.set()
            yield torch.full((2, 3, 3, 3), float(k)).permute(0, 3, 2, 1)

    items = to_device(source(), "cpu")
    first = next(items)
    assert first.is_contiguous() and float(first[0, 0, 0, 0]) == 0.0
    # waiting for a feeder that runs ahead: one that is bounded never does
    assert not far_ahead.wait(timeout=1.0), f"pulled {len(pulled)} batches ahead"
    rest = [float(x[0, 0, 0, 0]) for x in items]
    assert rest == [float(k) for k in range(1, 40)]
    assert not feeder_threads()


def test_to_device_raises_a_source_error_in_the_loop_and_stops_early_cleanly():
    closed = threading.Event()

    def failing():
        yield torch.zeros(1, 2, 2, 2)
        raise ValueError("cube 7 failed to build")

    items = to_device(failing(), "cpu")
    assert next(items).shape == (1, 2, 2, 2)
    with pytest.raises(ValueError, match="cube 7 failed to build"):
        next(items)

    def endless():
        try:
            while True:
                yield (7, torch.ones(1, 2, 2, 2))
        finally:
            closed.set()  # the generator ends in the feeder thread

    items = to_device(endless(), "cpu")
    assert next(items)[0] == 7
    items.close()
    assert closed.is_set() and not feeder_threads()
    with pytest.raises(TypeError, match=r"expected CPU tensors .* got ndarray"):
        next(to_device([np.zeros(3)], "cpu"))


def test_stored_shards_read_in_batches_into_reused_buffers(tmp_path, frames_dir, client):
    from pipeline import run_job

    cli = {"output": str(tmp_path), "frames": str(frames_dir), "cubes": 11, "dim": 9, "seed": 7,
           "cubes_per_shard": 4, "progress": False}  # fmt: skip
    (job,) = load_jobs([], cli, environ={})
    assert run_job(job.build(), job.options, client, echo=lambda m: None).complete
    ds = CubeShards(str(tmp_path), "cubes", verify=True)
    want = {k: ds[k].contiguous() for k in range(11)}
    buffers = set()
    seen = []
    for batch in ds.batches(4):
        assert not batch.is_contiguous() and batch.shape[1:] == (9, 9, 9)
        buffers.add(batch.data_ptr())
        seen += [c.contiguous() for c in batch]
    assert all(torch.equal(a, want[k]) for k, a in enumerate(seen))
    assert len(buffers) <= 2  # the one being read, and the one just dropped
    order = [10, 3, 5, 0, 1, 2, 4, 6, 7, 8, 9]
    got = [c for batch in ds.batches(3, device="cpu", ids=order) for c in batch]
    assert all(torch.equal(c, want[k]) for c, k in zip(got, order, strict=True))
    with pytest.raises(ValueError, match="batch_size=0"):
        ds.batches(0)


def test_stored_shards_in_batches_take_the_ranks_share(tmp_path, frames_dir, client, monkeypatch):
    from pipeline import run_job

    cli = {"output": str(tmp_path), "frames": str(frames_dir), "cubes": 7, "dim": 6, "seed": 2,
           "cubes_per_shard": 3, "progress": False}  # fmt: skip
    (job,) = load_jobs([], cli, environ={})
    assert run_job(job.build(), job.options, client, echo=lambda m: None).complete
    ds = CubeShards(str(tmp_path), "cubes")
    got = {}
    for rank in (0, 1):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "2")
        cubes = [c.contiguous() for batch in ds.batches(2, device="cpu") for c in batch]
        got[rank] = cubes
    assert len(got[0]) == 4 and len(got[1]) == 3  # cubes 0, 2, 4, 6 and 1, 3, 5
    assert all(torch.equal(c, ds[2 * i].contiguous()) for i, c in enumerate(got[0]))
    assert all(torch.equal(c, ds[2 * i + 1].contiguous()) for i, c in enumerate(got[1]))


@needs_cuda
@pytest.mark.parametrize("batch_size", [None, 4])
def test_cpu_built_batches_reach_the_gpu_with_the_builders_bytes(frames_dir, client, batch_size):
    job = CubeJob(frames=str(frames_dir), cubes=21, dim=10, seed=8)
    want = cpu_cubes(job)
    batched = batch_size is not None
    threads = CubeStream(job, device="cuda", build="cpu", batch_size=batch_size, with_ids=True)
    assert same_bytes(collect(threads, batched, "cuda"), want)
    cluster = CubeStream(job, device="cuda", batch_size=batch_size, cluster=client, with_ids=True)
    assert same_bytes(collect(cluster, batched, "cuda"), want)
    # pageable batches (loader workers' shared memory) go through page-locked staging
    loader = DataLoader(
        CubeStream(job, batch_size=3, with_ids=True), batch_size=None, num_workers=2
    )
    assert same_bytes(collect(to_device(loader, "cuda"), True, "cuda"), want)


@needs_cuda
def test_threads_build_into_page_locked_buffers_for_a_gpu(frames_dir):
    from pipeline.workloads.cubes.delivery.threads import thread_batches

    job = CubeJob(frames=str(frames_dir), cubes=6, dim=10, seed=8)
    workload = CubeWorkload(job, "cubes", job.frames)
    workload.preflight()
    memory = host_memory.HostMemory(torch.device("cuda"))
    for _ids, batch in thread_batches(workload, 2, memory=memory):
        assert torch.from_numpy(batch).is_pinned()
    region = np.frombuffer(mmap.mmap(-1, 1 << 20), dtype=np.uint8)  # as shared memory is
    memory.register(region)
    assert torch.from_numpy(region).is_pinned()
    memory.close()
    assert not torch.from_numpy(region).is_pinned()


@needs_cuda
def test_stored_shards_read_into_page_locked_buffers_reach_the_gpu(tmp_path, frames_dir):
    cli = {"output": str(tmp_path), "frames": str(frames_dir), "cubes": 9, "dim": 9, "seed": 7,
           "cubes_per_shard": 4, "progress": False, "workers": 2}  # fmt: skip
    (summary,) = run_jobs(load_jobs([], cli, environ={}), echo=lambda m: None)
    assert summary.complete
    ds = CubeShards(str(tmp_path), "cubes")
    got = [c.cpu() for batch in ds.batches(4, device="cuda") for c in batch]
    assert all(torch.equal(c, ds[k].contiguous()) for k, c in enumerate(got))
