"""TLS material and the production topology with real processes.

A TLS ``dask scheduler`` sits behind HAProxy (deploy/haproxy/haproxy.cfg, TCP
mode, TLS passthrough); workers register through HAProxy; clients connect
through HAProxy.  Refusal tests each prove that the *scheduler* rejected the
connection (its log names the TLS failure) and that a correct client is
accepted by the same running scheduler right afterwards.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import ipaddress
import os
import ssl
import stat
import subprocess
import time

import psutil
import pytest
from cryptography import x509
from cryptography.x509.verification import PolicyBuilder, Store
from distributed import Client
from distributed.security import Security

from harness import cluster_procs as cp
from pipeline.cluster.tls import make_certificates, tls_security

pytestmark = pytest.mark.integration

HOSTS = ("localhost", "127.0.0.1", "scheduler.internal", "::1")
CONNECT_TIMEOUT = 5


def _load(path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def _ext(cert: x509.Certificate, cls):
    return cert.extensions.get_extension_for_class(cls).value


# ---------------------------------------------------------------- certificates


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    return make_certificates(tmp_path_factory.mktemp("certs"), days=7, hosts=HOSTS)


@pytest.mark.timeout(120)
def test_files_exist_and_keys_are_private(certs):
    assert set(certs) == {
        "ca", "ca-key", "scheduler", "scheduler-key", "worker", "worker-key",
        "client", "client-key",
    }  # fmt: skip
    for name, path in certs.items():
        assert path.is_file() and path.stat().st_size > 0, name
        if name.endswith("-key"):
            assert stat.S_IMODE(path.stat().st_mode) == 0o600, name
            assert b"PRIVATE KEY" in path.read_bytes()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("role", ["scheduler", "worker", "client"])
def test_leaf_verifies_against_ca_both_directions(certs, role):
    ca, leaf = _load(certs["ca"]), _load(certs[role])
    assert _ext(ca, x509.BasicConstraints).ca is True
    assert _ext(leaf, x509.BasicConstraints).ca is False
    store = Store([ca])
    # Server verification checks serverAuth EKU + SAN, client checks clientAuth.
    PolicyBuilder().store(store).build_server_verifier(x509.DNSName("localhost")).verify(leaf, [])
    ip = x509.IPAddress(ipaddress.ip_address("127.0.0.1"))
    PolicyBuilder().store(store).build_server_verifier(ip).verify(leaf, [])
    PolicyBuilder().store(store).build_client_verifier().verify(leaf, [])
    # The stdlib loads the pair (key matches certificate) with the CA as trust root.
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=str(certs["ca"]))
    ctx.load_cert_chain(str(certs[role]), str(certs[f"{role}-key"]))


@pytest.mark.timeout(120)
def test_leaf_from_other_ca_does_not_verify(certs, tmp_path):
    other = make_certificates(tmp_path / "other")
    store = Store([_load(certs["ca"])])
    with pytest.raises(x509.verification.VerificationError):
        PolicyBuilder().store(store).build_client_verifier().verify(_load(other["client"]), [])


@pytest.mark.timeout(120)
def test_san_and_validity(certs):
    leaf = _load(certs["worker"])
    san = _ext(leaf, x509.SubjectAlternativeName)
    assert set(san.get_values_for_type(x509.DNSName)) == {"localhost", "scheduler.internal"}
    assert set(san.get_values_for_type(x509.IPAddress)) == {
        ipaddress.ip_address("127.0.0.1"),
        ipaddress.ip_address("::1"),
    }
    now = dt.datetime.now(dt.UTC)
    assert abs(leaf.not_valid_after_utc - (now + dt.timedelta(days=7))) < dt.timedelta(minutes=10)
    assert leaf.not_valid_before_utc <= now
    assert _load(certs["ca"]).not_valid_after_utc >= leaf.not_valid_after_utc


@pytest.mark.timeout(120)
@pytest.mark.parametrize("days", [0, -1, True, 1.5])
def test_days_validation(tmp_path, days):
    with pytest.raises(ValueError, match="days"):
        make_certificates(tmp_path, days=days)
    assert not any(tmp_path.iterdir())


@pytest.mark.timeout(120)
def test_existing_files_refused_then_overwritten(tmp_path):
    first = make_certificates(tmp_path)
    before = first["ca"].read_bytes()
    # (the flag of `pipeline certs`: "use overwrite" named none)
    with pytest.raises(FileExistsError, match=r"ca\.pem already exists \(--overwrite replaces"):
        make_certificates(tmp_path)
    assert first["ca"].read_bytes() == before
    # A key left world-readable by someone else must come back as 0600.
    first["client-key"].chmod(0o644)
    again = make_certificates(tmp_path, overwrite=True)
    assert again["ca"].read_bytes() != before
    assert stat.S_IMODE(again["client-key"].stat().st_mode) == 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(p.name for p in again.values())


@pytest.mark.timeout(120)
def test_tls_security(certs, tmp_path):
    sec = tls_security(certs["ca"], certs["client"], certs["client-key"])
    assert sec.require_encryption is True
    assert sec.tls_ca_file == str(certs["ca"])
    assert sec.tls_client_cert == str(certs["client"])
    assert sec.tls_client_key == str(certs["client-key"])
    missing = tmp_path / "nope.pem"
    for kwargs, setting in [
        ({"ca_file": missing}, "tls_ca_file"),
        ({"cert": missing}, "tls_cert"),
        ({"key": missing}, "tls_key"),
    ]:
        args = {"ca_file": certs["ca"], "cert": certs["client"], "key": certs["client-key"]}
        with pytest.raises(FileNotFoundError, match=setting):
            tls_security(**{**args, **kwargs})
    # Files that do not load as what they are given for are named before any connection
    # (not "cannot reach the Dask scheduler: [SSL] PEM lib")
    with pytest.raises(FileNotFoundError, match=r"tls_cert .*client-key\.pem and tls_key "
                       r".*client\.pem are not a certificate and its key"):  # fmt: skip
        tls_security(certs["ca"], certs["client-key"], certs["client"])
    with pytest.raises(FileNotFoundError, match=r"are not a certificate and its key: .*MISMATCH"):
        tls_security(certs["ca"], certs["client"], certs["worker-key"])
    with pytest.raises(FileNotFoundError, match=r"tls_ca_file .* is not a CA certificate"):
        tls_security(certs["client-key"], certs["client"], certs["client-key"])


@pytest.mark.timeout(120)
def test_haproxy_config_is_valid():
    env = {**os.environ, "LB_BIND": "127.0.0.1:18786", "SCHEDULER_ADDR": "127.0.0.1:8786"}
    res = subprocess.run(
        [_haproxy(), "-c", "-f", str(cp.HAPROXY_CFG)], env=env, capture_output=True, text=True
    )
    assert res.returncode == 0, res.stdout + res.stderr


# ------------------------------------------------------------- real cluster


def _haproxy() -> str:
    try:
        return cp.haproxy_binary()
    except RuntimeError as exc:  # fail, never skip: CI must install haproxy
        pytest.fail(str(exc))


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, certs):
    _haproxy()
    with cp.tls_cluster(tmp_path_factory.mktemp("cluster"), n_workers=2, certs=certs) as c:
        yield c


def _conn_ports(pids) -> set[int]:
    """Remote ports of the ESTABLISHED TCP connections of ``pids``."""
    ports = set()
    for pid in pids:
        with contextlib.suppress(psutil.NoSuchProcess):
            for conn in psutil.Process(pid).net_connections(kind="tcp"):
                if conn.status == psutil.CONN_ESTABLISHED and conn.raddr:
                    ports.add(conn.raddr.port)
    return ports


def _port(address: str) -> int:
    return int(address.rsplit(":", 1)[1])


def _assert_good_client_works(cluster) -> None:
    """Control: the properly configured client is accepted by the same scheduler."""
    with cluster.client(timeout=30) as client:
        assert client.submit(lambda: 1 + 1, pure=False).result(timeout=30) == 2


def _assert_refused(cluster, address, security, reason: str) -> None:
    log = cluster.scheduler.log_path
    offset = log.stat().st_size
    start = time.monotonic()
    with (
        pytest.raises((OSError, TimeoutError)),  # CommClosedError is an OSError
        Client(address, security=security, timeout=CONNECT_TIMEOUT) as client,
    ):
        client.submit(lambda: 1, pure=False).result(timeout=CONNECT_TIMEOUT)
    assert time.monotonic() - start < 4 * CONNECT_TIMEOUT
    # The refusal came from the scheduler's TLS listener (through HAProxy), for
    # the expected reason -- not from a client-side configuration error.
    deadline = time.monotonic() + 10
    while True:
        with open(log, "rb") as fh:
            fh.seek(offset)
            new = fh.read().decode(errors="replace")
        if reason in new:
            assert "TLS handshake failed" in new
            break
        assert time.monotonic() < deadline, f"{reason!r} not in scheduler log:\n{new}"
        time.sleep(0.2)
    _assert_good_client_works(cluster)


@pytest.mark.timeout(120)
def test_task_runs_through_haproxy(cluster):
    lb_port, sched_port = _port(cluster.address), _port(cluster.scheduler.address)
    assert lb_port != sched_port
    with cluster.client() as client:
        assert client.submit(lambda: 1 + 1, pure=False).result(timeout=30) == 2
        workers = client.scheduler_info()["workers"]
        assert len(workers) == 2
        for addr in workers:
            assert addr.startswith("tls://127.0.0.1:"), addr
            assert _port(addr) not in (lb_port, sched_port)
        # This client reaches the scheduler only through the LB port.
        mine = _conn_ports([os.getpid()])
        assert lb_port in mine and sched_port not in mine
    # Workers (nanny + worker processes) talk to the scheduler via HAProxy...
    for proc in cluster.workers:
        ports = _conn_ports(proc.pids())
        assert lb_port in ports, (proc.name, ports)
        assert sched_port not in ports, (proc.name, ports)
    # ...and HAProxy holds the connections to the scheduler.
    assert sched_port in _conn_ports([cluster.lb.pid])


@pytest.mark.timeout(120)
@pytest.mark.parametrize("direct", [False, True])
def test_direct_to_workers(cluster, direct):
    """direct_to_workers=False: results are relayed by the scheduler (client
    opens no comm to any worker); True: the client dials the workers itself."""
    with cluster.client(direct_to_workers=direct) as client:
        workers = set(client.scheduler_info()["workers"])
        assert client.submit(lambda: b"x" * 1000, pure=False).result(timeout=30) == b"x" * 1000
        pool = client.rpc
        dialled = set(pool.available) | set(pool.occupied)
        assert bool(dialled & workers) is direct, (dialled, workers)
        if not direct:  # the scheduler fetched the result itself, directly from the worker
            worker_ports = {_port(w) for w in workers}
            assert _conn_ports([cluster.scheduler.pid]) & worker_ports


@pytest.mark.timeout(120)
def test_a_bare_scheduler_address_with_tls_settings_is_taken_as_tls(cluster):
    # With TLS settings a bare address means tls:// (distributed would take tcp:// and
    # refuse it with a traceback); an explicit tcp:// is refused, saying what it should be.
    from pipeline import ClusterError, RunOptions, connect

    tls = {"tls_ca_file": str(cluster.certs["ca"]), "tls_cert": str(cluster.certs["client"]),
           "tls_key": str(cluster.certs["client-key"])}  # fmt: skip
    bare = cluster.address.removeprefix("tls://")
    with connect(RunOptions(scheduler=bare, **tls)) as client:
        assert client.submit(lambda: 1 + 1, pure=False).result(timeout=30) == 2
    tcp = connect(RunOptions(scheduler=f"tcp://{bare}", **tls))
    with pytest.raises(ClusterError, match=rf"the TLS settings are given, and a TLS scheduler's "
                       rf"address is tls://{bare}"):  # fmt: skip
        tcp.__enter__()


@pytest.mark.timeout(120)
def test_plaintext_client_refused(cluster):
    plain = "tcp://" + cluster.address.removeprefix("tls://")
    _assert_refused(cluster, plain, Security(require_encryption=False), "WRONG_VERSION_NUMBER")


class _NoClientCertSecurity(Security):
    """TLS that trusts the cluster CA but presents no client certificate."""

    def get_connection_args(self, role):
        args = super().get_connection_args(role)
        ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=self.tls_ca_file)
        ctx.check_hostname = False  # as Dask does; the CA is still verified
        args["ssl_context"] = ctx
        return args


@pytest.mark.timeout(120)
def test_tls_client_without_certificate_refused(cluster):
    sec = _NoClientCertSecurity(tls_ca_file=str(cluster.certs["ca"]), require_encryption=True)
    _assert_refused(cluster, cluster.address, sec, "PEER_DID_NOT_RETURN_A_CERTIFICATE")


@pytest.mark.timeout(120)
def test_client_cert_from_other_ca_refused(cluster, tmp_path):
    other = make_certificates(tmp_path / "other-ca")
    # Trust the real CA (so the client itself accepts the scheduler) but present
    # a certificate signed by another CA: only the scheduler can refuse this.
    sec = Security(
        tls_ca_file=str(cluster.certs["ca"]),
        tls_client_cert=str(other["client"]),
        tls_client_key=str(other["client-key"]),
        require_encryption=True,
    )
    _assert_refused(cluster, cluster.address, sec, "CERTIFICATE_VERIFY_FAILED")
