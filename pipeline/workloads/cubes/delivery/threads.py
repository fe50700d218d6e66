"""Cubes built by threads of the consumer's own process, when no cluster is configured.

The consumer is on this machine and so is every core that could build: building in
its own process skips starting a cluster (about 1.5 s) and all inter-process traffic,
and a cube is read while it is still in the CPU's shared cache. ``np.take`` releases
the GIL while it copies, so builder threads run beside the consumer's loop.

A cube is built in parts (column ranges of about a megabyte) that any thread may
take, and the consumer takes them too while it waits for the cube it needs: the
cores build one cube together instead of each its own, so the cubes in flight stay
few enough for the CPU's shared cache, and the consumer's core builds in the time
it would otherwise wait. On two cores, one builder and a consumer that waited
delivered 1,400-1,550 cubes/s, and 1,650-2,000 once the consumer built its share.

Batches come in the order of the plan whatever the threads' timing (each batch is
waited for in the order it was asked for). A batch's buffer is reused once the
consumer drops the last view of it, so memory stays bounded; a consumer that keeps
every cube gets a new buffer each time rather than a deadlock, as it would with copies.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Iterator, Sequence

import numpy as np

from ..workload import CubeWorkload
from .parts import BatchMemory, batch_shape, batch_view, build_part, part_bounds, part_layout

__all__ = ["builder_threads", "thread_batches"]

#: Buffers of one cube per builder thread: one being built, one being read. More
#: would not fit beside each other in a 32 MB cache: on two cores, one builder
#: delivered 1,400-1,800 cubes/s with two buffers, 800-1,300 with three. Buffers of
#: several cubes are fewer (as many cubes in all, two buffers at least): every thread
#: builds parts of the oldest batch, so two batches in rotation keep them all busy.
BUFFERS_PER_THREAD = 2
#: Builder threads at most: each cube holds the GIL for its columns' draw (tens of
#: microseconds), so beyond this the threads would queue for it, not build.
MAX_THREADS = 16


def builder_threads() -> int:
    return max(1, min(MAX_THREADS, (os.cpu_count() or 2) - 1))


def rotation_buffers(threads: int, batch_cubes: int) -> int:
    """Batch buffers the builders start with (more only while the consumer holds
    them all)."""
    return max(2, -(-BUFFERS_PER_THREAD * threads // batch_cubes))


class _Batch:
    """One batch being built: its parts are numbered cube by cube, part by part."""

    def __init__(self, ids: Sequence[int], flat: np.ndarray, array: np.ndarray, per_cube: int):
        self.ids, self.flat, self.array = ids, flat, array
        self.columns: list[np.ndarray | None] = [None] * len(ids)
        self.n_parts = len(ids) * per_cube
        self.next_part = 0  # the next part nobody has taken
        self.building = 0  # parts taken and not yet finished
        self.error: BaseException | None = None


class _Builders:
    """Threads, and the consumer while it waits, build batches in order into free buffers."""

    def __init__(
        self,
        workload: CubeWorkload,
        plan: Sequence[Sequence[int]],
        batch_cubes: int,
        threads: int,
        memory,
        contiguous: bool,
    ):
        d, dtype = workload.job.dim, np.dtype(workload.job.dtype)
        self.workload, self.batch_cubes, self.memory = workload, batch_cubes, memory
        self.d, self.dtype, self.contiguous = d, dtype, contiguous
        self.bounds = part_bounds(workload.job)
        # The batches this consumer takes, numbered 0.. in that list.
        self.plan, self.n_batches = plan, len(plan)
        # loaded (and cached) once, not by each thread
        self.layout = part_layout(workload, contiguous)
        buffers = min(rotation_buffers(threads, batch_cubes), max(1, self.n_batches))
        if memory is not None:  # refused here, before any is made, if too large
            what = f"batch buffers ({batch_cubes} cubes of {d}³ {dtype}, {threads} builders)"
            memory.reserve(buffers, batch_cubes * d**3 * dtype.itemsize, what)
        # A Condition's default lock is re-entrant: a buffer may come back (its last view
        # dropped) in a thread that already holds it.
        self.cond = threading.Condition()
        self.free = [self.new_buffer() for _ in range(buffers)]
        self.next_batch = 0
        self.active: dict[int, _Batch] = {}  # started, not finished; oldest first
        self.done: dict[int, np.ndarray | BaseException] = {}
        self.stopped = False
        self.threads = [
            threading.Thread(target=self._run, name=f"pipeline-cubes-{i}", daemon=True)
            for i in range(threads)
        ]
        for thread in self.threads:
            thread.start()

    def new_buffer(self) -> np.ndarray:
        """A buffer of ``batch_cubes`` cubes' values, 1-D."""
        values = self.batch_cubes * self.d**3
        if self.memory is not None:  # e.g. page-locked, for copies to a GPU
            return self.memory.empty((values,), self.dtype)
        return np.empty(values, dtype=self.dtype)

    def release(self, flat: np.ndarray) -> None:
        with self.cond:
            self.free.append(flat)
            self.cond.notify_all()

    def ids(self, batch: int) -> Sequence[int]:
        return self.plan[batch]

    def _start(self, flat: np.ndarray) -> _Batch:
        """Under the lock: the next batch, into ``flat``."""
        batch = self.next_batch
        self.next_batch += 1
        ids = self.ids(batch)
        array = batch_view(flat, self.d, len(ids), self.contiguous)
        work = self.active[batch] = _Batch(ids, flat, array, len(self.bounds) - 1)
        self.cond.notify_all()  # parts for builders that found none
        return work

    def _take_part(self, work: _Batch) -> int:
        """Under the lock: the number of a part of ``work`` to build."""
        work.next_part += 1
        work.building += 1
        return work.next_part - 1

    def _build(self, number: int, work: _Batch, part: int) -> None:
        """Outside the lock: build one part, then hand the batch over if it was the last."""
        cube = part // (len(self.bounds) - 1)
        try:
            columns = work.columns[cube]
            if columns is None:  # two threads may both draw them: the same columns
                columns = work.columns[cube] = self.workload.columns(work.ids[cube])
            build_part(self.layout, columns, work.array, self.bounds, part, self.contiguous)
        except BaseException as exc:
            error = exc
        else:
            error = None
        with self.cond:
            work.building -= 1
            if error is not None and work.error is None:
                work.error, work.next_part = error, work.n_parts  # the rest is not built
            if work.next_part == work.n_parts and not work.building:
                del self.active[number]
                self.done[number] = work.error or work.flat
                self.cond.notify_all()

    def _claim(self) -> tuple[int, _Batch, int] | None:
        """Under the lock: a builder's next part, the oldest batch's first."""
        for number, work in self.active.items():
            if work.next_part < work.n_parts:
                return number, work, self._take_part(work)
        if self.next_batch < self.n_batches and self.free:
            number = self.next_batch
            work = self._start(self.free.pop())
            return number, work, self._take_part(work)
        return None

    def _run(self) -> None:
        while True:
            with self.cond:
                while not self.stopped and (claim := self._claim()) is None:
                    if self.next_batch >= self.n_batches and not self.active:
                        return
                    self.cond.wait()
                if self.stopped:
                    return
            self._build(*claim)

    def take(self, batch: int) -> np.ndarray:
        """Batch ``batch``'s (1-D) buffer, once built; the caller builds parts of it
        meanwhile."""
        while True:
            with self.cond:
                while True:
                    if batch in self.done:
                        result = self.done.pop(batch)
                        if isinstance(result, BaseException):
                            raise result
                        return result
                    if batch == self.next_batch:
                        # Not started, so every buffer is with the consumer (earlier
                        # batches are all delivered): a new one, not a deadlock.
                        self._start(self.free.pop() if self.free else self.new_buffer())
                    work = self.active[batch]
                    if work.next_part < work.n_parts:
                        part = self._take_part(work)
                        break
                    self.cond.wait()
            self._build(batch, work, part)

    def stop(self) -> None:
        with self.cond:
            self.stopped = True
            self.cond.notify_all()
        for thread in self.threads:
            thread.join()


