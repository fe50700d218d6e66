"""``pipeline verify`` of a cube job: its manifest lists cubes in shards, not objects
with unit ranges."""

from __future__ import annotations

import io

from ...manifest import checksum
from ...storage import Store

__all__ = ["check_cube_shards"]


def check_cube_shards(store: Store, manifest, check) -> set[str]:
    """Cube jobs: each shard readable, each cube's checksum, each cube listed once."""
    import numpy as np

    listed_shards: set[str] = set()
    if manifest is not None:
        counts = manifest["cube_id"].value_counts()
        check.duplicated = [f"cube {c}" for c in sorted(counts[counts > 1].index)]
        present = set(manifest["cube_id"])
        check.missing = [f"cube {c}" for c in range(check.units_expected) if c not in present]
        for shard_key, rows in manifest.groupby("shard", sort=True):
            listed_shards.add(shard_key)
            where = store.describe(shard_key)
            try:
                data = store.read_bytes(shard_key)
            except FileNotFoundError:
                check.missing.append(where)
                check.damaged_units.add(int(rows["cube_id"].min()))
                continue
            check.objects_checked += 1
            try:
                if not data.startswith(b"\x93NUMPY"):  # (np.load takes it for a pickle)
                    raise ValueError(f"it begins {data[:8]!r}, not with numpy's magic")
                cubes = np.load(io.BytesIO(data), allow_pickle=False)
            except ValueError as exc:
                check.corrupt.append(f"{where}: not a readable .npy ({exc})")
                check.damaged_units.add(int(rows["cube_id"].min()))
                continue
            for row in rows.itertuples():
                if row.offset >= cubes.shape[-1]:
                    check.corrupt.append(f"{where}: no cube at offset {row.offset}")
                    check.damaged_units.add(int(row.cube_id))
                    continue
                actual = checksum(np.ascontiguousarray(cubes[..., row.offset].T))
                if actual != row.checksum:
                    check.damaged_units.add(int(row.cube_id))
                    check.corrupt.append(
                        f"{where}[{row.offset}] (cube {row.cube_id}): "
                        f"checksum {actual} != manifest {row.checksum}"
                    )
                else:
                    check.units_ok += 1
    return listed_shards
