"""A store on a local (or network-mounted) directory."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import shutil
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import BinaryIO

import numpy as np

from ..errors import StorageError
from .base import Buffer, Store

#: Chunks at least this large, page-aligned in memory and in the file, bypass the
#: page cache: on a machine with few cores, copying them through it costs more CPU
#: than building them, and the disk takes them 2-4x faster.
DIRECT_MIN_BYTES = 8 << 20
_PAGE = 4096
_O_DIRECT = getattr(os, "O_DIRECT", 0)
#: A write in progress is ``.<name>.<random>.tmp`` beside its target.
_TEMPORARY_SUFFIX = ".tmp"


def _is_temporary(name: str) -> bool:
    return name.startswith(".") and name.endswith(_TEMPORARY_SUFFIX)


def _write_chunk(f: BinaryIO, chunk: Buffer) -> int:
    view = memoryview(chunk).cast("B")
    start = f.tell()
    bulk = view.nbytes - view.nbytes % _PAGE
    if (
        _O_DIRECT
        and bulk >= DIRECT_MIN_BYTES
        and start % _PAGE == 0
        and np.frombuffer(view, np.uint8).ctypes.data % _PAGE == 0
    ):
        f.flush()
        try:
            _pwrite_direct(f.name, view[:bulk], start)
        except OSError as exc:
            if exc.errno != errno.EINVAL:
                raise
            # A file system without direct I/O (tmpfs, some network mounts).
        else:
            f.seek(start + bulk)
            return bulk + f.write(view[bulk:])
    return f.write(view)


def _pwrite_direct(path: str, view: memoryview, offset: int) -> None:
    fd = os.open(path, os.O_WRONLY | _O_DIRECT)
    try:
        done = 0
        while done < view.nbytes:
            done += os.pwrite(fd, view[done:], offset + done)
    finally:
        os.close(fd)


def file_version(path: str | os.PathLike) -> str:
    """A local file's :meth:`Store.version`: its size and modification time."""
    st = os.stat(path)
    return f"{st.st_size}-{st.st_mtime_ns}"


class LocalStore(Store):
    remote = False

    @classmethod
    def from_url(cls, url: str) -> LocalStore:
        return cls(url.removeprefix("file://"))

    def __init__(self, root: str | os.PathLike):
        # normpath: `../out` from a subfolder is the same folder, and messages say so
        self.root = Path(os.path.normpath(Path(root).expanduser().absolute()))
        self.url = str(self.root)

    def preflight(self) -> None:
        # A file at the nearest existing ancestor (an output given as a file's name,
        # or under one) fails every write with a bare "Not a directory".
        at = self._existing_ancestor()
        if at.exists() and not at.is_dir():
            raise StorageError(f"output {self.root}: {at} is a file, expected a folder")
        super().preflight()

    def free_bytes(self) -> int:
        return shutil.disk_usage(self._existing_ancestor()).free

    def _existing_ancestor(self) -> Path:
        """The root, or its nearest ancestor that exists (the root is made on write)."""
        at = self.root
        while not at.exists() and at != at.parent:
            at = at.parent
        return at

    def path(self, key: str) -> Path:
        return Path(self._path_text(key))

    def _path_text(self, key: str) -> str:
        # Text, not Path: a dataset of tens of thousands of small files stats and reads
        # each, and pathlib's parsing would be a good part of discovering it.
        if ".." in key.replace("\\", "/").split("/"):
            raise StorageError(f"key {key!r} must not contain '..'")
        return os.path.join(self.url, key) if key else self.url

    def write(self, key: str, chunks: Iterable[Buffer]) -> int:
        target = self.path(key)
        # A unique temporary name beside the target, then rename: readers never see
        # half an object, and two attempts of one task cannot interleave their bytes.
        tmp = target.with_name(f".{target.name}.{uuid.uuid4().hex[:12]}{_TEMPORARY_SUFFIX}")
        size = 0
        try:
            with self._create(tmp) as f:
                for chunk in chunks:
                    size += _write_chunk(f, chunk)
            os.replace(tmp, target)
        except OSError as exc:
            with contextlib.suppress(OSError):  # (a file where a folder is: NotADirectoryError)
                tmp.unlink()
            raise StorageError(f"cannot write {target}: {exc.strerror or exc}") from exc
        return size

    def create_once(self, key: str, data: Buffer) -> bool:
        # Written whole beside the target, then linked to its name: link(2) fails
        # where the name exists, so of racing writers one makes it, and a reader sees
        # the whole object or none.
        target = self.path(key)
        tmp = target.with_name(f".{target.name}.{uuid.uuid4().hex[:12]}{_TEMPORARY_SUFFIX}")
        try:
            with self._create(tmp) as f:
                _write_chunk(f, data)
            os.link(tmp, target)
        except FileExistsError:
            if target.is_file():
                return False
            raise StorageError(f"cannot write {target}: a folder is there") from None
        except OSError as exc:
            raise StorageError(f"cannot write {target}: {exc.strerror or exc}") from exc
        finally:
            with contextlib.suppress(OSError):
                tmp.unlink()
        return True

    @staticmethod
    def _create(path: Path) -> BinaryIO:
        retries = 2
        while True:
            path.parent.mkdir(parents=True, exist_ok=True)
            try:
                return open(path, "xb")
            except FileNotFoundError:
                # Another writer's delete_prefix removed the folder it emptied between
                # our mkdir and open: make it again.
                if not retries:
                    raise
                retries -= 1

    def read_bytes(self, key: str) -> bytes:
        with open(self._path_text(key), "rb") as f:
            return f.read()

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

    @contextlib.contextmanager
    def hold(self, key: str, owner: str) -> Iterator[None]:
        # flock: the kernel lets go when the holder's process ends, however it ends.
        # The file stays: removing it would let a third process lock a new file
        # while a second still waits on the old one.
        path = self.path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.pread(fd, 4096, 0).decode(errors="replace").strip()
                raise BlockingIOError(errno.EAGAIN, holder or "another process") from None
            os.ftruncate(fd, 0)
            os.pwrite(fd, owner.encode(), 0)
            yield
        finally:
            os.close(fd)

    def size(self, key: str) -> int:
        return self.path(key).stat().st_size

    def version(self, key: str) -> str:
        return file_version(self._path_text(key))

    def list(self, prefix: str = "") -> list[str]:
        base = self.path(prefix) if prefix else self.root
        if base.is_file():
            return [prefix]
        if not base.is_dir():
            return []
        keys = []
        for dirpath, _dirs, files in os.walk(base):
            folder = os.path.relpath(dirpath, self.root).replace(os.sep, "/")
            folder = "" if folder == "." else folder + "/"
            keys += [folder + name for name in files if not _is_temporary(name)]
        return sorted(keys)

    def discard_incomplete(self, prefix: str) -> int:
        base = self.path(prefix) if prefix else self.root
        removed = 0
        for dirpath, _dirs, files in os.walk(base):
            for name in files:
                if _is_temporary(name):
                    Path(dirpath, name).unlink(missing_ok=True)
                    removed += 1
        return removed

    def delete_prefix(self, prefix: str) -> int:
        target = self.path(prefix) if prefix else self.root
        if target.is_file():
            target.unlink()
            return 1
        if not target.is_dir():
            return 0
        count = sum(len(files) for _d, _s, files in os.walk(target))
        shutil.rmtree(target)
        # Folders are not objects: leave no empty ones behind, as an object store would.
        for parent in target.parents:
            if parent == self.root or not parent.is_relative_to(self.root):
                break
            try:
                parent.rmdir()
            except OSError:
                break
        return count
