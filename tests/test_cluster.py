"""The embedded cluster: single-threaded worker processes with BLAS pinned to one thread."""

from __future__ import annotations

import os
import time

import psutil
import pytest
from support.processes import session_alive
from support.waiting import wait_for

from pipeline import RunOptions, connect
from pipeline.cluster.connect import ClusterStart
from pipeline.cluster.environment import parse_env, process_env, worker_env
from pipeline.errors import ConfigError


def _thread_facts(keys):
    # Runs in a worker process: numpy was imported there after the variables were set.
    import numpy  # noqa: F401
    from threadpoolctl import threadpool_info

    return {
        "env": {k: os.environ.get(k) for k in keys},
        "pools": [(p["internal_api"], p["num_threads"]) for p in threadpool_info()],
        "pid": os.getpid(),
    }


def test_workers_are_processes_with_one_thread_and_pinned_blas(client):
    info = client.scheduler_info()["workers"]
    assert len(info) == 2
    assert all(w["nthreads"] == 1 for w in info.values())
    # The embedded workers' environment is worker.env's native-library variables: the
    # thread pinning among them.
    pinned = {"MKL_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
    assert pinned.items() <= process_env().items()
    facts = client.run(_thread_facts, list(process_env()))
    assert len({f["pid"] for f in facts.values()} | {os.getpid()}) == 3  # real processes
    for f in facts.values():
        assert f["env"] == process_env()
        assert f["pools"], "threadpoolctl found no BLAS/OpenMP pool to check"
        assert all(n == 1 for _api, n in f["pools"]), f["pools"]


def test_the_embedded_workers_take_the_native_library_variables_of_worker_env():
    env = worker_env()
    assert process_env() == {k: env[k] for k in env if not k.startswith(("DASK_", "PIPELINE_"))}
    assert set(process_env()) == {
        "MKL_NUM_THREADS", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS",
        "MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_",
    }  # fmt: skip
    # Package data: where an installed pipeline finds it.
    import tomllib
    from pathlib import Path

    pyproject = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())
    assert "cluster/worker.env" in pyproject["tool"]["setuptools"]["package-data"]["pipeline"]


@pytest.mark.parametrize(
    "line",
    ['A="1"', "A='1'", "A=1 # one", "A=", "1A=1", "A B=1", "export A=1", "A=1\nA=2"],
)
def test_worker_env_refuses_what_another_reader_would_read_otherwise(line):
    assert parse_env("# a comment\n\nB=2\n") == {"B": "2"}
    with pytest.raises(ValueError, match=r"worker\.env line \d"):
        parse_env(line)


def test_default_worker_count_is_the_core_count():
    with connect(RunOptions()) as c:
        assert len(c.scheduler_info()["workers"]) == os.cpu_count()


def test_scheduler_option_connects_to_an_existing_cluster(client):
    address = client.scheduler.address
    with connect(RunOptions(scheduler=address)) as other:
        assert other.scheduler.address == address
        assert other.submit(sum, [1, 2]).result() == 3


def test_plaintext_scheduler_beyond_loopback_is_refused_before_connecting():
    import pytest

    from pipeline import ClusterError

    # Refused by the driver itself: no packet is sent to the address.
    with (
        pytest.raises(
            ClusterError,
            match=r"tcp://192\.0\.2\.1:8786: plaintext connections "
            r"beyond loopback are refused; use tls://",
        ),
        connect(RunOptions(scheduler="tcp://192.0.2.1:8786")),
    ):
        pass


@pytest.mark.parametrize("address", ["junk", "tls://junk"])
def test_a_scheduler_address_without_a_port_is_named_before_connecting(address):
    """It was a traceback of Dask's ValueError."""
    from pipeline import ClusterError

    with (
        pytest.raises(
            ClusterError,
            match=rf"^--scheduler {address}: missing port number in "
            r"address 'junk'; expected tls://HOST:PORT",
        ),  # fmt: skip
        connect(RunOptions(scheduler=address)),
    ):
        pass


