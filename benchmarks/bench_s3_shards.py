"""S3 upload throughput of cube shards (store mode), on SeaweedFS on loopback.

Shards are uploaded the way a worker uploads them (``S3Store.write`` of the shard's
file image, one upload at a time), against:

  (1) shard size: cubes_per_shard 1 .. 32 (float64 cubes of d³), at the store's
      transfer settings;
  (2) multipart concurrency x part size, for one shard size;
  (3) float32 against float64 at the same cubes_per_shard: cubes/s and MB/s.

Each configuration uploads about --mb megabytes (at least 2 shards), in rounds
(--rounds); the median round counts. SeaweedFS runs in its own process but on the
same cores: the figures rank settings, they are not S3's rates. (The figures in
docs/benchmarks.md were measured on moto's server, the suite's S3 until SeaweedFS.)

  python -m benchmarks.bench_s3_shards
  python -m benchmarks.bench_s3_shards --mb 512 --rounds 3 --json s3.json
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

from harness.seaweedfs import ADMIN, SeaweedS3
from pipeline.storage import s3_client as s3mod
from pipeline.workloads.cubes.shards import ShardBuffer

MiB = 1 << 20
BUCKET = "bench-shards"


def upload_rate(server, d, dtype, cubes_per_shard, total_mb, rounds) -> dict:
    """Median over rounds of MB/s and cubes/s uploading shards of this shape."""
    from pipeline.storage import open_store

    shard = ShardBuffer((d, d, d, cubes_per_shard), dtype)
    shard.array.fill(0.5)
    nbytes = shard.file.nbytes
    count = max(2, round(total_mb * MiB / nbytes))
    results = []
    for r in range(rounds):
        server.reset()
        store = open_store(f"s3://{BUCKET}/r{r}")
        store._client().create_bucket(Bucket=BUCKET)
        t0 = time.perf_counter()
        for i in range(count):
            shard.write(store, f"shards/{i:06d}.npy")
        elapsed = time.perf_counter() - t0
        results.append(
            {
                "mb_per_s": count * nbytes / elapsed / 1e6,
                "cubes_per_s": count * cubes_per_shard / elapsed,
            }
        )
    median = sorted(results, key=lambda x: x["mb_per_s"])[len(results) // 2]
    return {**median, "shard_mb": nbytes / 1e6, "shards": count, "rounds": results}


def configure(concurrency: int, chunk_mb: int, threshold_mb: int | None = None) -> None:
    s3mod.MAX_CONCURRENCY = concurrency
    s3mod.MULTIPART_CHUNKSIZE = chunk_mb * MiB
    s3mod.MULTIPART_THRESHOLD = (threshold_mb or chunk_mb) * MiB


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--dim", type=int, default=100)
    ap.add_argument("--mb", type=float, default=256, help="megabytes per configuration")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--sizes", default="1,2,4,8,16,32", help="cubes_per_shard values of (1)")
    ap.add_argument("--concurrency", default="1,2,4,8", help="max_concurrency values of (2)")
    ap.add_argument("--parts", default="8,16,32,64", help="part sizes (MiB) of (2)")
    ap.add_argument("--shard", type=int, default=16, help="cubes_per_shard of (2) and (3)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()

    server = SeaweedS3().start()
    endpoint = server.endpoint
    os.environ.update(
        {
            "AWS_ACCESS_KEY_ID": ADMIN.key_id,
            "AWS_SECRET_ACCESS_KEY": ADMIN.secret,
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_EC2_METADATA_DISABLED": "true",
            "NO_PROXY": "127.0.0.1,localhost",
            "PIPELINE_S3_ENDPOINT_URL": endpoint,
        }
    )
    defaults = (s3mod.MAX_CONCURRENCY, s3mod.MULTIPART_CHUNKSIZE // MiB)
    d = args.dim
    out: dict = {"defaults": {"max_concurrency": defaults[0], "part_mib": defaults[1]}}
    print(
        f"SeaweedFS at {endpoint}; {os.cpu_count()} cores; load {os.getloadavg()[0]:.1f}; "
        f"d = {d}; store defaults: concurrency {defaults[0]}, parts of {defaults[1]} MiB",
        flush=True,
    )
    try:
        print("(1) shard size, float64, store defaults")
        out["sizes"] = {}
        for n in map(int, args.sizes.split(",")):
            r = upload_rate(server, d, "float64", n, args.mb, args.rounds)
            out["sizes"][n] = r
            print(
                f"    {n:3d} cubes/shard ({r['shard_mb']:6.1f} MB): {r['mb_per_s']:7.0f} MB/s "
                f"= {r['cubes_per_s']:6.0f} cubes/s",
                flush=True,
            )
        print(f"(2) multipart concurrency x part size, {args.shard} cubes/shard, float64")
        out["multipart"] = {}
        for c in map(int, args.concurrency.split(",")):
            row = []
            for part in map(int, args.parts.split(",")):
                configure(c, part)
                r = upload_rate(server, d, "float64", args.shard, args.mb, args.rounds)
                out["multipart"][f"{c}x{part}"] = r
                row.append(f"{part} MiB {r['mb_per_s']:5.0f}")
            print(f"    concurrency {c}: " + ", ".join(row) + " MB/s", flush=True)
        configure(defaults[0], defaults[1], 16)
        print(f"(3) dtype, {args.shard} cubes/shard, store defaults")
        out["dtype"] = {}
        for dtype in ("float64", "float32"):
            r = upload_rate(server, d, dtype, args.shard, args.mb, args.rounds)
            out["dtype"][dtype] = r
            print(
                f"    {dtype}: {r['mb_per_s']:7.0f} MB/s = {r['cubes_per_s']:6.0f} cubes/s",
                flush=True,
            )
        print(f"load at the end: {os.getloadavg()[0]:.1f}")
        if args.json:
            args.json.write_text(json.dumps(out, indent=2))
    finally:
        server.stop()


if __name__ == "__main__":
    main()
