"""Cubes built on a device: the frames uploaded once, each batch one gather there.

The device gets the layout the CPU builder uses (:func:`.frames.load_layout`, in
the job's dtype, so float32 is the same cast values), and a batch of cubes is one
advanced-indexing kernel writing a contiguous ``(n, d, d, d)`` tensor, axes (cube,
frame, row, column): with ``T[c - 1, r, f]`` and the batch's column positions
``cols`` (n, d),

    batch[k, f, r, c] = T[cols[k, c], r, f]

(``T[cols[:, None, None, :], r[:, None], f[:, None, None]]`` with broadcast index
tensors, none of them materialized at the batch's size). Columns per layer use the
by-frame layout ``F[f, c - 1, r]`` and ``cols`` (n, d, d): ``F[f, cols[k, f, c], r]``.
A gather copies values, so the batch holds the CPU builder's bytes.

The read pattern: the d columns of a cube are d contiguous blocks of ``T`` (d x d
each, 8 MB together at d = 100 float64), which fit in a large GPU's L2 cache (50 MB
on an H200) while the cube is written, so each byte of them should be read from
memory about once a cube. The alternative ``gather="rows"`` (whole blocks by
``index_select``, then one transposition) reads and writes each cube twice;
``python -m benchmarks.bench_cubes --gpu`` times both (on the CPU, whose caches serve the
one-kernel gather's strided reads worse, ``rows`` is faster).

The columns are drawn on the host (:mod:`.draws`, ahead in the background) and go
to the device through a few page-locked index buffers, copied with
``non_blocking=True`` on the consumer's current stream, each reused only after
the copy out of it is done (an event). Everything runs on the consumer's stream,
in order with its own work, so no stream synchronization is needed.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Iterator, Sequence

import numpy as np
import torch

from ...errors import ConfigError
from .draws import ColumnDraws, draw_processes
from .workload import CubeWorkload

__all__ = ["DeviceCubes", "byte_size", "check_fits", "device_batches", "resolve_device"]

#: Batches the device must have room for beside the frames: one being gathered,
#: one the consumer holds, one it has not yet dropped.
BATCHES_IN_MEMORY = 3
#: Page-locked index buffers in turn: the host runs at most this many batches ahead
#: of the device.
INDEX_SLOTS = 4
GATHERS = ("index", "rows")


def resolve_device(device, where: str = "CubeStream") -> torch.device:
    """``device`` (a string or ``torch.device``) as a device cubes can be built on or
    copied to: the CPU or a CUDA GPU that this process can use."""
    if isinstance(device, torch.device):
        dev = device
    elif isinstance(device, str):
        try:
            dev = torch.device(device)
        except RuntimeError:
            raise ConfigError(
                f"{where}: device={device!r}; expected 'cuda', 'cuda:N' or 'cpu'"
            ) from None
    else:
        raise ConfigError(
            f"{where}: device={device!r}; expected 'cuda', 'cuda:N', 'cpu' or a torch.device"
        )
    if dev.type == "cpu":
        return torch.device("cpu")
    if dev.type != "cuda":
        raise ConfigError(f"{where}: device={device!r}; only 'cuda' and 'cpu' are supported")
    if not torch.cuda.is_available():
        raise ConfigError(
            f"{where}: device={device!r}, but CUDA is not available to this process "
            f"(torch {torch.__version__}, torch.cuda.is_available() is False): use "
            "device='cpu', or leave device unset for CPU tensors"
        )
    index = torch.cuda.current_device() if dev.index is None else dev.index
    if index >= torch.cuda.device_count():
        raise ConfigError(
            f"{where}: device={device!r}, but this process sees "
            f"{torch.cuda.device_count()} CUDA device(s)"
        )
    return torch.device("cuda", index)


def check_fits(
    frames_bytes: int, batches_bytes: int, free_bytes: int, device, total_bytes: int = 0
) -> None:
    """Refuse, naming every size, a job whose frames and batches would not fit in the
    device's free memory."""
    if frames_bytes + batches_bytes <= free_bytes:
        return
    total = f" (of {byte_size(total_bytes)})" if total_bytes else ""
    raise ConfigError(
        f"the job's frames take {byte_size(frames_bytes)} on {device} and "
        f"{BATCHES_IN_MEMORY} batches of cubes {byte_size(batches_bytes)}, but {device} has "
        f"{byte_size(free_bytes)} free{total}: use fewer or narrower frames, a smaller "
        "batch_size or dtype='float32', or build='cpu' (cubes built by the CPUs and "
        "copied to the device)"
    )


def byte_size(n: int) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


