"""Where CPU-built batches live before their copy to a GPU: page-locked memory.

A copy to the GPU from page-locked (pinned) memory runs at the bus's speed, one
DMA of the batch's bytes, asynchronous to the host; from pageable memory the
driver copies through its own staging buffers first, at about a quarter of that
(1,872 against 6,930 cubes/s on the GPU host). So batch buffers are page-locked
where they are made (the threads' buffers: :meth:`HostMemory.empty`) or in place
where someone else made them (the cluster's shared-memory buffers, with
``cudaHostRegister``: :meth:`HostMemory.register`). For the CPU device nothing is
page-locked.
"""

from __future__ import annotations

import logging
import math

import numpy as np
import torch

__all__ = ["HostMemory"]

log = logging.getLogger("pipeline.cubes")

#: cudaHostRegisterPortable: page-locked for every CUDA context, as torch's own helper.
_REGISTER_PORTABLE = 1


class HostMemory:
    """Where CPU-built batches live before their copy to ``device``: page-locked
    memory for a CUDA device, ordinary memory otherwise."""

    def __init__(self, device: torch.device):
        self.device = device
        self.registered: list[np.ndarray] = []  # kept mapped until unregistered
        self.refused = False

    @property
    def page_locked(self) -> bool:
        return self.device.type == "cuda"

    def empty(self, shape: tuple, dtype) -> np.ndarray:
        """A Fortran-ordered array, page-locked for a CUDA device."""
        dtype = np.dtype(dtype)
        if not self.page_locked:
            return np.empty(shape, dtype=dtype, order="F")
        nbytes = math.prod(shape) * dtype.itemsize
        raw = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True).numpy()
        return np.ndarray(shape, dtype=dtype, buffer=raw, order="F")  # (holds raw)

    def register(self, array: np.ndarray) -> None:
        """Page-lock ``array``'s memory in place (a CUDA device; else nothing). If the
        driver refuses, its batches are copied through staging buffers instead."""
        if not self.page_locked or self.refused:
            return
        with torch.cuda.device(self.device):
            error = int(
                torch.cuda.cudart().cudaHostRegister(
                    array.ctypes.data, array.nbytes, _REGISTER_PORTABLE
                )
            )
        if error:
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
