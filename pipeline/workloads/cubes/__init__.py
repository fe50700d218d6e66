"""Cube generation: d x d x d training cubes from parquet frames, stored as ``.npy``
shards (:mod:`.workload`, :mod:`.frames`, :mod:`.shards`, checked by :mod:`.verify`)
or delivered straight into a training loop (:mod:`.delivery`, :mod:`.torch`)."""

from .shards import read_shard
from .workload import CubeJob, CubeWorkload, build_cube, cube_columns, ensure_auto_frames

__all__ = [
    "CubeJob",
    "CubeWorkload",
    "build_cube",
    "cube_columns",
    "ensure_auto_frames",
    "read_shard",
]
