"""Finding a task's objects in an output for the tests: their names carry the attempt
that wrote them (``part-000001.a1b2c3d4.parquet``), so a test finds them by task."""

from __future__ import annotations

from pathlib import Path


def part(folder: Path, index: int) -> Path:
    """The one part of task ``index`` in a table's ``folder``."""
    found = sorted(Path(folder).glob(f"part-{index:06d}.*parquet"))
    assert len(found) == 1, found
    return found[0]


def shard(folder: Path, index: int) -> Path:
    """The one shard ``index`` in a cube job's ``shards`` folder."""
    found = sorted(Path(folder).glob(f"{index:06d}.*npy"))
    assert len(found) == 1, found
    return found[0]


def unnamed(name: str) -> str:
    """An object's name without its attempt (``part-000001.a1b2c3d4.parquet`` ->
    ``part-000001.parquet``): what two runs of the same job share."""
    import re

    return re.sub(r"\.a[0-9a-f]{8}(?=\.|$)", "", name)


def contents(folder: Path) -> dict[str, bytes]:
    """Each object's bytes in ``folder``, by its name without its attempt."""
    return {unnamed(p.name): p.read_bytes() for p in sorted(Path(folder).iterdir())}


def cube_manifest(data: bytes):
    """A cube job's consolidated manifest (its parquet bytes) as a table, its shards'
    names without their attempts: the same for two runs of the same job, whichever
    attempts wrote the shards (the cubes' checksums are in it)."""
    import io

    import pyarrow.parquet as pq

    table = pq.read_table(io.BytesIO(data)).to_pandas()
    table["shard"] = table["shard"].map(unnamed)
    return table
