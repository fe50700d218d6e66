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
from support.torch_cubes import collect, cpu_cubes, needs_cuda, same_bytes  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402

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
def test_the_clusters_batches_reach_the_device_and_each_consumer_takes_the_samplers_share(
    frames_dir, client
):
    from torch.utils.data import DistributedSampler

    job = CubeJob(frames=str(frames_dir), cubes=22, dim=10, seed=5)
    want = cpu_cubes(job)
    stream = CubeStream(job, device="cpu", batch_size=4, cluster=client, with_ids=True)
    assert stream.build == "cpu"
    assert same_bytes(collect(stream, batched=True, device="cpu"), want)
    # The shares consumers take (shard=(i, k)), by shared memory and as Dask results
    # (relayed by the scheduler here, which iter_cubes warns of), in either layout
    for delivery, contiguous in (("shared-memory", True), ("dask", False), ("dask", True)):
        for i in range(3):
            sampler = DistributedSampler(range(22), num_replicas=3, rank=i, shuffle=False)
            batches = iter_cube_batches(
                job, client=client, cubes_per_task=4, delivery=delivery, shard=(i, 3),
                contiguous=contiguous,
            )  # fmt: skip
            got = []
            for ids, batch in batches:
                assert len(ids) <= 4 and batch.flags.c_contiguous == contiguous
                for j, k in enumerate(ids):
                    cube = batch[j] if contiguous else np.ascontiguousarray(batch[..., j])
                    assert torch.equal(torch.from_numpy(cube), want[k]), (delivery, k)
                    got.append(k)
            # every consumer 8 cubes (cube 0 again on consumer 1, 1 on consumer 2)
            assert sorted(got) == sorted(sampler), (delivery, i)
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


def stored(tmp_path, frames_dir, client, **settings) -> CubeJob:
    """A job stored under ``tmp_path``, and the same job to build its cubes from the
    frames: a reference that does not go through the shard reader under test."""
    from pipeline import run_job

    cli = {"output": str(tmp_path), "frames": str(frames_dir), "progress": False, **settings}
    (job,) = load_jobs([], cli, environ={})
    assert run_job(job.build(), job.options, client, echo=lambda m: None).complete
    keep = ("cubes", "dim", "seed", "dtype")
    return CubeJob(frames=str(frames_dir), **{k: v for k, v in settings.items() if k in keep})


def test_stored_shards_read_in_batches_into_reused_buffers(tmp_path, frames_dir, client):
    job = stored(tmp_path, frames_dir, client, cubes=11, dim=9, seed=7, cubes_per_shard=4)
    want = cpu_cubes(job)  # built from the frames
    ds = CubeShards(str(tmp_path), "cubes", verify=True)
    assert all(ds[k].is_contiguous() and torch.equal(ds[k], want[k]) for k in range(11))
    buffers = set()
    seen = []
    for batch in ds.batches(4):
        assert batch.is_contiguous() and batch.shape[1:] == (9, 9, 9)
        assert batch.view(len(batch), -1).shape == (len(batch), 9**3)  # the training layout
        buffers.add(batch.data_ptr())
        seen += list(batch.clone())
    assert len(seen) == 11 and all(torch.equal(a, want[k]) for k, a in enumerate(seen))
    assert len(buffers) <= 2  # the one being read, and the one just dropped
    order = [10, 3, 5, 0, 1, 2, 4, 6, 7, 8, 9]
    got = [c for batch in ds.batches(3, device="cpu", ids=order) for c in batch]
    assert all(torch.equal(c, want[k]) for c, k in zip(got, order, strict=True))
    with pytest.raises(ValueError, match="batch_size=0"):
        ds.batches(0)


