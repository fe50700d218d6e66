"""Deleting objects and aborting the multipart uploads that killed writers left open."""

from __future__ import annotations

from typing import Any, Protocol

from botocore.exceptions import BotoCoreError, ClientError

from .base import join


class Bucket(Protocol):
    """What cleaning up needs of its store (``S3Store`` is one)."""

    bucket: str
    prefix: str

    def _client(self) -> Any: ...

    def _error(self, exc: BaseException, key: str | None = None) -> OSError: ...

    def _relative(self, full_key: str) -> str: ...


__all__ = ["DELETE_BATCH", "abort_uploads", "delete_keys"]

#: Keys per DeleteObjects request (S3's limit).
DELETE_BATCH = 1000


def delete_keys(store: Bucket, keys: list[str], where: str | None) -> int:
    """Delete ``keys`` (full keys) in batches of :data:`DELETE_BATCH`; the count deleted.
    A failed deletion raises the store's error for the first key that failed."""
    deleted = 0
    client = store._client()
    for start in range(0, len(keys), DELETE_BATCH):
        batch = keys[start : start + DELETE_BATCH]
        try:
            response = client.delete_objects(
                Bucket=store.bucket,
                Delete={"Objects": [{"Key": k} for k in batch], "Quiet": True},
            )
        except (ClientError, BotoCoreError) as exc:
            raise store._error(exc, where) from exc
        errors = response.get("Errors") or []
        deleted += len(batch) - len(errors)
        if errors:
            first = errors[0]
            exc = ClientError(
                {"Error": {"Code": first.get("Code", ""), "Message": first.get("Message", "")}},
                "DeleteObjects",
            )
            err = store._error(exc, store._relative(first.get("Key", "")) or None)
            err.args = (
                f"{err} ({len(errors)} of {len(batch)} deletions failed, "
                f"{deleted} objects deleted)",
            )
            raise err from exc
    return deleted


def abort_uploads(store: Bucket, rel: str) -> int:
    """Abort the multipart uploads left open under ``rel``; their count."""
    full = join(store.prefix, rel)
    client = store._client()
    aborted = 0
    try:
        paginator = client.get_paginator("list_multipart_uploads")
        for page in paginator.paginate(Bucket=store.bucket, Prefix=f"{full}/" if full else ""):
            for upload in page.get("Uploads", ()):
                client.abort_multipart_upload(
                    Bucket=store.bucket, Key=upload["Key"], UploadId=upload["UploadId"]
                )
                aborted += 1
    except (ClientError, BotoCoreError) as exc:
        raise store._error(exc, rel or None) from exc
    return aborted
