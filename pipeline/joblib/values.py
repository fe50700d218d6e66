"""A batch's outcome on its way back to the driver: inside its receipt when small, else
through a store, never fetched from the worker that made it (a worker under load, or
gone, does not answer: the "Couldn't gather keys" loop of joblib's Dask backend).

Results too large for a receipt go to the session's *spill* store: the ``output`` of
``parallel_config(backend="pipeline", output=...)`` when given (under
``<output>/.joblib-spill/``), else, on the embedded cluster, a temporary folder on this
machine (the workers are processes of this machine), removed when the session ends.
A remote cluster without ``output`` has no place both ends reach: a result too large
fails its call, with a message saying so and which setting to give.
"""

from __future__ import annotations

import pickle

import cloudpickle

from ..storage import open_store

__all__ = ["INLINE_VALUE_BYTES", "SPILL_FOLDER", "pack", "unpack"]

#: Pickled bytes a batch's outcome may carry inside its receipt. Receipts travel through
#: the scheduler, which keeps a topic's last 1,000 events
#: (``distributed.admin.low-level-log-length``): at most this much each.
INLINE_VALUE_BYTES = 64 * 1024
#: Pickled bytes of a batch's calls (their arguments) a task may carry inside it: the
#: scheduler holds each queued task; beyond, they go through the spill store.
INLINE_ARGS_BYTES = 1024 * 1024
#: The folder of an output that holds results on their way back.
SPILL_FOLDER = ".joblib-spill"

_INLINE, _STORED = b"i", b"s"


def pack(outcome: tuple, spill_url: str | None, name: str) -> bytes:
    """Worker: ``outcome`` as the receipt's value: its pickle, or where it was stored."""
    try:
        data = cloudpickle.dumps(outcome, protocol=pickle.HIGHEST_PROTOCOL)
        if outcome[0] == "error":
            # An exception whose __init__ takes other arguments than its args (one that
            # calls super().__init__(message) alone) pickles, then fails as the driver
            # loads it, with a TypeError that hid the call's own error and traceback
            pickle.loads(data)
    except Exception as exc:
        data = cloudpickle.dumps(_unpicklable(outcome, exc))
    if len(data) <= INLINE_VALUE_BYTES:
        return _INLINE + data
    if spill_url is None:
        error = ValueError(
            f"this batch's results are {len(data) / 2**20:.1f} MiB pickled, beyond the "
            f"{INLINE_VALUE_BYTES >> 10} KiB a result may carry back through the scheduler, "
            "and the cluster is remote with no place to put them: give "
            "parallel_config(backend='pipeline', output='s3://bucket/prefix') (or a folder "
            "the workers and this program share)"
        )
        return _INLINE + cloudpickle.dumps(("error", error, str(error)))
    key = f"{SPILL_FOLDER}/{name}.pkl"
    open_store(spill_url).write_bytes(key, data)
    return _STORED + key.encode()


def unpack(value: bytes, spill_url: str | None) -> tuple:
    """Driver: the outcome a receipt's value carries (read back, and removed, from the
    spill store when it went there)."""
    kind, body = value[:1], value[1:]
    if kind == _INLINE:
        return pickle.loads(body)
    store = open_store(spill_url)
    key = body.decode()
    data = store.read_bytes(key)
    store.delete_prefix(key)
    return pickle.loads(data)


def _unpicklable(outcome: tuple, exc: BaseException) -> tuple:
    """An outcome that does not pickle, as an error that does."""
    if outcome[0] == "error":
        original = outcome[1]
        error = RuntimeError(
            f"{type(original).__name__}: {original} (raised on the worker; the exception "
            f"itself does not pickle and load back: {type(exc).__name__}: {exc})"
        )
        return ("error", error, outcome[2])
    error = TypeError(f"a joblib call's result cannot be sent back: it does not pickle ({exc})")
    return ("error", error, str(error))
