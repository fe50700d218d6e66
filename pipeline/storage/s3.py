"""A store in an S3 bucket, or on an S3-compatible server, through boto3.

``S3Store("s3://bucket/prefix")`` keeps every key under ``prefix/`` in ``bucket``.

Its settings are read when the store is constructed (a pickled copy keeps them):
``PIPELINE_S3_ENDPOINT_URL`` (an S3-compatible server; wins over boto3's own
``AWS_ENDPOINT_URL_S3`` / ``AWS_ENDPOINT_URL``; any custom endpoint switches to
path-style addressing), ``PIPELINE_S3_RETRY_MODE`` (botocore's ``standard`` or
``adaptive``) and ``PIPELINE_S3_MAX_ATTEMPTS`` (attempts per request, the first
included). Other botocore settings apply as usual (e.g.
``AWS_REQUEST_CHECKSUM_CALCULATION=when_required`` for servers that reject boto3's
default CRC32 checksum headers).

Credentials come only from the standard AWS chain (environment, ``AWS_PROFILE`` and
``~/.aws``, SSO, container or instance role). They are never arguments and never
appear in messages or reprs.

Every botocore failure goes through one table, :data:`ERRORS`, that turns an S3
error code into the exception callers see: ``FileNotFoundError`` for a missing
object, :class:`S3PermissionError` for a refusal, and :class:`StorageError`
naming the bucket and the endpoint for everything else.
"""

from __future__ import annotations

import contextlib
import errno
import os
import threading
from collections.abc import Iterable, Iterator
from typing import Any, BinaryIO
from urllib.parse import urlsplit

from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    ConnectionClosedError,
    IncompleteReadError,
    ReadTimeoutError,
    ResponseStreamingError,
)

from ..errors import ConfigError, StorageError
from . import s3_client
from .base import Buffer, Store, join
from .s3_cleanup import abort_uploads, delete_keys
from .s3_client import (
    CONNECT_TIMEOUT,
    bucket_and_prefix,
    make_client,
    object_version,
    transfer_config,
)
from .s3_create import put_if_absent
from .s3_errors import (
    ERRORS,
    NO_BUCKET,
    NOT_FOUND,
    OTHER,
    S3PermissionError,
    detail_of,
    error_code,
    safe_url,
)
from .s3_io import ChunksReader, S3InputFile, byte_view
from .s3_lease import lease

__all__ = ["S3PermissionError", "S3Store"]

ENV_ENDPOINT_URL = "PIPELINE_S3_ENDPOINT_URL"
ENV_RETRY_MODE = "PIPELINE_S3_RETRY_MODE"

RETRY_MODES = ("standard", "adaptive")

#: preflight() checks the bucket with few attempts so that a wrong endpoint fails
#: within seconds instead of after a minute of backoff.
PREFLIGHT_ATTEMPTS = 3
PREFLIGHT_CONNECT_TIMEOUT = 5
#: Re-GETs when a response body breaks off mid-stream (botocore retries only the call).
STREAM_ATTEMPTS = 3

_STREAM_ERRORS = (
    ResponseStreamingError,
    IncompleteReadError,
    ReadTimeoutError,
    ConnectionClosedError,
)


