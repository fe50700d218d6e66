"""A lock on S3: a lease object, taken and renewed with conditional PUTs.

S3 has no locks, but it has conditional writes: a PUT with ``If-None-Match: *``
succeeds only where the key does not exist, one with ``If-Match: <etag>`` only if
the object is still the one read. The holder writes the lease and renews it every
:data:`RENEW` seconds; a holder that dies (SIGKILL, a lost machine) stops renewing,
and once the lease is :data:`TTL` seconds old by S3's own clock the next run takes it
over, conditionally on the stale one, so of two runs doing so one wins. A lease
whose holder ran on this host and is no longer running (killed, its pid gone or
reused by a process started since) is taken over at once.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import socket
import threading
from collections.abc import Iterator
from email.utils import parsedate_to_datetime
from typing import Any

import psutil
from botocore.exceptions import ClientError

TTL = 60.0
RENEW = 15.0
_TAKEN = ("PreconditionFailed", "ConditionalRequestConflict")

log = logging.getLogger(__name__)


def _code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


@contextlib.contextmanager
def lease(client: Any, bucket: str, key: str, owner: str) -> Iterator[None]:
    """Hold ``key`` for the block; ``BlockingIOError`` naming the holder if held."""
    me = psutil.Process()
    body = json.dumps(
        {"owner": owner, "host": socket.gethostname(), "pid": me.pid, "started": me.create_time()}
    ).encode()
    etag = _acquire(client, bucket, key, body)
    if etag is None:  # an S3-compatible store without conditional writes
        yield
        return
    stop = threading.Event()
    renewer = threading.Thread(
        target=_renew, args=(client, bucket, key, body, etag, stop), daemon=True
    )
    renewer.start()
    try:
        yield
    finally:
        stop.set()
        renewer.join()
        with contextlib.suppress(ClientError):
            got = client.get_object(Bucket=bucket, Key=key)
            if json.loads(got["Body"].read()).get("owner") == owner:
                client.delete_object(Bucket=bucket, Key=key)


def _acquire(client: Any, bucket: str, key: str, body: bytes) -> str | None:
    for _attempt in range(3):
        try:
            return client.put_object(Bucket=bucket, Key=key, Body=body, IfNoneMatch="*")["ETag"]
        except ClientError as exc:
            if _code(exc) == "NotImplemented":
                log.warning("s3://%s/%s: no conditional writes; the job is not locked", bucket, key)
                return None
            if _code(exc) not in _TAKEN:
                raise
        try:
            got = client.get_object(Bucket=bucket, Key=key)
        except ClientError as exc:
            if _code(exc) in ("NoSuchKey", "404"):
                continue  # let go meanwhile
            raise
        record = json.loads(got["Body"].read())
        holder = record.get("owner", "another run")
        now = parsedate_to_datetime(got["ResponseMetadata"]["HTTPHeaders"]["date"])
        age = (now - got["LastModified"]).total_seconds()
        if age < TTL and not _gone(record):
            raise BlockingIOError(
                errno.EAGAIN, f"{holder} (its lease was renewed {max(age, 0):.0f} s ago)"
            )
        try:  # the holder stopped renewing: take over, unless another run just did
            return client.put_object(Bucket=bucket, Key=key, Body=body, IfMatch=got["ETag"])["ETag"]
        except ClientError as exc:
            if _code(exc) not in _TAKEN:
                raise
    raise BlockingIOError(errno.EAGAIN, "another run (the lock changed hands as we tried)")


def _gone(record: dict) -> bool:
    """Whether the holder ran on this host and has ended (the usual case of a run
    killed and started again: no need to wait for its lease to lapse)."""
    if record.get("host") != socket.gethostname() or not isinstance(record.get("pid"), int):
        return False
    if record["pid"] == os.getpid():
        return False
    try:
        return abs(psutil.Process(record["pid"]).create_time() - record.get("started", 0)) > 1
    except psutil.NoSuchProcess:
        return True
    except psutil.Error:
        return False


def _renew(client: Any, bucket: str, key: str, body: bytes, etag: str, stop) -> None:
    while not stop.wait(RENEW):
        try:
            etag = client.put_object(Bucket=bucket, Key=key, Body=body, IfMatch=etag)["ETag"]
        except ClientError as exc:
            if _code(exc) in _TAKEN:
                log.error("s3://%s/%s: the lease was taken over (renewals stalled > %ss)",
                          bucket, key, TTL)  # fmt: skip
                return
            log.warning("s3://%s/%s: renewing the lease failed: %s", bucket, key, exc)
