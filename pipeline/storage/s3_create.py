"""Create-once writes on S3: a PUT with ``If-None-Match: *``, which S3 (since 2024)
and SeaweedFS carry out only where the key holds no object, so of writers racing on
one key exactly one succeeds (``412 PreconditionFailed`` for the others;
``409 ConditionalRequestConflict`` while another's is under way)."""

from __future__ import annotations

import logging
from typing import Any, Protocol

from botocore.exceptions import BotoCoreError, ClientError

from .base import Buffer

__all__ = ["put_if_absent"]

log = logging.getLogger(__name__)


class Bucket(Protocol):
    """What a create-once write needs of its store (``S3Store`` is one)."""

    bucket: str
    url: str

    def _client(self) -> Any: ...

    def _key(self, key: str) -> str: ...

    def _error(self, exc: BaseException, key: str | None = None) -> OSError: ...

    def exists(self, key: str) -> bool: ...

    def write_bytes(self, key: str, data: Buffer) -> int: ...


_TAKEN = ("PreconditionFailed", "ConditionalRequestConflict")
_warned: set[str] = set()


def put_if_absent(store: Bucket, key: str, data: Buffer) -> bool:
    """Whether this PUT made ``key`` (False: an object was there, or another writer's
    won). A server without conditional writes gets a look then a plain PUT, said once:
    first-to-commit then holds only between writers that do not overlap."""
    client, full = store._client(), store._key(key)
    body = bytes(data)
    try:
        client.put_object(Bucket=store.bucket, Key=full, Body=body, IfNoneMatch="*")
    except ClientError as exc:
        code = str(exc.response.get("Error", {}).get("Code", ""))
        if code in _TAKEN:
            return False
        if code != "NotImplemented":
            raise store._error(exc, key) from exc
        if store.url not in _warned:
            _warned.add(store.url)
            log.warning("%s: no conditional writes; a task's entry is checked, then written",
                        store.url)  # fmt: skip
        if store.exists(key):
            return False
        store.write_bytes(key, body)
    except BotoCoreError as exc:
        raise store._error(exc, key) from exc
    return True
