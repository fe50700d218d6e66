"""``code = PATH`` on the workers: a ``.py`` file, a package or a folder of modules,
sent by a Dask worker plug-in that also reaches workers that join later."""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path

from distributed.diagnostics.plugin import WorkerPlugin

__all__ = ["ShippedCode", "forget_modules", "ship_code", "shipped_files", "top_level_modules"]


def ship_code(client, path: Path) -> None:
    """Send ``path`` to every worker, now and as they join (a Dask worker plug-in).

    Each version goes into a folder of its own, named by its content, which replaces
    the last version's on the workers' import path, and the modules the last version
    loaded are forgotten, so that results never come from the old code. (Dask's
    ``UploadDirectory`` writes a changed package over the old files while the workers
    keep the modules they imported, and puts a folder on the nanny's import path only,
    where the workers cannot import from it.)"""
    client.register_plugin(ShippedCode(path), name=f"pipeline-code-{path.name}")


class ShippedCode(WorkerPlugin):
    """Worker plug-in: ``code = PATH`` unpacked in a folder named by its content under
    the worker's local directory, on its import path (the unpacked folder itself for a
    folder of modules; the folder holding it for a package or a file)."""

    idempotent = False  # a new version replaces the old on workers that have it

    def __init__(self, path: Path):
        self.name = path.name
        # a folder of modules is imported from itself, a package or a file from its parent
        self.modules_folder = path.is_dir() and not (path / "__init__.py").is_file()
        self.modules = sorted(top_level_modules(path))
        self.archive = _zipped(path)
        # (of every file shipped, not only the .py ones the job's fingerprint hashes)
        self.digest = hashlib.sha256(self.archive).hexdigest()[:16]

    def setup(self, worker) -> None:
        import io
        import zipfile

        # (versions of one PATH replace each other; other PATHs' stay)
        root = Path(worker.local_directory) / "pipeline-code" / self.name
        home = root / self.digest
        if not home.is_dir():
            staging = root / f".{self.digest}.{os.getpid()}"
            with zipfile.ZipFile(io.BytesIO(self.archive)) as z:
                z.extractall(staging)
            try:
                staging.rename(home)
            except OSError:  # another process of this worker's host got there first
                import shutil

                shutil.rmtree(staging, ignore_errors=True)
        folder = str(home / self.name) if self.modules_folder else str(home)
        stale = [p for p in sys.path if p.startswith(str(root) + os.sep) and p != folder]
        if folder in sys.path and not stale:
            return  # this version is in place: its modules stay loaded (each run registers it)
        for p in stale:
            sys.path.remove(p)
        if folder not in sys.path:
            sys.path.insert(0, folder)
        forget_modules(self.modules, stale)


def top_level_modules(path: Path) -> set[str]:
    """The names ``code = PATH`` makes importable: a file's module, a package's name,
    or a folder's modules and packages."""
    if path.is_file():
        return {path.stem}
    if (path / "__init__.py").is_file():
        return {path.name}
    return {p.stem for p in path.glob("*.py")} | {
        p.name for p in path.iterdir() if p.is_dir() and (p / "__init__.py").is_file()
    }


def forget_modules(names: list[str], folders: list[str]) -> None:
    """Drop these modules (and their submodules), and any loaded from ``folders``, so
    that the next import reads the files now there."""
    import importlib

    for name, module in list(sys.modules.items()):
        top = name.partition(".")[0]
        where = getattr(module, "__file__", None) or ""
        if top in names or any(where.startswith(f + os.sep) for f in folders):
            del sys.modules[name]
    importlib.invalidate_caches()


def _zipped(path: Path) -> bytes:
    """``path`` (a file, or a folder without its caches and hidden files) as a zip whose
    names start with ``path``'s own name; the same bytes for the same files whatever
    their times (the digest names the version: a touched file is not a new one)."""
    import io
    import zipfile

    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as z:
        for f in shipped_files(path):
            parts = f.relative_to(path.parent).parts
            info = zipfile.ZipInfo("/".join(parts), date_time=(1980, 1, 1, 0, 0, 0))
            info.external_attr = (f.stat().st_mode & 0o777) << 16
            z.writestr(info, f.read_bytes(), zipfile.ZIP_DEFLATED)
    return buffer.getvalue()


def shipped_files(path: Path) -> list[Path]:
    """The files ``code = path`` ships, in path order: the file, or the folder's files
    without its caches and hidden files (hidden folders, a ``.venv``, not walked)."""
    if path.is_file():
        return [path]
    if path.name.startswith(".") or path.name == "__pycache__":
        return []
    files = []
    for folder, subfolders, names in os.walk(path):
        subfolders[:] = [d for d in subfolders if not d.startswith(".") and d != "__pycache__"]
        files += [
            Path(folder, n) for n in names if not n.startswith(".") and not n.endswith(".pyc")
        ]
    return sorted(files)


def add_import_paths(*folders: str | os.PathLike | None) -> None:
    """Put folders (the job file's, the current one) first on the import path, so
    that ``module:callable`` resolves on the driver and on spawned workers alike."""
    for folder in reversed([f for f in folders if f]):
        path = str(Path(folder).resolve())
        if path not in sys.path:
            sys.path.insert(0, path)
