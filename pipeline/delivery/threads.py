"""Cubes built by threads of the consumer's own process, when no cluster is configured.

The consumer is on this machine and so is every core that could build: building in
its own process skips starting a cluster (about 1.5 s) and all inter-process traffic,
and a cube is read while it is still in the CPU's shared cache. ``np.take`` releases
the GIL while it copies, so builder threads run beside the consumer's loop.

One builder thread per core but the consumer's: on two cores, one builder and the
consumer delivered 1,800-2,000 cubes/s where two builders delivered 1,600 (three
threads on two cores, and twice the buffers in the 32 MB cache).

Cubes come in id order whatever the threads' timing (each batch is waited for in
the order it was asked for). A batch's buffer is reused once the consumer drops the
last view of it, so memory stays bounded; a consumer that keeps every cube gets a new
buffer each time rather than a deadlock, as it would with copies.
"""

from __future__ import annotations

import os
import queue
import threading
import weakref
from collections.abc import Iterator

import numpy as np

from ..workloads.cubes import CubeWorkload
from .local import _BatchMemory

__all__ = ["builder_threads", "thread_batches"]

#: Buffers per builder thread to begin with: one being built, one being read. A
#: third would not fit beside them in a 32 MB cache: on two cores, one builder
#: delivered 1,400-1,800 cubes/s with two buffers, 800-1,300 with three.
BUFFERS_PER_THREAD = 2
#: Builder threads at most: each cube holds the GIL for its columns' draw (tens of
#: microseconds), so beyond this the threads would queue for it, not build.
MAX_THREADS = 16


def builder_threads() -> int:
    return max(1, min(MAX_THREADS, (os.cpu_count() or 2) - 1))


class _Builders:
    """Threads that build batches in order of their numbers into free buffers."""

    def __init__(self, workload: CubeWorkload, batch_cubes: int, threads: int):
        d, dtype = workload.job.dim, np.dtype(workload.job.dtype)
        self.workload, self.batch_cubes = workload, batch_cubes
        self.shape, self.dtype = (d, d, d, batch_cubes), dtype
        self.n_batches = -(-workload.n_units // batch_cubes)
        self.free: queue.SimpleQueue = queue.SimpleQueue()  # put from any thread
        for _ in range(BUFFERS_PER_THREAD * threads):
            self.free.put(self.new_buffer())
        self.cond = threading.Condition()
        self.next_batch = 0
        self.done: dict[int, np.ndarray | BaseException] = {}
        self.waiting: set[int] = set()  # batches whose builder waits for a buffer
        self.stopped = False
        workload._layout()  # loaded (and cached) once here, not by each thread at once
        self.threads = [
            threading.Thread(target=self._run, name=f"pipeline-cubes-{i}", daemon=True)
            for i in range(threads)
        ]
        for thread in self.threads:
            thread.start()

    def new_buffer(self) -> np.ndarray:
        return np.empty(self.shape, dtype=self.dtype, order="F")

    def ids(self, batch: int) -> range:
        start = batch * self.batch_cubes
        return range(start, min(self.workload.n_units, start + self.batch_cubes))

    def _run(self) -> None:
        while True:
            with self.cond:
                if self.stopped or self.next_batch >= self.n_batches:
                    return
                batch, self.next_batch = self.next_batch, self.next_batch + 1
                try:  # taken under the lock: take() never sees a builder about to get one
                    array = self.free.get_nowait()
                except queue.Empty:
                    array = False
                    self.waiting.add(batch)
                    self.cond.notify_all()
            if array is False:
                array = self.free.get()
                with self.cond:
                    self.waiting.discard(batch)
            if array is None:  # stopped
                return
            try:
                self.workload.build_batch(self.ids(batch), array)
                result = array
            except BaseException as exc:
                result = exc
            with self.cond:
                self.done[batch] = result
                self.cond.notify_all()

    def take(self, batch: int) -> np.ndarray:
        """Batch ``batch``'s buffer, once built."""
        with self.cond:
            while batch not in self.done:
                if batch in self.waiting and self.free.empty():
                    # Its builder waits for a buffer, and while this waits the consumer
                    # releases none: it holds them all. A new one, not a deadlock.
                    self.free.put(self.new_buffer())
                self.cond.wait()
            result = self.done.pop(batch)
        if isinstance(result, BaseException):
            raise result
        return result

    def stop(self) -> None:
        with self.cond:
            self.stopped = True
        for _ in self.threads:
            self.free.put(None)
        for thread in self.threads:
            thread.join()


def thread_batches(
    workload: CubeWorkload, batch_cubes: int, threads: int | None = None
) -> Iterator[tuple[range, np.ndarray]]:
    """Yield ``(cube ids, batch)`` in id order; ``batch`` is (d, d, d, n) Fortran-ordered,
    ``batch[..., i]`` cube ``ids[i]``, as the other deliveries give them."""
    batch_cubes = max(1, min(batch_cubes, workload.n_units))  # buffers no larger than the job
    builders = _Builders(workload, batch_cubes, threads or builder_threads())
    try:
        for batch in range(builders.n_batches):
            array = builders.take(batch)
            owner = _BatchMemory(array, array.shape, array.dtype)
            # Back to the builders when the consumer drops the last view of it: a
            # builder waiting for a buffer starts at once, while the consumer reads.
            weakref.finalize(owner, builders.free.put, array)
            view = np.asarray(owner)
            del owner, array
            ids = builders.ids(batch)
            yield ids, view[..., : len(ids)]
            del view
    finally:
        builders.stop()
