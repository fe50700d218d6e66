"""An in-process moto S3 server on loopback, and pytest fixtures around it.

pytest puts tests/ on ``sys.path`` (pyproject.toml's ``pythonpath``); load the fixtures
for every module with ``pytest_plugins = ["s3_server"]`` in the conftest, or in one module
with ``s3 = s3_server.s3`` (etc.) at module level. Fixtures:

* ``moto_server`` (session): the endpoint URL, ``http://127.0.0.1:<port>``. The
  server is one per process (:func:`moto_endpoint`) whichever modules import it.
* ``s3``: an :class:`S3Env` for one test: moto reset, dummy credentials
  (:data:`DUMMY_ACCESS_KEY_ID`/:data:`DUMMY_SECRET`) and ``PIPELINE_S3_ENDPOINT_URL``
  in the environment, the developer's ``~/.aws`` and any other endpoint/retry
  settings hidden, ``open_store``'s cache cleared before and after.
* ``s3_bucket``: creates bucket :data:`BUCKET` and returns ``s3://<BUCKET>/root``.

Without pytest: ``moto_endpoint()``, ``reset_moto(endpoint)`` and
``set_moto_auth(endpoint, n)`` (IAM enforcement after ``n`` requests; ``None`` turns
it off again).
"""

from __future__ import annotations

import atexit
import json
import logging
import threading
import urllib.request
from dataclasses import dataclass
from typing import Any

import pytest

__all__ = [
    "BUCKET",
    "DUMMY_ACCESS_KEY_ID",
    "DUMMY_SECRET",
    "S3Env",
    "moto_endpoint",
    "moto_server",
    "reset_moto",
    "s3",
    "s3_bucket",
    "set_moto_auth",
]

BUCKET = "pipeline-test"
REGION = "us-east-1"
# Distinctive values, so tests can assert they never leak into messages or pickles.
DUMMY_ACCESS_KEY_ID = "AKIAPIPELINEDUMMY0001"
DUMMY_SECRET = "pipeline-dummy-secret-7f3a9c"

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

_server: Any = None
_endpoint: str | None = None
_server_lock = threading.Lock()
_no_proxy = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def moto_endpoint() -> str:
    """Start moto's threaded server on loopback once per process; its URL."""
    global _server, _endpoint
    with _server_lock:
        if _endpoint is None:
            from moto.server import ThreadedMotoServer

            logging.getLogger("werkzeug").setLevel(logging.WARNING)  # one line per request

            server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
            server.start()
            host, port = server.get_host_and_port()
            _server, _endpoint = server, f"http://{host}:{port}"
            atexit.register(server.stop)
        return _endpoint


def _post(url: str, data: bytes = b"") -> dict:
    # Not form-encoded: moto reads the raw body (reset-auth takes a bare number).
    request = urllib.request.Request(
        url, data=data, method="POST", headers={"Content-Type": "application/octet-stream"}
    )
    with _no_proxy.open(request, timeout=30) as response:
        return json.loads(response.read() or b"{}")


def reset_moto(endpoint: str) -> None:
    """Forget every bucket, object and IAM entity."""
    _post(f"{endpoint}/moto-api/reset")


def set_moto_auth(endpoint: str, after_requests: int | None) -> None:
    """Enforce IAM (signatures and policies) after ``after_requests`` more requests."""
    count = "inf" if after_requests is None else str(after_requests)
    _post(f"{endpoint}/moto-api/reset-auth", count.encode())


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
    """The moto server of one test and helpers to arrange its contents."""

    endpoint: str
    monkeypatch: pytest.MonkeyPatch

    def client(
        self,
        endpoint: str | None = None,
        *,
        max_attempts: int | None = None,
        key_id: str = DUMMY_ACCESS_KEY_ID,
        secret: str = DUMMY_SECRET,
    ) -> Any:
        """A plain boto3 S3 client (to arrange or inspect the bucket behind a store)."""
        import boto3
        from botocore.config import Config

        retries = {"mode": "standard", "total_max_attempts": max_attempts} if max_attempts else None
        return boto3.session.Session().client(
            "s3",
            endpoint_url=endpoint or self.endpoint,
            region_name=REGION,
            aws_access_key_id=key_id,
            aws_secret_access_key=secret,
            config=Config(s3={"addressing_style": "path"}, retries=retries),
        )

    def iam(self) -> Any:
        import boto3

        return boto3.session.Session().client(
            "iam",
            endpoint_url=self.endpoint,
            region_name=REGION,
            aws_access_key_id=DUMMY_ACCESS_KEY_ID,
            aws_secret_access_key=DUMMY_SECRET,
        )

    def make_bucket(self, name: str = BUCKET) -> str:
        self.client().create_bucket(Bucket=name)
        return name

    def url(self, bucket: str = BUCKET, prefix: str = "root") -> str:
        return f"s3://{bucket}/{prefix}" if prefix else f"s3://{bucket}"

    def reset(self) -> None:
        reset_moto(self.endpoint)


@pytest.fixture(scope="session")
def moto_server() -> str:
    """The moto endpoint URL (one server per process)."""
    return moto_endpoint()


@pytest.fixture
def s3(moto_server: str, monkeypatch: pytest.MonkeyPatch):
    """A reset moto server with the environment pointing the pipeline at it."""
    set_moto_auth(moto_server, None)
    reset_moto(moto_server)
    isolate_aws_env(monkeypatch, moto_server)
    clear_store_cache()
    try:
        yield S3Env(moto_server, monkeypatch)
    finally:
        set_moto_auth(moto_server, None)
        clear_store_cache()


@pytest.fixture
def s3_bucket(s3: S3Env) -> str:
    """``s3://pipeline-test/root`` in a fresh bucket."""
    s3.make_bucket()
    return s3.url()
