"""Shared fixtures: one real embedded Dask cluster per session, small frames."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytest_plugins = ["support.s3_server"]  # seaweedfs, s3, s3_bucket fixtures

# Workers inherit this: the tests' layout cache never touches the user's ~/.cache.
if "PIPELINE_CACHE_DIR" not in os.environ:
    _cache = tempfile.mkdtemp(prefix="pipeline-test-cache-")
    os.environ["PIPELINE_CACHE_DIR"] = _cache
    atexit.register(shutil.rmtree, _cache, ignore_errors=True)


@pytest.fixture(autouse=True)
def _no_env_leaks():
    """A test must not leave PIPELINE_*/AWS_* variables behind for the next one."""
    before = {k: v for k, v in os.environ.items() if k.startswith(("PIPELINE_", "AWS_"))}
    yield
    after = {k: v for k, v in os.environ.items() if k.startswith(("PIPELINE_", "AWS_"))}
    assert after == before, f"environment leaked: {set(after.items()) ^ set(before.items())}"


@pytest.fixture(scope="session")
def client():
    from pipeline import RunOptions, connect

    with connect(RunOptions(workers=2)) as c:
        yield c


@pytest.fixture(scope="session")
def frames_dir(tmp_path_factory) -> Path:
    """12 frames of 40 x 30: enough for cubes of dimension up to 12."""
    from pipeline.storage import LocalStore
    from pipeline.workloads.cubes.frames import write_frames

    path = tmp_path_factory.mktemp("frames")
    write_frames(LocalStore(path), "", count=12, rows=40, cols=30, seed=7)
    return path
