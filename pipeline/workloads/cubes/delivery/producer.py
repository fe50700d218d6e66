"""Worker side of local delivery: build the batches a consumer asks for, in place,
in shared-memory buffers both processes map.

A producer runs as one long Dask task per worker. The consumer sends ``build``
requests (cube ids and the buffer to build them in, with the buffer's descriptor
the first time it is used); the producer answers ``built`` when the batch is
complete. A buffer is built into again only when the consumer has asked for it
again, i.e. after the consumer released it, so a producer never overwrites cubes
the consumer is still reading.

The consumer may build some of a batch itself while it waits for it: the producer
builds the batch's parts (:mod:`.parts`) from the first, the consumer from the
last, and they stop where they meet. Two words after the batch in its buffer say
where: ``front``, the parts the producer has finished, and ``back``, the first
part the consumer has taken. Neither is ever lowered by the other side, and a part
one side reads as not taken is at worst built by both, which writes the same
bytes twice; a part is never skipped by both. The consumer reads the batch only
after the ``built`` message (a system call on each side, so the producer's writes
are visible, whatever the CPU's memory order).
"""

from __future__ import annotations

import contextlib
import mmap
import os
import traceback

import numpy as np

from ..workload import CubeJob, CubeWorkload
from . import channel
from .parts import batch_view, build_part, part_layout

__all__ = ["produce", "reachable"]


def reachable(address: str) -> bool:
    """Worker: can this process reach the consumer's channel (same host and network
    namespace)? Run with ``client.run`` before choosing local delivery."""
    try:
        sock = channel.connect(address, timeout=2.0)
    except OSError:
        return False
    with contextlib.closing(channel.Channel(sock)) as conn:
        conn.send({"op": "probe"})
    return True


#: Bytes after a batch in its buffer: the int64 words ``front`` and ``back``.
TRAILER_BYTES = 64
FRONT, BACK = 0, 1


def buffer_views(
    region: mmap.mmap, job: CubeJob, batch_cubes: int, contiguous: bool = False
) -> tuple[np.ndarray, np.ndarray]:
    """A buffer's batch, (d, d, d, n) Fortran-ordered (or with ``contiguous`` (n, d,
    d, d) C-ordered), and its ``front`` and ``back`` words, as both sides see them."""
    d, dtype = job.dim, np.dtype(job.dtype)
    flat = np.frombuffer(region, dtype=dtype, count=batch_cubes * d**3)
    words = np.frombuffer(region, dtype=np.int64, count=2, offset=flat.nbytes)
    return batch_view(flat, d, batch_cubes, contiguous), words


def produce(
    address: str,
    workload: CubeWorkload,
    batch_cubes: int,
    bounds: list[int],
    contiguous: bool = False,
) -> int:
    """Worker task: serve build requests until the consumer says stop or goes away.
    ``bounds`` are the bounds of a cube's parts (:func:`.parts.part_bounds`), and
    ``contiguous`` the batches' layout (:mod:`.parts`).

    Returns the number of batches built (0 when the consumer was already gone).
    """
    try:
        sock = channel.connect(address)
    except OSError:
        return 0  # the consumer finished (or died) before this task started
    conn = channel.Channel(sock)
    buffers: dict[int, tuple[mmap.mmap, np.ndarray, np.ndarray]] = {}
    built = 0
    try:
        conn.send({"op": "hello", "pid": os.getpid()})
        job = workload.job
        batch_bytes = batch_cubes * job.dim**3 * np.dtype(job.dtype).itemsize
        while True:
            message, fd = conn.receive()
            if message is None or message.get("op") != "build":
                if fd is not None:
                    os.close(fd)
                return built
            slot, ids = message["buffer"], message["ids"]
            if fd is not None:  # the first request for this buffer
                region = channel.map_buffer(fd, batch_bytes + TRAILER_BYTES)
                views = buffer_views(region, job, batch_cubes, contiguous)
                buffers[slot] = (region, *views)
            _region, batch, words = buffers[slot]
            try:
                _build_front_to_back(workload, ids, batch, words, bounds, contiguous)
                reply = {"op": "built", "batch": message["batch"], "buffer": slot}
            except Exception as exc:
                reply = {"op": "failed", "batch": message["batch"], "buffer": slot}
                reply["error"] = f"{type(exc).__name__}: {exc}"
                reply["traceback"] = traceback.format_exc()
            try:
                conn.send(reply)
            except OSError:
                return built  # the consumer went away
            built += 1
    finally:
        conn.close()
        regions = [region for region, _view, _words in buffers.values()]
        buffers.clear()  # the views go first: a mapping with views cannot close
        for region in regions:
            with contextlib.suppress(BufferError):
                region.close()


def _build_front_to_back(
    workload: CubeWorkload,
    ids: list[int],
    batch: np.ndarray,
    words: np.ndarray,
    bounds: list[int],
    contiguous: bool,
) -> None:
    """Build the batch's parts in order until the consumer's ``back``."""
    layout = part_layout(workload, contiguous)
    per_cube = len(bounds) - 1
    columns, columns_of = None, -1
    for part in range(len(ids) * per_cube):
        if part >= words[BACK]:
            return  # the consumer has built (or is building) the rest
        cube = part // per_cube
        if cube != columns_of:
            columns, columns_of = workload.columns(ids[cube]), cube
        build_part(layout, columns, batch, bounds, part, contiguous)
        words[FRONT] = part + 1
