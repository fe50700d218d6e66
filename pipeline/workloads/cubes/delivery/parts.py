"""Cubes built in parts: slabs of about a megabyte that different threads or
processes build into the same buffer, so that the cores finish one cube together
and the consumer reads it while it is still in the CPU's shared cache.

A batch buffer holds its cubes in one of two layouts:

- as stored (``contiguous=False``): a (d, d, d, n) Fortran-ordered array, axes
  (frame, row, column, cube), the bytes of a shard; a part is a range of a cube's
  columns (:func:`..kernels.build_cube`);
- the training layout (``contiguous=True``): a C-ordered (n, d, d, d) array, axes
  (cube, frame, row, column), what a training loop reshapes or feeds to a
  convolution as it is; a part is a range of a cube's frames
  (:func:`..kernels.build_cube_frames_first`, from the layout by frame).

Parts are numbered cube by cube across a batch: part ``k`` of a batch of cubes is
range ``k % per_cube`` of its cube ``k // per_cube``.
"""

from __future__ import annotations

import numpy as np

from ..kernels import build_cube, build_cube_frames_first
from ..workload import CubeJob, CubeWorkload

__all__ = [
    "PART_BYTES",
    "BatchMemory",
    "batch_shape",
    "batch_view",
    "build_part",
    "part_bounds",
    "part_layout",
]

#: Bytes of a cube built at a time: small enough that two cores finish a cube
#: together, large enough that taking a part (a lock or a shared counter, some
#: Python) stays a few percent of copying it. 512 kB to 2 MB did equally well on
#: two cores; 256 kB and 8 MB did worse.
PART_BYTES = 1 << 20


def part_bounds(job: CubeJob) -> list[int]:
    """Bounds of one cube's parts (columns, or frames in the training layout): part
    ``p`` is ``[b[p], b[p + 1])``."""
    d = job.dim
    parts = max(1, min(d, d**3 * np.dtype(job.dtype).itemsize // PART_BYTES))
    if job.per_layer_columns:
        parts = 1  # its draw and a copy per layer hold the GIL: parts would queue for it
    return np.linspace(0, d, parts + 1).astype(int).tolist()


def part_layout(workload: CubeWorkload, contiguous: bool, cached_only: bool = False):
    """The frames' layout :func:`build_part` takes for ``contiguous`` batches."""
    return workload._layout(cached_only, by_frame=True if contiguous else None)


def batch_shape(d: int, n: int, contiguous: bool) -> tuple[int, ...]:
    return (n, d, d, d) if contiguous else (d, d, d, n)


def batch_view(flat: np.ndarray, d: int, n: int, contiguous: bool) -> np.ndarray:
    """A batch buffer's first ``n`` cubes (``flat``: at least n cubes' values, 1-D)
    in its layout."""
    cubes = flat[: n * d**3]
    return cubes.reshape(batch_shape(d, n, contiguous), order="C" if contiguous else "F")


def build_part(
    layout: np.ndarray,
    columns: np.ndarray,
    batch: np.ndarray,
    bounds: list[int],
    part: int,
    contiguous: bool = False,
) -> None:
    """Build part ``part`` of ``batch`` (in the layout ``contiguous`` says); ``columns``
    are those of its cube, ``part // (len(bounds) - 1)``."""
    cube, p = divmod(part, len(bounds) - 1)
    piece = slice(bounds[p], bounds[p + 1])
    if contiguous:
        build_cube_frames_first(layout, columns, batch[cube], piece)
    else:
        # batch[..., cube].T is the C-ordered (column, row, frame) block build_cube fills
        build_cube(layout, columns, batch[..., cube].T, piece)


class BatchMemory:
    """Owns one delivered batch's memory for numpy (``np.asarray(owner)`` is the batch,
    of ``shape`` in Fortran or C order): every cube view's ``base``, so a
    ``weakref.finalize`` on it runs once the last view of the batch is gone."""

    def __init__(self, mapping: np.ndarray, shape: tuple, dtype: np.dtype, c_order=False):
        itemsize = dtype.itemsize
        strides, step = [], itemsize
        # Fortran order: the first axis varies fastest; C order: the last
        for n in reversed(shape) if c_order else shape:
            strides.append(step)
            step *= n
        if c_order:
            strides.reverse()
        self._mapping = mapping  # keeps the mapping open while views exist
        self.__array_interface__ = {
            "shape": shape,
            "typestr": dtype.str,
            "strides": tuple(strides),
            "data": (mapping.ctypes.data, False),
            "version": 3,
        }
