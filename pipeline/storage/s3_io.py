"""Streams over S3 objects: upload bodies made of buffers without copying them, and
a seekable input file that fetches byte ranges as a reader asks for them."""

from __future__ import annotations

import bisect
import io
import threading
from typing import Any, Protocol

from ..errors import StorageError
from .base import Buffer


class ObjectSource(Protocol):
    """What a ranged reader needs of its store (``S3Store`` is one)."""

    def describe(self, key: str) -> str: ...

    def _get(self, key: str, **kwargs: Any) -> bytes: ...


MiB = 1024 * 1024
#: Smallest ranged GET of open_input(); sequential reading grows the read-ahead.
MIN_FETCH = 64 * 1024
MAX_READAHEAD = 8 * MiB
#: prefetch() reads through gaps up to this size rather than making another request
#: (1 MiB takes ~10 ms at S3's per-connection rate, less than a GET's first byte)...
MAX_HOLE = 1 * MiB
#: ...into requests of at most this size.
MAX_SPAN = 64 * MiB


def byte_view(chunk: Buffer) -> memoryview:
    """A flat unsigned-byte view of ``chunk``, without copying when contiguous."""
    view = memoryview(chunk)
    if view.format == "B" and view.ndim == 1 and view.c_contiguous:
        return view
    if view.c_contiguous:
        return view.cast("B")
    return memoryview(view.tobytes())


class _Seekable(io.RawIOBase):
    """A read-only file of ``_size`` bytes at position ``_pos``."""

    _pos = 0
    _size = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        if self.closed:
            raise ValueError("seek on closed file")
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}[whence]
        if base + offset < 0:
            raise ValueError("negative seek position")
        self._pos = base + offset
        return self._pos


class ChunksReader(_Seekable):
    """A seekable read-only file over a list of byte views (no up-front copy)."""

    def __init__(self, views: list[memoryview]):
        self._views = [v for v in views if v.nbytes]
        self._starts: list[int] = []
        total = 0
        for view in self._views:
            self._starts.append(total)
            total += view.nbytes
        self._size = total
        self._pos = 0

    def _slices(self, n: int) -> list[memoryview]:
        end = min(self._size, self._pos + n)
        out = []
        i = bisect.bisect_right(self._starts, self._pos) - 1
        pos = self._pos
        while pos < end and i < len(self._views):
            start = self._starts[i]
            view = self._views[i]
            take = min(view.nbytes - (pos - start), end - pos)
            out.append(view[pos - start : pos - start + take])
            pos += take
            i += 1
        self._pos = pos
        return out

    def read(self, size: int | None = -1) -> bytes:
        n = self._size - self._pos if size is None or size < 0 else size
        parts = self._slices(n)
        return parts[0].tobytes() if len(parts) == 1 else b"".join(parts)

    def readall(self) -> bytes:
        return self.read(-1)

    def readinto(self, buffer: Any) -> int:
        target = memoryview(buffer).cast("B")
        done = 0
        for part in self._slices(target.nbytes):
            target[done : done + part.nbytes] = part
            done += part.nbytes
        return done


class S3InputFile(_Seekable):
    """A seekable read-only file over one object, read with ranged GETs.

    Each read fetches what it needs (at least :data:`MIN_FETCH`), so a parquet
    reader pays for the footer and the column chunks it reads, not the object.
    Reads that continue where the previous fetch ended grow a read-ahead up to
    :data:`MAX_READAHEAD`. Ranged GETs carry ``If-Match`` with the ETag seen at
    open, so an object replaced meanwhile fails instead of mixing versions.
    """

    def __init__(self, store: ObjectSource, key: str, size: int, etag: str | None):
        self._store = store
        self._key = key
        self._size = int(size)
        self._etag = etag
        self.name = store.describe(key)
        self._pos = 0
        self._cache = b""
        self._cache_start = 0
        self._readahead = 0
        self._lock = threading.Lock()
        #: Ranges fetched ahead by :meth:`prefetch`: sorted starts, and their bytes.
        self._held_starts: list[int] = []
        self._held: list[bytes] = []

    def prefetch(self, spans: list[tuple[int, int]]) -> None:
        """Fetch the byte ranges a reader is about to read, merged where they are close
        (a task's row groups: one GET per run of them instead of one per column chunk)."""
        merged: list[list[int]] = []
        for start, end in sorted(spans):
            if merged and start - merged[-1][1] <= MAX_HOLE and end - merged[-1][0] <= MAX_SPAN:
                merged[-1][1] = max(merged[-1][1], end)
            else:
                merged.append([start, end])
        for start, end in merged:
            end = min(end, self._size)
            if end > start:
                self._held_starts.append(start)
                self._held.append(self._fetch(start, end))

    def _from_held(self, pos: int, end: int) -> memoryview | None:
        i = bisect.bisect_right(self._held_starts, pos) - 1
        if i < 0:
            return None
        off = pos - self._held_starts[i]
        data = self._held[i]
        if end - self._held_starts[i] > len(data):
            return None
        return memoryview(data)[off : off + (end - pos)]

    def _fetch(self, start: int, end: int) -> bytes:
        kwargs: dict[str, Any] = {"Range": f"bytes={start}-{end - 1}"}
        if self._etag:
            kwargs["IfMatch"] = self._etag
        data = self._store._get(self._key, **kwargs)
        if len(data) != end - start:
            raise StorageError(
                f"{self.name}: asked for bytes {start}-{end - 1}, got {len(data)} bytes"
            )
        return data

    def read(self, size: int | None = -1) -> bytes:
        if self.closed:
            raise ValueError("read of closed file")
        with self._lock:
            pos = self._pos
            end = self._size if size is None or size < 0 else min(self._size, pos + size)
            if end <= pos:
                return b""
            if self._held:
                view = self._from_held(pos, end)
                if view is not None:
                    self._pos = end
                    return view.tobytes() if view.nbytes != len(view.obj) else view.obj
            pieces: list[bytes | memoryview] = []
            cache_end = self._cache_start + len(self._cache)
            if self._cache_start <= pos < cache_end:
                take = min(end, cache_end) - pos
                off = pos - self._cache_start
                pieces.append(memoryview(self._cache)[off : off + take])
                pos += take
            if pos < end:
                if pos == cache_end and self._cache:
                    self._readahead = min(MAX_READAHEAD, max(MIN_FETCH, 2 * self._readahead))
                else:
                    self._readahead = 0
                fetch_end = min(self._size, max(end, pos + MIN_FETCH) + self._readahead)
                data = self._fetch(pos, fetch_end)
                self._cache, self._cache_start = data, pos
                pieces.append(memoryview(data)[: end - pos])
                pos = end
            self._pos = pos
            if (
                len(pieces) == 1
                and isinstance(pieces[0], memoryview)
                and pieces[0].nbytes == len(pieces[0].obj)
            ):
                return pieces[0].obj  # the whole fetch: no copy
            return b"".join(pieces)

    def readall(self) -> bytes:
        return self.read(-1)

    def readinto(self, buffer: Any) -> int:
        target = memoryview(buffer).cast("B")
        data = self.read(target.nbytes)
        target[: len(data)] = data
        return len(data)

    def close(self) -> None:
        self._cache = b""
        self._held, self._held_starts = [], []
        super().close()
