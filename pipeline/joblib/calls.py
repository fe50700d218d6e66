"""A joblib batch as a task of the runner: what travels to the worker, what runs there,
and the outcome's way back.

A batch of joblib calls becomes a :class:`CallTask` (its calls pickled with
cloudpickle, so functions defined in ``__main__`` travel by value) of the
:class:`CallsWorkload`, which the runner submits like any workload's task
(:mod:`pipeline.dispatch`). On the worker the calls run in order, each under the
nested backend joblib asked for, and their outcome (the values, or the first
exception with its traceback as text) comes back as the task's receipt value: in the
receipt's event when small (:data:`INLINE_VALUE_BYTES`), else written to the
session's store for results and read back by the driver (:mod:`.values`).
"""

from __future__ import annotations

import pickle
import time
import traceback
import zlib
from dataclasses import dataclass
from typing import Any, ClassVar

import cloudpickle

from ..errors import ConfigError
from ..manifest import checksum
from ..storage import open_store
from ..workload import TableResults, Task, TaskOutput, Workload
from . import values
from .shared_args import resolve_items

__all__ = [
    "CallBatch",
    "CallTask",
    "CallsResults",
    "CallsWorkload",
    "RemoteTraceback",
    "describe_call",
    "pickle_batch",
]


#: What a pickle of a function defined in ``__main__`` holds, by value. Dask pickles
#: a task whose pickle holds it again with cloudpickle (pure Python, several times
#: slower) each time it sends it, the scheduler once per task it hands a worker.
_MAIN = b"__main__"


@dataclass(frozen=True)
class CallTask(Task):
    """Calls ``start`` to ``stop - 1`` of the session (its units): their pickle
    (``compressed`` where it names ``__main__``: see :meth:`inline`), or (``spilled``)
    the key of their pickle in ``spill_url``'s store (:mod:`.values`)."""

    payload: bytes = b""
    spilled: str | None = None
    spill_url: str | None = None
    compressed: bool = False

    @classmethod
    def inline(cls, index: int, start: int, stop: int, payload: bytes) -> CallTask:
        """The task carrying ``payload``; compressed where it names ``__main__``, which
        the compressed bytes do not, so Dask pickles the task with the standard pickler."""
        if _MAIN in payload:
            return cls(index, start, stop, payload=zlib.compress(payload, 1), compressed=True)
        return cls(index, start, stop, payload=payload)

    def batch(self) -> CallBatch:
        """Worker: the calls."""
        if self.spilled is None:
            payload = zlib.decompress(self.payload) if self.compressed else self.payload
            return cloudpickle.loads(payload)
        return pickle.loads(open_store(self.spill_url).read_bytes(self.spilled))


class CallBatch:
    """The calls of one batch, and the backend (with its ``n_jobs``) joblib gave for a
    ``Parallel`` nested inside them: the worker runs them in order, stopping at the
    first that raises, as joblib's own batches do."""

    def __init__(
        self,
        items: list,
        nested: tuple[Any, Any],
        *,
        spill_url: str | None = None,
        output_url: str | None = None,
        keys: list[str] | None = None,
    ):
        self.items = items
        self.nested = nested
        #: Where results too large for the receipt go (:mod:`.values`), or None.
        self.spill_url = spill_url
        #: The output each call's result is kept in, under its key (:mod:`.resume`).
        self.output_url = output_url
        self.keys = keys

    def run(self) -> list:
        from joblib import parallel_config

        backend, n_jobs = self.nested
        items = resolve_items(self.items)
        with parallel_config(backend=backend, n_jobs=n_jobs):
            return [func(*args, **kwargs) for func, args, kwargs in items]

    def run_kept(self) -> tuple[list, list]:
        """The calls, each kept one's result read back from the output instead of run,
        each other's run and kept (its object written before its result is returned;
        :mod:`.resume`). The values, and each call's (size, checksum)."""
        from joblib import parallel_config

        store = open_store(self.output_url)
        backend, n_jobs = self.nested
        values, meta = [], []
        with parallel_config(backend=backend, n_jobs=n_jobs):
            for (func, args, kwargs), key in zip(self.items, self.keys, strict=True):
                try:
                    data = store.read_bytes(key)
                    value = pickle.loads(data)
                except FileNotFoundError:
                    args, kwargs = _resolved(args, kwargs)
                    value = func(*args, **kwargs)
                    data = cloudpickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
                    store.write_bytes(key, data)
                values.append(value)
                meta.append((len(data), checksum(data)))
        return values, meta


