"""iter_cubes: cubes delivered from the workers' shared memory (same host) or as Dask
results (other hosts), checked against cubes regenerated alone, and nothing left
behind when the consumer or a worker is killed with SIGKILL."""

from __future__ import annotations

import contextlib
import gc
import os
import signal
import subprocess
import sys
import textwrap
import time
import warnings
from pathlib import Path

import numpy as np
import pytest
import xxhash
from support.cube_jobs import cube_digest

from pipeline import CubeJob, CubeWorkload, iter_cubes
from pipeline.errors import ConfigError
from pipeline.workloads.cubes.delivery import RelayedThroughSchedulerWarning, local
from pipeline.workloads.cubes.delivery.channel import MEMFD_NAME
from pipeline.workloads.cubes.sharding import Share

ROOT = Path(__file__).resolve().parents[1]


def memfd_mappings(pid: int | str = "self") -> int:
    """Batch buffers mapped by a process (one line per mapping in /proc/PID/maps)."""
    with open(f"/proc/{pid}/maps") as f:
        return sum(f"memfd:{MEMFD_NAME}" in line for line in f)


def memfd_descriptors(pid: int | str = "self") -> int:
    n = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(FileNotFoundError):  # closed while listing
            n += f"memfd:{MEMFD_NAME}" in os.readlink(f"/proc/{pid}/fd/{fd}")
    return n


def shm_files() -> set[str]:
    """Named shared memory (``/dev/shm``): delivery must never leave any. Semaphores
    (``sem.*``) and PyTorch's own segments (``torch_*``) are skipped: other processes on
    the machine (multiprocessing locks, DataLoaders) make and remove them at any time."""
    return {n for n in os.listdir("/dev/shm") if not n.startswith(("sem.", "torch_"))}


def held_by(pid: int) -> int:
    return memfd_mappings(pid) + memfd_descriptors(pid)


def worker_pids(client) -> list[int]:
    return list(client.run(os.getpid).values())


def wait_until_released(pids, timeout=30.0) -> dict[int, int]:
    """Poll until no process in ``pids`` holds a batch buffer; what each still holds."""
    deadline = time.monotonic() + timeout
    while True:
        held = {pid: held_by(pid) for pid in pids if os.path.exists(f"/proc/{pid}")}
        if not any(held.values()) or time.monotonic() > deadline:
            return held
        time.sleep(0.2)


def expected_digests(job: CubeJob) -> dict[int, str]:
    workload = CubeWorkload(job, "cubes", job.frames)
    workload.preflight()
    return {k: xxhash.xxh3_64_hexdigest(workload.cube(k).copy()) for k in range(job.cubes)}


def test_with_no_client_threads_of_this_process_build_the_cubes_in_id_order(frames_dir):
    import threading

    from pipeline.workloads.cubes.delivery import threads

    job = CubeJob(frames=str(frames_dir), cubes=61, dim=10, seed=4)
    want = expected_digests(job)
    got, buffers = {}, set()
    for cube_id, cube in iter_cubes(job):
        got[cube_id] = cube_digest(cube)
        buffers.add(cube.__array_interface__["data"][0])
        assert memfd_mappings() == 0  # no worker, no shared memory
    assert list(got) == list(range(61)) and got == want
    # Reused: those being built, the one being read, and one on its way back.
    assert len(buffers) <= threads.BUFFERS_PER_THREAD * threads.builder_threads() + 1
    kept = list(iter_cubes(job))  # holding every cube: new buffers, not a deadlock
    assert {k: cube_digest(c) for k, c in kept} == want
    cubes = iter_cubes(job)
    next(cubes)
    cubes.close()  # left early: its threads end
    assert not [t for t in threading.enumerate() if t.name.startswith("pipeline-cubes")]


def small_parts_job(frames_dir, monkeypatch, cubes, seed, dtype, per_layer):
    """A job of cubes of 10^3 built in parts of 3 columns, and its workload."""
    from pipeline.workloads.cubes.delivery import parts

    monkeypatch.setattr(parts, "PART_BYTES", 3 * 10 * 10 * np.dtype(dtype).itemsize)
    job = CubeJob(
        frames=str(frames_dir), cubes=cubes, dim=10, seed=seed, dtype=dtype,
        per_layer_columns=per_layer,
    )  # fmt: skip
    workload = CubeWorkload(job, "cubes", job.frames)
    workload.writes_output = False
    workload.preflight()
    return job, workload


def cube_digests(ids, batch, contiguous: bool) -> dict[int, str]:
    """{cube id: digest} of a batch in either layout (axes frame, row, column)."""
    if contiguous:
        assert batch.flags.c_contiguous and batch.shape[0] == len(ids)
    return {k: cube_digest(batch[i] if contiguous else batch[..., i]) for i, k in enumerate(ids)}


