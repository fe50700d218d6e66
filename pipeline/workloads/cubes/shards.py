"""Cube shards as ``.npy`` files, built in place in a buffer laid out as the file.

A shard of n cubes of dimension d is a Fortran-ordered array of shape (d, d, d, n):
``np.load(shard)[..., i]`` is cube i with axes (frame, row, column), no copy.

The buffer a worker builds shards in is the whole file: the ``.npy`` header, then
the data, starting on a page boundary. Writing it is then one aligned buffer, which
the local store hands to the disk with direct I/O (no copy through the page cache)
and the S3 store uploads as it is.
"""

from __future__ import annotations

import contextlib
import io
import math
import mmap
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

import numpy as np

from ...storage import Store

__all__ = ["ShardBuffer", "ShardSpec", "read_shard", "shard_buffer", "write_shards"]

T = TypeVar("T")

#: key, array shape, dtype, and a function that fills the array and returns what the
#: caller wants back about the shard (e.g. its manifest rows).
ShardSpec = tuple[str, tuple[int, ...], str, Callable[[np.ndarray], T]]


class ShardBuffer:
    """One shard's file image: ``array`` is the data, ``file`` the bytes to write."""

    def __init__(self, shape: tuple[int, ...], dtype: str):
        header = npy_header(shape, dtype)
        nbytes = len(header) + math.prod(shape) * np.dtype(dtype).itemsize
        image = _page_aligned(nbytes)
        image[: len(header)] = np.frombuffer(header, dtype=np.uint8)
        # numpy pads .npy headers to a multiple of 64 bytes, so the data stays aligned.
        self.array = image[len(header) :].view(dtype).reshape(shape, order="F")
        self.file = memoryview(image)

    def write(self, store: Store, key: str) -> int:
        return store.write(key, [self.file])


def _page_aligned(nbytes: int) -> np.ndarray:
    """Zeroed, page-aligned memory on huge pages where the kernel allows, every page
    touched now: faulting pages in later, while the other buffer is being written
    with direct I/O, is several times slower."""
    region = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    with contextlib.suppress(AttributeError, OSError):  # not Linux, or THP off
        region.madvise(mmap.MADV_HUGEPAGE)
    image = np.frombuffer(region, dtype=np.uint8)
    image.fill(0)
    return image


_pairs: dict = {}


def shard_buffer(shape: tuple[int, ...], dtype: str, slot: int = 0) -> ShardBuffer:
    """This process's buffer number ``slot`` (0 or 1) for shards of ``shape``: reused,
    because a fresh 128 MB array per shard costs more in page faults than building
    the shard. Both slots are made together, before either is being written; the
    pairs of two shapes are kept (a job's full shards and its last, shorter one)."""
    key = (shape, dtype)
    if key not in _pairs:
        if len(_pairs) >= 2:
            # Dropping a reference never frees a buffer a write still holds.
            del _pairs[next(iter(_pairs))]
        _pairs[key] = (ShardBuffer(shape, dtype), ShardBuffer(shape, dtype))
    return _pairs[key][slot]


def write_shards(
    store: Store, specs: Iterable[ShardSpec], phases: dict[str, float] | None = None
) -> Iterator[tuple[str, T | None, int, BaseException | None]]:
    """Build and write shards, each write overlapping the build of the next.

    Yields ``(key, filled, nbytes, error)`` per shard, in order: ``filled`` is what
    the spec's fill function returned, ``error`` what building or writing raised
    (then ``filled`` is None). Two buffers alternate: a buffer is built into only
    after its previous write has finished, so the worker's one compute thread
    never waits for the disk or the network unless they are the slower part.
    ``phases`` (if given) gains the seconds spent building ("compute") and waiting
    for writes ("writing").
    """
    phases = {} if phases is None else phases

    def settle(key: str, filled, future: Future):
        t0 = time.perf_counter()
        try:
            return key, filled, future.result(), None
        except Exception as exc:
            return key, None, 0, exc
        finally:
            phases["writing"] = phases.get("writing", 0.0) + time.perf_counter() - t0

    with ThreadPoolExecutor(1, thread_name_prefix="shard-writer") as writer:
        in_flight: tuple[str, object, Future] | None = None
        built = 0
        for key, shape, dtype, fill in specs:
            shard = shard_buffer(shape, dtype, slot=built % 2)
            t0 = time.perf_counter()
            try:
                filled = fill(shard.array)
            except Exception as exc:
                if in_flight is not None:
                    yield settle(*in_flight)
                    in_flight = None
                yield key, None, 0, exc
                continue
            finally:
                phases["compute"] = phases.get("compute", 0.0) + time.perf_counter() - t0
            built += 1
            future = writer.submit(shard.write, store, key)
            if in_flight is not None:
                yield settle(*in_flight)
            in_flight = (key, filled, future)
        if in_flight is not None:
            yield settle(*in_flight)


def npy_header(shape: tuple[int, ...], dtype: str) -> bytes:
    buf = io.BytesIO()
    header = {"descr": np.lib.format.dtype_to_descr(np.dtype(dtype))}
    header.update(fortran_order=True, shape=tuple(shape))
    np.lib.format.write_array_header_1_0(buf, header)
    return buf.getvalue()


def read_shard(data: bytes | str) -> np.ndarray:
    """A shard's cubes as an array of shape (n, d, d, d), axes (cube, frame, row, column)."""
    src = io.BytesIO(data) if isinstance(data, bytes | bytearray) else data
    return np.moveaxis(np.load(src), -1, 0)
