"""Cubes built on a device (pipeline.workloads.cubes.gather): the same torch code runs
on the CPU here and on a GPU where there is one, and its cubes must be the CPU
builder's bytes; columns drawn ahead (draws), errors, the memory check, and the
shares of ranks and loader workers (sharding), with a real gloo process group."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import xxhash

torch = pytest.importorskip("torch")
from support.torch_cubes import CUDA, collect, cpu_cubes, needs_cuda, same_bytes  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402

from pipeline import CubeJob, CubeWorkload  # noqa: E402
from pipeline.errors import ConfigError, PipelineError  # noqa: E402
from pipeline.torch import CubeStream  # noqa: E402
from pipeline.workloads.cubes import draws, gather, sharding  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def wide_frames(tmp_path_factory) -> Path:
    """100 frames of 100 x 130: cubes of d = 100."""
    from pipeline.storage import LocalStore
    from pipeline.workloads.cubes.frames import write_frames

    path = tmp_path_factory.mktemp("wide-frames")
    write_frames(LocalStore(path), "", count=100, rows=100, cols=130, seed=3)
    return path


@pytest.mark.parametrize(
    "dtype, per_layer, batch_size",
    [
        ("float64", False, 4),  # 23 cubes: a last batch of 3
        ("float32", False, 7),
        ("float64", True, 5),
        ("float32", True, None),
        ("float64", False, None),
    ],
)
def test_cubes_gathered_by_torch_on_the_cpu_are_the_cpu_builders_bytes(
    frames_dir, dtype, per_layer, batch_size
):
    job = CubeJob(
        frames=str(frames_dir), cubes=23, dim=10, seed=5, dtype=dtype, per_layer_columns=per_layer
    )
    stream = CubeStream(job, device="cpu", batch_size=batch_size, with_ids=True)
    got = collect(stream, batched=batch_size is not None)
    assert same_bytes(got, cpu_cubes(job))
    assert got[0].dtype == getattr(torch, dtype) and got[0].shape == (10, 10, 10)
    # without ids: the batches themselves, contiguous (n, d, d, d)
    first = next(iter(CubeStream(job, device="cpu", batch_size=batch_size)))
    assert first.is_contiguous() and first.shape[-3:] == (10, 10, 10)


def test_both_gathers_give_the_same_bytes_at_d_100(wide_frames):
    for dtype in ("float64", "float32"):
        job = CubeJob(frames=str(wide_frames), cubes=5, dim=100, seed=11, dtype=dtype)
        workload = CubeWorkload(job, "cubes", job.frames)
        workload.preflight()
        want = cpu_cubes(job)
        for how in gather.GATHERS:
            plan = [range(0, 3), range(3, 5)]
            cpu = torch.device("cpu")
            got = {}
            for ids, batch in gather.device_batches(workload, cpu, plan, 3, how):
                assert batch.is_contiguous() and batch.shape == (len(ids), 100, 100, 100)
                got.update(zip(ids, batch, strict=True))
            assert same_bytes(got, want), (dtype, how)


def test_the_device_builder_asks_for_a_bounded_number_of_batches_ahead(frames_dir):
    job = CubeJob(frames=str(frames_dir), cubes=40, dim=6, seed=3)
    workload = CubeWorkload(job, "cubes", job.frames)
    workload.preflight()
    asked = []

    def plan():
        for start in range(0, 40, 4):
            asked.append(start)
            yield range(start, start + 4)

    batches = gather.device_batches(workload, torch.device("cpu"), plan(), 4)
    held = [next(batches) for _ in range(2)]
    assert len(asked) <= 4  # the two taken, and two being drawn
    assert [list(ids) for ids, _ in held] == [list(range(4)), list(range(4, 8))]
    assert sum(1 for _ in batches) == 8 and len(asked) == 10


def test_the_same_cubes_whatever_the_batch_size_and_loader_workers(frames_dir):
    job = CubeJob(frames=str(frames_dir), cubes=19, dim=9, seed=2)
    want = cpu_cubes(job)
    for batch_size in (None, 1, 6):
        for workers in (0, 2):
            stream = CubeStream(job, device="cpu", batch_size=batch_size, with_ids=True)
            loader = DataLoader(stream, batch_size=None, num_workers=workers)
            got = collect(loader, batched=batch_size is not None)
            assert same_bytes(got, want), (batch_size, workers)


def test_columns_drawn_ahead_are_bounded_and_equal_the_builders(frames_dir):
    asked = []

    def batches():
        for start in range(0, 40, 4):
            asked.append(start)
            yield range(start, start + 4)

    with draws.ColumnDraws(3, 10, 30, False, batches(), ahead=2) as drawn:
        assert len(asked) == 2  # drawn ahead: two batches, no more
        ids, columns = next(drawn)
        assert len(asked) == 3 and drawn.in_flight == 2
        from pipeline.workloads.cubes import cube_columns

        assert columns.dtype == np.int64 and columns.shape == (4, 10)
        want = np.stack([cube_columns(3, k, 10, 30, False) for k in ids]) - 1
        np.testing.assert_array_equal(columns, want)
        assert sum(1 for _ in drawn) == 9  # the rest, in order
    assert asked == list(range(0, 40, 4))


def test_columns_per_layer_drawn_by_fresh_processes_equal_the_threads(frames_dir):
    plan = [range(i, i + 3) for i in range(0, 12, 3)]
    with draws.ColumnDraws(9, 10, 30, True, plan) as by_thread:
        want = [columns for _ids, columns in by_thread]
    with draws.ColumnDraws(9, 10, 30, True, plan, processes=2) as by_processes:
        got = [columns for _ids, columns in by_processes]
    assert len(got) == 4 and all(np.array_equal(a, b) for a, b in zip(got, want, strict=True))
    # a draw that fails in a process is raised here, with numpy's own message
    failing = draws.ColumnDraws(9, 10, 5, False, [range(2)], processes=1)
    with failing, pytest.raises(ValueError, match="larger sample than population"):
        next(failing)


def test_draws_run_in_processes_only_for_jobs_with_seconds_of_draws():
    assert draws.draw_processes(False, 1000, 100) == 0  # 8 ms of draws: one thread
    assert draws.draw_processes(True, 100, 100) == 0  # 80 ms
    assert 1 <= draws.draw_processes(False, 10**7, 100) <= draws.SHARED_PROCESSES
    assert 1 <= draws.draw_processes(True, 10**6, 100) <= draws.MAX_PROCESSES


def test_a_device_that_cannot_be_used_is_refused_by_name(frames_dir):
    job = CubeJob(frames=str(frames_dir), cubes=3, dim=4)
    with pytest.raises(ConfigError, match=r"device='gpu0'; expected 'cuda', 'cuda:N' or 'cpu'"):
        CubeStream(job, device="gpu0")
    with pytest.raises(ConfigError, match="only 'cuda' and 'cpu' are supported"):
        CubeStream(job, device="meta")
    with pytest.raises(ConfigError, match="device=3"):
        CubeStream(job, device=3)
    with pytest.raises(ConfigError, match=r"build='gpu'; expected one of \('device', 'cpu'\)"):
        CubeStream(job, device="cpu", build="gpu")
    with pytest.raises(ConfigError, match="build='cpu' needs device="):
        CubeStream(job, build="cpu")
    with pytest.raises(ConfigError, match="cluster= builds the cubes on the cluster's CPUs"):
        CubeStream(job, device="cpu", build="device", cluster=True)
    assert CubeStream(job, device="cpu", cluster=True).build == "cpu"
    assert CubeStream(job, device="cpu").build == "device"
    if not CUDA:
        with pytest.raises(ConfigError, match=r"device='cuda', but CUDA is not available"):
            CubeStream(job, device="cuda")
        with pytest.raises(ConfigError, match=r"device='cuda:1', but CUDA is not available"):
            CubeStream(job, device="cuda:1")


def test_frames_too_large_for_the_device_are_refused_naming_both_sizes():
    gather.check_fits(80 << 20, 3 * (256 << 20), 1 << 30, "cuda:0")  # fits
    with pytest.raises(ConfigError) as err:
        gather.check_fits(80 << 20, 768 << 20, 50 << 20, "cuda:0", total_bytes=141 << 30)
    message = str(err.value)
    assert "frames take 80.0 MiB on cuda:0" in message
    assert "3 batches of cubes 768.0 MiB" in message
    assert "cuda:0 has 50.0 MiB free (of 141.00 GiB)" in message
    assert "build='cpu'" in message


@pytest.mark.parametrize("drop_last", [False, True])
def test_a_ranks_share_is_the_distributed_samplers_and_its_workers_split_it(drop_last):
    from torch.utils.data import DistributedSampler

    for n in (1, 2, 5, 17, 22, 50):
        for world in (1, 2, 3, 4):
            for rank in range(world):
                sampler = DistributedSampler(
                    range(n), num_replicas=world, rank=rank, shuffle=False, drop_last=drop_last
                )
                want = list(sampler)
                share = sharding.Share(n, (rank, world), drop_last)
                assert list(share) == want, (n, world, rank)
                assert len(share) == (n // world if drop_last else -(-n // world))
                for b in (1, 3, 8):
                    batches = [list(ids) for ids in share.in_batches(b)]
                    assert [k for ids in batches for k in ids] == want
                    assert all(len(ids) == b for ids in batches[:-1])
                for workers in (2, 3):  # loader workers: each cube of the share once
                    split = [k for w in range(workers) for k in share.every(w, workers)]
                    assert sorted(split) == sorted(want)


def test_the_rank_comes_from_the_process_group_or_torchruns_variables(monkeypatch):
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "3")
    assert sharding.distributed_rank() == (1, 3)
    assert list(sharding.Share.of_rank(8)) == [1, 4, 7]
    assert list(sharding.Share.of_rank(8, drop_last=True)) == [1, 4]
    for rank, world in (("2", "2"), ("x", "2"), ("0", "0")):
        monkeypatch.setenv("RANK", rank)
        monkeypatch.setenv("WORLD_SIZE", world)
        with pytest.raises(ConfigError, match=r"RANK=.*WORLD_SIZE="):
            sharding.distributed_rank()
    monkeypatch.delenv("RANK")
    monkeypatch.delenv("WORLD_SIZE")
    assert sharding.distributed_rank() == (0, 1)


#: 17 cubes: 17 % 2 == 1 and 17 % 3 == 2, so two and three ranks pad and drop.
GLOO_JOB = {"cubes": 17, "dim": 8, "seed": 4}


@pytest.fixture(scope="module")
def stored_cubes(tmp_path_factory, frames_dir, client):
    """A stored job of the gloo test's cubes (for CubeShards.batches)."""
    from pipeline import load_jobs, run_job

    output = tmp_path_factory.mktemp("ddp-stored")
    cli = {"output": str(output), "frames": str(frames_dir), "progress": False,
           "cubes_per_shard": 4, **GLOO_JOB}  # fmt: skip
    (job,) = load_jobs([], cli, environ={})
    assert run_job(job.build(), job.options, client, echo=lambda m: None).complete
    return output