class DeviceCubes:
    """A job's frames on ``device``; :meth:`gather` builds batches of its cubes there."""

    def __init__(
        self, workload: CubeWorkload, device: torch.device, max_batch: int, gather="index"
    ):
        job = workload.job
        if gather not in GATHERS or (gather == "rows" and job.per_layer_columns):
            raise ConfigError(f"gather={gather!r}; expected one of {GATHERS} ('index' per layer)")
        self.d, self.device, self.per_layer, self.how = (
            job.dim,
            device,
            job.per_layer_columns,
            gather,
        )
        layout = workload._layout()
        if device.type == "cuda":
            free, total = torch.cuda.mem_get_info(device)
            batch_bytes = max_batch * job.dim**3 * layout.itemsize
            check_fits(layout.nbytes, BATCHES_IN_MEMORY * batch_bytes, free, device, total)
        self.frames = _upload(layout, device)
        d = self.d
        ar = torch.arange(d, device=device)
        self.f, self.r = ar.view(1, d, 1, 1), ar.view(1, 1, d, 1)
        self.slots: list[list] = []
        if device.type == "cuda":  # [page-locked index buffer, event of its last copy]
            width = d * d if self.per_layer else d
            self.slots = [
                [torch.empty((max_batch, width), dtype=torch.int64, pin_memory=True), None]
                for _ in range(INDEX_SLOTS)
            ]
        self.batches = 0
        self.streams: set = set()

    def gather(self, columns: np.ndarray) -> torch.Tensor:
        """Cubes with ``columns`` (0-based positions, as :func:`.draws.draw_columns`
        gives them) as one contiguous (n, d, d, d) tensor on the device."""
        n, d = len(columns), self.d
        if self.device.type == "cuda":
            self._used_on(torch.cuda.current_stream(self.device))
        idx = self._index(columns)
        if self.per_layer:  # F[f, c - 1, r]
            out = self.frames[self.f, idx.view(n, d, 1, d), self.r]
        elif self.how == "index":  # T[c - 1, r, f]
            out = self.frames[idx.view(n, 1, 1, d), self.r, self.f]
        else:
            rows = self.frames.view(-1, d * d).index_select(0, idx.view(-1))
            out = rows.view(n, d, d, d).permute(0, 3, 2, 1)
        return out if out.is_contiguous() else out.contiguous()

    def _used_on(self, stream) -> None:
        """The frames are read on ``stream`` (the consumer's, which may change): freed,
        their memory waits for its gathers (the allocator knows only the stream they
        were made on)."""
        if stream not in self.streams:
            self.streams.add(stream)
            for tensor in (self.frames, self.f):
                tensor.record_stream(stream)

    def _index(self, columns: np.ndarray) -> torch.Tensor:
        flat = columns.reshape(len(columns), -1)
        if not self.slots:
            return torch.from_numpy(flat)
        slot = self.slots[self.batches % len(self.slots)]
        self.batches += 1
        if slot[1] is not None:
            slot[1].synchronize()  # the copy out of this buffer is done
        host = slot[0][: len(flat)]
        host.numpy()[...] = flat
        idx = host.to(self.device, non_blocking=True)
        slot[1] = torch.cuda.Event()
        slot[1].record(torch.cuda.current_stream(self.device))
        return idx


def _upload(layout: np.ndarray, device: torch.device) -> torch.Tensor:
    """The layout as a tensor on ``device`` (on the CPU, its memory itself)."""
    with warnings.catch_warnings():
        # a read-only memory map of the host's layout cache: torch only reads it
        warnings.filterwarnings("ignore", "The given NumPy array is not writable")
        host = torch.from_numpy(layout)
        if device.type == "cpu":
            return host
        out = torch.empty(host.shape, dtype=host.dtype, device=device)
        step = max(1, (64 << 20) // max(1, host[0].nbytes))  # about 64 MB a copy
        for i in range(0, len(host), step):
            out[i : i + step].copy_(host[i : i + step])
        return out


def device_batches(
    workload: CubeWorkload,
    device: torch.device,
    batches: Iterable[Sequence[int]],
    max_batch: int,
    gather: str = "index",
) -> Iterator[tuple[Sequence[int], torch.Tensor]]:
    """``(ids, cubes)`` for each batch of cube ids, gathered on ``device``: ``cubes``
    a contiguous (n, d, d, d) tensor, ``cubes[i]`` cube ``ids[i]``."""
    job = workload.job
    cubes = DeviceCubes(workload, device, max_batch, gather)
    processes = draw_processes(job.per_layer_columns, workload.n_units, job.dim)
    args = (job.seed, job.dim, workload.frames.n_cols, job.per_layer_columns)
    with ColumnDraws(*args, batches, processes=processes) as draws:
        for ids, columns in draws:
            yield ids, cubes.gather(columns)
