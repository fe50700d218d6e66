"""A store a package could add for a scheme of its own, ``memory://NAME``: objects in
this process's memory. The test package's entry point registers it
(``[pipeline.stores] memory = memory_store:MemoryStore``), and tests/test_storage.py
runs the store contract on it as on the built-in stores."""

from __future__ import annotations

import contextlib
import io
import threading
from collections.abc import Iterable, Iterator

from pipeline.storage import Store

#: Every memory store's objects, by the store's URL: stores of one URL share them.
_OBJECTS: dict[str, dict[str, bytes]] = {}
_HELD: dict[tuple[str, str], str] = {}
_LOCK = threading.Lock()


class MemoryStore(Store):
    remote = True

    def __init__(self, url: str):
        self.url = url.rstrip("/")
        self._objects = _OBJECTS.setdefault(self.url, {})

    def __reduce__(self):
        return (type(self), (self.url,))

    def write(self, key: str, chunks: Iterable) -> int:
        data = b"".join(bytes(memoryview(c).cast("B")) for c in chunks)  # all, or nothing
        self._objects[key] = data
        return len(data)

    def read_bytes(self, key: str) -> bytes:
        try:
            return self._objects[key]
        except KeyError:
            raise FileNotFoundError(f"{self.describe(key)}: no such object") from None

    def open_input(self, key: str):
        return io.BytesIO(self.read_bytes(key))

    def exists(self, key: str) -> bool:
        return key in self._objects

    def list(self, prefix: str = "") -> list[str]:
        prefix = prefix.rstrip("/")
        return sorted(
            k for k in self._objects if not prefix or k == prefix or k.startswith(prefix + "/")
        )

    def delete_prefix(self, prefix: str) -> int:
        keys = self.list(prefix)
        for key in keys:
            del self._objects[key]
        return len(keys)

    @contextlib.contextmanager
    def hold(self, key: str, owner: str) -> Iterator[None]:
        with _LOCK:
            if (self.url, key) in _HELD:
                raise BlockingIOError(f"{self.describe(key)} is held by {_HELD[self.url, key]}")
            _HELD[self.url, key] = owner
        try:
            yield
        finally:
            with _LOCK:
                del _HELD[self.url, key]
