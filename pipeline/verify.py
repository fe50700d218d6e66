"""``pipeline verify``: check a job's output against its manifest.

Every object the manifest lists must exist, every checksum must match the bytes
read back, every unit must be listed exactly once, and nothing else may sit
among the job's data objects.
"""

from __future__ import annotations

import io
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import pyarrow.parquet as pq
import xxhash

from .errors import InputError
from .storage import Store, join, open_store

__all__ = ["JobCheck", "verify_output"]


@dataclass
class JobCheck:
    job_id: str
    workload: str
    units_expected: int = 0
    units_ok: int = 0
    objects_checked: int = 0
    missing: list[str] = field(default_factory=list)
    extra: list[str] = field(default_factory=list)
    corrupt: list[str] = field(default_factory=list)
    duplicated: list[str] = field(default_factory=list)
    incomplete: str | None = None

    @property
    def ok(self) -> bool:
        return not (
            self.missing or self.extra or self.corrupt or self.duplicated or self.incomplete
        )


def verify_output(url: str, job_ids: list[str] | None = None) -> list[JobCheck]:
    """Check every job under ``url`` (or only ``job_ids``)."""
    store = open_store(url)
    records = [k for k in store.list() if k.endswith("/job.json") and k.count("/") == 1]
    found = {k.split("/", 1)[0]: k for k in records}
    if job_ids:
        absent = sorted(set(job_ids) - set(found))
        if absent:
            raise InputError(
                f"{store.url}: no job {', '.join(absent)} (found: "
                f"{', '.join(sorted(found)) or 'none'})"
            )
        found = {j: found[j] for j in job_ids}
    if not found:
        raise InputError(f"{store.url}: no job output here (no <job>/job.json)")
    checks = []
    for job_id, key in sorted(found.items()):
        record = json.loads(store.read_bytes(key))
        checker = _CHECKERS.get(record["workload"])
        if checker is None:
            raise InputError(f"{store.describe(key)}: unknown workload {record['workload']!r}")
        check, listed = checker(store, job_id, record)
        check.extra = [store.describe(k) for k in unlisted_objects(store, job_id, listed, record)]
        checks.append(check)
    return checks


#: Objects a job writes about itself besides what its manifests list.
_BOOKKEEPING = ("job.json", "manifest.parquet")
#: ... and those a workload's finalize writes, by workload.
_FINAL_OBJECTS = {"regressions": ("coefficients-summary.pdf",)}


def unlisted_objects(store: Store, job_id: str, listed: set[str], record: dict) -> list[str]:
    """Every object under the job's prefix that no manifest lists and that is not the
    job's own bookkeeping (its record, its manifests), sorted."""
    own = {
        join(job_id, name) for name in (*_BOOKKEEPING, *_FINAL_OBJECTS.get(record["workload"], ()))
    }
    parts = re.compile(re.escape(join(job_id, "manifest")) + r"/part-\d{6}\.parquet")
    return [
        k for k in store.list(job_id) if k not in listed and k not in own and not parts.fullmatch(k)
    ]


def _read_manifest(store: Store, job_id: str, check: JobCheck):
    key = join(job_id, "manifest.parquet")
    if store.exists(key):
        return pq.read_table(io.BytesIO(store.read_bytes(key))).to_pandas()
    parts = store.list(join(job_id, "manifest"))
    check.incomplete = (
        f"no manifest.parquet: the run has not completed "
        f"({len(parts)} task entries present); run the job again to finish it"
    )
    if not parts:
        return None
    import pandas as pd

    return pd.concat(
        [pq.read_table(io.BytesIO(store.read_bytes(p))).to_pandas() for p in parts],
        ignore_index=True,
    )


def _check_cubes(store: Store, job_id: str, record: dict) -> tuple[JobCheck, set[str]]:
    check = JobCheck(job_id, "cubes", units_expected=record["units"])
    manifest = _read_manifest(store, job_id, check)
    listed_shards: set[str] = set()
    if manifest is not None:
        counts = manifest["cube_id"].value_counts()
        check.duplicated = [f"cube {c}" for c in sorted(counts[counts > 1].index)]
        present = set(manifest["cube_id"])
        check.missing = [f"cube {c}" for c in range(record["units"]) if c not in present]
        for shard_key, rows in manifest.groupby("shard", sort=True):
            listed_shards.add(shard_key)
            where = store.describe(shard_key)
            try:
                data = store.read_bytes(shard_key)
            except FileNotFoundError:
                check.missing.append(where)
                continue
            check.objects_checked += 1
            try:
                cubes = np.load(io.BytesIO(data))
            except ValueError as exc:
                check.corrupt.append(f"{where}: not a readable .npy ({exc})")
                continue
            for row in rows.itertuples():
                if row.offset >= cubes.shape[-1]:
                    check.corrupt.append(f"{where}: no cube at offset {row.offset}")
                    continue
                actual = xxhash.xxh3_64_hexdigest(np.ascontiguousarray(cubes[..., row.offset].T))
                if actual != row.checksum:
                    check.corrupt.append(
                        f"{where}[{row.offset}] (cube {row.cube_id}): "
                        f"checksum {actual} != manifest {row.checksum}"
                    )
                else:
                    check.units_ok += 1
    return check, listed_shards


def _check_regressions(store: Store, job_id: str, record: dict):
    from .regress.verify import check_regressions

    return check_regressions(store, job_id, record)


#: Workload -> its check, returning the JobCheck and the objects its manifests list.
_CHECKERS: dict[str, Callable[[Store, str, dict], tuple[JobCheck, set[str]]]] = {
    "cubes": _check_cubes,
    "regressions": _check_regressions,
}
