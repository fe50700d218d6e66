"""The contract every store keeps, as a test class a store's tests subclass.

A store's test module defines a ``store`` fixture giving an empty store and
subclasses :class:`StoreContract`: the local and S3 stores do (tests/test_storage.py),
and so does a store a package adds for a scheme of its own::

    class TestMyStore(StoreContract):
        @pytest.fixture
        def store(self):
            return MyStore("my://bucket/prefix")
"""

from __future__ import annotations

import io
import pickle

import numpy as np
import pyarrow as pa
import pytest

from pipeline.storage import (
    is_remote,
    open_store,
    read_parquet_file,
    read_parquet_tables,
    scheme_of,
    store_class,
    write_parquet,
)

MiB = 1024 * 1024


class StoreContract:
    """What the runner, verify and the workloads rely on of a store."""

    def test_round_trip(self, store):
        assert store.write("a/x.bin", [b"abc", bytearray(b"de"), memoryview(b"fgh")]) == 8
        assert store.read_bytes("a/x.bin") == b"abcdefgh"
        assert store.write_bytes("empty", b"") == 0
        assert store.read_bytes("empty") == b""
        # a slice of a bytes object is written as the slice
        assert store.write("slice", [memoryview(b"0123456789")[2:5]]) == 3
        assert store.read_bytes("slice") == b"234"

    def test_overwrite_replaces(self, store):
        store.write_bytes("k", b"first version, long")
        store.write_bytes("k", b"second")
        assert store.read_bytes("k") == b"second"
        assert store.size("k") == 6

    def test_failed_write_leaves_old_object_and_no_temp(self, store):
        store.write_bytes("d/k", b"old")

        def chunks():
            yield b"new data "
            raise RuntimeError("producer failed")

        with pytest.raises(RuntimeError, match="producer failed"):
            store.write("d/k", chunks())
        with pytest.raises(RuntimeError):
            store.write("d/other", chunks())
        assert store.read_bytes("d/k") == b"old"
        assert store.list() == ["d/k"]
        assert not store.exists("d/other")

    def test_list_sorted_and_prefix_scoped(self, store):
        for key in ["a/b1/y/z", "a/b10/w", "a/b1/x", "a/b1.txt", "z", "a/c"]:
            store.write_bytes(key, key.encode())
        assert store.list() == ["a/b1.txt", "a/b1/x", "a/b1/y/z", "a/b10/w", "a/c", "z"]
        assert store.list("a/b1") == ["a/b1/x", "a/b1/y/z"]
        assert store.list("a/b1/") == ["a/b1/x", "a/b1/y/z"]
        assert store.list("a/b1/x") == ["a/b1/x"]  # a prefix naming an object
        assert store.list("a") == ["a/b1.txt", "a/b1/x", "a/b1/y/z", "a/b10/w", "a/c"]
        assert store.list("nothing") == []

    def test_delete_prefix_counts(self, store):
        for key in ["p/1", "p/2", "p/sub/3", "p10/4", "q"]:
            store.write_bytes(key, b"x")
        assert store.delete_prefix("p") == 3
        assert store.list() == ["p10/4", "q"]
        assert store.delete_prefix("p") == 0
        assert store.delete_prefix("missing") == 0
        assert store.delete_prefix("q") == 1
        assert store.list() == ["p10/4"]

    def test_exists_and_size(self, store):
        assert not store.exists("s/k")
        store.write_bytes("s/k", b"12345")
        assert store.exists("s/k")
        assert store.size("s/k") == 5
        assert not store.exists("s")  # a "directory" is not an object
        with pytest.raises(FileNotFoundError):
            store.size("s/missing")

    def test_open_input_seek_read(self, store):
        data = bytes(range(256)) * 1000
        store.write_bytes("f.bin", data)
        with store.open_input("f.bin") as f:
            assert f.seekable() and f.readable()
            assert f.read(10) == data[:10]
            assert f.seek(100) == 100
            assert f.read(5) == data[100:105]
            assert f.tell() == 105
            f.seek(-7, io.SEEK_END)
            assert f.read() == data[-7:]
            assert f.read(3) == b""
            f.seek(200_000)
            assert f.read(1000) == data[200_000:201_000]
            f.seek(10, io.SEEK_CUR)
            assert f.read(5) == data[201_010:201_015]
            buf = bytearray(20)
            f.seek(3)
            assert f.readinto(buf) == 20 and bytes(buf) == data[3:23]
            f.seek(0)
            assert f.read() == data

    def test_read_missing_is_file_not_found(self, store):
        with pytest.raises(FileNotFoundError) as info:
            store.read_bytes("no/such/key")
        assert store.describe("no/such/key") in str(info.value)  # the path or s3:// URL
        with pytest.raises(FileNotFoundError):
            store.open_input("no/such/key")

    def test_multipart_payload_round_trip(self, store):
        arr = np.random.default_rng(0).integers(0, 2**62, size=5 * MiB, dtype=np.int64)
        assert arr.nbytes == 40 * MiB
        header = b"\x93NUMPY-ish header\n"
        size = store.write("shards/0.npy", [header, memoryview(arr)])
        assert size == len(header) + arr.nbytes
        assert store.size("shards/0.npy") == size
        back = store.read_bytes("shards/0.npy")
        assert back[: len(header)] == header
        assert np.array_equal(np.frombuffer(back, dtype=np.int64, offset=len(header)), arr)
        # a 2-D array's buffer is written in C order, without the caller flattening it
        grid = arr[: 3 * MiB].reshape(3 * 1024, 1024)
        assert store.write("shards/1.npy", [grid]) == grid.nbytes
        assert store.read_bytes("shards/1.npy") == grid.tobytes()

    def test_pickled_store_still_works(self, store):
        store.write_bytes("before", b"1")
        copy = pickle.loads(pickle.dumps(store))
        assert copy.url == store.url
        copy.write_bytes("after", b"2")
        assert copy.list() == ["after", "before"]
        assert store.read_bytes("after") == b"2"

    def test_parquet_through_open_input(self, store):
        table = pa.table({"a": np.arange(1000), "b": [f"s{i}" for i in range(1000)]})
        write_parquet(store, "t.parquet", table)
        pf = read_parquet_file(store, "t.parquet")
        assert pf.metadata.num_rows == 1000
        assert pf.read(columns=["b"]).column("b").to_pylist() == table.column("b").to_pylist()

    def test_many_parquet_objects_read_in_order(self, store):
        # A job's end reads every task's manifest entry: in threads from S3, in key order.
        keys = [f"parts/part-{i:03d}.parquet" for i in range(40)]
        for i, key in enumerate(keys):
            write_parquet(store, key, pa.table({"i": [i], "s": [f"t{i}"]}))
        tables = read_parquet_tables(store, keys[::-1], columns=["i"])
        assert [t.column_names for t in tables[:1]] == [["i"]]
        assert [t.column("i")[0].as_py() for t in tables] == list(range(39, -1, -1))
        with pytest.raises(FileNotFoundError):
            read_parquet_tables(store, [keys[0], "parts/missing.parquet"])

    def test_preflight_passes(self, store):
        store.preflight()
        assert store.list() == []

    def test_listed_versions_begin_with_any_text_in_key_order(self, store):
        for key in ["logs/2024-01-02", "logs/2024-01-01", "logs/2024-02-01", "logs.txt", "z"]:
            store.write_bytes(key, key.encode())
        listed = store.listed_versions("logs/2024-01-")
        assert [k for k, _ in listed] == ["logs/2024-01-01", "logs/2024-01-02"]
        assert [v for _, v in listed] == [store.version(k) for k, _ in listed]
        assert [k for k, _ in store.listed_versions("logs/", limit=2)] == [
            "logs/2024-01-01",
            "logs/2024-01-02",
        ]
        assert {k for k, _ in store.listed_versions("logs")} == {
            "logs.txt",
            "logs/2024-01-01",
            "logs/2024-01-02",
            "logs/2024-02-01",
        }  # (SeaweedFS lists logs/ before logs.txt, S3 after: byte order)
        assert len(store.listed_versions()) == 5
        assert store.listed_versions("nothing") == []

    def test_a_version_changes_with_the_object_and_starts_with_its_size(self, store):
        store.write_bytes("v", b"12345")
        first = store.version("v")
        store.write_bytes("v", b"1234567")
        assert store.version("v") != first
        assert store.version("v").startswith("7")

    def test_its_scheme_opens_it_again_and_says_where_it_lives(self, store):
        cls = store_class(scheme_of(store.url))
        assert isinstance(store, cls)
        assert is_remote(store.url) == store.remote
        store.write_bytes("k", b"x")
        assert open_store(store.url).read_bytes("k") == b"x"
