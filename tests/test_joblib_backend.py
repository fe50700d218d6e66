"""The ``pipeline`` joblib backend on a real embedded cluster (two worker processes,
shared by the module): joblib's own expectations (its test_parallel.py: ordering,
exceptions, generators, nesting, a Parallel reused, an exhausted iterator, large numpy
arguments) and the runner's (a worker killed mid-call)."""

from __future__ import annotations

import functools
import multiprocessing
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import joblib
import numpy as np
import pytest
from joblib import Parallel, delayed
from support.waiting import wait_for

import pipeline
from pipeline.joblib import PipelineBackend, close_sessions
from pipeline.joblib.calls import RemoteTraceback

WORKERS = 2


@pytest.fixture(scope="module", autouse=True)
def pipeline_backend():
    with joblib.parallel_config(backend="pipeline", workers=WORKERS):
        yield
    close_sessions()


def square(x):
    return x * x


def add(x, y=0, *, z=0):
    return x + y + z


def raise_on(x, bad):
    if x == bad:
        raise KeyError(f"bad value {x}")
    return x


class TwoArgumentError(Exception):
    """Pickles, but does not load back: its __init__ wants more than its args."""

    def __init__(self, message, code):
        super().__init__(message)
        self.code = code


def raise_two_argument_error(x):
    raise TwoArgumentError(f"bad value {x}", 3)


def slow_square(x, seconds):
    time.sleep(seconds)
    return x * x


def backend_name(_):
    """The backend a Parallel inside a call would get, and the process it runs in."""
    backend, _n = joblib.parallel.get_active_backend()
    return type(backend).__name__, os.getpid()


def library_function(values):
    """A library that calls joblib itself (as scikit-learn does), used inside a call."""
    return sum(Parallel(n_jobs=2)(delayed(square)(v) for v in values))


def record(folder, index, seconds):
    """One file per attempt of call ``index``: its pid, and "done" once it finished."""
    path = Path(folder) / f"{index}-{os.getpid()}-{time.monotonic_ns()}"
    path.write_text("running")
    time.sleep(seconds)
    path.write_text("done")
    return index


# -- joblib's expectations -------------------------------------------------------------


def test_registered_under_its_name():
    backend, _n_jobs = joblib.parallel.get_active_backend()
    assert isinstance(backend, PipelineBackend)
    assert joblib.effective_n_jobs(-1) == WORKERS
    assert joblib.effective_n_jobs(-2) == 2  # (not 1: joblib would run it in the driver)
    assert joblib.effective_n_jobs(3) == 3


@pytest.mark.parametrize("n_jobs", [1, 2, -1])
def test_results_in_input_order(n_jobs):
    assert Parallel(n_jobs=n_jobs)(delayed(square)(i) for i in range(100)) == [
        i * i for i in range(100)
    ]


def test_args_kwargs_and_partials():
    calls = [delayed(add)(1, 2, z=3), delayed(functools.partial(add, y=5))(1), delayed(len)("ab")]
    assert Parallel(n_jobs=2)(calls) == [6, 6, 2]


def test_calls_of_unequal_length_finish_in_order():
    times = [0.3, 0.0, 0.2, 0.0, 0.1, 0.0]
    out = Parallel(n_jobs=2, batch_size=1)(delayed(slow_square)(i, s) for i, s in enumerate(times))
    assert out == [i * i for i in range(len(times))]


@pytest.mark.parametrize("return_as", ["generator", "generator_unordered"])
def test_generators(return_as):
    out = Parallel(n_jobs=2, return_as=return_as)(delayed(square)(i) for i in range(50))
    assert not isinstance(out, list)
    got = list(out)
    expected = [i * i for i in range(50)]
    assert (got if return_as == "generator" else sorted(got)) == expected


def test_exception_type_and_remote_traceback():
    with pytest.raises(KeyError, match="bad value 7") as info:
        Parallel(n_jobs=2)(delayed(raise_on)(i, 7) for i in range(20))
    cause = info.value.__cause__
    assert isinstance(cause, RemoteTraceback)
    assert "raise_on" in cause.text and "KeyError" in cause.text