@pytest.mark.slow
@pytest.mark.timeout(600)  # 90-150 s on the shared 2-core VM: ranks start clusters
@pytest.mark.parametrize("world", [2, 3])
def test_ranks_of_a_gloo_process_group_take_the_samplers_share_on_every_path(
    frames_dir, stored_cubes, tmp_path, world
):
    import os
    import subprocess

    from torch.utils.data import DistributedSampler

    job = dict(frames=str(frames_dir), **GLOO_JOB)
    script = ROOT / "tests" / "support" / "distributed_cubes.py"
    args = [sys.executable, str(script), str(world), json.dumps(job), str(stored_cubes)]
    env = {**os.environ, "PIPELINE_WORKERS": "1"}  # each rank's embedded cluster
    done = subprocess.run(
        [*args, str(tmp_path)], capture_output=True, text=True, timeout=560, env=env
    )
    assert done.returncode == 0, done.stdout + done.stderr[-5000:]
    want = {k: xxhash.xxh3_64_hexdigest(c.numpy()) for k, c in cpu_cubes(CubeJob(**job)).items()}
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(world)]
    for case in ranks[0]:
        drop_last = case.endswith("drop_last")
        for rank, report in enumerate(ranks):
            got = report[case]
            sampler = DistributedSampler(
                range(17), num_replicas=world, rank=rank, shuffle=False, drop_last=drop_last
            )
            expected = list(sampler)  # ceil(17 / world) cubes, or floor with drop_last
            ids = expected if got["ids"] is None else got["ids"]
            order = (lambda x: x) if got["ordered"] else sorted
            assert order(ids) == order(expected), (case, rank)
            assert got["digests"] == [want[k] for k in ids], (case, rank)
            assert got["contiguous"], (case, rank)
            if got["len"] is not None:
                assert got["len"] == got["items"], (case, rank)
        assert len({r[case]["items"] for r in ranks}) == 1, case  # the same steps


