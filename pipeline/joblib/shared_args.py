"""Large arguments shared by a ``Parallel`` call's calls, stored once.

Libraries pass the same large object to every call (scikit-learn passes ``X`` and ``y``
to each fold's fit): pickled into each batch, it would be written, held and read once
per batch. An argument of more than :data:`SHARED_BYTES` (by ``dask.sizeof``) is
written once per ``Parallel`` call to the session's spill store
(:mod:`.values`: the ``output``, or the embedded cluster's temporary folder) and the
batches carry its key; each worker process reads it once (the last few are kept) and
the driver removes them when the call ends. Where there is no spill store (a remote
cluster without ``output``), arguments stay inside the batches.
"""

from __future__ import annotations

import collections
import itertools
import pickle
import threading

import cloudpickle

from ..storage import open_store

__all__ = ["SHARED_BYTES", "SharedArgs", "StoredArg", "resolve_items"]

#: Size from which an argument is stored once rather than pickled into each batch.
SHARED_BYTES = 1024 * 1024
#: Stored arguments a worker process keeps unpickled, the latest.
KEPT_PER_WORKER = 4

_LOADED: collections.OrderedDict = collections.OrderedDict()
_LOADED_LOCK = threading.Lock()


class StoredArg:
    """What a batch carries in place of a large argument: where it is stored."""

    __slots__ = ("key", "url")

    def __init__(self, url: str, key: str):
        self.url, self.key = url, key

    def __reduce__(self):
        return (StoredArg, (self.url, self.key))

    def load(self):
        """Worker: the argument (read once per process while among the latest)."""
        with _LOADED_LOCK:
            if self.key in _LOADED:
                _LOADED.move_to_end(self.key)
                return _LOADED[self.key]
        value = pickle.loads(open_store(self.url).read_bytes(self.key))
        with _LOADED_LOCK:
            _LOADED[self.key] = value
            while len(_LOADED) > KEPT_PER_WORKER:
                _LOADED.popitem(last=False)
        return value


def resolve_items(items: list) -> list:
    """Worker: the calls with their stored arguments read back."""

    def load(value):
        return value.load() if isinstance(value, StoredArg) else value

    return [
        (func, [load(a) for a in args], {k: load(v) for k, v in kwargs.items()})
        for func, args, kwargs in items
    ]


class SharedArgs:
    """Driver: a ``Parallel`` call's large arguments, each stored once under ``prefix``
    of the store at ``url``; :meth:`clear` removes them."""

    def __init__(self, url: str, prefix: str):
        self.url, self.prefix = url, prefix
        #: id of the object -> (the object, held so its id is not reused; its StoredArg)
        self._stored: dict[int, tuple[object, StoredArg]] = {}
        self._numbers = itertools.count()
        self._lock = threading.Lock()

    def replace(self, items: list) -> list:
        """The calls, their large arguments replaced by their stored keys."""
        return [
            (func, [self._arg(a) for a in args], {k: self._arg(v) for k, v in kwargs.items()})
            for func, args, kwargs in items
        ]

    def clear(self) -> None:
        with self._lock:
            stored, self._stored = self._stored, {}
        if stored:
            open_store(self.url).delete_prefix(self.prefix)

    def _arg(self, value):
        if value is None or isinstance(value, (bool, int, float, str)):
            return value
        with self._lock:
            found = self._stored.get(id(value))
            if found is not None and found[0] is value:
                return found[1]
        from dask.sizeof import sizeof

        try:
            large = sizeof(value) > SHARED_BYTES
        except Exception:
            large = False
        if not large:
            return value
        key = f"{self.prefix}/arg-{next(self._numbers)}.pkl"
        open_store(self.url).write_bytes(key, cloudpickle.dumps(value, protocol=5))
        stored = StoredArg(self.url, key)
        with self._lock:
            self._stored[id(value)] = (value, stored)
        return stored
