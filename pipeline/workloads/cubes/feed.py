"""Batches built by CPUs, moved to a device off the consumer's thread, at the bus's speed.

:func:`to_device` takes any iterable of CPU batches (the threads' or the cluster's
batches, a DataLoader's, stored shards') and yields them on the device, contiguous
in the training layout (n, d, d, d). A feeder thread does all of the moving while
the consumer trains on the batch before:

- A batch in page-locked memory is copied as it is: the threads path builds its
  batches straight into page-locked buffers, and the cluster's shared-memory
  buffers are page-locked in place (``cudaHostRegister``) the first time they are
  used (:class:`HostMemory`). Any other batch is first copied into one of a few
  page-locked staging buffers (torch's copy, on its CPU threads), made under the
  page-locked memory cap (:mod:`.host_memory`); past the cap it is copied from
  where it is. Copies from pageable memory go through the driver's own staging, at
  about a quarter of the bus's speed (1,872 against 6,930 cubes/s on the GPU host).
- The copy (``non_blocking=True``) keeps the batch's layout (its strides), so it is
  one DMA of its bytes; the transposition into (n, d, d, d) runs on the device,
  where it costs a fraction of the copy. Both run on a side stream; the consumer's
  stream waits for the batch's event before using it, and the batch is recorded on
  that stream (``Tensor.record_stream``), so its memory is not reused while the
  consumer's work on it is queued.
- A host buffer goes back to its builder only once the copy out of it is done (its
  event), so a builder never overwrites a batch still being copied.
- At most ``depth`` batches wait on the device for the consumer, and at most
  ``COPIES_IN_FLIGHT`` copies are not known to be done: host and device memory
  stay a few batches whatever the job's length.

On the CPU (``device="cpu"``) the same thread makes each batch contiguous in the
training layout, and nothing else.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import queue
import threading
from collections.abc import Iterable, Iterator

import torch

from ...errors import PipelineError
from .gather import resolve_device
from .host_memory import HostMemory

__all__ = ["to_device"]

log = logging.getLogger(__name__)

#: Batches moved and waiting for the consumer.
DEPTH = 2
#: Copies issued and not known to be done: each holds a host buffer and a batch's
#: device memory, so the feeder waits for the oldest before issuing more. (The
#: consumer takes batches without waiting for their copies, which it orders on its
#: stream, so nothing else keeps the feeder within reach of the copy engine.)
COPIES_IN_FLIGHT = DEPTH + 2
#: Page-locked staging buffers at most (for batches that are not page-locked).
STAGING_BUFFERS = 3
#: Seconds the consumer waits for the feeder thread to stop when it stops early
#: (the thread finishes the batch it is taking from its source first).
STOP_SECONDS = 60.0


def to_device(
    items: Iterable, device, *, depth: int = DEPTH, memory: HostMemory | None = None
) -> Iterator:
    """Yield each item of ``items`` with its batch moved to ``device``, contiguous.

    An item is a CPU tensor (the batch) or a tuple whose last element is the batch
    (``(ids, batch)``: the other elements pass unchanged). ``memory``: the
    :class:`HostMemory` the source's buffers were made or registered with (and the
    staging buffers are made with), closed when the feeding ends; by default one
    with the default cap. See the module's description."""
    if depth < 1:
        raise ValueError(f"to_device: depth={depth!r}; expected at least 1")
    device = resolve_device(device, "to_device")
    feeder = _Feeder(items, device, depth, memory or HostMemory(device))
    return feeder.run()


class _End:
    pass


class _Failed:
    def __init__(self, exc: BaseException):
        self.exc = exc