@needs_cuda
@pytest.mark.parametrize("dtype, per_layer", [("float64", False), ("float32", True)])
def test_cubes_gathered_on_the_gpu_are_the_cpu_builders_bytes(frames_dir, dtype, per_layer):
    job = CubeJob(
        frames=str(frames_dir), cubes=23, dim=10, seed=5, dtype=dtype, per_layer_columns=per_layer
    )
    for batch_size in (None, 4):
        stream = CubeStream(job, device="cuda", batch_size=batch_size, with_ids=True)
        items = [(ids, x) for ids, x in stream]
        assert all(x.device.type == "cuda" for _ids, x in items)
        assert same_bytes(collect(items, batched=batch_size is not None), cpu_cubes(job))


@needs_cuda
def test_a_rank_without_gpu_memory_for_the_frames_is_refused(frames_dir):
    free, _total = torch.cuda.mem_get_info()
    job = CubeJob(frames=str(frames_dir), cubes=3, dim=10)
    # a batch larger than the GPU's free memory: refused before anything is allocated
    huge = free // (10**3 * 8) + 1
    with pytest.raises(ConfigError, match="free"):
        next(iter(CubeStream(job, device="cuda", batch_size=huge)))


def test_a_draw_process_that_dies_is_one_error_naming_it():
    from pipeline.workloads.cubes import cube_columns

    proc = draws._DrawProcess()
    try:
        columns = proc.submit(1, [0], 10, 30, False)()
        np.testing.assert_array_equal(columns[0] + 1, cube_columns(1, 0, 10, 30, False))
        proc.proc.kill()
        proc.proc.wait()
        with pytest.raises(PipelineError, match=r"drawing cube columns \(pid \d+\) ended"):
            proc.submit(1, [1], 10, 30, False)()
    finally:
        proc.close()
