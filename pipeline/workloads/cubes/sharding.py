"""Which cubes a training process (and each of its loader workers) takes.

Under ``torch.distributed`` (one process per GPU) every rank iterates the same
dataset, so each must take a disjoint share of the cube ids or every rank would
train on every cube. A rank's share is items ``rank, rank + world, ...`` (items are
cubes, or batches of cubes); its loader workers split that share again, worker
``w`` of ``N`` taking every N-th of it. Over all ranks and workers each item is
taken exactly once, and a rank's share does not depend on its number of workers
(so ``len()`` in the main process is right whatever the DataLoader starts).

Loader workers started by spawn or forkserver have no process group, and one
initialized with an explicit rank sets no ``RANK`` variable: a dataset sent to them
carries the rank its training process had (``CubeStream.__getstate__``).
"""

from __future__ import annotations

import os

from ...errors import ConfigError

__all__ = ["distributed_rank", "share"]


def distributed_rank() -> tuple[int, int]:
    """(rank, world size): from ``torch.distributed`` once its process group is
    initialized; else from the ``RANK`` and ``WORLD_SIZE`` variables ``torchrun``
    sets (before the group exists); else (0, 1), a single process."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    rank, world = os.environ.get("RANK"), os.environ.get("WORLD_SIZE")
    if rank is None and world is None:
        return 0, 1
    try:
        rank_n, world_n = int(rank if rank is not None else 0), int(world or 1)
    except ValueError:
        raise ConfigError(
            f"RANK={rank!r}, WORLD_SIZE={world!r}: expected integers (as torchrun sets "
            "them), the rank from 0 to WORLD_SIZE - 1"
        ) from None
    if world_n < 1 or not 0 <= rank_n < world_n:
        raise ConfigError(
            f"RANK={rank!r}, WORLD_SIZE={world!r}: expected WORLD_SIZE >= 1 and "
            "0 <= RANK < WORLD_SIZE"
        )
    return rank_n, world_n


def share(
    worker: tuple[int, int] | None = None, rank: tuple[int, int] | None = None
) -> tuple[int, int]:
    """(i, k): this process takes items ``i, i + k, ...``. ``worker`` is (id, number of
    loader workers) inside a DataLoader worker, else None; ``rank``: (rank, world size)
    as the training process saw it, else :func:`distributed_rank` now."""
    rank, world = rank or distributed_rank()
    w, workers = worker or (0, 1)
    return rank + w * world, world * workers


def items_in(share_: tuple[int, int], total: int) -> int:
    """How many of ``total`` items share ``share_`` takes."""
    return len(range(share_[0], total, share_[1]))