class S3Store(Store):
    """Objects under ``s3://bucket/prefix``; see the module docstring for settings."""

    def __init__(self, url: str, *, endpoint_url: str | None = None):
        self.bucket, self.prefix = bucket_and_prefix(url)
        self.url = f"s3://{self.bucket}/{self.prefix}" if self.prefix else f"s3://{self.bucket}"

        from ..config import process_settings

        settings = process_settings()
        endpoint = (endpoint_url or settings.s3_endpoint_url or "").strip() or None
        if endpoint is not None and urlsplit(endpoint).scheme not in ("http", "https"):
            raise ConfigError(
                f"S3 endpoint {safe_url(endpoint)!r} (from endpoint_url or "
                f"{ENV_ENDPOINT_URL}) must be an http:// or https:// URL"
            )
        self.endpoint_url = endpoint

        mode = settings.s3_retry_mode.strip().lower()
        if mode not in RETRY_MODES:
            raise ConfigError(
                f"{ENV_RETRY_MODE}={mode!r}: expected one of {', '.join(RETRY_MODES)}"
            )
        attempts = settings.s3_max_attempts
        self.retry_mode = mode
        self.max_attempts = attempts
        self._reset_runtime()

    # -- process-local state (not pickled)

    def _reset_runtime(self) -> None:
        self._client_obj: Any = None
        self._client_pid: int | None = None
        self._lock = threading.Lock()
        self._bucket_checked = False

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        for name in ("_client_obj", "_client_pid", "_lock", "_bucket_checked"):
            state.pop(name, None)
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._reset_runtime()

    def __repr__(self) -> str:
        if self.endpoint_url:
            return f"S3Store({self.url!r}, endpoint_url={safe_url(self.endpoint_url)!r})"
        return f"S3Store({self.url!r})"

    def _uses_custom_endpoint(self) -> bool:
        return bool(
            self.endpoint_url
            or os.environ.get("AWS_ENDPOINT_URL_S3")
            or os.environ.get("AWS_ENDPOINT_URL")
        )

    def _make_client(self, *, attempts: int, connect_timeout: float) -> Any:
        return make_client(
            self.endpoint_url,
            self.retry_mode,
            attempts=attempts,
            connect_timeout=connect_timeout,
            path_style=self._uses_custom_endpoint(),
        )

    def _client(self) -> Any:
        """The S3 client of this process, created on first use."""
        pid = os.getpid()
        client = self._client_obj
        if client is not None and self._client_pid == pid:
            return client
        if self._client_pid is not None and self._client_pid != pid:
            self._lock = threading.Lock()  # forked: the parent's lock may be held
        with self._lock:
            if self._client_obj is None or self._client_pid != pid:
                try:
                    self._client_obj = self._make_client(
                        attempts=self.max_attempts, connect_timeout=CONNECT_TIMEOUT
                    )
                except BotoCoreError as exc:
                    raise self._error(exc) from exc
                self._client_pid = pid
            return self._client_obj

    # -- keys and errors

    def endpoint_display(self) -> str:
        """The endpoint for messages (never with credentials)."""
        client = self._client_obj
        if client is not None:
            return safe_url(client.meta.endpoint_url)
        if self.endpoint_url:
            return safe_url(self.endpoint_url)
        env = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
        return safe_url(env) if env else "the default AWS S3 endpoint"

    def _key(self, key: str) -> str:
        rel = str(key).strip("/")
        if not rel:
            raise StorageError(f"{self.url}: empty object key {key!r}")
        if ".." in rel.split("/"):
            raise StorageError(f"key {key!r} must not contain '..'")
        return join(self.prefix, rel)

    def _relative(self, full_key: str) -> str:
        return full_key[len(self.prefix) + 1 :] if self.prefix else full_key

    def _error(self, exc: BaseException, key: str | None = None) -> OSError:
        """The exception to raise (``from exc``) for a botocore failure on ``key``."""
        code = error_code(exc)
        rule = ERRORS.get(code, OTHER)
        target = self.describe(key) if key else self.url
        if rule is NOT_FOUND:
            if key is None:
                rule = NO_BUCKET
            else:
                return FileNotFoundError(errno.ENOENT, "No such object", target)
        message = rule.message.format(
            target=target,
            bucket=self.bucket,
            code=code,
            endpoint=self.endpoint_display(),
            detail=detail_of(exc, code),
        )
        err = rule.exc(message)
        err.errno = rule.errno
        return err

    def _check_bucket(self) -> None:
        """Raise when the bucket is missing: a HEAD 404 cannot tell key from bucket."""
        if self._bucket_checked:
            return
        try:
            self._client().head_bucket(Bucket=self.bucket)
        except (ClientError, BotoCoreError) as exc:
            raise self._error(exc) from exc
        self._bucket_checked = True

    def _head(self, key: str) -> dict:
        try:
            return self._client().head_object(Bucket=self.bucket, Key=self._key(key))
        except ClientError as exc:
            if ERRORS.get(error_code(exc)) is NOT_FOUND:
                self._check_bucket()
            raise self._error(exc, key) from exc
        except BotoCoreError as exc:
            raise self._error(exc, key) from exc

    def _get(self, key: str, **kwargs: Any) -> bytes:
        """The body of a GET (whole or ranged), re-requested if it breaks off."""
        full = self._key(key)
        for attempt in range(1, STREAM_ATTEMPTS + 1):
            try:
                response = self._client().get_object(Bucket=self.bucket, Key=full, **kwargs)
            except (ClientError, BotoCoreError) as exc:
                raise self._error(exc, key) from exc
            try:
                return response["Body"].read()
            except _STREAM_ERRORS as exc:
                if attempt == STREAM_ATTEMPTS:
                    raise self._error(exc, key) from exc
            except BotoCoreError as exc:
                raise self._error(exc, key) from exc
        raise AssertionError("unreachable")  # pragma: no cover

    # -- Store interface

    def write(self, key: str, chunks: Iterable[Buffer]) -> int:
        full = self._key(key)
        views = [byte_view(chunk) for chunk in chunks]
        size = sum(v.nbytes for v in views)
        client = self._client()
        try:
            if size < s3_client.MULTIPART_THRESHOLD:
                # One PUT of one copy (or none, for a single bytes chunk).
                whole = (
                    len(views) == 1
                    and type(views[0].obj) is bytes
                    and views[0].nbytes == len(views[0].obj)
                )
                body = views[0].obj if whole else b"".join(views)
                client.put_object(Bucket=self.bucket, Key=full, Body=body)
            else:
                # Multipart: the object appears only when the upload completes, and
                # the transfer manager aborts the upload if a part fails.
                client.upload_fileobj(
                    ChunksReader(views), self.bucket, full, Config=transfer_config()
                )
        except (ClientError, BotoCoreError) as exc:
            raise self._error(exc, key) from exc
        return size

    def read_bytes(self, key: str) -> bytes:
        return self._get(key)

    def open_input(self, key: str) -> BinaryIO:
        head = self._head(key)
        return S3InputFile(self, key, head["ContentLength"], head.get("ETag"))  # type: ignore[return-value]

    def open_ranges(self, key: str, spans: list[tuple[int, int]]) -> BinaryIO:
        f = self.open_input(key)
        f.prefetch(spans)  # type: ignore[attr-defined]
        return f

    def create_once(self, key: str, data: Buffer) -> bool:
        return put_if_absent(self, key, data)

    def exists(self, key: str) -> bool:
        try:
            self._head(key)
        except FileNotFoundError:
            return False
        return True

    @contextlib.contextmanager
    def hold(self, key: str, owner: str) -> Iterator[None]:
        try:
            with lease(self._client(), self.bucket, self._key(key), owner):
                yield
        except (ClientError, BotoCoreError) as exc:
            raise self._error(exc, key) from exc

    def size(self, key: str) -> int:
        return int(self._head(key)["ContentLength"])

    def version(self, key: str) -> str:
        head = self._head(key)
        return object_version(head["ContentLength"], head.get("ETag", ""))

    def listed_versions(self, start: str = "", limit: int | None = None) -> list[tuple[str, str]]:
        """``(key, version)`` of the objects whose key (under the store's prefix, as a
        folder) begins with ``start``: any text, not only a folder's (``logs/2024-01-``
        lists only those), in key order, at most ``limit``. The versions come with the
        listing: a request per 1,000 objects, not a HEAD each."""
        rel = str(start).lstrip("/")
        if ".." in rel.split("/"):
            raise StorageError(f"prefix {start!r} must not contain '..'")
        full = f"{self.prefix}/{rel}" if self.prefix else rel
        try:
            return [
                (self._relative(obj["Key"]), object_version(obj["Size"], obj.get("ETag", "")))
                for obj in self._list_full(full, limit)
            ]
        except (ClientError, BotoCoreError) as exc:
            raise self._error(exc, rel or None) from exc

    def _list_full(self, full_prefix: str, limit: int | None = None) -> Iterator[dict]:
        """The listing's objects under ``full_prefix`` (at most ``limit``), but a
        console's "folder" markers."""
        paginator = self._client().get_paginator("list_objects_v2")
        pages = {"MaxItems": limit} if limit else {}
        for page in paginator.paginate(
            Bucket=self.bucket, Prefix=full_prefix, PaginationConfig=pages
        ):
            for obj in page.get("Contents", ()):
                if not obj["Key"].endswith("/"):
                    yield obj

    def _list_full_keys(self, prefix: str) -> list[str]:
        rel = str(prefix).strip("/")
        if ".." in rel.split("/"):
            raise StorageError(f"prefix {prefix!r} must not contain '..'")
        full = join(self.prefix, rel)
        keys: list[str] = []
        try:
            if rel:
                # Like a directory store, a prefix naming an object lists that object.
                # It sorts before every longer key sharing the prefix.
                first = (
                    self._client()
                    .list_objects_v2(Bucket=self.bucket, Prefix=full, MaxKeys=1)
                    .get("Contents", ())
                )
                if first and first[0]["Key"] == full:
                    keys.append(full)
            keys.extend(obj["Key"] for obj in self._list_full(f"{full}/" if full else ""))
        except (ClientError, BotoCoreError) as exc:
            raise self._error(exc, rel or None) from exc
        return keys

    def list(self, prefix: str = "") -> list[str]:
        return sorted(self._relative(k) for k in self._list_full_keys(prefix))

    def delete_prefix(self, prefix: str) -> int:
        return delete_keys(self, self._list_full_keys(prefix), str(prefix).strip("/") or None)

    def discard_incomplete(self, prefix: str) -> int:
        # A worker killed mid-upload leaves its multipart upload open; S3 bills its
        # parts until it is aborted.
        return abort_uploads(self, str(prefix).strip("/"))

    def warm(self) -> None:
        # The process's first client loads botocore's service models: 0.2-0.3 s of
        # CPU that a worker's first task would otherwise spend.
        with contextlib.suppress(StorageError):
            self._client()

    def preflight(self) -> None:
        """Check the bucket quickly (a wrong endpoint fails in seconds), then probe."""
        try:
            client = self._make_client(
                attempts=PREFLIGHT_ATTEMPTS, connect_timeout=PREFLIGHT_CONNECT_TIMEOUT
            )
            client.list_objects_v2(
                Bucket=self.bucket, MaxKeys=1, Prefix=f"{self.prefix}/" if self.prefix else ""
            )
        except (ClientError, BotoCoreError) as exc:
            raise self._error(exc) from exc
        super().preflight()
