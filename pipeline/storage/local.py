"""A store on a local (or network-mounted) directory."""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import BinaryIO

from ..errors import StorageError
from .base import Buffer, Store


class LocalStore(Store):
    def __init__(self, root: str | os.PathLike):
        self.root = Path(root).expanduser().absolute()
        self.url = str(self.root)

    def path(self, key: str) -> Path:
        if ".." in Path(key).parts:
            raise StorageError(f"key {key!r} must not contain '..'")
        return self.root / key

    def write(self, key: str, chunks: Iterable[Buffer]) -> int:
        target = self.path(key)
        # A unique temporary name beside the target, then rename: readers never see
        # half an object, and two attempts of one task cannot interleave their bytes.
        tmp = target.with_name(f".{target.name}.{uuid.uuid4().hex[:12]}.tmp")
        size = 0
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            with open(tmp, "wb") as f:
                for chunk in chunks:
                    size += f.write(chunk)
            os.replace(tmp, target)
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            raise StorageError(f"cannot write {target}: {exc.strerror or exc}") from exc
        return size

    def read_bytes(self, key: str) -> bytes:
        return self.path(key).read_bytes()

    def open_input(self, key: str) -> BinaryIO:
        import pyarrow as pa

        # A native file: pyarrow reads it without a round trip through Python per read.
        try:
            return pa.OSFile(str(self.path(key)), "rb")
        except FileNotFoundError:
            raise
        except OSError as exc:
            if not self.path(key).exists():
                raise FileNotFoundError(f"{self.path(key)}: no such file") from exc
            raise

    def exists(self, key: str) -> bool:
        return self.path(key).is_file()

    def size(self, key: str) -> int:
        return self.path(key).stat().st_size

    def version(self, key: str) -> str:
        st = self.path(key).stat()
        return f"{st.st_size}-{st.st_mtime_ns}"

    def list(self, prefix: str = "") -> list[str]:
        base = self.path(prefix) if prefix else self.root
        if base.is_file():
            return [prefix]
        if not base.is_dir():
            return []
        keys = []
        for dirpath, _dirs, files in os.walk(base):
            for name in files:
                if name.startswith(".") and name.endswith(".tmp"):
                    continue
                keys.append(Path(dirpath, name).relative_to(self.root).as_posix())
        return sorted(keys)

    def delete_prefix(self, prefix: str) -> int:
        target = self.path(prefix) if prefix else self.root
        if target.is_file():
            target.unlink()
            return 1
        if not target.is_dir():
            return 0
        count = sum(len(files) for _d, _s, files in os.walk(target))
        shutil.rmtree(target)
        return count
