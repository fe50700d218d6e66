"""Worker side of local delivery: build the batches a consumer asks for, in place,
in shared-memory buffers the consumer maps once and reads without a copy.

A producer runs as one long Dask task per worker. The consumer sends
``build`` requests (cube ids and the buffer to build them in); the producer
answers ``built`` when the batch is complete, with the buffer's descriptor the
first time that buffer is used. A buffer is built into again only when the
consumer has asked for it again, i.e. after the consumer released it, so a
producer never overwrites cubes the consumer is still reading.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import traceback

import numpy as np

from ..workloads.cubes import CubeWorkload
from . import channel

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


def produce(address: str, workload: CubeWorkload, batch_cubes: int) -> int:
    """Worker task: serve build requests until the consumer says stop or goes away.

    Returns the number of batches built (0 when the consumer was already gone).
    """
    try:
        sock = channel.connect(address)
    except OSError:
        return 0  # the consumer finished (or died) before this task started
    conn = channel.Channel(sock)
    buffers: dict[int, tuple[mmap.mmap, np.ndarray]] = {}
    built = 0
    try:
        conn.send({"op": "hello", "pid": os.getpid()})
        d, dtype = workload.job.dim, np.dtype(workload.job.dtype)
        nbytes = batch_cubes * d**3 * dtype.itemsize
        while True:
            message, fd = conn.receive()
            if fd is not None:
                os.close(fd)
            if message is None or message.get("op") != "build":
                return built
            slot, ids = message["buffer"], range(message["start"], message["stop"])
            new_fd = None
            if slot not in buffers:
                new_fd, region = channel.new_buffer(nbytes)
                shape = (d, d, d, batch_cubes)
                view = np.frombuffer(region, dtype=dtype).reshape(shape, order="F")
                buffers[slot] = (region, view)
            try:
                workload.build_batch(ids, buffers[slot][1])
                reply = {"op": "built", "batch": message["batch"], "buffer": slot}
            except Exception as exc:
                reply = {"op": "failed", "batch": message["batch"], "buffer": slot}
                reply["error"] = f"{type(exc).__name__}: {exc}"
                reply["traceback"] = traceback.format_exc()
            try:
                conn.send(reply, fd=new_fd)
            except OSError:
                return built  # the consumer went away
            finally:
                if new_fd is not None:
                    os.close(new_fd)  # the consumer has its own descriptor now
            built += 1
    finally:
        conn.close()
        regions = [region for region, _view in buffers.values()]
        buffers.clear()  # the views go first: a mapping with views cannot close
        for region in regions:
            with contextlib.suppress(BufferError):
                region.close()