def test_an_exception_that_does_not_load_back_is_told_with_its_traceback():
    """It was a TypeError of its __init__'s missing argument, raised as the driver
    loaded it: the call's error and the worker's traceback were lost."""
    told = (r"^TwoArgumentError: bad value \d \(raised on the worker; the exception itself "
            r"does not pickle and load back: TypeError: .*__init__\(\) missing")  # fmt: skip
    with pytest.raises(RuntimeError, match=told) as info:
        Parallel(n_jobs=2)(delayed(raise_two_argument_error)(i) for i in range(4))
    assert "raise_two_argument_error" in info.value.__cause__.text


def test_an_exception_cancels_the_remaining_calls(tmp_path):
    def calls():
        yield delayed(raise_on)(0, 0)
        for i in range(1, 200):
            yield delayed(record)(tmp_path, i, 0.2)

    with pytest.raises(KeyError):
        Parallel(n_jobs=2, batch_size=1)(calls())
    time.sleep(1.0)  # (what still ran would have written by now)
    assert len(list(tmp_path.iterdir())) < 50


def test_exception_in_a_generator_is_raised_while_iterating():
    out = Parallel(n_jobs=2, return_as="generator")(delayed(raise_on)(i, 3) for i in range(10))
    got = []
    with pytest.raises(KeyError):
        for value in out:  # (joblib raises as soon as it knows: maybe before call 0's)
            got.append(value)
    assert got == list(range(len(got))) and len(got) <= 3


def test_nested_parallel_runs_on_the_worker():
    outer_pids = {pid for _, pid in Parallel(n_jobs=2)(delayed(backend_name)(i) for i in range(4))}
    assert os.getpid() not in outer_pids
    names = Parallel(n_jobs=2)(delayed(backend_name)(i) for i in range(2))
    assert all(name != "PipelineBackend" for name, _ in names)


def test_a_library_calling_parallel_inside_a_call():
    out = Parallel(n_jobs=2)(delayed(library_function)(range(k)) for k in range(6))
    assert out == [sum(v * v for v in range(k)) for k in range(6)]


def test_a_library_calling_parallel_under_parallel_config():
    # the library's Parallel, in this process, picks the configured backend
    assert library_function(range(10)) == sum(v * v for v in range(10))


def test_parallel_reused_as_a_context_manager():
    with Parallel(n_jobs=2) as parallel:
        first = parallel(delayed(square)(i) for i in range(10))
        second = parallel(delayed(square)(i) for i in range(10, 20))
    assert first + second == [i * i for i in range(20)]


def test_exhausted_iterator():
    calls = iter([delayed(square)(i) for i in range(3)])
    assert Parallel(n_jobs=2)(calls) == [0, 1, 4]
    assert Parallel(n_jobs=2)(calls) == []


def test_pre_dispatch_with_a_generator_of_calls():
    out = Parallel(n_jobs=2, pre_dispatch="n_jobs", batch_size=2)(
        delayed(square)(i) for i in range(30)
    )
    assert out == [i * i for i in range(30)]


@pytest.mark.filterwarnings("error:Sending large graph")  # (through the store, not the graph)
def test_large_numpy_arguments_and_results():
    big = np.arange(2_000_000, dtype=np.float64)  # 16 MB
    sums = Parallel(n_jobs=2)(delayed(np.sum)(big[i:]) for i in range(4))
    assert sums == [big[i:].sum() for i in range(4)]
    # the same large argument in every call (as libraries pass X): stored once, then removed
    offsets = Parallel(n_jobs=2, batch_size=1)(delayed(np.take)(big, i) for i in range(8))
    assert offsets == list(range(8))
    backend, _ = joblib.parallel.get_active_backend()
    scratch = Path(backend.session.spill_url(None))
    assert [p for p in scratch.rglob("*") if p.is_file()] == []
    # results beyond what a receipt carries come back through the store
    arrays = Parallel(n_jobs=2)(delayed(np.full)(100_000, i) for i in range(4))
    assert [a[0] for a in arrays] == [0, 1, 2, 3] and all(a.size == 100_000 for a in arrays)


def _multiplier(k):
    def times(x):
        return x * k

    return times


