"""Input frames: generating them, validating them, and loading them on workers in
the column-major layout that makes building a cube one contiguous gather."""

from __future__ import annotations

import fcntl
import functools
import io
import json
import logging
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import xxhash

from ...errors import ConfigError, InputError, StorageError
from ...storage import Store, join, open_store

log = logging.getLogger(__name__)

__all__ = [
    "FrameSet",
    "data_columns",
    "frame_keys",
    "inspect_frames",
    "load_layout",
    "write_frames",
]

#: Rows per parquet row group: a worker that needs the first d rows reads
#: only the row groups that hold them.
ROW_GROUP_ROWS = 100


def write_frames(
    store: Store,
    prefix: str,
    *,
    count: int,
    rows: int,
    cols: int,
    seed: int,
    overwrite: bool = False,
) -> list[str]:
    """Write ``count`` parquet frames of ``rows`` x ``cols`` random floats in [0, 1),
    rounded to 10 decimals. Frame i depends only on (seed, i).

    A folder that holds frames already (:func:`frame_keys`) is refused unless
    ``overwrite``; then its frames are replaced wholly: those this call does not
    write again (a larger count's) are deleted, so no stale frame remains."""
    for name, value in (("count", count), ("rows", rows), ("cols", cols)):
        if value < 1:
            raise InputError(f"--{name} must be at least 1, got {value}")
    try:
        existing, _nested = frame_keys(store.list(prefix), prefix)
    except OSError as exc:
        raise StorageError(f"{store.describe(prefix)}: cannot list it: {exc}") from exc
    if existing and not overwrite:
        raise ConfigError(
            f"{store.describe(prefix)} already holds {len(existing)} frames "
            f"({existing[0].rsplit('/', 1)[-1]}...); give --overwrite to replace them, or "
            "another --out"
        )
    names = [str(c) for c in range(cols)]

    def write(i: int) -> str:
        data = np.random.default_rng([seed, i]).random((rows, cols)).round(10)
        # Columns from the transpose: contiguous, where data[:, c] made pyarrow gather
        # a strided column (0.2 s of a 0.3 s frame of 1000x1000)
        columns = np.ascontiguousarray(data.T)
        table = pa.table({n: columns[c] for c, n in enumerate(names)})
        sink = io.BytesIO()
        pq.write_table(
            table, sink, row_group_size=ROW_GROUP_ROWS, compression="none", write_statistics=False
        )
        key = join(prefix, f"frame-{i:05d}.parquet")
        store.write_bytes(key, sink.getbuffer())
        return key

    # numpy and parquet let go of the GIL: frames are made a core each
    with ThreadPoolExecutor(min(8, os.cpu_count() or 1)) as pool:
        written = list(pool.map(write, range(count)))
    for stale in sorted(set(existing) - set(written)):
        store.delete_prefix(stale)  # (a key naming an object deletes that object alone)
    return written


@dataclass(frozen=True)
class FrameSet:
    """The frames a cube job uses: the first ``dim`` files of a folder, in name order."""

    url: str
    keys: tuple[str, ...]
    n_cols: int  # data columns (:func:`data_columns`), the same in every used frame
    n_rows: int  # the fewest rows of any used frame
    versions: tuple[str, ...] = ()  # size and mtime or ETag: a changed frame is reloaded


