"""Where CPU-built batches live before their copy to a GPU: page-locked memory.

A copy to the GPU from page-locked (pinned) memory runs at the bus's speed, one
DMA of the batch's bytes, asynchronous to the host; from pageable memory the
driver copies through its own staging buffers first, at about a quarter of that
(1,872 against 6,930 cubes/s on the GPU host). So batch buffers are page-locked
where they are made (the threads' buffers: :meth:`HostMemory.empty`) or in place
where someone else made them (the cluster's shared-memory buffers, with
``cudaHostRegister``: :meth:`HostMemory.register`). For the CPU device nothing is
page-locked.

Page-locked memory is capped: the kernel can neither swap nor reclaim it, so a
few large batches in rotation (256 cubes of 100³ float64 are 2 GB each) could
otherwise take the host's memory from everything else. The buffers a path needs
to start must fit under the cap (:meth:`HostMemory.reserve`: refused before any
is made, naming the sizes); past the cap, further buffers are ordinary memory,
copied at the pageable rate, and a warning says so once.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import weakref

import numpy as np
import torch

from ...errors import ConfigError
from .gather import byte_size

__all__ = ["PINNED_ENV", "HostMemory", "pinned_limit"]

log = logging.getLogger(__name__)

#: cudaHostRegisterPortable: page-locked for every CUDA context, as torch's own helper.
_REGISTER_PORTABLE = 1
#: The setting of the cap, in GiB, when ``pinned_gib=`` is not given.
PINNED_ENV = "PIPELINE_PINNED_GIB"
#: The default cap: this share of the host's RAM.
PINNED_SHARE_OF_RAM = 0.25


def pinned_limit(gib: float | None = None) -> tuple[int, str]:
    """The cap in bytes, and where it comes from: ``gib``, else ``PIPELINE_PINNED_GIB``,
    else a quarter of this host's RAM."""
    source = f"pinned_gib={gib!r}"
    if gib is None and os.environ.get(PINNED_ENV, "").strip():
        gib, source = os.environ[PINNED_ENV].strip(), f"{PINNED_ENV}={os.environ[PINNED_ENV]!r}"
    if gib is None:
        import psutil

        ram = psutil.virtual_memory().total
        return int(ram * PINNED_SHARE_OF_RAM), f"a quarter of this host's {byte_size(ram)} of RAM"
    try:
        value = float(gib)
    except (TypeError, ValueError):
        value = math.nan
    if isinstance(gib, bool) or not value >= 0 or math.isinf(value):
        raise ConfigError(f"{source}: expected a number of GiB, at least 0 (e.g. 8 or 0.5)")
    return int(value * 2**30), source


class HostMemory:
    """Where CPU-built batches live before their copy to ``device``: page-locked
    memory for a CUDA device, at most ``pinned_gib`` (:func:`pinned_limit`) of it;
    ordinary memory otherwise."""

    def __init__(self, device: torch.device, pinned_gib: float | None = None):
        self.device = device
        self.limit, self.limit_source = pinned_limit(pinned_gib)
        self.pinned = 0  # bytes page-locked by this object now
        self.lock = threading.Lock()  # buffers are freed in whichever thread drops them
        self.registered: list[np.ndarray] = []  # kept mapped until unregistered
        self.refused = False
        self.warned = False

    @property
    def page_locked(self) -> bool:
        return self.device.type == "cuda"

    def reserve(self, count: int, nbytes: int, what: str) -> None:
        """Refuse, before anything is allocated, a path that needs ``count`` page-locked
        buffers of ``nbytes`` beyond the cap."""
        if not self.page_locked or self.pinned + count * nbytes <= self.limit:
            return
        held = f", beside {byte_size(self.pinned)} page-locked already" if self.pinned else ""
        raise ConfigError(
            f"{count} page-locked {what} of {byte_size(nbytes)} each would take "
            f"{byte_size(count * nbytes)}{held}, beyond the page-locked memory limit of "
            f"{byte_size(self.limit)} ({self.limit_source}): use a smaller batch_size, "
            f"dtype='float32' or fewer builders, or raise the limit (pinned_gib=, or "
            f"{PINNED_ENV})"
        )

    def _take(self, nbytes: int) -> bool:
        """Count ``nbytes`` as page-locked if they fit under the cap."""
        with self.lock:
            if self.pinned + nbytes > self.limit:
                fits = False
            else:
                self.pinned += nbytes
                fits = True
        if not fits and not self.warned:
            self.warned = True
            log.warning(
                "page-locked memory limit of %s (%s) reached: further batch buffers "
                "are ordinary memory, copied to %s at the pageable rate",
                byte_size(self.limit),
                self.limit_source,
                self.device,
            )
        return fits

    def _give_back(self, nbytes: int) -> None:
        with self.lock:
            self.pinned -= nbytes

    def pinned_bytes(self, nbytes: int) -> torch.Tensor | None:
        """``nbytes`` of page-locked memory (a uint8 tensor), or None past the cap."""
        if not self._take(nbytes):
            return None
        raw = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
        weakref.finalize(raw, self._give_back, nbytes)  # freed with its last view
        return raw

    def empty(self, shape: tuple, dtype) -> np.ndarray:
        """A Fortran-ordered array, page-locked for a CUDA device under the cap."""
        dtype = np.dtype(dtype)
        nbytes = math.prod(shape) * dtype.itemsize
        raw = self.pinned_bytes(nbytes) if self.page_locked else None
        if raw is None:
            return np.empty(shape, dtype=dtype, order="F")
        return np.ndarray(shape, dtype=dtype, buffer=raw.numpy(), order="F")  # (holds raw)

    def register(self, array: np.ndarray) -> None:
        """Page-lock ``array``'s memory in place (a CUDA device, under the cap; else
        nothing). If the driver refuses, its batches are copied through staging
        buffers instead."""
        if not self.page_locked or self.refused or not self._take(array.nbytes):
            return
        with torch.cuda.device(self.device):
            error = int(
                torch.cuda.cudart().cudaHostRegister(
                    array.ctypes.data, array.nbytes, _REGISTER_PORTABLE
                )
            )
        if error:
            self._give_back(array.nbytes)
            self.refused = True
            log.warning(
                "cudaHostRegister of a %.0f MB batch buffer failed (CUDA error %d): "
                "batches are copied to page-locked buffers first",
                array.nbytes / 1e6,
                error,
            )
            return
        self.registered.append(array)

    def close(self) -> None:
        """Unregister what :meth:`register` page-locked; call it once no copy out of
        that memory is pending."""
        while self.registered:
            array = self.registered.pop()
            with torch.cuda.device(self.device):
                torch.cuda.cudart().cudaHostUnregister(array.ctypes.data)
            self._give_back(array.nbytes)
