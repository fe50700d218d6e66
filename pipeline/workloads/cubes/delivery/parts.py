"""Cubes built in parts: column ranges of about a megabyte that different threads or
processes build into the same buffer, so that the cores finish one cube together
and the consumer reads it while it is still in the CPU's shared cache.

Parts are numbered cube by cube across a batch: part ``k`` of a batch of cubes is
column range ``k % per_cube`` of its cube ``k // per_cube``.
"""

from __future__ import annotations

import numpy as np

from ..workload import CubeJob, build_cube

__all__ = ["PART_BYTES", "build_part", "part_bounds"]

#: Bytes of a cube built at a time: small enough that two cores finish a cube
#: together, large enough that taking a part (a lock or a shared counter, some
#: Python) stays a few percent of copying it. 512 kB to 2 MB did equally well on
#: two cores; 256 kB and 8 MB did worse.
PART_BYTES = 1 << 20


def part_bounds(job: CubeJob) -> list[int]:
    """Column bounds of one cube's parts: part ``p`` is columns ``[b[p], b[p + 1])``."""
    d = job.dim
    parts = max(1, min(d, d**3 * np.dtype(job.dtype).itemsize // PART_BYTES))
    if job.per_layer_columns:
        parts = 1  # its draw and a copy per layer hold the GIL: parts would queue for it
    return np.linspace(0, d, parts + 1).astype(int).tolist()


def build_part(
    layout: np.ndarray, columns: np.ndarray, batch: np.ndarray, bounds: list[int], part: int
) -> None:
    """Build part ``part`` of ``batch`` ((d, d, d, n), Fortran-ordered); ``columns`` are
    those of its cube, ``part // (len(bounds) - 1)``."""
    cube, p = divmod(part, len(bounds) - 1)
    # batch[..., cube].T is the C-ordered (column, row, frame) block build_cube fills
    build_cube(layout, columns, batch[..., cube].T, slice(bounds[p], bounds[p + 1]))
