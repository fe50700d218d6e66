"""An :class:`.s3.S3Store`'s URL, its boto3 client and transfer settings, and the
versions it gives objects."""

from __future__ import annotations

import re
from typing import Any

import boto3.session
from boto3.s3.transfer import TransferConfig
from botocore.config import Config

from ..errors import ConfigError

__all__ = [
    "CONNECT_TIMEOUT",
    "bucket_and_prefix",
    "make_client",
    "object_version",
    "transfer_config",
]

_BUCKET_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,254}")

MiB = 1024 * 1024
#: Payloads at least this big go up as multipart uploads, in parts of this size.
MULTIPART_THRESHOLD = 16 * MiB
MULTIPART_CHUNKSIZE = 16 * MiB
#: Parts uploaded at once. Threads are fine even on a one-thread Dask worker: they
#: wait on sockets with the GIL released. Each holds one part (a copy) in memory.
MAX_CONCURRENCY = 4
#: Several Dask threads may each run a transfer, plus ranged reads and listings.
MAX_POOL_CONNECTIONS = 32
CONNECT_TIMEOUT = 10
READ_TIMEOUT = 60


def make_client(
    endpoint_url: str | None,
    retry_mode: str,
    *,
    attempts: int,
    connect_timeout: float,
    path_style: bool,
) -> Any:
    """A new S3 client (its own session: boto3's default session is not thread-safe)."""
    config = Config(
        # total_max_attempts counts the first attempt; botocore's max_attempts
        # key would count retries only (max_attempts=10 is 11 requests).
        retries={"mode": retry_mode, "total_max_attempts": attempts},
        max_pool_connections=MAX_POOL_CONNECTIONS,
        connect_timeout=connect_timeout,
        read_timeout=READ_TIMEOUT,
        user_agent_extra="pipeline",
        s3={"addressing_style": "path"} if path_style else None,
    )
    session = boto3.session.Session()
    return session.client("s3", endpoint_url=endpoint_url, config=config)


def transfer_config() -> TransferConfig:
    """Uploads' settings: multipart parts in threads, bounded in memory."""
    config = TransferConfig(
        multipart_threshold=MULTIPART_THRESHOLD,
        multipart_chunksize=MULTIPART_CHUNKSIZE,
        max_concurrency=MAX_CONCURRENCY,
        use_threads=True,
        preferred_transfer_client="classic",  # CRT would bypass our retry config
    )
    # Parts read ahead of the uploading threads, each a copy: bound the memory.
    config.max_in_memory_upload_chunks = MAX_CONCURRENCY
    return config


def bucket_and_prefix(url: str) -> tuple[str, str]:
    """``s3://bucket/prefix`` as (bucket, prefix), checked: a clear error for a URL that
    is not one."""
    url = str(url)
    if not url.startswith("s3://"):
        raise ConfigError(f"{url!r} is not an s3:// URL (expected s3://bucket/prefix)")
    bucket, _, prefix = url[len("s3://") :].partition("/")
    if not bucket:
        raise ConfigError(f"S3 URL {url!r} has no bucket (expected s3://bucket/prefix)")
    if not _BUCKET_RE.fullmatch(bucket):
        raise ConfigError(f"S3 URL {url!r}: {bucket!r} is not a valid bucket name")
    parts = [p for p in prefix.split("/") if p]
    if ".." in parts:
        raise ConfigError(f"S3 URL {url!r}: the prefix must not contain '..'")
    return bucket, "/".join(parts)


def object_version(size: int, etag: str) -> str:
    """An object's :meth:`Store.version`: its size, then its ETag (a HEAD's or a
    listing's: the same)."""
    return f"{size}-{etag.strip(chr(34))}"
