"""Storage backends behind one small interface (:class:`Store`)."""

from __future__ import annotations

import functools
import io
import os
import re

from ..errors import ConfigError
from .base import (
    Store,
    join,
    per_object,
    read_parquet,
    read_parquet_file,
    read_parquet_object,
    read_parquet_schema,
    read_parquet_tables,
    write_parquet,
)
from .local import LocalStore
from .schemes import is_remote, scheme_of, store_class

__all__ = [
    "LocalStore",
    "checked_output",
    "Store",
    "join",
    "open_file",
    "open_store",
    "per_object",
    "read_parquet",
    "read_parquet_file",
    "read_parquet_object",
    "read_parquet_schema",
    "read_parquet_tables",
    "is_remote",
    "scheme_of",
    "store_class",
    "write_parquet",
]


def open_store(url: str) -> Store:
    """The store for ``url``: a local path, ``file://`` path, ``s3://bucket/prefix``,
    or a URL of a scheme a package adds (:mod:`.schemes`).

    Cached per process so that each worker keeps one client per store (a relative
    local path per working folder: ``out`` after ``os.chdir`` is another folder).
    """
    url = str(url)
    local = scheme_of(url) == "file" and not os.path.isabs(
        os.path.expanduser(url.removeprefix("file://"))
    )
    return _open_store(url, os.getcwd() if local else "")


@functools.lru_cache(maxsize=16)
def _open_store(url: str, _working_folder: str) -> Store:
    scheme = scheme_of(url)
    try:
        cls = store_class(scheme)
    except ConfigError as exc:
        raise ConfigError(f"output/input URL {url!r}: {exc}") from None
    if scheme != "file":
        return cls.from_url(url)
    if re.match(r"[A-Za-z][A-Za-z0-9+.-]+:/(?!/)", url):
        # s3:/bucket/x: a URL missing a slash would be a local folder named "s3:"
        fixed = re.sub(r":/", "://", url, count=1)
        raise ConfigError(
            f"output/input {url!r} reads as a URL missing a '/' (did you mean {fixed!r}?); "
            "a local folder whose name ends in ':' can be given as ./" + url
        )
    return cls.from_url(url)


def checked_output(output: str) -> Store:
    """The store of ``output``, for a folder under it that a job's set-up writes (its
    ``inputs``), checked first so that a bad output is named as given: ``s3://`` (read
    as ``s3:/inputs``, a URL missing a '/'), a local file or a folder under one (the
    writes under it failed with a bare "Not a directory"). An object store's own
    check, a round trip, is left to the run's."""
    store = open_store(output)
    if not store.remote:
        store.preflight()
    return store


def open_file(path, mode: str = "rb", encoding: str | None = None):
    """Open a local path or an ``s3://`` URL for reading, as a file object.

    What a ``map`` function over ``files`` needs: its paths may be ``s3://`` URLs,
    read here through the same S3 settings as the job's own (endpoint, credentials,
    retries; ranged GETs, so a reader that seeks fetches what it reads). ``mode``:
    ``"rb"`` or ``"r"`` (text, ``encoding`` default UTF-8)."""
    if mode not in ("rb", "r"):
        raise ConfigError(f"open_file({path!r}): mode {mode!r}; expected 'rb' or 'r' (reading)")
    path = str(path)
    if not is_remote(path):
        return open(path.removeprefix("file://"), mode, encoding=encoding if mode == "r" else None)
    folder, _, name = path.rpartition("/")
    if "/" not in path.partition("://")[2] or not name:
        scheme = scheme_of(path)
        raise ConfigError(
            f"open_file({path!r}): expected {scheme}://bucket/key, the URL of an object"
        )
    raw = open_store(folder).open_input(name)
    if mode == "rb":
        return io.BufferedReader(raw)
    return io.TextIOWrapper(io.BufferedReader(raw), encoding=encoding or "utf-8")
