"""Shard files: the in-place buffer layout and the overlapped build-and-write loop."""

from __future__ import annotations

import io

import numpy as np
import pytest

from pipeline.errors import StorageError
from pipeline.storage import LocalStore
from pipeline.workloads.cubes.shards import read_shard, shard_buffer, write_shards


def _specs(keys, n=3, fail_at=None):
    for i, key in enumerate(keys):

        def fill(array, i=i):
            if i == fail_at:
                raise ValueError(f"shard {i} cannot be built")
            array[...] = np.arange(array.size).reshape(array.shape, order="F") + i
            return f"filled {i}"

        yield key, (4, 4, 4, n), "float64", fill


def test_shards_written_in_order_with_their_bytes(tmp_path):
    store = LocalStore(tmp_path)
    keys = [f"s/{i}.npy" for i in range(5)]
    results = list(write_shards(store, _specs(keys)))
    assert [r[0] for r in results] == keys
    assert [r[1] for r in results] == [f"filled {i}" for i in range(5)]
    assert all(r[3] is None and r[2] == store.size(k) for r, k in zip(results, keys, strict=True))
    for i, key in enumerate(keys):
        # Each shard has its own bytes, although two buffers were reused for five.
        cubes = read_shard(store.read_bytes(key))
        assert cubes.shape == (3, 4, 4, 4)
        expected = np.arange(4 * 4 * 4 * 3).reshape((4, 4, 4, 3), order="F") + i
        np.testing.assert_array_equal(np.moveaxis(cubes, 0, -1), expected)


def test_a_shard_that_cannot_be_built_is_reported_and_the_rest_written(tmp_path):
    store = LocalStore(tmp_path)
    keys = [f"s/{i}.npy" for i in range(4)]
    results = list(write_shards(store, _specs(keys, fail_at=1)))
    assert [r[0] for r in results] == keys
    assert isinstance(results[1][3], ValueError) and results[1][1] is None
    assert store.list("s") == ["s/0.npy", "s/2.npy", "s/3.npy"]
    # Shard 2 was built into the buffer shard 1 failed in: its own bytes, not a mix.
    expected = np.arange(4 * 4 * 4 * 3).reshape((4, 4, 4, 3), order="F") + 2
    np.testing.assert_array_equal(
        np.moveaxis(read_shard(store.read_bytes("s/2.npy")), 0, -1), expected
    )


def test_a_shard_that_cannot_be_written_is_reported_and_the_rest_written(tmp_path):
    store = LocalStore(tmp_path)
    (tmp_path / "s" / "1.npy").mkdir(parents=True)  # a folder where the object should go
    keys = [f"s/{i}.npy" for i in range(3)]
    results = list(write_shards(store, _specs(keys)))
    assert isinstance(results[1][3], StorageError) and "s/1.npy" in str(results[1][3])
    assert results[0][3] is None and results[2][3] is None
    assert store.exists("s/0.npy") and store.exists("s/2.npy")


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_buffer_is_the_npy_file(dtype):
    shard = shard_buffer((5, 6, 7, 2), dtype, slot=0)
    other = shard_buffer((5, 6, 7, 2), dtype, slot=1)
    assert shard is not other and shard is shard_buffer((5, 6, 7, 2), dtype, slot=0)
    shard.array[...] = np.random.default_rng(1).random((5, 6, 7, 2))
    loaded = np.load(io.BytesIO(bytes(shard.file)))
    assert loaded.dtype == np.dtype(dtype) and loaded.flags.f_contiguous
    np.testing.assert_array_equal(loaded, shard.array)
    assert np.frombuffer(shard.file, np.uint8).ctypes.data % 4096 == 0
