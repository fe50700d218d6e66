"""Cubes into GPU memory: each way of getting them there against the limits, in one run.

The consumer is the GPU host harness's (``gpu_feed.py``): it moves each item to the
GPU (``x.to("cuda", non_blocking=True)``, nothing to do for an item already there)
and sums it there; a rate counts cubes from the first item to the last one's sum.

  limits   (L1) a page-locked (32, d, d, d) block copied host to device, (L2) the
           same from pageable memory, (L3) cubes gathered on the GPU from frames held
           there (random columns, ``arr[:, :d, :][:, :, cols].permute(...).contiguous()``),
           all three as gpu_feed.py measures them
  (R)      the reference method (ThreadPool over ``arr[:, :d, cols]``), each cube copied
  (G)      CubeStream(job, device="cuda", batch_size=B): gathered on the GPU, B = 64 and
           256; (G-rows) the other gather (whole column blocks, then a transposition)
  CPU-built, into the GPU from page-locked memory off the consumer's thread:
  (T)      CubeStream(job, device="cuda", build="cpu", batch_size=4): threads;
           (T0) the same with the consumer's own ``.to`` (CubeStream(job), as before)
  (W)      to_device(DataLoader(CubeStream(job, batch_size=32), num_workers=4)) and the
           same with 15 workers (batches of 8): loader workers' shared memory, through
           page-locked staging buffers
  (C)      CubeStream(job, device="cuda", batch_size=8, cluster=True): the embedded
           cluster's shared memory, page-locked in place
  (S)      CubeShards(...).batches(32, device="cuda"): a stored job read back (from the
           page cache here: the disk or S3 bounds it elsewhere)
  float32: L1, G (B = 256), T and C again

Targets (issue 36): G >= 50,000 cubes/s and >= 0.5 of L3; CPU paths >= 0.8 of L1;
float32 >= 1.8x float64 for G and for the CPU paths.

  python -m benchmarks.bench_cubes --gpu [--frames FRAMES]    # this section alone
  python -m benchmarks.bench_cubes_gpu --frames FRAMES --json gpu.json
  python -m benchmarks.bench_cubes_gpu --device cpu --seconds 1   # the code paths, no GPU
"""

from __future__ import annotations

import argparse
import json
import os
import random
import tempfile
import time
from multiprocessing.pool import ThreadPool
from pathlib import Path

import numpy as np


def consume(items, device, seconds: float, per_batch: bool) -> float:
    """gpu_feed.py's consumer, for ``seconds`` after the first item: cubes/s."""
    import torch

    t0, k, k0 = None, 0, 0
    acc = torch.zeros((), dtype=torch.float64, device=device)
    it = iter(items)
    try:
        for x in it:
            if isinstance(x, tuple):
                x = x[-1]
            g = x.to(device, non_blocking=True)
            acc += g.sum()
            k += g.shape[0] if per_batch else 1
            if t0 is None:
                _sync(device)
                t0, k0 = time.perf_counter(), k
            elif time.perf_counter() - t0 >= seconds:
                break
    finally:
        getattr(it, "close", lambda: None)()
    _sync(device)
    return (k - k0) / (time.perf_counter() - t0)


def _sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def copy_limits(device, d: int, dtype, seconds: float) -> dict:
    """(L1) and (L2): host-to-device copies of a (32, d, d, d) block, cubes/s."""
    import torch

    rates = {}
    for name, src in (
        ("pinned", torch.empty((32, d, d, d), dtype=dtype).pin_memory()),
        ("pageable", torch.empty((32, d, d, d), dtype=dtype)),
    ):
        for _ in range(3):
            src.to(device)
        _sync(device)
        n, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            src.to(device, non_blocking=True)
            n += 1
            if n % 8 == 0:
                _sync(device)
        _sync(device)
        rates[name] = n * 32 / (time.perf_counter() - t0)
    return rates


