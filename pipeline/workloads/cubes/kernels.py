"""The cube kernels: a cube built from the frames' layout, in the layout cubes are
stored in (:func:`build_cube`, d block copies) or in the training layout
(:func:`build_cube_frames_first`, C-contiguous over (frame, row, column)), whole or
a part at a time so that threads can share one cube."""

from __future__ import annotations

import math
import threading

import numpy as np

__all__ = ["build_cube", "build_cube_frames_first"]


def build_cube(
    layout: np.ndarray, cols: np.ndarray, out: np.ndarray, part: slice = slice(None)
) -> None:
    """Fill ``out`` (C-ordered, axes column, row, frame) from the layout; with ``part``,
    only those of its columns (``out[part]``), so that threads can share one cube.
    Columns per layer (``cols`` (d, d)) take the layout by frame
    (``load_layout(..., by_frame=True)``)."""
    if cols.ndim == 1:
        np.take(layout, cols[part] - 1, axis=0, out=out[part], mode="clip")
        return
    target = out[part]
    layers = _scratch((cols.shape[0], target.shape[0], target.shape[1]), out.dtype)
    for f in range(cols.shape[0]):  # a layer's columns: contiguous rows of its frame
        np.take(layout[f], cols[f, part] - 1, axis=0, out=layers[f], mode="clip")
    np.copyto(target, layers.transpose(1, 2, 0))  # one pass of transposition


#: Bytes of frames gathered and transposed at a time: a few frames (d x d each) stay
#: in a core's cache from the gather to the transposition. At d = 100 float64 on the
#: test VM (one cube's columns again and again), a cube took 0.96-1.0 ms in blocks of
#: 2 to 6 frames, 1.09 frame by frame, 1.27 in blocks of 12 and 1.44 whole, against
#: 0.57 for :func:`build_cube`; with each cube's own columns (read from memory, not
#: the cache), 1.3-2.1 ms against 0.6-0.9: about twice the block copies.
FRAMES_BLOCK_BYTES = 256 << 10


def build_cube_frames_first(
    layout: np.ndarray, cols: np.ndarray, out: np.ndarray, frames: slice = slice(None)
) -> None:
    """Fill ``out`` (C-ordered, axes frame, row, column: the training layout, where
    ``out.reshape(-1)`` needs no copy) from the layout by frame ``F[f, c - 1, r]``
    (``load_layout(..., by_frame=True)``); with ``frames``, only those of its frames
    (``out[frames]``, a contiguous slab), so that threads can share one cube.

    A frame's d columns are d contiguous runs of the layout: a few frames at a time
    are gathered into a scratch (frame, column, row) block and transposed into place
    while it is still in the core's cache (``FRAMES_BLOCK_BYTES``)."""
    first, stop, _ = frames.indices(out.shape[0])
    d_rows, d_cols = out.shape[1], out.shape[2]
    block = max(1, FRAMES_BLOCK_BYTES // (d_rows * d_cols * out.dtype.itemsize))
    scratch = _scratch((min(block, stop - first), d_cols, d_rows), out.dtype)
    positions = cols - 1
    for f0 in range(first, stop, block):
        f1 = min(stop, f0 + block)
        taken = scratch[: f1 - f0]
        if cols.ndim == 1:
            np.take(layout[f0:f1], positions, axis=1, out=taken, mode="clip")
        else:
            for i, f in enumerate(range(f0, f1)):
                np.take(layout[f], positions[f], axis=0, out=taken[i], mode="clip")
        np.copyto(out[f0:f1], taken.transpose(0, 2, 1))


_scratches = threading.local()


def _scratch(shape: tuple, dtype) -> np.ndarray:
    """A buffer per thread, reused from cube to cube (a new 8 MB array each time
    costs its page faults); it only grows, so parts of unequal sizes share it."""
    size = math.prod(shape)
    buf = getattr(_scratches, "buf", None)
    if buf is None or buf.size < size or buf.dtype != dtype:
        buf = _scratches.buf = np.empty(size, dtype=dtype)
    return buf[:size].reshape(shape)
