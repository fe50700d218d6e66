"""Cubes as torch tensors for the delivery tests: the CPU builder's bytes to compare
against, and the cubes a loader delivered, each id once."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pipeline import CubeJob, CubeWorkload

CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU (torch.cuda.is_available())")


def cpu_cubes(job: CubeJob) -> dict[int, torch.Tensor]:
    """Every cube of the job from the CPU builder, axes (frame, row, column)."""
    workload = CubeWorkload(job, "cubes", job.frames)
    workload.preflight()
    return {k: torch.from_numpy(np.ascontiguousarray(workload.cube(k))) for k in range(job.cubes)}


def collect(items, batched: bool, device: str | None = None) -> dict[int, torch.Tensor]:
    """{cube id: cube} from ``(ids, batch)`` or ``(cube id, cube)`` items, each id once,
    each batch contiguous in the training layout (and on ``device``'s type, if given)."""
    got: dict[int, torch.Tensor] = {}
    for ids, x in items:
        assert x.is_contiguous()
        assert device is None or x.device.type == device, f"a batch on {x.device}, not {device}"
        pairs = zip(ids.tolist(), x, strict=True) if batched else [(ids, x)]
        for cube_id, cube in pairs:
            assert cube_id not in got, f"cube {cube_id} twice"
            got[cube_id] = cube.cpu()
    return got


def same_bytes(got: dict, want: dict) -> bool:
    return sorted(got) == sorted(want) and all(
        got[k].dtype == want[k].dtype and torch.equal(got[k], want[k]) for k in want
    )