def test_stored_shards_in_batches_take_the_ranks_share(tmp_path, frames_dir, client, monkeypatch):
    job = stored(tmp_path, frames_dir, client, cubes=7, dim=6, seed=2, cubes_per_shard=3)
    want = cpu_cubes(job)
    ds = CubeShards(str(tmp_path), "cubes")
    shares = {  # (rank, drop_last): cubes, as DistributedSampler(shuffle=False) shares 7
        (0, False): [0, 2, 4, 6],
        (1, False): [1, 3, 5, 0],  # padded: cube 0 again
        (0, True): [0, 2, 4],
        (1, True): [1, 3, 5],  # cube 6 dropped
    }
    for (rank, drop_last), ids in shares.items():
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "2")
        batches = list(ds.batches(2, device="cpu", drop_last=drop_last))
        assert [len(b) for b in batches] == ([2, 1] if drop_last else [2, 2])
        cubes = [c for batch in batches for c in batch]
        assert len(cubes) == len(ids) and all(
            torch.equal(c, want[k]) for c, k in zip(cubes, ids, strict=True)
        ), (rank, drop_last)


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
    from pipeline.workloads.cubes.sharding import Share

    job = CubeJob(frames=str(frames_dir), cubes=6, dim=10, seed=8)
    workload = CubeWorkload(job, "cubes", job.frames)
    workload.preflight()
    memory = host_memory.HostMemory(torch.device("cuda"))
    for _ids, batch in thread_batches(workload, Share(6).in_batches(2), memory=memory):
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


def test_page_locked_buffers_beyond_the_cap_are_refused_before_any_is_made(frames_dir, monkeypatch):
    from pipeline.workloads.cubes.delivery.threads import thread_batches
    from pipeline.workloads.cubes.sharding import Share

    # A CUDA device is only named here: the check comes before any page-locking call.
    cuda = torch.device("cuda")
    job = CubeJob(frames=str(frames_dir), cubes=600, dim=10, seed=8)  # 8,000 bytes a cube
    workload = CubeWorkload(job, "cubes", job.frames)
    workload.preflight()
    # 15 builders and batches of 256 cubes: two buffers in rotation, not 30
    gib = 1.5 * 256 * 8000 / 2**30  # room for one and a half buffers
    memory = host_memory.HostMemory(cuda, pinned_gib=gib)
    with pytest.raises(ConfigError) as err:
        next(thread_batches(workload, Share(600).in_batches(256), 15, memory=memory))
    assert memory.pinned == 0  # refused before anything was page-locked
    message = str(err.value)
    assert "2 page-locked batch buffers (256 cubes of 10³ float64, 15 builders)" in message
    assert "of 2.0 MiB each would take 3.9 MiB, beyond the page-locked memory limit" in message
    assert f"limit of 2.9 MiB (pinned_gib={gib!r})" in message
    assert "smaller batch_size, dtype='float32'" in message
    # The limit's default: a quarter of the RAM, or PIPELINE_PINNED_GIB
    import psutil

    limit, source = host_memory.pinned_limit()
    assert limit == int(psutil.virtual_memory().total / 4) and "a quarter of" in source
    monkeypatch.setenv("PIPELINE_PINNED_GIB", "0.5")
    assert host_memory.pinned_limit() == (2**29, "PIPELINE_PINNED_GIB='0.5'")
    assert host_memory.pinned_limit(2) == (2 * 2**30, "pinned_gib=2")
    for bad in ("lots", "-1", "inf"):
        monkeypatch.setenv("PIPELINE_PINNED_GIB", bad)
        with pytest.raises(ConfigError, match=f"PIPELINE_PINNED_GIB='{bad}': expected a number"):
            host_memory.HostMemory(cuda)
    with pytest.raises(ConfigError, match=r"pinned_gib=True: expected a number of GiB"):
        CubeStream(job, pinned_gib=True)


@needs_cuda
def test_a_stream_whose_page_locked_buffers_exceed_the_cap_is_refused_naming_them(frames_dir):
    job = CubeJob(frames=str(frames_dir), cubes=40, dim=10, seed=8)
    before = torch.cuda.host_memory_stats().get("allocated_bytes.current", 0)
    stream = CubeStream(job, device="cuda", build="cpu", batch_size=32, pinned_gib=1e-4)
    with pytest.raises(ConfigError, match=r"page-locked batch buffers \(32 cubes of 10³"):
        next(iter(stream))
    assert torch.cuda.host_memory_stats().get("allocated_bytes.current", 0) == before
    # within the cap, the same stream delivers
    capped = CubeStream(job, device="cuda", build="cpu", batch_size=32, pinned_gib=0.01)
    assert sum(len(b) for b in capped) == 40