@pytest.mark.parametrize(
    "dtype, per_layer, batch_cubes, threads, contiguous",
    [
        ("float64", False, 1, 1, False),
        ("float32", True, 1, 3, False),
        ("float64", False, 4, 2, False),
        ("float64", False, 1, 2, True),
        ("float32", True, 3, 2, True),
        ("float32", False, 4, 3, True),
    ],
)
def test_threads_and_the_waiting_consumer_share_each_cube_part_by_part(
    frames_dir, monkeypatch, dtype, per_layer, batch_cubes, threads, contiguous
):
    from pipeline.workloads.cubes.delivery import threads as builders

    # Every cube is built by whichever threads are free, the consumer among them, in
    # parts that must land in the right columns (or frames, in the training layout).
    job, workload = small_parts_job(frames_dir, monkeypatch, 45, 6, dtype, per_layer)
    got = {}
    plan = Share(45).in_batches(batch_cubes)
    for ids, batch in builders.thread_batches(workload, plan, threads, contiguous=contiguous):
        got.update(cube_digests(ids, batch, contiguous))
    assert list(got) == list(range(45)) and got == expected_digests(job)


class _FailsAtCube(CubeWorkload):
    def columns(self, cube_id):
        if cube_id == 7:
            raise ValueError("column draw failed for cube 7")
        return super().columns(cube_id)


def test_a_cube_that_fails_to_build_raises_in_the_consumer_and_ends_the_threads(frames_dir):
    import threading

    from pipeline.workloads.cubes.delivery import threads as builders

    job = CubeJob(frames=str(frames_dir), cubes=30, dim=10, seed=6)
    workload = _FailsAtCube(job, "cubes", job.frames)
    workload.preflight()
    delivered = []
    with pytest.raises(ValueError, match="cube 7"):
        for ids, _batch in builders.thread_batches(workload, Share(30).in_batches(1), 2):
            delivered.extend(ids)
    assert delivered == list(range(7))
    assert not [t for t in threading.enumerate() if t.name.startswith("pipeline-cubes")]


def test_shared_memory_delivers_every_cube_once_as_views_of_worker_memory(frames_dir, client):
    job = CubeJob(frames=str(frames_dir), cubes=203, dim=10, seed=4)
    want = expected_digests(job)
    got: dict[int, str] = {}
    most_mapped = 0
    for cube_id, cube in iter_cubes(job, client=client, cubes_per_task=4, delivery="shared-memory"):
        assert cube_id not in got
        assert cube.shape == (10, 10, 10) and not cube.flags.owndata
        got[cube_id] = cube_digest(cube)
        most_mapped = max(most_mapped, memfd_mappings())
    assert got == want
    # The cubes lived in the workers' buffers, and no more of them than the
    # producers' slots were ever mapped: memory is bounded by slots, not by cubes.
    assert 1 <= most_mapped <= 2 * local.SLOTS
    del cube
    gc.collect()
    assert memfd_mappings() == 0
    assert wait_until_released(worker_pids(client)) == dict.fromkeys(worker_pids(client), 0)


@pytest.mark.parametrize(
    "dtype, per_layer, batch_cubes, contiguous",
    [
        ("float64", False, 1, False),
        ("float32", True, 3, False),
        ("float64", False, 4, False),
        ("float64", False, 3, True),
        ("float32", True, 2, True),
    ],
)
def test_the_waiting_consumer_builds_the_last_parts_of_the_workers_batches(
    frames_dir, client, monkeypatch, dtype, per_layer, batch_cubes, contiguous
):
    from pipeline.workloads.cubes.delivery import channel, parts

    # The workers get the consumer's part bounds with their task.
    job, workload = small_parts_job(frames_dir, monkeypatch, 120, 8, dtype, per_layer)
    parts.part_layout(workload, contiguous)  # in this host's cache, as a producer leaves it
    address = channel.new_address()
    share = Share(120, (1, 7))  # cubes 1, 8, ..., 113, then cube 0 (padding)
    with channel.listen(address) as listener:
        delivery = local.LocalDelivery(
            client, workload, share.in_batches(batch_cubes), listener, address,
            contiguous=contiguous,
        )  # fmt: skip
        got = {}
        for ids, batch in delivery.batches():
            got.update(cube_digests(ids, batch, contiguous))
            del batch
    want = expected_digests(job)
    assert got == {k: want[k] for k in share} and list(share)[-1] == 0
    assert delivery.parts_built_here > 0


def test_auto_picks_shared_memory_on_this_host_and_dask_gives_the_same_cubes(frames_dir, client):
    job = CubeJob(frames=str(frames_dir), cubes=37, dim=9, seed=2, dtype="float32")
    want = expected_digests(job)
    seen_shared = False
    auto = {}
    for k, cube in iter_cubes(job, client=client, cubes_per_task=5):
        auto[k] = cube_digest(cube)
        seen_shared |= memfd_mappings() > 0
    assert seen_shared and auto == want
    with warnings.catch_warnings():  # the embedded cluster's client relays results
        warnings.simplefilter("ignore", RelayedThroughSchedulerWarning)
        via_dask = {k: cube_digest(c) for k, c in iter_cubes(job, client=client, delivery="dask")}
    assert via_dask == want


