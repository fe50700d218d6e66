"""Which cubes a training process (and each of its loader workers) takes.

Under ``torch.distributed`` (one process per GPU) every rank iterates the same
dataset, so each must take its own share of the cubes or every rank would train on
every cube. Shares are by cube on every path, with the semantics of PyTorch's
``DistributedSampler(shuffle=False)``: the job's n cubes are lined up as positions
``0, 1, ...``, padded to a multiple of the world size W by repeating from the start
(position p is cube ``p % n``) or, with ``drop_last``, cut to one (the last
``n % W`` cubes left out), and rank r takes positions ``r, r + W, ...``. Every rank
then has the same number of cubes, ``ceil(n / W)`` (``floor`` with ``drop_last``),
and so the same number of batches: DDP's collectives need each rank to run as many
steps as the others, or the ranks that have more wait for ever at the epoch's end.

With ``batch_size=b`` a rank's cubes are cut into batches of b in order (all full
but the last), and loader workers take those batches in turn (worker w of N:
batches w, w + N, ...); without, they take the rank's cubes in turn. A rank's share
therefore does not depend on its number of loader workers, and ``len()`` in the
main process is what the rank yields whatever the DataLoader starts.

Loader workers started by spawn or forkserver have no process group, and one
initialized with an explicit rank sets no ``RANK`` variable: a dataset sent to them
carries the rank its training process had (``CubeStream.__getstate__``).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence

from ...errors import ConfigError

__all__ = ["Batches", "Share", "distributed_rank"]


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


class Share(Sequence):
    """The cube ids one consumer of ``k`` takes (consumer ``i``) of a job of ``n``
    cubes, in order, padded or cut as the module says: ``share[j]`` is a cube id,
    ``share.batches(b)`` the same cubes b at a time. Nothing is listed in memory: a
    rank's share of ten million cubes is a range and a rule."""

    def __init__(self, n: int, shard: tuple[int, int] = (0, 1), drop_last: bool = False):
        i, k = shard
        self.n, self.shard, self.drop_last = n, (i, k), drop_last
        total = (n // k) * k if drop_last else -(-n // k) * k
        self.positions = range(i, total, k)

    @classmethod
    def of_rank(cls, n: int, rank: tuple[int, int] | None = None, drop_last: bool = False):
        """This process's share: ``rank`` (rank, world size) as the training process
        saw it, else :func:`distributed_rank` now."""
        return cls(n, rank or distributed_rank(), drop_last)

    def __len__(self) -> int:
        return len(self.positions)

    def __getitem__(self, j):
        if isinstance(j, slice):
            return self.ids(self.positions[j])
        return self.positions[j] % self.n

    def ids(self, positions: range) -> Sequence[int]:
        """Cube ids at ``positions``: the range itself unless it reaches the padding."""
        if not positions or positions[-1] < self.n:
            return positions
        return _Wrapped(positions, self.n)

    def every(self, first: int, step: int) -> Sequence[int]:
        """Cubes ``first, first + step, ...`` of the share (a loader worker's)."""
        return self.ids(self.positions[first::step])

    def n_batches(self, batch: int) -> int:
        return -(-len(self) // batch)

    def batch(self, batch: int, j: int) -> Sequence[int]:
        """Batch ``j`` of ``batch`` cubes: cubes ``share[j * batch : (j + 1) * batch]``."""
        return self.ids(self.positions[j * batch : (j + 1) * batch])

    def in_batches(self, batch: int) -> Batches:
        """The share ``batch`` cubes at a time: ``plan[j]`` is batch ``j``'s cube ids."""
        return Batches(self, batch)


class Batches(Sequence):
    """A share's cubes ``batch`` at a time, in order: all batches full but the last."""

    def __init__(self, share: Share, batch: int):
        self.share, self.batch_cubes = share, batch

    def __len__(self) -> int:
        return self.share.n_batches(self.batch_cubes)

    def __getitem__(self, j: int) -> Sequence[int]:
        if not -len(self) <= j < len(self):
            raise IndexError(f"batch {j} of {len(self)}")
        return self.share.batch(self.batch_cubes, j % len(self))


class _Wrapped(Sequence):
    """Positions as cube ids, ``p % n``, computed as they are read."""

    def __init__(self, positions: range, n: int):
        self.positions, self.n = positions, n

    def __len__(self) -> int:
        return len(self.positions)

    def __getitem__(self, j):
        if isinstance(j, slice):
            return _Wrapped(self.positions[j], self.n)
        return self.positions[j] % self.n

    def __iter__(self) -> Iterator[int]:
        return (p % self.n for p in self.positions)

    def __repr__(self) -> str:
        return f"[{', '.join(map(str, self))}]" if len(self) <= 8 else f"<{len(self)} cube ids>"
