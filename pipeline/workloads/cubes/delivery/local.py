"""Consumer side of local delivery: cubes built by the workers of this host arrive
as numpy views of shared memory, without a copy and without passing through Dask.

Dask starts one producer task per worker, on as many workers as this host has
cores but the consumer's (:func:`.producer.produce`); from then on the consumer
talks to the producers over :mod:`.channel`. Each producer has a few buffers
(``SLOTS``), which the consumer makes and sends with its first request for each;
the consumer asks for a batch to be built into a buffer only when that buffer is
free, keeps ``DEPTH`` requests queued per producer so none idles, and yields each
cube as a view of its buffer. While it waits, it builds the last parts of the
oldest batch it asked for, from the layout the producers cached on this host, as
the consumer of :mod:`.threads` does: the cores finish a batch together, and the
consumer reads it while it is still in the CPU's cache.

A buffer is free again when the last view of its batch is gone (a
``weakref.finalize`` on the object that owns the views' memory), so memory stays
bounded: producers wait for the consumer, not the other way round.

If the consumer keeps every cube (``list(iter_cubes(...))``), buffers are never
released; the consumer then grants producers new buffers one at a time instead
of waiting forever, so memory grows with what the consumer keeps, as it would
with copies.

A producer that dies (its worker killed) loses only the batches it was asked for
and had not delivered: they go back to the queue, and a replacement producer task
is submitted. Batches it delivered stay readable: the consumer's mapping keeps
their memory.
"""

from __future__ import annotations

import collections
import contextlib
import gc
import itertools
import mmap
import os
import selectors
import socket
import time
import weakref
from collections.abc import Iterator, Sequence

import numpy as np

from ....errors import ClusterError, PipelineError
from ..workload import CubeWorkload
from . import channel
from .parts import BatchMemory, batch_shape, build_part, part_bounds, part_layout
from .producer import BACK, FRONT, TRAILER_BYTES, buffer_views, produce

__all__ = ["LocalDelivery"]

#: Buffers per producer: one being built, one queued, one being read.
SLOTS = 3
#: Build requests queued per producer.
DEPTH = 2
#: Replacement producers submitted for dead ones, per worker, before giving up.
MAX_RESTARTS_PER_WORKER = 3


_ids = itertools.count()


class _Producer:
    def __init__(self, conn: channel.Channel):
        self.id = next(_ids)  # not the fileno: a new connection may reuse that
        self.conn = conn
        self.ready = False  # after its hello; probes never say hello
        # slot -> (mapping, its bytes, the batch's (d, d, d, n) view, front and back)
        self.mappings: dict[int, tuple[mmap.mmap, np.ndarray, np.ndarray, np.ndarray]] = {}
        self.free = list(range(SLOTS))
        self.next_slot = SLOTS
        self.requested: dict[int, int] = {}  # batch -> buffer slot


def _listed(ids: list[int]) -> str:
    """Cube ids for a message: ``4..7``, or ``3, 5, 7``."""
    if ids == list(range(ids[0], ids[0] + len(ids))):
        return f"{ids[0]}..{ids[-1]}"
    return ", ".join(map(str, ids[:8])) + (f", ... ({len(ids)} cubes)" if len(ids) > 8 else "")


def _release(released: collections.deque, wake: socket.socket, key: tuple) -> None:
    # Runs wherever the last view dies (any thread): hand the buffer back to the
    # consumer loop and wake it if it is waiting.
    released.append(key)
    with contextlib.suppress(OSError):
        wake.send(b"\0")


