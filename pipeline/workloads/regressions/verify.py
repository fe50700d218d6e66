"""``pipeline verify`` for regression jobs: the generic object checks, and each chunk
listed exactly once in the models tables (their content, not only the ranges)."""

from __future__ import annotations

from ...manifest import check_listed_objects
from ...storage import Store, read_parquet

#: A regression job's manifest: each object and its chunks' range.
CHUNK_RANGE = ("object", "chunk_start", "chunk_stop")

__all__ = ["check_regressions"]


def check_regressions(store: Store, manifest, check) -> set[str]:
    seen: dict[int, int] = {}

    def count_chunks(row, data: bytes) -> None:
        if row.kind != "models":
            return
        try:
            ids = read_parquet(data, columns=["chunk_id"]).column(0)
        except Exception as exc:
            check.corrupt.append(f"{store.describe(row.object)}: not a readable table ({exc})")
            check.damaged_units.add(int(row.chunk_start))
            return
        for cid in ids.to_pylist():
            seen[cid] = seen.get(cid, 0) + 1

    listed = check_listed_objects(
        store, manifest, check, count_chunks, coverage=False, columns=CHUNK_RANGE
    )
    n = check.units_expected
    check.duplicated = [f"chunk {c}" for c, k in sorted(seen.items()) if k > 1]
    check.missing += [f"chunk {c}" for c in range(n) if c not in seen]
    check.units_ok = sum(1 for c in range(n) if seen.get(c) == 1 and c not in check.unverified)
    return listed