def test_results_kept_are_of_the_same_captured_values(tmp_path):
    """A call's key hashed its function's source alone: with a closure's value or a
    partial's argument changed, the program got the results kept of the old one."""
    changed = r"holds the results of .*\(its code has changed since\)"
    with joblib.parallel_config(backend="pipeline", workers=WORKERS, output=str(tmp_path)):
        assert Parallel(n_jobs=2)(delayed(_multiplier(2))(x) for x in range(4)) == [0, 2, 4, 6]
        assert Parallel(n_jobs=2)(delayed(_multiplier(2))(x) for x in range(4)) == [0, 2, 4, 6]
        with pytest.raises(pipeline.ConfigError, match=changed):
            Parallel(n_jobs=2)(delayed(_multiplier(3))(x) for x in range(4))
        plus = functools.partial(add, z=1)
        assert Parallel(n_jobs=2)(delayed(plus)(x) for x in range(3)) == [1, 2, 3]
        with pytest.raises(pipeline.ConfigError, match=changed):
            Parallel(n_jobs=2)(delayed(functools.partial(add, z=5))(x) for x in range(3))


def test_without_output_nothing_is_kept(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    first = Parallel(n_jobs=2)(delayed(np.full)(100_000, i) for i in range(3))
    again = Parallel(n_jobs=2)(delayed(np.full)(100_000, i) for i in range(3))
    assert [a[0] for a in first] == [a[0] for a in again] == [0, 1, 2]
    assert list(tmp_path.iterdir()) == []  # (no results/ folder, nothing else)
    backend, _ = joblib.parallel.get_active_backend()
    scratch = backend.session.spill_url(None)  # results on their way back: read, removed
    assert [p for p in Path(scratch).rglob("*") if p.is_file()] == []


def test_verbose_prints_progress(capsys):
    Parallel(n_jobs=2, verbose=10)(delayed(square)(i) for i in range(10))
    err = capsys.readouterr().err
    assert "Done  10 out of  10" in err or "Done 10 out of 10" in err


def test_timeout_is_honoured():
    # (joblib raises multiprocessing's TimeoutError, as with its own backends)
    with pytest.raises((TimeoutError, multiprocessing.TimeoutError)):
        Parallel(n_jobs=2, timeout=0.5)(delayed(slow_square)(i, 5.0) for i in range(2))


def test_unpicklable_function_is_named():
    lock = threading.Lock()

    def holds_a_lock(x):
        with lock:
            return x

    with pytest.raises(pipeline.ConfigError, match="holds_a_lock"):
        Parallel(n_jobs=2)(delayed(holds_a_lock)(i) for i in range(3))


def test_unknown_setting_is_refused_where_given():
    with (
        pytest.raises(pipeline.ConfigError, match="workerz"),
        joblib.parallel_config(backend="pipeline", workerz=2),
    ):
        pass


def test_unreachable_scheduler_names_the_address():
    import dask

    with (
        dask.config.set({"distributed.comm.timeouts.connect": "3s"}),
        joblib.parallel_config(backend="pipeline", scheduler="tcp://127.0.0.1:9"),
        pytest.raises(pipeline.ClusterError, match=r"127\.0\.0\.1:9"),
    ):
        Parallel(n_jobs=2)(delayed(square)(i) for i in range(3))


# -- the runner's guarantees -----------------------------------------------------------


def test_a_call_whose_worker_is_killed_runs_again(tmp_path):
    n = 40
    results: list = []

    def run():  # (in a thread of its own: parallel_config is per thread)
        with joblib.parallel_config(backend="pipeline", workers=WORKERS):
            calls = (delayed(record)(tmp_path, i, 0.3) for i in range(n))
            results.extend(Parallel(n_jobs=2, batch_size=1)(calls))

    thread = threading.Thread(target=run)
    thread.start()

    def running_pid():
        for path in tmp_path.iterdir():
            if path.read_text() == "running":
                return int(path.name.split("-")[1])
        return None

    wait_for("a call running", lambda: running_pid() is not None, timeout=60, interval=0.02)
    os.kill(running_pid(), signal.SIGKILL)
    thread.join(timeout=300)
    assert not thread.is_alive()
    assert results == list(range(n))
    done = {int(p.name.split("-")[0]) for p in tmp_path.iterdir() if p.read_text() == "done"}
    assert done == set(range(n))  # each call's side effect, at least once
    killed = [p for p in tmp_path.iterdir() if p.read_text() == "running"]
    assert len(killed) >= 1  # the call that was killed mid-way, run again


# -- scripts ---------------------------------------------------------------------------

SCRIPT = """
import os
import joblib
import pipeline  # noqa: F401  (registers the backend)

def cube(x):
    return x ** 3, os.getpid()

with joblib.parallel_config(backend="pipeline", workers=1):
    out = joblib.Parallel(n_jobs=-1)(joblib.delayed(cube)(i) for i in range(5))
print("on the cluster:", all(pid != os.getpid() for _, pid in out))
print([value for value, _ in out])
"""


def test_script_without_a_main_guard(tmp_path):
    out = _run_script(tmp_path, SCRIPT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-2:] == ["on the cluster: True", "[0, 1, 8, 27, 64]"]


def _run_script(folder, text: str) -> subprocess.CompletedProcess:
    """``text`` run as a script of its own, in ``folder``, by this interpreter."""
    script = folder / "script.py"
    script.write_text(text)
    return subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=300, cwd=folder
    )