def gather_limit(device, d: int, dtype, seconds: float, ncols: int = 1000) -> float:
    """(L3): gpu_feed.py's cubes gathered on the GPU from frames held there, cubes/s."""
    import torch

    arr = torch.rand((d, 1000, ncols), dtype=dtype, device=device)
    g = torch.Generator(device=device)
    g.manual_seed(1)
    b, k = 64, 0
    _sync(device)
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        cols = torch.rand((b, ncols - 1), device=device, generator=g).argsort(dim=1)[:, :d] + 1
        arr[:, :d, :][:, :, cols].permute(2, 0, 1, 3).contiguous()
        k += b
    _sync(device)
    return k / (time.perf_counter() - t0)


def reference(frames_dir: Path, device, d: int, seconds: float) -> float:
    """(R): gpu_feed.py's reference case, with at most two cubes a thread in flight
    (an unbounded ``imap`` builds 8 MB cubes four times faster than the GPU takes
    them, into memory, until the run ends)."""
    import pyarrow.parquet as pq
    import torch

    files = sorted(frames_dir.glob("*.parquet"))[:d]
    arr = np.stack([pq.read_table(f).to_pandas().to_numpy(dtype=np.float64) for f in files])
    ncols, threads = arr.shape[2], os.cpu_count() or 2

    def cube(_):
        return torch.from_numpy(arr[:, :d, random.sample(range(1, ncols), d)])

    def cubes(pool):
        pending = [pool.apply_async(cube, (k,)) for k in range(2 * threads)]
        while True:
            pending.append(pool.apply_async(cube, (0,)))
            yield pending.pop(0).get()

    with ThreadPool(threads) as pool:
        return consume(cubes(pool), device, seconds, False)


def stored_job(frames_dir: Path, d: int, cubes: int, out: Path) -> str:
    from pipeline import load_jobs, run_jobs

    cli = {"frames": str(frames_dir), "cubes": cubes, "dim": d, "seed": 9, "sink": "store"}
    cli.update(output=str(out), overwrite=True, progress=False, name="gpu-shards")
    (summary,) = run_jobs(load_jobs([], cli, environ={}), echo=lambda m: None)
    assert summary.complete
    return str(out)


def paths(frames_dir: Path, device, d: int, dtype: str, args, shards: str | None) -> dict:
    """(G), (T), (W), (C), (S) for one dtype (float32: G, T and C only)."""
    from torch.utils.data import DataLoader

    from pipeline import CubeJob
    from pipeline.torch import CubeShards, CubeStream, to_device
    from pipeline.workloads.cubes.gather import device_batches

    job = CubeJob(frames=str(frames_dir), cubes=10**9, dim=d, seed=5, dtype=dtype)
    secs, full = args.seconds, dtype == "float64"
    cases = {
        "G256": lambda: consume(CubeStream(job, device=device, batch_size=256), device, secs, True),
        "T": lambda: consume(
            CubeStream(job, device=device, build="cpu", batch_size=4), device, secs, True
        ),
        "C": lambda: consume(
            CubeStream(job, device=device, batch_size=8, cluster=True), device, secs, True
        ),
    }
    if full:
        stream = CubeStream(job, contiguous=False)  # as before: cubes as built
        workload = stream.workload

        def rows():
            plan = (range(i, i + 256) for i in range(0, 10**9, 256))
            batches = device_batches(workload, device, plan, 256, "rows")
            return consume(batches, device, secs, True)

        cases.update(
            G64=lambda: consume(CubeStream(job, device=device, batch_size=64), device, secs, True),
            G_rows=rows,
            T0=lambda: consume(DataLoader(stream, batch_size=None), device, secs, False),
        )
        for n in args.loader_workers:
            # gpu_feed.py's loader4 with 4 workers (batches of 32, 4 prefetched); with
            # more, batches of 8, 2 prefetched: each is a segment of /dev/shm
            b, ahead = (32, 4) if n <= 4 else (8, 2)
            # (as built: the GPU transposes while the loader workers build the next)
            loader = DataLoader(
                CubeStream(job, batch_size=b, contiguous=False),
                batch_size=None,
                num_workers=n,
                prefetch_factor=ahead,
            )
            cases[f"W{n}"] = lambda loader=loader: consume(
                to_device(loader, device), device, secs, True
            )
        if shards:
            ds = CubeShards(shards, "gpu-shards")
            order = [k % len(ds) for k in range(10**6)]  # epochs over the stored cubes
            cases["S"] = lambda: consume(
                ds.batches(32, device=device, ids=order), device, secs, True
            )
    rates = {}
    for name, run in cases.items():
        rates[name] = run()
        print(f"    {dtype} {name:8s} {rates[name]:10,.0f} cubes/s", flush=True)
    return rates


