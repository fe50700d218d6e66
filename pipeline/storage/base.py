"""The store interface: a flat namespace of keys under one root URL.

Workers never receive a store object: they receive its URL and reopen it with
:func:`pipeline.storage.open_store`, which caches one instance per process.
That keeps clients that do not pickle (boto3) out of task graphs.
"""

from __future__ import annotations

import contextlib
import io
import os
from abc import ABC, abstractmethod
from collections.abc import Iterable
from typing import BinaryIO

from ..errors import UnreadableObject

Buffer = bytes | bytearray | memoryview


class Store(ABC):
    """Objects addressed by ``/``-separated keys relative to :attr:`url`.

    Writes are atomic: a reader sees either the whole new object or the old one
    (or nothing), never a partial object. That is what lets a task write its
    data first and its manifest entry last, and lets a retried task overwrite
    its own output.
    """

    #: Reads wait on a network (so many may be in flight); a local disk's do not.
    remote: bool = True

    @classmethod
    def from_url(cls, url: str) -> Store:
        """The store whose root is ``url`` (of this class's scheme)."""
        return cls(url)

    #: The root, e.g. ``/data/out`` or ``s3://bucket/prefix``.
    url: str

    @abstractmethod
    def write(self, key: str, chunks: Iterable[Buffer]) -> int:
        """Write the concatenation of ``chunks`` to ``key`` atomically; return its size."""

    @abstractmethod
    def read_bytes(self, key: str) -> bytes:
        """The whole object; ``FileNotFoundError`` when it does not exist."""

    @abstractmethod
    def open_input(self, key: str) -> BinaryIO:
        """A seekable binary file for formats that read parts (parquet footers, row groups)."""

    def open_ranges(self, key: str, spans: list[tuple[int, int]]) -> BinaryIO:
        """:meth:`open_input` for a reader about to read the byte ranges ``spans``
        (start, end): a remote store fetches them up front in as few requests as it can."""
        return self.open_input(key)

    @abstractmethod
    def exists(self, key: str) -> bool: ...

    @abstractmethod
    def list(self, prefix: str = "") -> list[str]:
        """Keys under ``prefix`` (a folder-like prefix, without trailing slash), sorted."""

    @abstractmethod
    def delete_prefix(self, prefix: str) -> int:
        """Delete every key under ``prefix``; return how many were deleted."""

    def listed_versions(self, start: str = "", limit: int | None = None) -> list[tuple[str, str]]:
        """``(key, version)`` of the objects whose key begins with ``start`` (any
        text, not only a folder's: ``logs/2024-01-`` lists only those), in key order,
        at most ``limit``. A store whose listing gives versions overrides this to
        save a :meth:`version` call an object."""
        folder = start.rpartition("/")[0]
        keys = [k for k in self.list(folder) if k.startswith(start)]
        return [(k, self.version(k)) for k in keys[:limit]]

    def discard_incomplete(self, prefix: str) -> int:
        """Remove what writers killed mid-write left under ``prefix``; return how many.

        Atomic writes never expose these, but they take space (and, on S3, cost
        money) until removed. Call it only when no write under ``prefix`` is under way.
        """
        return 0

    def create_once(self, key: str, data: Buffer) -> bool:
        """Write ``data`` to ``key`` atomically only where no object is there; whether
        this call made it. Of writers racing on one key exactly one gets True, and
        nothing overwrites the object it made (how a task's entry is committed once)."""
        raise NotImplementedError(f"{type(self).__name__} has no create-once write")

    def size(self, key: str) -> int:
        return len(self.read_bytes(key))

    def version(self, key: str) -> str:
        """A token that changes when the object changes (for caches keyed on inputs);
        it starts with the size in bytes (``pipeline.inputs.dataset`` reads it)."""
        return str(self.size(key))

    def write_bytes(self, key: str, data: Buffer) -> int:
        return self.write(key, [data])

    def describe(self, key: str = "") -> str:
        """A human-readable location for messages."""
        return f"{self.url.rstrip('/')}/{key}" if key else self.url

    @abstractmethod
    def hold(self, key: str, owner: str) -> contextlib.AbstractContextManager[None]:
        """Hold ``key`` as a lock for the ``with`` block; another holder's ``owner``
        text is in the ``BlockingIOError`` raised when it is held. A holder that dies,
        even by SIGKILL, lets go (at once on a local disk; on S3 when its lease lapses)."""

    def warm(self) -> None:
        """Get ready for a task's first request (a worker's, while the driver validates)."""
        return None

    def free_bytes(self) -> int | None:
        """Bytes free where the objects go; None: no limit (an object store)."""
        return None

    def preflight(self) -> None:
        """Check that the store can be written, read and deleted; raise ``StorageError``."""
        from ..errors import StorageError

        probe = "_preflight/probe"
        payload = b"pipeline preflight probe"
        try:
            self.write_bytes(probe, payload)
            if self.read_bytes(probe) != payload:
                raise StorageError(f"{self.describe(probe)}: read back different bytes")
            self.delete_prefix("_preflight")
        except StorageError:
            raise
        except OSError as exc:
            raise StorageError(f"cannot write, read and delete in {self.url}: {exc}") from exc

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r})"