def thread_batches(
    workload: CubeWorkload,
    plan: Sequence[Sequence[int]],
    threads: int | None = None,
    *,
    memory=None,
    contiguous: bool = False,
) -> Iterator[tuple[Sequence[int], np.ndarray]]:
    """Yield ``(cube ids, batch)`` for each batch of cube ids in ``plan`` (e.g. a
    :class:`.sharding.Batches`), in order: ``batch`` is (d, d, d, n) Fortran-ordered,
    ``batch[..., i]`` cube ``ids[i]``, as the other deliveries give them, or with
    ``contiguous`` C-ordered (n, d, d, d), ``batch[i]`` cube ``ids[i]``.

    ``memory``: makes the batch buffers (``memory.empty(shape, dtype)``), e.g. in
    page-locked memory that a GPU copies from, after ``memory.reserve`` of those it
    starts with."""
    batch_cubes = len(plan[0]) if len(plan) else 1  # all full but the last
    threads = threads or builder_threads()
    builders = _Builders(workload, plan, batch_cubes, threads, memory, contiguous)
    d, dtype = builders.d, builders.dtype
    try:
        for batch in range(builders.n_batches):
            flat = builders.take(batch)
            ids = builders.ids(batch)
            shape = batch_shape(d, len(ids), contiguous)
            owner = BatchMemory(flat, shape, dtype, contiguous)
            # Back to the builders when the consumer drops the last view of it: a
            # builder waiting for a buffer starts at once, while the consumer reads.
            weakref.finalize(owner, builders.release, flat)
            view = np.asarray(owner)
            del owner, flat
            yield ids, view
            del view
    finally:
        builders.stop()