def inspect_frames(url: str, dim: int) -> FrameSet:
    """Validate a frames folder for cubes of dimension ``dim`` from parquet footers only."""
    store = open_store(url)
    try:
        listed = store.list()
    except OSError as exc:
        raise InputError(f"frames folder {url}: cannot list it: {exc}") from exc
    if listed == [""]:  # a file, not a folder
        raise InputError(
            f"frames {url} is a file; frames are a folder of parquet files, one per frame "
            "(or an s3:// prefix)"
        )
    keys, nested = frame_keys(listed)
    folders = sorted({k.rsplit("/", 1)[0] + "/" for k in nested})
    subfolders = ", ".join(folders[:3]) + (", ..." if len(folders) > 3 else "")
    nested_text = f"the {len(nested)} .parquet files in its subfolders ({subfolders})"
    if not keys:
        what = "has no .parquet files" if listed else "is missing or empty"
        if nested:
            what = (
                f"has no .parquet files of its own ({nested_text} are not frames: give "
                "the folder that holds the frames themselves)"
            )
        raise InputError(
            f"frames folder {url} {what}; expected at least {dim} parquet "
            "frames (make some with `pipeline data frames`)"
        )
    if len(keys) < dim:
        raise InputError(
            f"frames folder {url} has {len(keys)} frames; a cube of dimension "
            f"{dim} needs at least {dim}" + (f" ({nested_text} are not frames)" if nested else "")
        )
    if nested:
        log.info("frames folder %s: %s are not frames, only its own files", url, nested_text)
    used = keys[:dim]
    versions = tuple(store.version(key) for key in used)
    inspected = (store.url, dim, tuple(used), versions)
    cached = _INSPECTED.get(inspected)
    if cached is not None:
        return cached
    n_cols = None
    n_rows = None
    left_out: dict[str, str] = {}  # pandas index columns left out, and column 0 then
    for key in used:
        where = store.describe(key)
        try:
            with store.open_input(key) as f:
                # read_metadata, not ParquetFile: that also builds a path per column,
                # a third of the time on frames of 1,000 columns.
                meta = pq.read_metadata(f)
                schema = meta.schema.to_arrow_schema()
        except (OSError, pa.ArrowException) as exc:
            raise InputError(f"frame {where}: not a readable parquet file ({exc})") from exc
        names = data_columns(schema)
        kept = set(names)  # (a list searched for each of 1,000 columns: 1 s a start)
        index = [n for n in schema.names if n not in kept]
        if index and names:
            left_out.update(dict.fromkeys(index, names[0]))
        besides = f" besides its pandas index ({', '.join(map(repr, index))})" if index else ""
        for name, t in zip(schema.names, schema.types, strict=True):
            # column 0 (a date, an index) is never drawn
            numbers = pa.types.is_floating(t) or pa.types.is_integer(t)
            if name in kept and name != names[0] and not numbers:
                raise InputError(
                    f"frame {where}: column {name!r} has type {t}; expected numbers "
                    "(float or integer) in every column after the first"
                )
        if meta.num_rows < dim:
            raise InputError(
                f"frame {where} has {meta.num_rows} rows; a cube of dimension "
                f"{dim} needs at least {dim}"
            )
        if len(names) - 1 < dim:
            raise InputError(
                f"frame {where} has {len(names)} columns{besides}; a cube of dimension "
                f"{dim} draws {dim} columns from columns 1..ncols-1, so it needs "
                f"at least {dim + 1}"
            )
        if n_cols is not None and len(names) != n_cols:
            raise InputError(
                f"frame {where} has {len(names)} columns{besides}; expected {n_cols} "
                f"like {store.describe(used[0])}"
            )
        n_cols = len(names)
        n_rows = meta.num_rows if n_rows is None else min(n_rows, meta.num_rows)
    if left_out:
        log.info(
            "frames %s: the pandas index column(s) %s are not data: left out (columns are "
            "counted as pd.read_parquet gives them back, so column 0, %s, is not drawn either)",
            store.url,
            ", ".join(map(repr, left_out)),
            " or ".join(map(repr, dict.fromkeys(left_out.values()))),
        )
    frames = FrameSet(
        url=store.url, keys=tuple(used), n_cols=n_cols, n_rows=n_rows, versions=versions
    )
    _INSPECTED[inspected] = frames
    return frames


def frame_keys(listed: list[str], prefix: str = "") -> tuple[list[str], list[str]]:
    """Of the keys ``listed`` under folder ``prefix``: its frames (its own .parquet
    files, in name order) and the .parquet files in its subfolders, which are not
    frames (an older set kept in a subfolder sorted ahead of the folder's own)."""
    own, nested = [], []
    for key in listed:
        rel = key[len(prefix) :].lstrip("/") if prefix else key
        # Files named _* or .* are not frames (a writer's _SUCCESS, _tmp or .crc): a
        # broken _tmp.parquet failed the job
        if rel.endswith(".parquet") and rel.rsplit("/", 1)[-1][0] not in "_.":
            (nested if "/" in rel else own).append(key)
    return own, nested


def data_columns(schema: pa.Schema) -> list[str]:
    """A frame's columns as ``pd.read_parquet`` gives them back: without the index
    columns pandas stored beside them (``DataFrame.to_parquet`` keeps any index but a
    plain range as a last column, ``__index_level_0__`` or the index's name), which
    are row labels, not data."""
    raw = (schema.metadata or {}).get(b"pandas")
    stored = _index_columns(raw) if raw else frozenset()
    return [name for name in schema.names if name not in stored]


@functools.lru_cache(maxsize=16)
def _index_columns(raw: bytes) -> frozenset[str]:
    """The index columns pandas' metadata names (parsed once: frames of a set share
    it, and parsing its entry for each of 1,000 columns, for each frame, added up)."""
    try:
        meta = json.loads(raw)
    except ValueError:  # metadata under the pandas key that is not JSON: not pandas'
        return frozenset()
    index = meta.get("index_columns") if isinstance(meta, dict) else None
    # (a range index is a description, {"kind": "range", ...}, not a column)
    return frozenset(name for name in index or () if isinstance(name, str))


#: Frame sets already inspected by this process, by folder, dimension and the frames'
#: versions: a consumer that iterates again (an epoch) does not read 100 footers again.
_INSPECTED: dict[tuple, FrameSet] = {}