def join(*parts: str) -> str:
    """Join key parts with ``/``, ignoring empty ones."""
    return "/".join(p.strip("/") for p in parts if p and p.strip("/"))


def read_parquet_file(store: Store, key: str):
    """A ``pyarrow.parquet.ParquetFile`` over a stored object (reads footer only)."""
    import pyarrow.parquet as pq

    return pq.ParquetFile(store.open_input(key))


#: Objects of a remote store read at once by :func:`per_object`: on S3 each is a round
#: trip or two, so thousands of small files (or task tables at a job's end) read one
#: after another would take minutes.
READ_THREADS = 16


def per_object(store: Store, fn, items, *, heavy: bool = False) -> list:
    """``[fn(x) for x in items]``, in threads for a remote store, or for ``heavy``
    items (each mostly time in pyarrow or numpy, which let go of the GIL: the chunk
    keys of a few large files). Small ones from a local disk would only contend for
    the GIL in threads (twice as slow on thousands of files)."""
    if not (store.remote or heavy) or len(items) < 2:
        return [fn(x) for x in items]
    from concurrent.futures import ThreadPoolExecutor

    # A remote store's first call creates its client before the threads share it.
    first = [fn(items[0])] if store.remote else []
    rest = items[len(first) :]
    threads = READ_THREADS if store.remote else os.cpu_count() or 1
    with ThreadPoolExecutor(min(threads, len(rest))) as pool:
        return first + list(pool.map(fn, rest))


def read_parquet(source, columns: list[str] | None = None):
    """One parquet file (its bytes, or a file object) as a ``pyarrow.Table``.

    Through ``ParquetFile``, never ``pq.read_table``, and on the calling thread (as is
    every ``to_pandas``: ``use_threads=False``): a task of pyarrow's pools (the dataset
    scanner's, or the CPU pool's that decodes columns with ``use_threads``) can drop the
    last reference to the Python bytes it read from after the call returned; if the
    interpreter is finalizing by then, taking the GIL ends that thread with
    ``pthread_exit``, and its unwinding through Arrow's ``noexcept`` frames aborts the
    process ("terminate called without an active exception", exit 134) after the
    command's work is done (``scripts/exit_stress.py --widen-us`` reproduces it). A read
    on the calling thread starts no pool thread."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    if isinstance(source, (bytes, bytearray, memoryview)):
        source = pa.BufferReader(source)
    return pq.ParquetFile(source).read(columns=columns, use_threads=False)


@contextlib.contextmanager
def _parquet_of(store: Store, key: str):
    """An object that does not read as parquet (a bad footer is an ArrowInvalid, a bad
    page an OSError: "Corrupt snappy compressed data") is an :class:`UnreadableObject`
    naming it: pyarrow names no file."""
    import pyarrow as pa

    try:
        yield
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise UnreadableObject(store.describe(key), str(exc)) from None


def read_parquet_object(store: Store, key: str, columns: list[str] | None = None):
    """The ``pyarrow.Table`` stored at ``key`` (:func:`read_parquet`); one that does not
    read as a table is an :class:`UnreadableObject` naming it."""
    data = store.read_bytes(key)
    with _parquet_of(store, key):
        return read_parquet(data, columns)


def read_parquet_schema(store: Store, key: str):
    """The schema of the parquet object at ``key``, from its footer alone; an unreadable
    one is an :class:`UnreadableObject` naming it."""
    import pyarrow.parquet as pq

    with store.open_input(key) as f, _parquet_of(store, key):
        return pq.read_schema(f)


def read_parquet_tables(store: Store, keys: list[str], columns: list[str] | None = None) -> list:
    """The ``pyarrow.Table`` of each key, in order (:func:`per_object`)."""
    return per_object(store, lambda key: read_parquet_object(store, key, columns), keys)


def write_parquet(store: Store, key: str, table) -> int:
    """Write a ``pyarrow.Table`` as one parquet object."""
    import pyarrow.parquet as pq

    sink = io.BytesIO()
    pq.write_table(table, sink)
    return store.write_bytes(key, sink.getbuffer())
