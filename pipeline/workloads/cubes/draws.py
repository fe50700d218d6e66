"""Cube columns drawn ahead of a device builder, off the consumer's thread.

A GPU gathers a cube in microseconds; drawing its columns (:func:`.workload.
cube_columns`, numpy's Philox keyed by (seed, cube id)) costs about 8.5 us a cube
on one core (117,000 cubes/s measured here), and 0.6 ms with columns per layer (d
draws of d). The draws therefore run in the background, a bounded number of
batches ahead, with the very function the CPU builders call, so the columns are
the same by construction:

- in one thread for a small job;
- in a few fresh interpreters for a job whose draws would take more than a few
  seconds of one core: a thread drawing 50,000 cubes/s would hold the GIL for
  40 % of the time, which the training loop's own Python needs. Started as new
  processes, never forked (the consumer may have initialized CUDA, which a forked
  child inherits broken), and not through multiprocessing's spawn, which runs the
  consumer's script again in each child: a training script without an
  ``if __name__ == "__main__":`` guard would start its loop there.
"""

from __future__ import annotations

import collections
import contextlib
import os
import pickle
import subprocess
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from ...errors import PipelineError
from .workload import cube_columns

__all__ = ["ColumnDraws", "draw_columns"]

#: One core's draw time of a cube's columns (8.5 us at d = 100, 6 us at d = 10), d times
#: that per layer; a job whose draws take more than PROCESS_SECONDS gets processes.
DRAW_SECONDS = 8e-6
PROCESS_SECONDS = 2.0
#: Processes for columns shared by the layers (together 200,000+ cubes/s), and at
#: most for columns per layer.
SHARED_PROCESSES = 2
MAX_PROCESSES = 8


def draw_columns(
    seed: int, ids: Sequence[int], dim: int, n_cols: int, per_layer: bool
) -> np.ndarray:
    """The columns of cubes ``ids`` as 0-based positions in the layout (column - 1):
    int64 (n, d), or (n, d, d) per layer."""
    shape = (len(ids), dim, dim) if per_layer else (len(ids), dim)
    out = np.empty(shape, dtype=np.int64)
    for i, cube_id in enumerate(ids):
        out[i] = cube_columns(seed, cube_id, dim, n_cols, per_layer)
    out -= 1
    return out


def draw_processes(per_layer: bool, cubes: int, dim: int) -> int:
    """Processes to draw a job's columns with: 0 (one thread) unless drawing them on
    one core would take more than :data:`PROCESS_SECONDS`."""
    if cubes * DRAW_SECONDS * (dim if per_layer else 1) < PROCESS_SECONDS:
        return 0
    cores = max(1, (os.cpu_count() or 2) - 1)
    return min(cores, MAX_PROCESSES if per_layer else SHARED_PROCESSES)


class _DrawProcess:
    """A fresh interpreter serving :func:`draw_columns` requests in order over pipes."""

    def __init__(self):
        # the folder that holds the package (pipeline/workloads/cubes/draws.py)
        root = str(Path(__file__).resolve().parents[3])
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, (root, env.get("PYTHONPATH"))))
        code = "from pipeline.workloads.cubes.draws import serve; serve()"
        self.proc = subprocess.Popen(
            [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env
        )
        self.asked = 0  # requests not answered yet

    def submit(self, *args) -> Callable[[], np.ndarray]:
        """Ask for a draw; call the result to get it (answers come in the order asked)."""
        try:
            pickle.dump(args, self.proc.stdin)
            self.proc.stdin.flush()
        except OSError:  # (a broken pipe: it has ended)
            raise self._ended() from None
        self.asked += 1
        return self._receive

    def _receive(self) -> np.ndarray:
        try:
            self.asked -= 1
            result = pickle.load(self.proc.stdout)
        except EOFError:
            raise self._ended() from None
        if isinstance(result, BaseException):
            raise result
        return result

    def _ended(self) -> PipelineError:
        return PipelineError(
            f"a process drawing cube columns (pid {self.proc.pid}) ended with status "
            f"{self.proc.wait()}"
        )

    def close(self) -> None:
        if self.asked:  # its answers would not be read: it would wait to write them
            self.proc.kill()
        with contextlib.suppress(BrokenPipeError):
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc.stdout.close()


def serve() -> None:
    """A draw process: answer pickled :func:`draw_columns` arguments on stdin with
    the columns (or the exception) on stdout, until stdin closes."""
    source, sink = sys.stdin.buffer, sys.stdout.buffer
    while True:
        try:
            args = pickle.load(source)
        except EOFError:
            return
        try:
            result = draw_columns(*args)
        except Exception as exc:
            result = exc
        pickle.dump(result, sink)
        sink.flush()


class ColumnDraws:
    """``(ids, columns)`` for each batch of ``batches`` in order, the draws of up to
    ``ahead`` batches running in the background (one thread, or ``processes``
    processes, batches dealt to them in turn). Close it (or exhaust it) to stop."""

    def __init__(
        self,
        seed: int,
        dim: int,
        n_cols: int,
        per_layer: bool,
        batches: Iterable[Sequence[int]],
        *,
        processes: int = 0,
        ahead: int = 2,
    ):
        self._args = (seed, dim, n_cols, per_layer)
        self._batches = iter(batches)
        self._thread = None
        self._procs = [_DrawProcess() for _ in range(processes)]
        if not processes:
            self._thread = ThreadPoolExecutor(1, thread_name_prefix="pipeline-cube-draws")
        self._submitted = 0
        self._pending: collections.deque = collections.deque()
        for _ in range(max(ahead, 2 * processes)):
            self._submit()

    def _submit(self) -> None:
        ids = next(self._batches, None)
        if ids is None:
            return
        seed, rest = self._args[0], self._args[1:]
        if self._thread is not None:
            result = self._thread.submit(draw_columns, seed, ids, *rest).result
        else:
            proc = self._procs[self._submitted % len(self._procs)]
            result = proc.submit(seed, list(ids), *rest)
        self._submitted += 1
        self._pending.append((ids, result))

    def __iter__(self) -> Iterator[tuple[Sequence[int], np.ndarray]]:
        return self

    def __next__(self) -> tuple[Sequence[int], np.ndarray]:
        if not self._pending:
            self.close()
            raise StopIteration
        ids, result = self._pending.popleft()
        columns = result()
        self._submit()
        return ids, columns

    @property
    def in_flight(self) -> int:
        """Batches submitted and not yet taken."""
        return len(self._pending)

    def close(self) -> None:
        self._pending.clear()
        if self._thread is not None:
            self._thread.shutdown(wait=True, cancel_futures=True)
        for proc in self._procs:
            proc.close()
        self._procs = []

    def __enter__(self) -> ColumnDraws:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