def _resolved(args, kwargs) -> tuple[list, dict]:
    ((_, args, kwargs),) = resolve_items([(None, args, kwargs)])
    return args, kwargs


def describe_call(func) -> str:
    """``module:qualname`` of a joblib call's function (a partial's function)."""
    import functools

    while isinstance(func, functools.partial):
        func = func.func
    name = getattr(func, "__qualname__", None) or f"{type(func).__qualname__} object"
    return f"{getattr(func, '__module__', None) or type(func).__module__}:{name}"


def pickle_batch(batch: CallBatch) -> bytes:
    """The batch as bytes; a call that cannot be pickled is named (joblib's own error
    names only the pickler's complaint)."""
    try:
        return cloudpickle.dumps(batch)
    except Exception as exc:
        for func, args, kwargs in batch.items:
            try:
                cloudpickle.dumps((func, args, kwargs))
            except Exception:
                raise ConfigError(
                    f"joblib call of {describe_call(func)} cannot be sent to the cluster: "
                    f"it does not pickle ({type(exc).__name__}: {exc}); define the function "
                    "at a module's top level and pass picklable arguments"
                ) from exc
        raise ConfigError(
            f"a joblib batch cannot be sent to the cluster ({type(exc).__name__}: {exc})"
        ) from exc


class RemoteTraceback(Exception):
    """The traceback of an exception raised on a worker, as text: the ``__cause__`` of
    the exception re-raised in the driver (as ``concurrent.futures`` shows a process
    pool's)."""

    def __init__(self, text: str):
        super().__init__(text)
        self.text = text

    def __str__(self) -> str:
        return f'\n"""\n{self.text}"""'


class CallsResults(TableResults):
    """The kept results of a session's calls: tables, none of failures (its calls'
    errors are raised in the driver, never kept as data)."""

    failures_table = None


@dataclass
class CallsWorkload(Workload):
    """The joblib calls of one session: each task a batch of them. Generic: the calls
    carry their own code."""

    kind: ClassVar[str] = "joblib"
    settings_class: ClassVar[type] = dict
    job_id: str
    n_units: int = 1
    writes_output: ClassVar[bool] = False
    results: ClassVar[type[TableResults]] = CallsResults

    @classmethod
    def from_settings(cls, settings, job_id, options):  # pragma: no cover - not a job kind
        raise ConfigError("joblib calls are no job: run them through joblib.Parallel")

    def preflight(self) -> None:
        return None

    def fingerprint(self) -> dict[str, Any]:
        return {}

    def run_task(self, task: Task, store) -> TaskOutput:
        """Worker: the batch's calls; their values, or the first exception."""
        t0 = time.perf_counter()
        batch, outcome = _run_batch(task)
        seconds = time.perf_counter() - t0
        spill_url = batch.spill_url if batch is not None else None
        value = values.pack(outcome, spill_url, f"{self.job_id}/{task.index}")
        return TaskOutput(value=value, busy_seconds=seconds, phases={"compute": seconds})


def _run_batch(task: CallTask) -> tuple[CallBatch | None, tuple]:
    """The batch, and ("ok", values) or ("error", exception, traceback text)."""
    batch = None
    try:
        batch = task.batch()
        if batch.output_url is not None and batch.keys is not None:
            return batch, ("ok", *batch.run_kept())
        return batch, ("ok", batch.run())
    except BaseException as exc:  # (the call's, as joblib's batches report any)
        text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        return batch, ("error", exc, text)
