"""``pipeline verify`` for regression jobs: register with
``_CHECKERS["regressions"] = check_regressions`` in :mod:`pipeline.verify`.

Every object a manifest entry lists must exist with the recorded xxh3_64; every
chunk must appear exactly once in the models tables; nothing unlisted may sit
under the job's prefix (:func:`pipeline.verify.unlisted_objects`).
"""

from __future__ import annotations

import io

import pyarrow.parquet as pq
import xxhash

from ..storage import Store

__all__ = ["check_regressions"]


def check_regressions(store: Store, job_id: str, record: dict):
    from ..verify import JobCheck, _read_manifest

    check = JobCheck(job_id, "regressions", units_expected=record["units"])
    manifest = _read_manifest(store, job_id, check)
    listed: set[str] = set()
    seen: dict[int, int] = {}
    if manifest is not None:
        for row in manifest.itertuples():
            listed.add(row.object)
            where = store.describe(row.object)
            try:
                data = store.read_bytes(row.object)
            except FileNotFoundError:
                check.missing.append(where)
                continue
            check.objects_checked += 1
            actual = xxhash.xxh3_64_hexdigest(data)
            if actual != row.checksum:
                check.corrupt.append(f"{where}: checksum {actual} != manifest {row.checksum}")
                continue
            if row.kind == "models":
                try:
                    ids = pq.read_table(io.BytesIO(data), columns=["chunk_id"]).column(0)
                except Exception as exc:
                    check.corrupt.append(f"{where}: not a readable parquet table ({exc})")
                    continue
                for cid in ids.to_pylist():
                    seen[cid] = seen.get(cid, 0) + 1
    check.duplicated = [f"chunk {c}" for c, n in sorted(seen.items()) if n > 1]
    check.missing += [f"chunk {c}" for c in range(record["units"]) if c not in seen]
    check.units_ok = sum(1 for c in range(record["units"]) if seen.get(c) == 1)
    return check, listed
