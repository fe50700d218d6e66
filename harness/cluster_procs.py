"""Real-process Dask clusters (TLS scheduler behind HAProxy) for the integration tests
and the benchmarks.

Everything is started as a separate OS process (``python -m distributed.cli.dask_*``
of *this* Python, and the ``haproxy`` binary), each in its own process group, with
stdout/stderr in log files under a temporary directory (never pipes, which can fill up
and block the child).  :class:`ProcessManager` stops every process on exit, also
on failure.

Which connections go through the load balancer, which go direct
----------------------------------------------------------------
Only connections whose *target is the scheduler* use the LB address: a Dask
endpoint connects to the address it was given, and only the scheduler is
given the LB address.

* Through the LB: client -> scheduler (all client RPCs and its batched
  stream: submit, results' status, heartbeats, and the proxied gather /
  scatter when ``direct_to_workers`` is False); worker -> scheduler
  (registration, heartbeats, batched stream); nanny -> scheduler.
* Direct, to the address each worker advertises (``--host`` /
  ``--contact-address``, here ``tls://127.0.0.1:<port>``): scheduler ->
  worker/nanny RPCs (``gather`` on behalf of clients, ``client.run``
  broadcast, stealing, restart), worker -> worker (fetching task
  dependencies), and client -> worker *only* when ``direct_to_workers=True``
  (``Client._gather``/``_scatter`` then open comms from the client's own
  connection pool to the workers' addresses).

``direct_to_workers``: ``Client(direct_to_workers=None)`` (the default, from
config ``distributed.client.direct-to-workers: null``) resolves to False for
a driver that is not itself running inside a worker (``Client._gather``:
``direct = False`` unless ``get_worker()`` succeeds), i.e. results are pulled
by the scheduler from the worker and relayed to the client over the LB
connection.  A maintainer describes the same default in
dask/distributed#8964 ("in almost all circumstances it chooses the proxy over
scheduler approach unless the client is initialized with
direct_to_worker=True").  For this topology the driver should pass
``direct_to_workers=False`` explicitly: the LB path is the only one a driver
is guaranteed to have, and it needs no firewall rule from the driver to
every worker.  ``True`` also works (proven in tests/test_tls.py) when the
driver can open TLS connections to every worker's advertised address, and
spares the scheduler relaying large results.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from pipeline.cluster.embedded import WORKER_ENV

REPO_ROOT = Path(__file__).resolve().parents[1]
HAPROXY_CFG = REPO_ROOT / "deploy" / "haproxy" / "haproxy.cfg"
LOOPBACK = "127.0.0.1"
ENCRYPTION_ENV = {"DASK_DISTRIBUTED__COMM__REQUIRE_ENCRYPTION": "True"}


class StartupError(RuntimeError):
    """A process did not become ready; the message carries its log tail."""


def haproxy_binary() -> str:
    path = shutil.which("haproxy")
    if path is None:
        raise RuntimeError(
            "haproxy is not installed; the TLS/load-balancer integration tests need it: "
            "apt-get update && apt-get install -y haproxy (CI installs it)"
        )
    return path


def free_ports(n: int = 1, host: str = LOOPBACK) -> list[int]:
    """``n`` distinct free TCP ports on ``host`` (sockets held open until all are chosen)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((host, 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def free_port(host: str = LOOPBACK) -> int:
    return free_ports(1, host)[0]


@dataclass
class Proc:
    """One started process (leader of its own process group) and its log."""

    name: str
    argv: list[str]
    popen: subprocess.Popen
    log_path: Path
    address: str | None = None  # what clients connect to, if it listens
    _log_file: object = field(default=None, repr=False)
    _children: list = field(default_factory=list, repr=False)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError as exc:
            return f"<no log: {exc}>"
        return "\n".join(text.splitlines()[-lines:])

    def pids(self) -> list[int]:
        """The leader and its descendants (e.g. a nanny and its worker)."""
        try:
            leader = psutil.Process(self.pid)
            return [self.pid] + [c.pid for c in leader.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def kill(self) -> None:
        """SIGKILL the whole process group (a nanny *and* its worker) and reap it."""
        semaphores = _semaphores(self.pids()) if self.alive() else set()
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pid, signal.SIGKILL)
        self.popen.wait(timeout=10)
        # A lost machine takes its semaphores along; one simulated here leaves them in
        # /dev/shm, its resource tracker killed with it: remove them as the machine would.
        for name in semaphores:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(f"/dev/shm/{name}")

    def stop(self, timeout: float = 5.0) -> None:
        """SIGTERM, then SIGKILL (whole group) after ``timeout``; kill leftover children."""
        self.terminate()
        self.finish(time.monotonic() + timeout)

    def terminate(self) -> None:
        with contextlib.suppress(psutil.NoSuchProcess):  # remember children while we can
            self._children = psutil.Process(self.pid).children(recursive=True)
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                self.popen.send_signal(signal.SIGTERM)

    def finish(self, deadline: float) -> None:
        try:
            self.popen.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            self.kill()
        # Children exit on their own once their leader has; multiprocessing's resource
        # tracker unlinks the semaphores it was told of as it does. Killed at once, it
        # left them in /dev/shm (a dozen per test module).
        _, alive = psutil.wait_procs(
            self._children, timeout=max(0.0, deadline - time.monotonic()) + 2
        )
        for child in alive:  # psutil guards against pid reuse
            with contextlib.suppress(psutil.NoSuchProcess):
                child.kill()
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None


def _semaphores(pids: list[int]) -> set[str]:
    """The POSIX semaphores (``/dev/shm/sem.*``) that processes ``pids`` have mapped."""
    names: set[str] = set()
    for pid in pids:
        try:
            maps = Path(f"/proc/{pid}/maps").read_text()
        except OSError:
            continue
        names.update(re.findall(r"/dev/shm/(sem\.\S+)", maps))
    return names


class ProcessManager:
    """Starts processes with logs in ``log_dir``; ``close()`` stops them all.

    Use as a context manager; an ``atexit`` hook is a last resort if the
    interpreter exits without running ``close()``.
    """

    def __init__(self, log_dir: str | os.PathLike | None = None):
        if log_dir is None:
            log_dir = tempfile.mkdtemp(prefix="pipeline-cluster-")
        self.log_dir = Path(log_dir)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.procs: list[Proc] = []
        atexit.register(self.close)

    def start(self, name: str, argv: Sequence[str], env: Mapping[str, str] | None = None) -> Proc:
        full_env = dict(os.environ)
        full_env["PYTHONUNBUFFERED"] = "1"
        # So that tasks may import this repository's code on the workers.
        paths = [str(REPO_ROOT), full_env.get("PYTHONPATH", "")]
        full_env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
        full_env.update(env or {})
        log_path = self.log_dir / f"{name}.log"
        log_file = open(log_path, "ab")  # noqa: SIM115 - closed in Proc.stop
        try:
            popen = subprocess.Popen(
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                env=full_env,
                cwd=self.log_dir,
                start_new_session=True,  # own process group: killpg reaches children
            )
        except BaseException:
            log_file.close()
            raise
        proc = Proc(name, list(argv), popen, log_path, _log_file=log_file)
        self.procs.append(proc)
        return proc

    def tails(self, lines: int = 25) -> str:
        return "\n".join(f"--- {p.name} (pid {p.pid}) ---\n{p.tail(lines)}" for p in self.procs)

    def close(self, grace: float = 3.0) -> None:
        """SIGTERM everything at once, SIGKILL what is still alive after ``grace``.

        Tests do not need graceful shutdowns (a nanny waits up to 8 s for its
        worker), so the grace period is short.
        """
        procs, self.procs = self.procs, []
        # Kinds stop in the reverse order they started (workers, then the load
        # balancer, then the scheduler): workers told to stop while the way to the
        # scheduler is up are gone in a moment; without it they retried it until
        # SIGKILLed, which left their nannies' semaphores in /dev/shm.
        kinds = list(dict.fromkeys(p.name.split("-")[0] for p in procs))
        for kind in reversed(kinds):
            group = [p for p in procs if p.name.split("-")[0] == kind]
            for proc in group:
                proc.terminate()
            deadline = time.monotonic() + grace
            for proc in group:
                proc.finish(deadline)
        atexit.unregister(self.close)

    def __enter__(self) -> ProcessManager:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def wait_for_port(proc: Proc, host: str, port: int, timeout: float) -> None:
    """Poll until ``proc`` (or a child) listens on ``host:port``; fail fast if it dies.

    Its sockets are looked at rather than connected to: a connection closed before
    the TLS handshake makes the listener log a failed handshake, and now and then
    raises in tornado's accept callback ("Exception in callback ..."), noise in the
    very logs the scale tests scan for errors."""
    deadline = time.monotonic() + timeout
    while True:
        if not proc.alive():
            raise StartupError(
                f"{proc.name} exited with code {proc.popen.returncode} before listening on "
                f"{host}:{port}; log {proc.log_path}:\n{proc.tail()}"
            )
        if _listens(proc, host, port):
            return
        if time.monotonic() > deadline:
            raise StartupError(
                f"{proc.name} not listening on {host}:{port} after {timeout}s; "
                f"log {proc.log_path}:\n{proc.tail()}"
            )
        time.sleep(0.1)


def _listens(proc: Proc, host: str, port: int) -> bool:
    for pid in proc.pids():
        with contextlib.suppress(psutil.Error):
            for conn in psutil.Process(pid).net_connections(kind="tcp"):
                if (
                    conn.status == psutil.CONN_LISTEN
                    and conn.laddr.port == port
                    and conn.laddr.ip in (host, "0.0.0.0", "::")
                ):
                    return True
    return False


def _tls_args(certs: Mapping[str, Path], role: str) -> list[str]:
    return [
        "--tls-ca-file", str(certs["ca"]),
        "--tls-cert", str(certs[role]),
        "--tls-key", str(certs[f"{role}-key"]),
    ]  # fmt: skip


def start_scheduler(
    pm: ProcessManager, certs: Mapping[str, Path], *, port: int | None = None, timeout: float = 30
) -> Proc:
    """``dask scheduler`` with mutual TLS on 127.0.0.1:``port``, no dashboard."""
    port = port or free_port()
    argv = [
        sys.executable, "-m", "distributed.cli.dask_scheduler",
        "--protocol", "tls", "--host", LOOPBACK, "--port", str(port),
        # --no-dashboard drops the Bokeh app, but the HTTP server (/health,
        # /metrics) still binds: give it a free loopback port instead of :8787.
        "--no-dashboard", "--dashboard-address", f"{LOOPBACK}:{free_port()}",
        *_tls_args(certs, "scheduler"),
    ]  # fmt: skip
    proc = pm.start("scheduler", argv, ENCRYPTION_ENV)
    proc.address = f"tls://{LOOPBACK}:{port}"
    wait_for_port(proc, LOOPBACK, port, timeout)
    return proc


def start_haproxy(
    pm: ProcessManager,
    scheduler_hostport: str,
    *,
    port: int | None = None,
    config: str | os.PathLike = HAPROXY_CFG,
    maxconn: int = 1000,
    timeout: float = 15,
) -> Proc:
    """HAProxy (foreground, ``-db``) with the repo config, forwarding to the scheduler."""
    binary = haproxy_binary()
    port = port or free_port()
    env = {
        "LB_BIND": f"{LOOPBACK}:{port}",
        "SCHEDULER_ADDR": scheduler_hostport,
        # The production default (50000) needs a nofile hard limit of ~100k,
        # which CI containers may not grant; a test cluster needs a few dozen.
        "LB_MAXCONN": str(maxconn),
    }
    check = subprocess.run(
        [binary, "-c", "-f", str(config)], env={**os.environ, **env}, capture_output=True, text=True
    )
    if check.returncode != 0:
        raise StartupError(f"haproxy -c rejected {config}:\n{check.stdout}\n{check.stderr}")
    proc = pm.start(f"haproxy-{port}", [binary, "-db", "-f", str(config)], env)
    proc.address = f"tls://{LOOPBACK}:{port}"
    wait_for_port(proc, LOOPBACK, port, timeout)
    return proc


def start_worker(
    pm: ProcessManager,
    scheduler_address: str,
    certs: Mapping[str, Path],
    *,
    name: str,
    nanny: bool = True,
    death_timeout: str = "60s",
    extra_args: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
) -> Proc:
    """``dask worker <scheduler_address> --nthreads 1`` advertising 127.0.0.1.

    ``death_timeout`` makes an orphaned worker exit on its own if the
    scheduler is gone (cleanup safety net).
    """
    argv = [
        sys.executable, "-m", "distributed.cli.dask_worker", scheduler_address,
        "--nthreads", "1", "--host", LOOPBACK, "--name", name, "--no-dashboard",
        "--nanny" if nanny else "--no-nanny", "--death-timeout", death_timeout,
        "--local-directory", str(pm.log_dir / "scratch"),
        *_tls_args(certs, "worker"), *extra_args,
    ]  # fmt: skip
    return pm.start(f"worker-{name}", argv, {**ENCRYPTION_ENV, **WORKER_ENV, **(env or {})})


def client_security(certs: Mapping[str, Path], role: str = "client"):
    from distributed.security import Security

    return Security(
        tls_ca_file=str(certs["ca"]),
        tls_client_cert=str(certs[role]),
        tls_client_key=str(certs[f"{role}-key"]),
        require_encryption=True,
    )


def wait_for_workers(
    pm: ProcessManager, address: str, security, n: int, *, timeout: float = 60
) -> None:
    """Connect a TLS client to ``address`` and wait until ``n`` workers are registered."""
    from distributed import Client

    try:
        with Client(address, security=security, timeout=timeout) as client:
            client.wait_for_workers(n, timeout=timeout)
    except Exception as exc:
        raise StartupError(
            f"{n} worker(s) not ready at {address} within {timeout}s: {exc!r}\n{pm.tails()}"
        ) from exc


@dataclass
class TLSCluster:
    """A running scheduler + HAProxy + workers.  ``address`` is the LB address."""

    pm: ProcessManager
    certs: dict[str, Path]
    scheduler: Proc
    lb: Proc
    workers: list[Proc]

    @property
    def address(self) -> str:
        return self.lb.address

    def security(self, role: str = "client"):
        return client_security(self.certs, role)

    def client(self, **kwargs):
        from distributed import Client

        kwargs.setdefault("timeout", 30)
        return Client(self.address, security=self.security(), **kwargs)

    def add_worker(self, name: str | None = None, **kwargs) -> Proc:
        name = name or f"w{len(self.workers)}"
        proc = start_worker(self.pm, self.address, self.certs, name=name, **kwargs)
        self.workers.append(proc)
        return proc

    def kill_worker(self, worker: Proc | int) -> Proc:
        """kill -9 a worker (its nanny and the nanny's children too), no graceful
        shutdown.  The children may linger as zombies if PID 1 does not reap."""
        proc = self.workers[worker] if isinstance(worker, int) else worker
        proc.kill()
        return proc

    def wait_for_workers(self, n: int, timeout: float = 60) -> None:
        wait_for_workers(self.pm, self.address, self.security(), n, timeout=timeout)


@contextlib.contextmanager
def tls_cluster(
    workdir: str | os.PathLike,
    *,
    n_workers: int = 2,
    certs: dict[str, Path] | None = None,
    nanny: bool = True,
    timeout: float = 60,
    worker_env: Mapping[str, str] | None = None,
) -> Iterator[TLSCluster]:
    """Certificates (unless given), TLS scheduler, HAProxy and ``n_workers`` workers
    that register through HAProxy; yields a :class:`TLSCluster`, stops all on exit."""
    from pipeline.cluster.tls import make_certificates

    workdir = Path(workdir)
    haproxy_binary()  # fail early with the install hint
    if certs is None:
        certs = make_certificates(workdir / "certs")
    with ProcessManager(workdir / "logs") as pm:
        scheduler = start_scheduler(pm, certs, timeout=timeout)
        lb = start_haproxy(pm, scheduler.address.removeprefix("tls://"), timeout=timeout)
        cluster = TLSCluster(pm, dict(certs), scheduler, lb, [])
        for i in range(n_workers):
            cluster.add_worker(f"w{i}", nanny=nanny, env=worker_env)
        if n_workers:
            cluster.wait_for_workers(n_workers, timeout=timeout)
        yield cluster
