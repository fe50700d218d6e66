"""PyTorch datasets of cubes (the ``pipeline[torch]`` extra): ``from pipeline.torch
import CubeStream, CubeShards, to_device``. They live with the cube workload
(:mod:`pipeline.workloads.cubes.torch`)."""

from .workloads.cubes.feed import to_device
from .workloads.cubes.torch import CubeShards, CubeStream

__all__ = ["CubeShards", "CubeStream", "to_device"]