def test_dask_delivery_from_its_own_embedded_cluster_does_not_warn_of_a_relay(frames_dir):
    # No warning of results relayed through the scheduler (nor advice of a client with
    # direct_to_workers): the user passed no client, and the cluster is on this host.
    job = CubeJob(frames=str(frames_dir), cubes=6, dim=5, seed=2)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RelayedThroughSchedulerWarning)
        got = {k: cube_digest(c) for k, c in iter_cubes(job, delivery="dask")}
    assert got == expected_digests(job)


def test_with_no_client_the_cluster_is_embedded_whatever_pipeline_scheduler_says(
    frames_dir, monkeypatch
):
    # An exported PIPELINE_SCHEDULER (for runs) must not make the "embedded" cluster of
    # iter_cubes and CubeStream(cluster=True) that remote one, whose workers on other
    # hosts cannot build in this host's memory; PIPELINE_WORKERS, resolved beside it,
    # still sizes the embedded one.
    from distributed import default_client

    monkeypatch.setenv("PIPELINE_SCHEDULER", "tcp://127.0.0.1:9")  # nothing listens there
    monkeypatch.setenv("PIPELINE_WORKERS", "1")
    job = CubeJob(frames=str(frames_dir), cubes=6, dim=5, seed=2)
    got, workers = {}, set()
    for k, c in iter_cubes(job, delivery="shared-memory"):
        got[k] = cube_digest(c)
        workers.add(len(default_client().scheduler_info(n_workers=-1)["workers"]))
    assert got == expected_digests(job)
    assert workers == {1}


def test_a_consumer_that_keeps_every_cube_gets_new_buffers_instead_of_waiting(frames_dir, client):
    # 3 slots per producer would hold 2 x 3 x 2 = 12 cubes: keeping 40 needs more.
    job = CubeJob(frames=str(frames_dir), cubes=40, dim=8, seed=9)
    kept = list(iter_cubes(job, client=client, cubes_per_task=2, delivery="shared-memory"))
    assert {k: cube_digest(c) for k, c in kept} == expected_digests(job)


def test_stopping_early_frees_the_workers(frames_dir, client):
    job = CubeJob(frames=str(frames_dir), cubes=100_000, dim=10, seed=1)
    cubes = iter_cubes(job, client=client, cubes_per_task=4, delivery="shared-memory")
    for n, (_k, cube) in enumerate(cubes):
        float(cube.sum())
        if n == 50:
            break
    cubes.close()
    del cube
    gc.collect()
    assert memfd_mappings() == 0
    pids = worker_pids(client)
    assert wait_until_released(pids) == dict.fromkeys(pids, 0)
    deadline = time.monotonic() + 30
    while any(client.processing().values()) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(client.processing().values()), "producer tasks still running"


def test_bad_delivery_and_batch_size_are_refused(frames_dir, client):
    job = CubeJob(frames=str(frames_dir), cubes=3, dim=5)
    with pytest.raises(ConfigError, match="delivery='fast'"):
        next(iter_cubes(job, client=client, delivery="fast"))
    with pytest.raises(ConfigError, match="cubes_per_task=0"):
        next(iter_cubes(job, client=client, cubes_per_task=0))


# --- real processes: a TLS scheduler behind HAProxy, `dask worker` processes -----


@pytest.fixture(scope="module")
def procs_cluster(tmp_path_factory):
    from harness.cluster_procs import tls_cluster

    tmp = tmp_path_factory.mktemp("delivery-cluster")
    with tls_cluster(tmp, n_workers=2) as cluster:
        yield cluster


CONSUMER = textwrap.dedent(
    """
    import sys, time, warnings
    from distributed import Client
    from harness.cluster_procs import client_security
    from pipeline import CubeJob, iter_cubes

    address, ca, cert, key, frames, delivery, direct, rounds, pause = sys.argv[1:]
    certs = {"ca": ca, "client": cert, "client-key": key}
    warnings.simplefilter("default")
    with Client(address, security=client_security(certs), direct_to_workers=direct == "1") as c:
        for _ in range(int(rounds)):
            job = CubeJob(frames=frames, cubes=400, dim=10, seed=3)
            n = 0
            for k, cube in iter_cubes(job, client=c, cubes_per_task=4, delivery=delivery):
                float(cube.sum())
                n += 1
                if n == 20:
                    print("consuming", flush=True)
                time.sleep(float(pause))
            print("done", n, flush=True)
    """
)