class _Feeder:
    def __init__(self, items: Iterable, device: torch.device, depth: int, memory):
        self.items, self.device, self.memory = items, device, memory
        self.cuda = device.type == "cuda"
        self.ready: queue.Queue = queue.Queue(maxsize=depth)
        self.stopped = threading.Event()
        # (event, host batch or None, staging buffer or None) of copies not known done
        self.pending: collections.deque = collections.deque()
        self.spare: list[torch.Tensor] = []  # staging buffers not in use
        self.staging = 0
        self.thread = threading.Thread(target=self._produce, name="pipeline-cubes-feed")
        self.thread.daemon = True
        self.stream = None

    # -- the consumer's side ------------------------------------------------------
    def run(self) -> Iterator:
        self.thread.start()
        try:
            while True:
                got = self._get()
                if isinstance(got, _End):
                    return
                if isinstance(got, _Failed):
                    raise got.exc
                yield self._finish(got)
                del got
        finally:
            self._stop()

    def _get(self):
        while True:
            try:
                return self.ready.get(timeout=1.0)
            except queue.Empty:
                if not self.thread.is_alive() and self.ready.empty():
                    raise PipelineError(
                        "to_device: the feeder thread ended without a word"
                    ) from None

    def _finish(self, item):
        head, (batch, event) = item
        if event is not None:
            stream = torch.cuda.current_stream(self.device)
            stream.wait_event(event)
            batch.record_stream(stream)
        return (*head, batch) if head is not None else batch

    def _stop(self) -> None:
        self.stopped.set()
        while not self.ready.empty():  # a put it is blocked on returns
            with contextlib.suppress(queue.Empty):
                self.ready.get_nowait()
        self.thread.join(STOP_SECONDS)
        if self.thread.is_alive():
            log.warning("to_device: the feeder thread did not stop within %s s", STOP_SECONDS)

    # -- the feeder thread --------------------------------------------------------
    def _produce(self) -> None:
        source = None
        try:
            with torch.cuda.device(self.device) if self.cuda else contextlib.nullcontext():
                if self.cuda:
                    self.stream = torch.cuda.Stream(self.device)
                source = iter(self.items)
                for item in source:
                    if self.stopped.is_set() or not self._put(self._move(item)):
                        break
                    del item
                    self._reap()  # a builder may be waiting for a buffer
                else:
                    self._put(_End())
        except BaseException as exc:
            self._put(_Failed(exc))
        finally:
            with contextlib.suppress(Exception):
                getattr(source, "close", lambda: None)()  # a generator ends in its thread
            del source
            for event, _host, _staging in self.pending:
                event.synchronize()
            self.pending.clear()
            self.memory.close()

    def _put(self, item) -> bool:
        while not self.stopped.is_set():
            try:
                self.ready.put(item, timeout=0.2)
                return True
            except queue.Full:
                continue
        return False

    def _move(self, item):
        if isinstance(item, tuple | list):
            head, batch = tuple(item[:-1]), item[-1]
        else:
            head, batch = None, item
        if not isinstance(batch, torch.Tensor) or batch.device.type != "cpu":
            raise TypeError(
                f"to_device: expected CPU tensors (or tuples ending in one), got "
                f"{type(batch).__name__}"
                + (f" on {batch.device}" if isinstance(batch, torch.Tensor) else "")
            )
        if not self.cuda:
            return head, (batch.contiguous(), None)
        self._reap()
        while len(self.pending) >= COPIES_IN_FLIGHT:
            entry = self.pending.popleft()
            entry[0].synchronize()
            self._release(entry)
        host = batch if _dense(batch) else batch.contiguous()
        staging = None
        nbytes = host.numel() * host.element_size()
        if not host.is_pinned():
            staging = self._staging_buffer(nbytes)
        if staging is None:
            src = host  # kept until the copy out of it is done
        else:
            src = staging[:nbytes].view(host.dtype).as_strided(host.size(), host.stride())
            src.copy_(host)
            host = None
        with torch.cuda.stream(self.stream):
            on_device = src.to(self.device, non_blocking=True)  # keeps src's strides
            out = on_device.contiguous()
            event = torch.cuda.Event()
            event.record(self.stream)
        self.pending.append((event, host, staging))
        return head, (out, event)

    def _reap(self) -> None:
        """Let go of host memory whose copies are done (in order)."""
        while self.cuda and self.pending and self.pending[0][0].query():
            self._release(self.pending.popleft())

    def _release(self, entry: tuple) -> None:
        _event, _host, staging = entry  # (the host batch's last reference here goes)
        if staging is not None:
            self.spare.append(staging)

    def _staging_buffer(self, nbytes: int) -> torch.Tensor | None:
        """A page-locked buffer of at least ``nbytes`` no pending copy reads; None when
        there is none and the page-locked memory cap allows no other."""
        while True:
            if self.spare:
                buffer = self.spare.pop()
                if buffer.numel() >= nbytes:
                    return buffer
                self.staging -= 1  # too small for this batch: let it go
                continue
            if self.staging < STAGING_BUFFERS:
                buffer = self.memory.pinned_bytes(nbytes)
                if buffer is not None:
                    self.staging += 1
                    return buffer
            if not self.staging:
                return None
            if not self.pending:  # (every buffer is spare or being copied from)
                return None
            entry = self.pending.popleft()  # every buffer is being copied from
            entry[0].synchronize()
            self._release(entry)


def _dense(t: torch.Tensor) -> bool:
    """Does ``t`` fill its memory exactly, in some order of its axes (so its bytes
    can be copied as they are)?"""
    expected = 1
    axes = sorted((st, sz) for st, sz in zip(t.stride(), t.size(), strict=True) if sz != 1)
    for stride, size in axes:
        if stride != expected:
            return False
        expected *= size
    return True