def test_partial_tls_settings_name_what_is_missing(tmp_path):
    import pytest

    from pipeline import ClusterError

    none = RunOptions(scheduler="tls://127.0.0.1:1")
    with (
        pytest.raises(ClusterError, match=r"tls://127.0.0.1:1: TLS needs --tls-ca-file, --tls-"),
        connect(none),
    ):
        pass
    partial = RunOptions(scheduler="tls://127.0.0.1:1", tls_ca_file="ca.pem")
    needs = r"TLS needs --tls-cert, --tls-key too"
    with pytest.raises(ClusterError, match=needs), connect(partial):
        pass
    with (
        pytest.raises(ClusterError, match=r"tls_cert points at a missing file"),
        connect(
            RunOptions(
                scheduler="tls://127.0.0.1:1",
                tls_ca_file=__file__,
                tls_cert=str(tmp_path / "none.pem"),
                tls_key=__file__,
            )
        ),
    ):
        pass


def _profiler_on(dask_worker) -> bool:
    return "profile" in dask_worker.periodic_callbacks


def test_the_workers_profiler_runs_only_for_a_report_or_the_dashboard(client, tmp_path):
    # Dask's statistical profiler takes the GIL from the task every 10 ms: about 4 %
    # of a regressions run. The performance report and dashboard show what it gathers.
    assert not any(client.run(_profiler_on).values())
    with connect(RunOptions(workers=1, report=str(tmp_path))) as c:
        assert all(c.run(_profiler_on).values())


def _background_ms(dask_worker=None, dask_scheduler=None):
    server = dask_worker or dask_scheduler
    return {k: server.periodic_callbacks[k].callback_time for k in ("tick", "monitor")}


def test_the_embedded_cluster_keeps_its_background_work_low(client, tmp_path):
    # The embedded cluster shares the driver's cores; Dask's defaults (a tick every
    # 20 ms, a system monitor every 0.5 s, in every server) kept an idle driver at
    # 5.8% of a core. The report's plots need the monitor at its own pace.
    quiet = {"tick": 500, "monitor": 5000}
    assert list(client.run(_background_ms).values()) == [quiet, quiet]
    assert client.run_on_scheduler(_background_ms) == quiet
    with connect(RunOptions(workers=1, report=str(tmp_path))) as c:
        assert c.run_on_scheduler(_background_ms) == {"tick": 500, "monitor": 500}


@pytest.mark.parametrize("start", [connect, ClusterStart])
def test_more_workers_than_this_machine_holds_are_refused_before_any_starts(start):
    # --workers 960 meant for a fleet started 960 processes on 2 cores.
    before = set(psutil.Process().children(recursive=True))
    refused = r"workers = 960 \(--workers, PIPELINE_WORKERS\).*at most \d+ here.*--fleet"
    with pytest.raises(ConfigError, match=refused), start(RunOptions(workers=960)):
        pass
    assert set(psutil.Process().children(recursive=True)) <= before


def test_semaphores_of_a_run_killed_whole_are_swept_by_the_next():
    # A process group killed with SIGKILL (a container stop) takes multiprocessing's
    # resource tracker with it, and the nannies' semaphores stayed in /dev/shm.
    import signal
    import subprocess
    import sys
    from pathlib import Path

    from pipeline.cluster.embedded import sweep_stale_semaphores

    script = (
        "import multiprocessing, time\n"
        "lock = multiprocessing.get_context('spawn').Lock()\n"
        "print(lock._semlock.name, flush=True)\n"
        "time.sleep(120)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                            start_new_session=True)  # fmt: skip
    try:
        path = Path("/dev/shm") / f"sem.{proc.stdout.readline().strip().lstrip('/')}"
        assert path.exists()
        long_ago = time.time() - 3600
        os.utime(path, (long_ago, long_ago))
        sweep_stale_semaphores()
        assert path.exists()  # in use: a live process maps it
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    wait_for("the killed session's processes to exit", lambda: not session_alive(proc.pid), 30)
    assert path.exists()  # left behind: its tracker was killed too
    assert sweep_stale_semaphores() >= 1
    assert not path.exists()
