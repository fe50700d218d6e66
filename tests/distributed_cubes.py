"""Two ranks of a gloo process group iterate CubeStream in its paths; each writes the
cubes it got (id -> xxh3 of the bytes), its len() and the items it iterated to
rank<r>.json. Run by tests/test_device.py:

    python tests/distributed_cubes.py JOB_JSON OUT_DIR
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

WORLD = 2


def rank_main(rank: int, job_json: str, out: str) -> None:
    import numpy as np
    import torch.distributed as dist
    import xxhash
    from torch.utils.data import DataLoader

    from pipeline import CubeJob
    from pipeline.torch import CubeStream

    dist.init_process_group("gloo", init_method=f"file://{out}/group", rank=rank, world_size=WORLD)
    job = CubeJob(**json.loads(job_json))
    cases = {
        # name: (stream, batched, loader workers)
        "gathered": (CubeStream(job, device="cpu", batch_size=3, with_ids=True), True, 0),
        "gathered_cubes": (CubeStream(job, device="cpu", with_ids=True), False, 0),
        "gathered_workers": (CubeStream(job, device="cpu", batch_size=3, with_ids=True), True, 2),
        "threads": (CubeStream(job, with_ids=True), False, 0),
        "threads_fed": (
            CubeStream(job, device="cpu", build="cpu", batch_size=2, with_ids=True),
            True,
            0,
        ),
        "loader_workers": (CubeStream(job, batch_size=3, with_ids=True), True, 2),
    }
    report = {}
    for name, (stream, batched, workers) in cases.items():
        cubes, items = {}, 0
        for ids, x in DataLoader(stream, batch_size=None, num_workers=workers):
            items += 1
            pairs = zip(ids.tolist(), x, strict=True) if batched else [(ids, x)]
            for cube_id, cube in pairs:
                cubes[cube_id] = xxhash.xxh3_64_hexdigest(np.ascontiguousarray(cube.numpy()))
        report[name] = {"cubes": cubes, "len": len(stream), "items": items}
    Path(out, f"rank{rank}.json").write_text(json.dumps(report))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    import torch.multiprocessing as mp

    mp.spawn(rank_main, args=(sys.argv[1], sys.argv[2]), nprocs=WORLD, join=True)