class LocalDelivery:
    def __init__(
        self,
        client,
        workload: CubeWorkload,
        plan: Sequence[Sequence[int]],
        listener,
        address: str,
        *,
        memory=None,
        contiguous: bool = False,
    ):
        self.client = client
        self.workload = workload
        # The batches of cube ids this consumer takes, numbered 0.. in this list, all
        # full but the last
        self.plan, self.n_batches = plan, len(plan)
        self.batch_cubes = len(plan[0]) if len(plan) else 1
        self.listener = listener
        self.address = address
        self.memory = memory  # ``memory.register(array)``: e.g. page-locks each buffer
        self.contiguous = contiguous
        self.d = d = workload.job.dim
        self.dtype = np.dtype(workload.job.dtype)
        self.buffer_bytes = self.batch_cubes * d**3 * self.dtype.itemsize
        self.next_batch = 0
        self.retry: collections.deque[int] = collections.deque()
        self.ready: collections.deque[tuple[_Producer, int, int]] = collections.deque()
        self.released: collections.deque[tuple[int, int]] = collections.deque()
        self.producers: dict[int, _Producer] = {}  # by id
        self.selector = selectors.DefaultSelector()
        self.wake_r, self.wake_w = socket.socketpair()
        self.futures: list = []
        self.restarts_left = 0
        self.bounds = part_bounds(workload.job)
        self.layout: np.ndarray | None = None  # the host's cached layout, once there
        self.layout_looked_at = -1.0
        self.columns: tuple[tuple[int, int], np.ndarray] | None = None  # last drawn
        self.parts_built_here = 0

    def batches(self) -> Iterator[tuple[range, np.ndarray]]:
        """Yield ``(cube ids, batch)``: batch is a (d, d, d, n) Fortran-ordered view
        of a producer's buffer, ``batch[..., i]`` cube ``ids[i]``."""
        # One producer per core but the consumer's, as many as there are workers: a
        # producer more would take turns on a core with the consumer.
        workers = list(self.client.ncores())  # (once: every worker's address)
        workers = workers[: max(1, (os.cpu_count() or 2) - 1)]
        if self.memory is not None:  # refused here, before any buffer is made
            what = (
                f"shared-memory buffers ({self.batch_cubes} cubes of {self.d}³ {self.dtype}; "
                f"{SLOTS} for each of {len(workers)} producers)"
            )
            self.memory.reserve(len(workers) * SLOTS, self.buffer_bytes, what)
        self.restarts_left = MAX_RESTARTS_PER_WORKER * len(workers)
        self.listener.setblocking(False)
        self.selector.register(self.listener, selectors.EVENT_READ, "accept")
        self.selector.register(self.wake_r, selectors.EVENT_READ, "wake")
        try:
            for worker in workers:
                self._submit_producer(worker)
            delivered = 0
            while delivered < self.n_batches:
                self._take_releases()
                self._assign()
                if self.ready:
                    producer, batch, slot = self.ready.popleft()
                    delivered += 1
                    yield self._batch_range(batch), self._batch_view(producer, batch, slot)
                elif self._help():
                    if self._producer_done():  # else no answer is due: no system call
                        self._wait(timeout=0)
                else:
                    self._wait()
        finally:
            self._close()

    def _batch_range(self, batch: int) -> Sequence[int]:
        return self.plan[batch]

    def _batch_view(self, producer: _Producer, batch: int, slot: int) -> np.ndarray:
        shape = batch_shape(self.d, len(self._batch_range(batch)), self.contiguous)
        raw = producer.mappings[slot][1]
        memory = BatchMemory(raw, shape, self.dtype, self.contiguous)
        key = (producer.id, slot)
        weakref.finalize(memory, _release, self.released, self.wake_w, key)
        # The views hold ``memory`` now; when the last is gone the buffer is free.
        return np.asarray(memory)

    def _submit_producer(self, worker: str | None = None) -> None:
        # Pinned to a worker at the start (one producer each), but free to run
        # elsewhere if that worker dies before starting it.
        where = {"workers": [worker], "allow_other_workers": True} if worker else {}
        self.futures.append(
            self.client.submit(
                produce,
                *(self.address, self.workload, self.batch_cubes, self.bounds, self.contiguous),
                pure=False,
                **where,
            )
        )

    def _take_releases(self) -> None:
        while self.released:
            producer_id, slot = self.released.popleft()
            producer = self.producers.get(producer_id)
            if producer is not None:
                producer.free.append(slot)

    def _work_left(self) -> bool:
        return bool(self.retry) or self.next_batch < self.n_batches

    def _assign(self) -> None:
        for producer in self.producers.values():
            if not producer.ready:
                continue
            while len(producer.requested) < DEPTH and producer.free and self._work_left():
                if self.retry:
                    batch = self.retry.popleft()
                else:
                    batch, self.next_batch = self.next_batch, self.next_batch + 1
                slot = producer.free.pop()
                ids = self._batch_range(batch)
                message = {"op": "build", "batch": batch, "buffer": slot, "ids": list(ids)}
                fd = None
                if slot not in producer.mappings:
                    fd, region = channel.new_buffer(self.buffer_bytes + TRAILER_BYTES)
                    producer.mappings[slot] = self._mapped(region)
                words = producer.mappings[slot][3]
                words[FRONT], words[BACK] = 0, len(ids) * (len(self.bounds) - 1)
                try:
                    producer.conn.send(message, fd=fd)
                except OSError:
                    self.retry.appendleft(batch)
                    break  # its end of the connection shows up as closed in _wait
                finally:
                    if fd is not None:
                        os.close(fd)  # the producer has its own descriptor now
                producer.requested[batch] = slot

    def _mapped(self, region: mmap.mmap) -> tuple:
        raw = np.frombuffer(region, dtype=np.uint8, count=self.buffer_bytes)
        if self.memory is not None:
            self.memory.register(raw)
        views = buffer_views(region, self.workload.job, self.batch_cubes, self.contiguous)
        return (region, raw, *views)

    def _help(self) -> bool:
        """While waiting: build the last part nobody has taken of the oldest batch
        requested, and take it from its producer (:mod:`.producer` says how the two
        meet). False when there is none, or this host's layout is not cached yet."""
        if self.layout is None and not self._find_layout():
            return False
        oldest = None
        for producer in self.producers.values():
            for batch, slot in producer.requested.items():
                words = producer.mappings[slot][3]
                # Not the producer's next part: it may be building that one now.
                if words[BACK] - 1 > words[FRONT] and (oldest is None or batch < oldest[0]):
                    oldest = (batch, producer, slot)
        if oldest is None:
            return False
        batch, producer, slot = oldest
        _region, _bytes, array, words = producer.mappings[slot]
        part = int(words[BACK]) - 1
        words[BACK] = part
        if words[FRONT] > part:
            return True  # the producer got there first
        cube = part // (len(self.bounds) - 1)
        if self.columns is None or self.columns[0] != (batch, cube):
            cube_id = self._batch_range(batch)[cube]
            self.columns = ((batch, cube), self.workload.columns(cube_id))
        build_part(self.layout, self.columns[1], array, self.bounds, part, self.contiguous)
        self.parts_built_here += 1
        return True

    def _producer_done(self) -> bool:
        """Has a producer come to the end of its side of a batch (its answer is due)?"""
        for producer in self.producers.values():
            for slot in producer.requested.values():
                words = producer.mappings[slot][3]
                if words[FRONT] >= words[BACK]:
                    return True
        return False

    def _find_layout(self) -> bool:
        """The layout the producers built into this host's cache, if they have (looked
        for at most every 0.1 s): building it here would read every frame again."""
        now = time.monotonic()
        if now - self.layout_looked_at < 0.1:
            return False
        self.layout_looked_at = now
        self.layout = part_layout(self.workload, self.contiguous, cached_only=True)
        return self.layout is not None

    def _wait(self, timeout: float = 1.0) -> None:
        if self._work_left() and self._stalled():
            self._grow()
        events = self.selector.select(timeout=timeout)
        for key, _mask in events:
            if key.data == "accept":
                with contextlib.suppress(BlockingIOError):
                    sock, _ = self.listener.accept()
                    sock.setblocking(True)
                    producer = _Producer(channel.Channel(sock))
                    self.producers[producer.id] = producer
                    self.selector.register(sock, selectors.EVENT_READ, producer)
            elif key.data == "wake":
                self.wake_r.recv(4096)
            else:
                self._receive(key.data)
        if not events and timeout:
            self._check_producers_alive()

    def _stalled(self) -> bool:
        """Nothing requested, nothing ready, and no producer has a free buffer."""
        ready = [p for p in self.producers.values() if p.ready]
        return bool(ready) and not any(p.requested or p.free for p in ready)

    def _grow(self) -> None:
        gc.collect()  # views in reference cycles
        self._take_releases()
        if not self._stalled():
            return
        producer = min(
            (p for p in self.producers.values() if p.ready), key=lambda p: len(p.mappings)
        )
        producer.free.append(producer.next_slot)
        producer.next_slot += 1

    def _receive(self, producer: _Producer) -> None:
        message, fd = producer.conn.receive()
        if message is None:
            self._lost(producer)
            return
        op = message["op"]
        if op == "hello":
            producer.ready = True
        elif op in ("built", "failed"):
            slot = message["buffer"]
            batch = message["batch"]
            del producer.requested[batch]
            if op == "failed":
                ids = list(self._batch_range(batch))
                raise PipelineError(
                    f"building cubes {_listed(ids)} failed on a worker: "
                    f"{message['error']}\n{message['traceback']}"
                )
            self.ready.append((producer, batch, slot))
        if fd is not None:
            os.close(fd)

    def _lost(self, producer: _Producer) -> None:
        """A producer's connection closed: its worker died (or it was a probe)."""
        self.selector.unregister(producer.conn.sock)
        producer.conn.close()
        del self.producers[producer.id]
        if not producer.ready:
            return
        self.retry.extend(sorted(producer.requested))
        # Buffers it delivered stay mapped here: views and queued batches still read them.
        if self._work_left():
            if self.restarts_left <= 0:
                raise ClusterError("cube producers keep dying; their workers were killed")
            self.restarts_left -= 1
            self._submit_producer()

    def _check_producers_alive(self) -> None:
        if any(p.ready for p in self.producers.values()):
            return
        if all(f.done() for f in self.futures):
            errors = [f.exception() for f in self.futures if f.status == "error"]
            raise ClusterError(
                "no cube producer is running on the workers"
                + (f": {errors[-1]!r}" if errors else "")
            )

    def _close(self) -> None:
        for producer in self.producers.values():
            with contextlib.suppress(OSError):
                producer.conn.send({"op": "stop"})
            producer.conn.close()
        self.producers.clear()
        self.selector.close()
        self.listener.close()
        self.wake_r.close()
        self.wake_w.close()
        # Running tasks are not interrupted: each returns when its connection closes.
        with contextlib.suppress(Exception):
            self.client.cancel(self.futures)