def run_consumer(cluster, frames_dir, delivery, direct="0", rounds=1, pause=0.0, **popen):
    certs = cluster.certs
    argv = [sys.executable, "-c", CONSUMER, cluster.address, certs["ca"], certs["client"]]
    argv += [certs["client-key"], frames_dir, delivery, direct, rounds, pause]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")])}
    return subprocess.Popen([str(a) for a in argv], env=env, text=True, **popen)


@pytest.mark.integration
def test_a_scheduler_killed_mid_iteration_is_one_error_naming_it(tmp_path, frames_dir):
    # One error naming the scheduler, not Dask's tracebacks (CommClosedError...).
    from harness.cluster_procs import tls_cluster

    with tls_cluster(tmp_path, n_workers=1) as cluster:
        consumer = run_consumer(cluster, frames_dir, "dask", pause=0.05,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
        try:
            assert consumer.stdout.readline().strip() == "consuming"
            cluster.scheduler.kill()
            _, err = consumer.communicate(timeout=120)
        finally:
            consumer.kill()
    assert consumer.returncode == 1
    last = err.strip().splitlines()[-1]
    assert last.startswith(
        "pipeline.errors.ClusterError: iter_cubes: lost the connection to the Dask scheduler at"
    ), err[-3000:]
    assert "During handling of the above exception" not in err


@pytest.mark.integration
def test_sigkilled_consumer_leaves_no_memory_behind(procs_cluster, frames_dir):
    shm_before = shm_files()
    with procs_cluster.client() as client:
        pids = worker_pids(client)
        consumer = run_consumer(
            procs_cluster, frames_dir, "shared-memory", pause=0.05, stdout=subprocess.PIPE
        )
        try:
            assert consumer.stdout.readline().strip() == "consuming"
            # The consumer holds buffers, and so do the producers on the workers.
            assert memfd_mappings(consumer.pid) > 0
            assert sum(held_by(pid) for pid in pids) > 0
            consumer.send_signal(signal.SIGKILL)
        finally:
            consumer.kill()
            consumer.wait()
        assert wait_until_released(pids) == dict.fromkeys(pids, 0)
        deadline = time.monotonic() + 30
        while any(client.processing().values()) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(client.processing().values()), "producers outlived their consumer"
    assert shm_files() <= shm_before


@pytest.mark.integration
def test_sigkilled_worker_mid_iteration_loses_no_cube_and_leaves_nothing(procs_cluster, frames_dir):
    job = CubeJob(frames=str(frames_dir), cubes=600, dim=10, seed=6)
    want = expected_digests(job)
    shm_before = shm_files()
    with procs_cluster.client() as client:
        pids = worker_pids(client)
        got: dict[int, str] = {}
        for cube_id, cube in iter_cubes(job, client=client, cubes_per_task=4):
            assert cube_id not in got
            got[cube_id] = cube_digest(cube)
            if len(got) == 40:
                # A worker that runs a producer: it holds buffers (on two cores
                # only one of the two workers does).
                victim = next(pid for pid in pids if held_by(pid))
                (survivor,) = set(pids) - {victim}
                os.kill(victim, signal.SIGKILL)
            time.sleep(0.002)  # slow enough that the kill lands mid-iteration
        assert got == want
        del cube
        gc.collect()
        assert memfd_mappings() == 0
        procs_cluster.wait_for_workers(2)  # the nanny restarted the killed one
        pids = worker_pids(client)
        assert victim not in pids and survivor in pids
        assert wait_until_released(pids) == dict.fromkeys(pids, 0)
    assert shm_files() <= shm_before


@pytest.mark.integration
def test_remote_delivery_warns_once_when_relayed_through_the_scheduler(procs_cluster, frames_dir):
    relayed = run_consumer(
        procs_cluster, frames_dir, "dask", rounds=2, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    out, err = relayed.communicate(timeout=120)
    assert relayed.returncode == 0, err
    assert [line for line in out.splitlines() if line.startswith("done")] == ["done 400"] * 2
    assert err.count("RelayedThroughSchedulerWarning") == 1
    assert "worker -> scheduler -> here" in err
    pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE}
    direct = run_consumer(procs_cluster, frames_dir, "dask", direct="1", **pipes)
    out, err = direct.communicate(timeout=120)
    assert direct.returncode == 0, err
    assert out.splitlines()[-1:] == ["done 400"]
    assert "RelayedThroughSchedulerWarning" not in err


@pytest.mark.integration
def test_remote_delivery_through_the_load_balancer_gives_the_stored_cubes(
    procs_cluster, frames_dir
):
    job = CubeJob(frames=str(frames_dir), cubes=45, dim=7, seed=8)
    with procs_cluster.client(direct_to_workers=True) as client:
        got = {k: cube_digest(c) for k, c in iter_cubes(job, client=client, delivery="dask")}
    assert got == expected_digests(job)