def gpu_section(frames_dir: Path, args) -> dict | None:
    """Every figure above, printed with its ratios; None without CUDA."""
    try:
        import torch
    except ImportError:
        print("GPU section: torch is not installed: skipped")
        return None
    if args.device == "cuda" and not torch.cuda.is_available():
        print(f"GPU section: no CUDA here (torch {torch.__version__}): skipped; every GPU "
              "figure in docs/cubes.md is from the GPU host")  # fmt: skip
        return None
    device = torch.device(args.device)
    d, secs = args.dim, args.seconds
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    print(f"GPU section: {name}, torch {torch.__version__}, d = {d}, {secs} s a case", flush=True)
    out: dict = {"device": name, "torch": torch.__version__}
    for dtype in ("float64", "float32"):
        t = getattr(torch, dtype)
        lim = copy_limits(device, d, t, secs) if device.type == "cuda" else {}
        if dtype == "float64":
            lim["gather"] = gather_limit(device, d, t, secs)
        print(f"    {dtype} limits: " + ", ".join(f"{k} {v:,.0f}" for k, v in lim.items()))
        out[dtype] = {"limits": lim}
    out["float64"]["R"] = reference(frames_dir, device, d, secs)
    print(f"    float64 R        {out['float64']['R']:10,.0f} cubes/s", flush=True)
    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        shards = (
            stored_job(frames_dir, d, args.shard_cubes, Path(tmp)) if args.shard_cubes else None
        )
        for dtype in ("float64", "float32"):
            out[dtype].update(paths(frames_dir, device, d, dtype, args, shards))
    print_ratios(out)
    return out


def print_ratios(out: dict) -> None:
    f64, f32 = out["float64"], out["float32"]
    lim = f64["limits"]
    print("ratios (targets: G >= 50,000/s and >= 0.5 of L3; CPU paths >= 0.8 of L1; "
          "float32 >= 1.8x float64):")  # fmt: skip
    for g in ("G64", "G256", "G_rows"):
        if g in f64 and "gather" in lim:
            print(f"    {g} = {f64[g]:,.0f}/s = {f64[g] / lim['gather']:.2f} of L3")
    cpu = [k for k in f64 if k[0] in "TWCS" or k == "R"]
    if "pinned" in lim:
        print("    of L1 (pinned copy, " + f"{lim['pinned']:,.0f}/s): " + ", ".join(
            f"{k} {f64[k] / lim['pinned']:.2f}" for k in cpu))  # fmt: skip
    print("    float32 / float64: " + ", ".join(
        f"{k} {f32[k] / f64[k]:.2f}" for k in ("G256", "T", "C") if k in f32))  # fmt: skip


def arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--seconds", type=float, default=4.0, help="GPU section: seconds a case")
    ap.add_argument("--device", default="cuda", help="GPU section: cuda, or cpu to try the code")
    ap.add_argument("--loader-workers", type=lambda s: [int(x) for x in s.split(",")],
                    default=[4, max(1, (os.cpu_count() or 2) - 1)],
                    help="GPU section: loader workers of (W), comma-separated")  # fmt: skip
    ap.add_argument("--shard-cubes", type=int, default=1000, help="(S): cubes stored; 0 skips")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--frames", type=Path, help="frames folder (default: make 100x1000x1000)")
    ap.add_argument("--dim", type=int, default=100)
    ap.add_argument("--workdir", type=Path)
    ap.add_argument("--json", type=Path)
    arguments(ap)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        os.environ.setdefault("PIPELINE_CACHE_DIR", str(Path(tmp) / "cache"))
        frames = args.frames
        if frames is None:
            from pipeline.storage import LocalStore
            from pipeline.workloads.cubes.frames import write_frames

            frames = Path(tmp) / "frames"
            write_frames(LocalStore(frames), "", count=args.dim, rows=1000, cols=1000, seed=0)
        figures = gpu_section(frames, args)
    if args.json and figures is not None:
        args.json.write_text(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