TWO_CLUSTERS = """
import joblib
import pipeline  # noqa: F401
from joblib import Parallel, delayed

for workers in (1, 2):
    with joblib.parallel_config(backend="pipeline", workers=workers):
        print(Parallel(n_jobs=2)(delayed(abs)(-x) for x in range(3)))
"""


def test_a_program_on_two_clusters_ends_without_dasks_closing_lines(tmp_path):
    """The sessions were closed first opened first: the first cluster's close put back
    the level of Dask's log handlers, and the second's printed 18 INFO lines."""
    out = _run_script(tmp_path, TWO_CLUSTERS)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["[0, 1, 2]", "[0, 1, 2]"]
    assert "distributed." not in out.stderr, out.stderr


# -- resume ----------------------------------------------------------------------------

RESUMABLE = """
import os, sys, time
import joblib
import pipeline  # noqa: F401

def fit(x):
    open(os.path.join(sys.argv[2], f"{x}-{os.getpid()}-{time.monotonic_ns()}"), "w").close()
    time.sleep(0.3)
    return {"x": x, "sq": x * x}

with joblib.parallel_config(backend="pipeline", workers=2, output=sys.argv[1]):
    out = joblib.Parallel(n_jobs=-1, batch_size=1)(joblib.delayed(fit)(i) for i in range(N))
print([r["sq"] for r in out])
"""


