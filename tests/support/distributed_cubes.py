"""Ranks of a gloo process group iterate every CubeStream path (and CubeShards.batches
of a stored job), padded and with drop_last, as a DDP training loop would: one
all_reduce per item, so a rank with more items than another fails (the group's
timeout) instead of returning. Each rank writes, per case, the cube ids it got in
order (repeats included), each cube's xxh3 of its bytes (in that order), len(), the
items iterated,
and whether every item was C-contiguous in the training layout, to rank<r>.json.
Run by tests/test_device.py:

    python tests/support/distributed_cubes.py WORLD JOB_JSON STORED_OUTPUT OUT_DIR
"""

from __future__ import annotations

import datetime
import json
import sys
from pathlib import Path


def cases(job, stored: str):
    """(name, stream or None, items, batched, in id order) of every path, padded and
    with drop_last."""
    from torch.utils.data import DataLoader

    from pipeline.torch import CubeShards, CubeStream

    def loader(workers: int, start: str = "fork", **settings):
        stream = CubeStream(job, with_ids=True, **settings)
        context = start if workers else None
        loader = DataLoader(
            stream, batch_size=None, num_workers=workers, multiprocessing_context=context
        )
        return stream, loader

    shards = CubeShards(stored)
    for drop_last in (False, True):
        tag = "drop_last" if drop_last else "padded"
        paths = {
            "threads": (0, {}),
            "threads_batched": (0, {"batch_size": 3}),
            "loader_workers": (2, {}),
            # spawned workers, which see no process group: the stream carries the rank
            "loader_workers_batched": (2, {"batch_size": 3, "start": "spawn"}),
            "gathered": (0, {"device": "cpu"}),
            "gathered_batched": (0, {"device": "cpu", "batch_size": 3}),
            "gathered_workers": (2, {"device": "cpu", "batch_size": 3}),
            "threads_fed": (0, {"device": "cpu", "build": "cpu", "batch_size": 2}),
        }
        for name, (workers, settings) in paths.items():
            if drop_last:
                settings.pop("start", None)  # (forked: starting interpreters takes seconds)
            stream, items = loader(workers, drop_last=drop_last, **settings)
            yield f"{name}/{tag}", stream, items, "batch_size" in settings, True
        # The embedded cluster (one per iteration): its batches come in completion order
        settings = {"batch_size": 3} if drop_last else {}
        stream, items = loader(0, cluster=True, drop_last=drop_last, **settings)
        yield f"cluster/{tag}", stream, items, drop_last, False
        for device in (None, "cpu"):
            batches = shards.batches(3, device=device, drop_last=drop_last)
            yield f"shards_{device}/{tag}", None, batches, True, True


def rank_main(rank: int, world: int, job_json: str, stored: str, out: str) -> None:
    import numpy as np
    import torch
    import torch.distributed as dist
    import xxhash

    from pipeline import CubeJob

    dist.init_process_group(
        "gloo",
        init_method=f"file://{out}/group",
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=60),
    )
    job = CubeJob(**json.loads(job_json))
    report = {}
    for name, stream, items, batched, ordered in cases(job, stored):
        ids, digests, count, contiguous = [], [], 0, True
        for item in items:
            count += 1
            got, x = (None, item) if stream is None else item  # CubeShards: no ids
            contiguous &= x.is_contiguous() and x.shape[-3:] == (job.dim,) * 3
            cubes = x if batched else [x]
            if got is not None:
                ids += got.tolist() if batched else [got]
            digests += [xxhash.xxh3_64_hexdigest(np.ascontiguousarray(c.numpy())) for c in cubes]
            dist.all_reduce(torch.ones(1))  # as DDP's gradient sync: every rank, each step
        report[name] = {
            "ids": ids if stream is not None else None,
            "digests": digests,
            "len": None if stream is None else len(stream),
            "items": count,
            "contiguous": contiguous,
            "ordered": ordered,
        }
    Path(out, f"rank{rank}.json").write_text(json.dumps(report))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    import torch.multiprocessing as mp

    world = int(sys.argv[1])
    mp.spawn(rank_main, args=(world, *sys.argv[2:5]), nprocs=world, join=True)