@functools.lru_cache(maxsize=2)
def load_layout(frames: FrameSet, dim: int, dtype: str, by_frame: bool = False) -> np.ndarray:
    """Worker: ``T[c - 1, r, f] = frame_f[r, c]`` for columns 1.., the first ``dim`` rows.

    Column-major over (row, frame) means the d x d block of one column is
    contiguous, so a cube with columns ``cols`` is ``T[cols - 1]``: d block copies.
    ``by_frame``: ``F[f, c - 1, r]`` instead, for cubes whose every layer has columns
    of its own: a layer's columns are then d contiguous runs of d values, where in
    ``T`` each value of them is in a cache line of its own.

    Each worker process holds it once (this cache). Across the processes of a
    host it is built once and memory-mapped from a cache file, so a host of 96
    workers reads the frames once and keeps one copy in memory, not 96.
    """
    path = _layout_path(frames, dim, dtype, by_frame)
    if path is None:
        return _read_layout(frames, dim, dtype, by_frame=by_frame)
    shape = (dim, frames.n_cols - 1, dim) if by_frame else (frames.n_cols - 1, dim, dim)
    try:
        layout = _whole(path, shape, dtype)
        if layout is not None:
            return layout
        path.parent.mkdir(parents=True, exist_ok=True)
        lock = open(path.with_suffix(".lock"), "w")  # noqa: SIM115 - the with below closes it
    except OSError as exc:  # e.g. PIPELINE_CACHE_DIR names a file: work without the cache
        log.warning("layout cache %s unusable (%s): frames read by each process", path, exc)
        return _read_layout(frames, dim, dtype, by_frame=by_frame)
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one builder per host; the others wait
        layout = _whole(path, shape, dtype)  # built while this process waited
        if layout is not None:
            return layout
        # The host's other workers wait on the lock: their cores read frames too.
        layout = _read_layout(frames, dim, dtype, _reader_threads(), by_frame)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        with open(tmp, "wb") as f:
            np.save(f, layout)
        digest_tmp = path.with_suffix(f".{os.getpid()}.xxh3.tmp")
        digest_tmp.write_text(xxhash.xxh3_64_hexdigest(layout))
        os.replace(digest_tmp, path.with_suffix(".xxh3"))  # first: a layout is never unsigned
        os.replace(tmp, path)
        return layout


def _whole(path: Path, shape: tuple[int, ...], dtype: str) -> np.ndarray | None:
    """The cached layout at ``path``, memory-mapped, if it is there and whole: its shape,
    type and digest as written (a damaged file gave wrong cubes, whose checksums then
    verified); a damaged one is removed, to be built again."""
    if not path.exists():
        return None
    digest = path.with_suffix(".xxh3")
    try:
        layout = np.load(path, mmap_mode="r")
        if (
            layout.shape == shape
            and layout.dtype == np.dtype(dtype)
            and digest.read_text() == xxhash.xxh3_64_hexdigest(layout)
        ):
            return layout
    except (OSError, ValueError):
        pass
    if digest.exists():  # (files of earlier versions have none: built again, unsaid)
        log.warning("layout cache file %s is damaged: built again from the frames", path)
    path.unlink(missing_ok=True)
    return None


def cached_layout(
    frames: FrameSet, dim: int, dtype: str, by_frame: bool = False
) -> np.ndarray | None:
    """:func:`load_layout`'s result if this host's cache holds it already, else None
    (never reading the frames)."""
    path = _layout_path(frames, dim, dtype, by_frame)
    if path is None or not path.exists():
        return None
    return load_layout(frames, dim, dtype, by_frame)


def _layout_path(frames: FrameSet, dim: int, dtype: str, by_frame: bool) -> Path | None:
    cache_dir = layout_cache_dir()
    if cache_dir is None:
        return None
    ident = repr((frames.url, frames.keys, frames.versions, frames.n_cols, dim, dtype))
    order = "-by-frame" if by_frame else ""
    return cache_dir / f"layout-{xxhash.xxh3_64_hexdigest(ident.encode())}{order}.npy"


def layout_cache_dir() -> Path | None:
    """``PIPELINE_CACHE_DIR`` (``off`` disables), default ``~/.cache/pipeline``."""
    from ...config import process_settings

    value = process_settings().cache_dir or ""
    if value.lower() in {"off", "none", "0"}:
        return None
    return Path(value or Path.home() / ".cache" / "pipeline") / "layouts"


#: Threads reading frames while a host's layout is built (its cores, up to this).
MAX_READER_THREADS = 8


def _reader_threads() -> int:
    return max(1, min(MAX_READER_THREADS, len(os.sched_getaffinity(0))))


def _read_layout(
    frames: FrameSet, dim: int, dtype: str, threads: int = 1, by_frame: bool = False
) -> np.ndarray:
    store = open_store(frames.url)
    # Read frame by frame into (frame, column, row), then transpose once: writing
    # each frame straight into the final layout is a cache-hostile strided scatter.
    layers = np.empty((dim, frames.n_cols - 1, dim), dtype=dtype)

    def read(f: int) -> None:
        with store.open_input(frames.keys[f]) as fh:
            pf = pq.ParquetFile(fh)
            groups, rows = [], 0
            while rows < dim:
                groups.append(len(groups))
                rows += pf.metadata.row_group(groups[-1]).num_rows
            names = data_columns(pf.schema_arrow)[1:]
            table = pf.read_row_groups(groups, columns=names, use_threads=False).slice(0, dim)
        layers[f] = np.column_stack([c.to_numpy() for c in table.columns]).T

    read(0)  # creates the store's client before threads share it
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(read, range(1, len(frames.keys))))
    return layers if by_frame else np.ascontiguousarray(layers.transpose(1, 2, 0))