def test_a_killed_driver_resumes_from_the_kept_results(tmp_path):
    import pickle

    n = 24
    script = tmp_path / "fits.py"
    script.write_text(RESUMABLE.replace("range(N)", f"range({n})"))
    output, ran = tmp_path / "out", tmp_path / "ran"
    ran.mkdir()
    command = [sys.executable, str(script), str(output), str(ran)]
    first = subprocess.Popen(command, start_new_session=True, cwd=tmp_path,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    calls = output / "fit" / "calls"
    try:
        wait_for("6 kept calls", lambda: calls.is_dir() and len(list(calls.iterdir())) >= 6,
                 timeout=240, interval=0.05)  # fmt: skip
    finally:
        os.killpg(first.pid, signal.SIGKILL)
        first.wait()
    kept = {pickle.loads(p.read_bytes())["x"] for p in calls.iterdir() if p.suffix == ".pkl"}
    assert 6 <= len(kept) < n
    check = subprocess.run([sys.executable, "-m", "pipeline", "verify", str(output)],
                           capture_output=True, text=True, timeout=120)  # fmt: skip
    assert check.returncode != 0 and "not completed" in check.stdout + check.stderr

    second = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert second.returncode == 0, second.stderr
    assert second.stdout.strip().splitlines()[-1] == str([i * i for i in range(n)])
    runs: dict[int, int] = {}
    for marker in ran.iterdir():
        x = int(marker.name.split("-")[0])
        runs[x] = runs.get(x, 0) + 1
    assert set(runs) == set(range(n))
    assert all(runs[x] == 1 for x in kept)  # the kept calls did not run again
    check = subprocess.run([sys.executable, "-m", "pipeline", "verify", str(output)],
                           capture_output=True, text=True, timeout=120)  # fmt: skip
    assert check.returncode == 0, check.stdout + check.stderr
    assert f"{n} of {n} units verified" in check.stdout

    # another program's function of the same name: refused, both named
    script.write_text(RESUMABLE.replace("x * x", "x + x").replace("range(N)", "range(3)"))
    other = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert other.returncode != 0
    assert "holds the results of __main__:fit, not of this program's __main__:fit" in other.stderr


# -- a load balancer restarted mid-call ------------------------------------------------

GATED_DRIVER = """
import os, sys, time
import joblib
import pipeline  # noqa: F401

address, ca, cert, key, gate, log = sys.argv[1:7]

def unit(x):
    with open(os.path.join(log, f"started-{x}"), "a") as f:
        f.write(f"{os.getpid()}\\n")
    deadline = time.monotonic() + 120
    while not os.path.exists(gate) and time.monotonic() < deadline:
        time.sleep(0.05)
    return 2 * x

with joblib.parallel_config(backend="pipeline", scheduler=address, tls_ca_file=ca,
                            tls_cert=cert, tls_key=key):
    print(joblib.Parallel(n_jobs=-1, batch_size=1)(joblib.delayed(unit)(x) for x in range(6)))
"""


@pytest.mark.integration
def test_a_load_balancer_restarted_mid_call_is_waited_out(tmp_path):
    from harness.cluster_procs import (
        REPO_ROOT,
        ProcessManager,
        free_port,
        start_haproxy,
        start_scheduler,
        start_worker,
    )
    from pipeline.cluster.tls import make_certificates

    certs = make_certificates(tmp_path / "certs")
    log, gate = tmp_path / "log", tmp_path / "gate"
    log.mkdir()
    script = tmp_path / "driver.py"
    script.write_text(GATED_DRIVER)
    with ProcessManager(tmp_path / "logs") as pm:
        port = free_port()
        scheduler = start_scheduler(pm, certs, port=port)
        lb = start_haproxy(pm, f"127.0.0.1:{port}")
        for i in range(2):
            start_worker(pm, scheduler.address, certs, name=f"w{i}")
        stderr = tmp_path / "driver.stderr"
        argv = [sys.executable, str(script), lb.address, certs["ca"], certs["client"],
                certs["client-key"], gate, log]  # fmt: skip
        driver = subprocess.Popen(
            list(map(str, argv)), stdout=subprocess.PIPE, stderr=stderr.open("w"), text=True,
            env={**os.environ, "PYTHONPATH": str(REPO_ROOT)}, cwd=tmp_path,
        )  # fmt: skip
        wait_for("two running calls", lambda: len(list(log.glob("started-*"))) >= 2)
        lb.kill()  # SIGKILL, as a balancer node lost
        lb = start_haproxy(pm, scheduler.address.removeprefix("tls://"),
                           port=int(lb.address.rsplit(":", 1)[1]))  # fmt: skip
        wait_for("the driver to reconnect",
                 lambda: "reconnected to the scheduler" in stderr.read_text())  # fmt: skip
        gate.touch()
        stdout, _ = driver.communicate(timeout=180)
    assert driver.returncode == 0, stdout + stderr.read_text()
    assert stdout.strip().splitlines()[-1] == str([2 * x for x in range(6)])
    starts = {p.name: len(p.read_text().split()) for p in log.iterdir()}
    assert starts == {f"started-{x}": 1 for x in range(6)}  # none run twice


def exits_on(x, bad):
    if x == bad:
        os._exit(1)  # (the call ends its worker process, every time it runs)
    return x


@pytest.mark.slow
def test_a_call_that_kills_its_worker_every_time_is_an_error_not_a_hang():
    import dask

    close_sessions()  # (a cluster of its own: the scheduler's allowed failures set)
    try:
        with (
            dask.config.set({"distributed.scheduler.allowed-failures": 0}),
            pytest.raises(RuntimeError, match="KilledWorker: the worker process running"),
        ):
            Parallel(n_jobs=2, batch_size=1)(delayed(exits_on)(i, 3) for i in range(6))
    finally:
        close_sessions()
