"""Store conformance (LocalStore and S3Store on SeaweedFS) and S3Store's own behaviour."""

from __future__ import annotations

import errno
import io
import pickle
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

# Helper modules beside the tests (on sys.path by pyproject.toml's pytest `pythonpath`;
# tests/conftest.py loads s3_server's fixtures: seaweedfs, s3, s3_bucket).
from support.fault_proxy import FaultProxy
from support.s3_server import (
    BUCKET,
    DUMMY_ACCESS_KEY_ID,
    DUMMY_SECRET,
    NOBODY,
    READER,
    clear_store_cache,
    isolate_aws_env,
)
from support.store_contract import StoreContract

import pipeline
from pipeline.errors import ConfigError, StorageError
from pipeline.storage import (
    LocalStore,
    is_remote,
    open_store,
    read_parquet_file,
    write_parquet,
)
from pipeline.storage.s3 import S3PermissionError, S3Store

pytestmark = pytest.mark.timeout(60)
integration = pytest.mark.integration

MiB = 1024 * 1024


class TestLocalStore(StoreContract):
    @pytest.fixture
    def store(self, tmp_path):
        return LocalStore(tmp_path / "store")


@integration
class TestS3Store(StoreContract):
    @pytest.fixture
    def store(self, s3_bucket):
        return S3Store(s3_bucket)


class TestMemoryStore(StoreContract):
    """A store a package adds for a scheme of its own (tests/support/memory_store.py, by the
    test package's entry point) keeps the same contract."""

    @pytest.fixture
    def store(self, request):
        url = f"memory://{request.node.name}"
        yield open_store(url)
        open_store(url).delete_prefix("")


def test_a_scheme_a_package_adds_is_found_by_its_entry_point():
    from support.memory_store import MemoryStore

    store = open_store("memory://added")
    assert type(store) is MemoryStore and store.remote and is_remote("memory://x")
    assert not is_remote("relative/folder") and not is_remote("file:///tmp/x")
    with pytest.raises(ConfigError) as info:
        open_store("broken://x")
    message = str(info.value)
    for part in ("broken://", "memory_store_missing:NoSuchStore", "pipeline-test-workloads"):
        assert part in message
    assert "install" in message
    with pytest.raises(ConfigError) as info:
        open_store("gs://b/x")
    assert "memory://" in str(info.value) and "s3://" in str(info.value)
    assert "'pipeline.stores'" in str(info.value)


def _all_messages(exc: BaseException) -> str:
    """Everything a user could see of ``exc``: str, repr and the chained traceback."""
    return "\n".join([str(exc), repr(exc), *traceback.format_exception(exc)])


def _assert_no_credentials(text: str) -> None:
    assert DUMMY_ACCESS_KEY_ID not in text
    assert DUMMY_SECRET not in text


# --------------------------------------------------------------------------- conformance


def test_a_url_missing_a_slash_is_refused_not_made_a_local_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match=r"'s3:/b/x' reads as a URL missing a '/' \(did you "
                       r"mean 's3://b/x'\?\)"):  # fmt: skip
        open_store("s3:/b/x")
    with pytest.raises(ConfigError, match="unsupported scheme 'gs'"):
        open_store("gs://b/x")
    assert not list(tmp_path.iterdir())
    open_store("./s3:/b/x").write_bytes("k", b"1")  # a local folder so named, said so
    assert (tmp_path / "s3:" / "b" / "x" / "k").read_bytes() == b"1"
    assert open_store("C:/data").root.name == "data"  # a drive letter is no URL


def test_a_relative_path_is_opened_in_the_working_folder_of_each_call(tmp_path, monkeypatch):
    """The stores are cached by URL: `out` opened again after os.chdir (a notebook's
    second pipeline.map(..., output="out")) was the first folder's `out`."""
    for folder in ("a", "b"):
        (tmp_path / folder).mkdir()
        monkeypatch.chdir(tmp_path / folder)
        assert open_store("out").url == str(tmp_path / folder / "out")
        assert open_store("file://out").url == str(tmp_path / folder / "out")


def test_local_write_killed_midway_is_invisible_and_discarded(tmp_path):
    # A real process killed with SIGKILL in the middle of a write, as a lost worker is.
    root = tmp_path / "store"
    script = (
        "import os, signal, sys\n"
        "from pipeline.storage import LocalStore\n"
        "def chunks():\n"
        "    yield b'x' * (9 << 20)\n"
        "    os.kill(os.getpid(), signal.SIGKILL)\n"
        "LocalStore(sys.argv[1]).write(sys.argv[2], chunks())\n"
    )
    for key in ["job/shards/s-1.npy", "other/k"]:
        child = subprocess.run([sys.executable, "-c", script, str(root), key])
        assert child.returncode == -signal.SIGKILL
    store = LocalStore(root)
    assert store.list() == []
    assert len([p for p in root.rglob("*") if p.is_file()]) == 2  # the partial files
    assert store.discard_incomplete("job") == 1
    assert store.discard_incomplete("job") == 0
    assert [p.parent.name for p in root.rglob("*.tmp")] == ["other"]  # outside the prefix


@integration
def test_s3_discard_incomplete_aborts_open_uploads_under_the_prefix(s3, s3_bucket):
    store = S3Store(s3_bucket)
    client = s3.client()
    # What a writer killed mid-upload leaves: an upload started, a part sent, never completed.
    for key in ["job/shards/s-1.npy", "job/manifest/part-1", "other/k"]:
        upload = client.create_multipart_upload(Bucket=BUCKET, Key=f"{store.prefix}/{key}")
        client.upload_part(
            Bucket=BUCKET,
            Key=f"{store.prefix}/{key}",
            UploadId=upload["UploadId"],
            PartNumber=1,
            Body=b"x" * 1024,
        )
    store.write_bytes("job/done", b"kept")
    assert store.discard_incomplete("job") == 2
    assert store.discard_incomplete("job") == 0
    left = client.list_multipart_uploads(Bucket=BUCKET).get("Uploads", [])
    assert [u["Key"] for u in left] == [f"{store.prefix}/other/k"]
    assert store.list() == ["job/done"]


def test_local_large_aligned_chunks_round_trip(tmp_path):
    # Chunks big and page-aligned enough take the direct-I/O path, the rest the page
    # cache; every mix must give back exactly the bytes written, tail included.
    from pipeline.workloads.cubes.shards import ShardBuffer

    store = LocalStore(tmp_path / "store")
    image = ShardBuffer((1000, 1100), "float64")  # header + 8.8 MB: not whole pages
    image.array[...] = np.random.default_rng(0).random((1000, 1100))
    expected = bytes(image.file)
    assert store.write("one", [image.file]) == len(expected)
    assert store.read_bytes("one") == expected
    np.testing.assert_array_equal(np.load(tmp_path / "store" / "one"), image.array)
    # After an odd-sized chunk the file offset is not page-aligned: page cache.
    assert store.write("after-odd", [b"abc", image.file, b"xyz"]) == len(expected) + 6
    assert store.read_bytes("after-odd") == b"abc" + expected + b"xyz"
    # After a page-sized chunk it is aligned again: direct I/O in the middle.
    page = bytes(range(256)) * 16
    assert store.write("after-page", [page, image.file, page]) == len(expected) + 2 * 4096
    assert store.read_bytes("after-page") == page + expected + page
    # A view that does not start on a page boundary in memory: page cache.
    assert store.write("unaligned", [image.file[1:]]) == len(expected) - 1
    assert store.read_bytes("unaligned") == expected[1:]
    assert store.list() == ["after-odd", "after-page", "one", "unaligned"]


def test_local_delete_prefix_leaves_no_empty_folders(tmp_path):
    store = LocalStore(tmp_path / "store")
    store.write_bytes("job/_calibration/host-1/shards/0.npy", b"x")
    store.write_bytes("job/keep", b"y")
    assert store.delete_prefix("job/_calibration/host-1") == 1
    assert not (tmp_path / "store" / "job" / "_calibration").exists()
    assert store.read_bytes("job/keep") == b"y"
    # and writing there again works
    store.write_bytes("job/_calibration/host-2/0.npy", b"z")
    assert store.list("job/_calibration") == ["job/_calibration/host-2/0.npy"]


# --------------------------------------------------------------------------- S3 only


@integration
def test_s3_multipart_is_used_and_small_objects_are_not(s3, s3_bucket):
    store = S3Store(s3_bucket)
    store.write("big", [np.zeros(40 * MiB, dtype=np.uint8)])
    store.write("small", [b"x" * 1000])
    client = s3.client()
    assert client.head_object(Bucket=BUCKET, Key="root/big")["ETag"].endswith('-3"')
    assert "-" not in client.head_object(Bucket=BUCKET, Key="root/small")["ETag"]
    assert client.list_multipart_uploads(Bucket=BUCKET).get("Uploads", []) == []
    # a non-contiguous buffer is copied, not rejected
    grid = np.arange(64, dtype=np.int16).reshape(8, 8)
    assert store.write("strided", [grid[:, :2]]) == 32
    assert store.read_bytes("strided") == grid[:, :2].tobytes()


@integration
def test_s3_keys_live_under_the_prefix(s3, s3_bucket):
    store = S3Store(s3_bucket + "/")
    assert store.url == "s3://pipeline-test/root"
    store.write_bytes("x/y", b"1")
    client = s3.client()
    client.put_object(Bucket=BUCKET, Key="rootless", Body=b"outside the prefix")
    client.put_object(Bucket=BUCKET, Key="root/folder/", Body=b"")  # console marker
    keys = [o["Key"] for o in client.list_objects_v2(Bucket=BUCKET)["Contents"]]
    assert "root/x/y" in keys
    assert store.list() == ["x/y"]
    whole = S3Store(f"s3://{BUCKET}")
    assert whole.list() == ["root/x/y", "rootless"]
    assert whole.read_bytes("root/x/y") == b"1"


@integration
def test_s3_list_and_delete_more_than_one_batch(s3, s3_bucket):
    store = S3Store(s3_bucket)
    client = s3.client()
    keys = [f"many/{i:05d}" for i in range(1005)]
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda k: client.put_object(Bucket=BUCKET, Key=f"root/{k}", Body=b"."), keys))
    store.write_bytes("many.txt", b"not under many/")
    assert store.list("many") == keys  # more than one page of list_objects_v2
    calls = []
    store._client().meta.events.register(
        "before-call.s3.DeleteObjects", lambda **_: calls.append(1)
    )
    assert store.delete_prefix("many") == 1005
    assert len(calls) == 2  # 1000 + 5
    assert store.list() == ["many.txt"]


@integration
def test_s3_partial_parquet_read_fetches_little(s3, s3_bucket, record_property):
    rows = 2_000_000
    rng = np.random.default_rng(1)
    table = pa.table(
        {"small": np.arange(rows, dtype=np.int32) % 7, "big": rng.random(rows)}
    )  # random doubles do not compress
    with FaultProxy(s3.endpoint) as proxy:  # no faults: it just counts the bytes
        store = S3Store(s3_bucket, endpoint_url=proxy.url)
        size = write_parquet(store, "wide.parquet", table)
        proxy.reset_counters()
        pf = pq.ParquetFile(store.open_input("wide.parquet"))
        small = pf.read(columns=["small"])
        fetched = proxy.response_bytes
        gets = [r for r in proxy.requests if r.method == "GET"]
    assert small.column("small").equals(table.column("small"))
    assert size > 15 * MiB
    record_property("parquet_object_bytes", size)
    record_property("parquet_bytes_fetched", fetched)
    print(
        f"partial parquet read: fetched {fetched} of {size} bytes "
        f"({100 * fetched / size:.2f}%) in {len(gets)} ranged GETs"
    )
    assert fetched < size / 20
    assert all(r.response_bytes < size / 10 for r in gets)


@integration
def test_s3_open_input_sequential_reads_use_read_ahead(s3, s3_bucket):
    data = np.random.default_rng(2).bytes(4 * MiB)
    with FaultProxy(s3.endpoint) as proxy:
        store = S3Store(s3_bucket, endpoint_url=proxy.url)
        store.write_bytes("seq", data)
        proxy.reset_counters()
        with store.open_input("seq") as f:
            chunks = iter(lambda: f.read(8192), b"")
            assert b"".join(chunks) == data
        gets = [r for r in proxy.requests if r.method == "GET"]
    assert len(gets) < 20  # 512 reads of 8 KiB
    assert proxy.response_bytes == len(data)


@integration
def test_s3_conditional_writes_refuse_a_second_create(s3, s3_bucket):
    """A job's lock is created once (``If-None-Match: *``) and renewed only while it is
    the object read (``If-Match``): the server must answer 412 otherwise, or two runs
    would both hold it."""
    from botocore.exceptions import ClientError

    client = s3.client()
    key = "root/_locks/once"
    first = client.put_object(Bucket=BUCKET, Key=key, Body=b"first", IfNoneMatch="*")
    for condition in ({"IfNoneMatch": "*"}, {"IfMatch": '"0123456789abcdef"'}):
        with pytest.raises(ClientError) as info:
            client.put_object(Bucket=BUCKET, Key=key, Body=b"second", **condition)
        assert info.value.response["ResponseMetadata"]["HTTPStatusCode"] == 412
        assert info.value.response["Error"]["Code"] == "PreconditionFailed"
    client.put_object(Bucket=BUCKET, Key=key, Body=b"renewed", IfMatch=first["ETag"])
    assert client.get_object(Bucket=BUCKET, Key=key)["Body"].read() == b"renewed"
    # The store's lock: a second holder is refused while the first holds it.
    store = S3Store(s3_bucket)
    with store.hold("_locks/job", "run 1"):
        with pytest.raises(BlockingIOError, match="run 1"), store.hold("_locks/job", "run 2"):
            pass
        assert "run 1" in store.read_bytes("_locks/job").decode()
    assert store.list("_locks") == ["_locks/once"]


@integration
def test_s3_object_replaced_while_reading(s3, s3_bucket):
    store = S3Store(s3_bucket)
    store.write_bytes("v", b"a" * 300_000)
    f = store.open_input("v")
    assert f.read(10) == b"a" * 10
    store.write_bytes("v", b"b" * 300_000)
    f.seek(200_000)
    with pytest.raises(StorageError, match="replaced while it was being read"):
        f.read(10)


@integration
def test_open_store_dispatches_and_caches(s3, s3_bucket):
    a = open_store(s3_bucket)
    assert isinstance(a, S3Store)
    assert open_store(s3_bucket) is a
    a.write_bytes("k", b"v")
    assert a.read_bytes("k") == b"v"


@integration
def test_s3_no_credentials_in_repr_pickle_or_state(s3, s3_bucket):
    store = S3Store(s3_bucket)
    store.write_bytes("k", b"v")  # the client exists now
    dumped = pickle.dumps(store)
    for secret in (DUMMY_ACCESS_KEY_ID, DUMMY_SECRET):
        assert secret.encode() not in dumped
        assert secret not in repr(store)
        assert secret not in repr(vars(pickle.loads(dumped)))


@integration
def test_endpoint_precedence(s3, s3_bucket, monkeypatch):
    # PIPELINE_S3_ENDPOINT_URL wins over AWS_ENDPOINT_URL ...
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{_closed_port()}")
    S3Store(s3_bucket).write_bytes("k", b"v")
    # ... the constructor argument wins over both ...
    with FaultProxy(s3.endpoint) as proxy:
        S3Store(s3_bucket, endpoint_url=proxy.url).read_bytes("k")
        assert len(proxy.requests) == 1
    # ... and AWS_ENDPOINT_URL alone is honoured (by boto3 itself).
    monkeypatch.delenv("PIPELINE_S3_ENDPOINT_URL")
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3.endpoint)
    assert S3Store(s3_bucket).read_bytes("k") == b"v"


@pytest.mark.parametrize(
    "url", ["s3://", "s3:///prefix", "s3://bad bucket/x", "s3://bucket/../x", "gs://bucket/x"]
)
def test_malformed_url_is_config_error(url):
    with pytest.raises(ConfigError):
        S3Store(url)


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("PIPELINE_S3_RETRY_MODE", "aggressive"),
        ("PIPELINE_S3_MAX_ATTEMPTS", "0"),
        ("PIPELINE_S3_MAX_ATTEMPTS", "many"),
        ("PIPELINE_S3_ENDPOINT_URL", "127.0.0.1:9000"),
    ],
)
def test_bad_settings_are_config_errors(monkeypatch, name, value):
    monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError, match=name):
        S3Store("s3://bucket/x")


def test_settings_from_env(monkeypatch):
    monkeypatch.setenv("PIPELINE_S3_RETRY_MODE", "Adaptive")
    monkeypatch.setenv("PIPELINE_S3_MAX_ATTEMPTS", "4")
    monkeypatch.setenv("PIPELINE_S3_ENDPOINT_URL", "http://user:pw@127.0.0.1:9000")
    store = S3Store("s3://bucket/x")
    assert (store.retry_mode, store.max_attempts) == ("adaptive", 4)
    assert "pw" not in repr(store) and "127.0.0.1:9000" in repr(store)
    assert "pw" not in store.endpoint_display()


# --------------------------------------------------------------------------- S3 errors


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@integration
def test_missing_bucket_names_bucket_and_endpoint(s3):
    store = S3Store("s3://no-such-bucket/x")
    for action in (
        lambda: store.read_bytes("k"),
        lambda: store.exists("k"),
        lambda: store.size("k"),
        lambda: store.list(),
        lambda: store.write_bytes("k", b"v"),
        store.preflight,
    ):
        with pytest.raises(StorageError) as info:
            action()
        assert not isinstance(info.value, FileNotFoundError)
        assert "no-such-bucket" in str(info.value)
        assert s3.endpoint in str(info.value)
        assert "does not exist" in str(info.value)


@integration
def test_wrong_endpoint_fails_fast_and_names_it(s3, monkeypatch):
    endpoint = f"http://127.0.0.1:{_closed_port()}"
    store = S3Store(f"s3://{BUCKET}/x", endpoint_url=endpoint)
    start = time.monotonic()
    with pytest.raises(StorageError) as info:
        store.preflight()
    assert time.monotonic() - start < 10
    message = str(info.value)
    assert endpoint in message and "unreachable" in message
    _assert_no_credentials(_all_messages(info.value))
    # ordinary operations retry PIPELINE_S3_MAX_ATTEMPTS times, then say the same
    monkeypatch.setenv("PIPELINE_S3_MAX_ATTEMPTS", "2")
    with pytest.raises(StorageError, match="unreachable") as info:
        S3Store(f"s3://{BUCKET}/x", endpoint_url=endpoint).read_bytes("k")
    assert endpoint in str(info.value)


@integration
def test_no_credentials_in_the_chain(s3, s3_bucket, monkeypatch):
    isolate_aws_env(monkeypatch, s3.endpoint, credentials=False)
    store = S3Store(s3_bucket)
    for action in (
        store.preflight,
        lambda: store.read_bytes("k"),
        lambda: store.write_bytes("k", b"v"),
    ):
        with pytest.raises(StorageError, match="no AWS credentials were found") as info:
            action()
        assert BUCKET in str(info.value) and s3.endpoint in str(info.value)


@pytest.fixture
def readable(s3, s3_bucket):
    """An object in the tests' bucket, which identity READER may list and read only."""
    S3Store(s3_bucket).write_bytes("readable", b"data")
    return s3_bucket


def _assert_denied(action, *secrets: str) -> None:
    with pytest.raises(PermissionError) as info:
        action()
    assert isinstance(info.value, StorageError) and isinstance(info.value, S3PermissionError)
    assert info.value.errno == errno.EACCES
    assert "access denied" in str(info.value) and BUCKET in str(info.value)
    text = _all_messages(info.value)
    assert not [s for s in secrets if s in text]


@integration
def test_access_denied_is_permission_error(s3, readable):
    s3.sign_as(READER)
    store = S3Store(readable)
    assert store.read_bytes("readable") == b"data"
    assert store.list() == ["readable"]
    for action in (lambda: store.write_bytes("k", b"v"), store.preflight):
        _assert_denied(action, READER.key_id, READER.secret)
    # An identity the server knows and allows nothing: refused reading and listing too.
    s3.sign_as(NOBODY)
    store = S3Store(readable)
    for action in (lambda: store.read_bytes("readable"), store.list, store.preflight):
        _assert_denied(action, NOBODY.key_id, NOBODY.secret)


@integration
@pytest.mark.parametrize("which", ["unknown key id", "wrong secret"])
def test_rejected_credentials(s3, readable, monkeypatch, which):
    if which == "wrong secret":
        bad_id, bad_secret = READER.key_id, "not-the-secret-0123456789"
    else:
        bad_id, bad_secret = "AKIAUNKNOWNKEY000000", READER.secret
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", bad_id)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", bad_secret)
    store = S3Store(readable)
    for action in (
        store.preflight,
        lambda: store.read_bytes("readable"),
        lambda: store.list(),
    ):
        with pytest.raises(StorageError, match="credentials were rejected") as info:
            action()
        assert BUCKET in str(info.value) and s3.endpoint in str(info.value)
        text = _all_messages(info.value)
        for value in (bad_id, bad_secret, READER.key_id, READER.secret):
            assert value not in text


# --------------------------------------------------------------------------- faults


@integration
def test_retries_ride_over_injected_faults(s3, s3_bucket):
    arr = np.random.default_rng(3).random(5 * MiB)  # 40 MiB: multipart
    table = pa.table({"a": np.arange(50_000), "b": np.random.default_rng(4).random(50_000)})
    with FaultProxy(s3.endpoint, fail_every=4) as proxy:
        store = S3Store(s3_bucket, endpoint_url=proxy.url)
        store.preflight()
        assert store.write("big.npy", [memoryview(arr)]) == arr.nbytes
        for i in range(8):
            store.write_bytes(f"small/{i}", f"payload {i}".encode())
        write_parquet(store, "t.parquet", table)
        assert np.array_equal(np.frombuffer(store.read_bytes("big.npy")), arr)
        assert [store.read_bytes(f"small/{i}") for i in range(8)] == [
            f"payload {i}".encode() for i in range(8)
        ]
        assert read_parquet_file(store, "t.parquet").read().equals(table)
        assert store.list("small") == [f"small/{i}" for i in range(8)]
        assert store.exists("big.npy") and not store.exists("nope")
        assert store.delete_prefix("small") == 8
        injected = {r.injected for r in proxy.requests if r.injected}
        assert proxy.failures_injected >= 5
        assert injected == {"InternalError", "SlowDown"}
        assert any(r.injected and "partNumber" in r.path for r in proxy.requests)
    assert S3Store(s3_bucket).list() == ["big.npy", "t.parquet"]


@integration
def test_failed_multipart_upload_is_aborted_and_invisible(s3, s3_bucket, monkeypatch):
    monkeypatch.setenv("PIPELINE_S3_MAX_ATTEMPTS", "2")
    with FaultProxy(s3.endpoint, fail_every=1, fail_if=lambda r: "partNumber=2" in r.path) as proxy:
        store = S3Store(s3_bucket, endpoint_url=proxy.url)
        with pytest.raises(StorageError, match=r"InternalError|SlowDown") as info:
            store.write("big", [np.ones(40 * MiB, dtype=np.uint8)])
        assert info.value.errno == errno.EIO
        assert proxy.failures_injected == 2
    assert S3Store(s3_bucket).list() == []
    assert s3.client().list_multipart_uploads(Bucket=BUCKET).get("Uploads", []) == []


@integration
def test_fault_proxy_is_deterministic(s3):
    s3.make_bucket()
    client = s3.client()
    with FaultProxy(s3.endpoint, fail_every=3, errors=["SlowDown"]) as proxy:
        raw = s3.client(endpoint=proxy.url, max_attempts=1)
        statuses = []
        for i in range(6):
            try:
                raw.put_object(Bucket=BUCKET, Key=f"k{i}", Body=b"v")
                statuses.append("ok")
            except Exception as exc:
                statuses.append(exc.response["Error"]["Code"])
        assert proxy.failures_injected == 2
    assert statuses[2] == statuses[5] == "SlowDown"
    assert statuses.count("ok") == 4
    assert len(client.list_objects_v2(Bucket=BUCKET)["Contents"]) == 4


@integration
def test_fault_proxy_concurrent_clients(s3):
    s3.make_bucket()
    with FaultProxy(s3.endpoint, fail_rate=0.2, seed=7) as proxy:
        # 10 attempts: ten injected failures in a row (p = 1e-7) would be needed to fail.
        client = s3.client(endpoint=proxy.url, max_attempts=10)
        errors: list[BaseException] = []

        def work(i: int) -> None:
            try:
                client.put_object(Bucket=BUCKET, Key=f"c/{i}", Body=bytes([i]) * 1000)
                assert (
                    client.get_object(Bucket=BUCKET, Key=f"c/{i}")["Body"].read()
                    == bytes([i]) * 1000
                )
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=work, args=(i,)) for i in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
        assert proxy.failures_injected > 0


@integration
def test_s3_task_reads_one_get_per_file(s3, s3_bucket, monkeypatch):
    """A task's row groups come in one ranged GET per file, not one per column chunk;
    a small file in one GET, footer included."""
    from pipeline.inputs.chunks import plan_chunks
    from pipeline.inputs.dataset import discover
    from pipeline.inputs.task_rows import read_task_rows

    rows_per_chunk, chunks = 1000, 64
    rng = np.random.default_rng(3)
    n = rows_per_chunk * chunks
    table = pa.table(
        {"chunk": np.repeat(np.arange(chunks), rows_per_chunk)}
        | {f"x{j}": rng.random(n) for j in range(6)}
    )
    with FaultProxy(s3.endpoint) as proxy:
        monkeypatch.setenv("PIPELINE_S3_ENDPOINT_URL", proxy.url)  # the tasks' stores too
        clear_store_cache()
        store = S3Store(s3_bucket, endpoint_url=proxy.url)
        big = io.BytesIO()
        # 16 row groups, more than a task reads whole (pipeline.inputs.dataset.WHOLE_FILE_BYTES)
        pq.write_table(table, big, row_group_size=4 * rows_per_chunk)
        store.write_bytes("data/big.parquet", big.getvalue())
        ds = discover(f"{store.url}/data")
        index = plan_chunks(ds, ("chunk",), None)
        proxy.reset_counters()
        got = read_task_rows(ds, index, 8, 40, ["x0", "x3", "x5"])  # row groups 2..9
        gets = [r for r in proxy.requests if r.method == "GET"]
        assert len(gets) == 1, [r.response_bytes for r in gets]
        assert got.table.num_rows == 32 * rows_per_chunk
        assert got.table.column("x3").to_numpy().tolist() == (
            table.column("x3").to_numpy()[8000:40000].tolist()
        )
        small = io.BytesIO()
        pq.write_table(table.slice(0, 2 * rows_per_chunk), small)
        store.write_bytes("few/small.parquet", small.getvalue())
        ds = discover(f"{store.url}/few")
        index = plan_chunks(ds, ("chunk",), None)
        proxy.reset_counters()
        got = read_task_rows(ds, index, 0, 2, ["x1"])
        gets = [r for r in proxy.requests if r.method in ("GET", "HEAD")]
        assert len(gets) == 1
        assert got.table.column("x1").equals(table.column("x1").slice(0, 2 * rows_per_chunk))


def test_a_local_key_cannot_climb_out_of_its_store(tmp_path):
    store = LocalStore(tmp_path / "store")
    for key in ("../escape", "a/../../escape", "a\\..\\escape"):
        with pytest.raises(StorageError, match=r"must not contain '\.\.'"):
            store.write_bytes(key, b"x")
    store.write_bytes("a/..b/c..", b"x")  # dots inside names are names
    assert (tmp_path / "store" / "a" / "..b" / "c..").read_bytes() == b"x"
    assert not (tmp_path / "escape").exists()


def test_a_local_root_given_through_dot_dot_is_named_plainly(tmp_path, monkeypatch):
    (tmp_path / "jobs").mkdir()
    monkeypatch.chdir(tmp_path / "jobs")
    store = LocalStore("../out")
    assert store.url == str(tmp_path / "out") and store.describe("a") == str(tmp_path / "out" / "a")


def test_a_process_that_reads_parquet_exits_cleanly(tmp_path):
    """pyarrow's ``pq.read_table`` leaves scanner threads that abort a short process
    as it exits (SIGABRT, "terminate called without an active exception"; half of 20
    runs with pyarrow 26): ``pipeline results`` did so after printing its error."""
    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"unit": list(range(100)), "x": [1.5] * 100}), path)
    script = (
        "import sys; from pipeline.storage import read_parquet, read_parquet_object, open_store;"
        "t = read_parquet(open(sys.argv[1], 'rb').read());"
        "u = read_parquet_object(open_store(sys.argv[2]), 't.parquet', columns=['x']);"
        "assert t.num_rows == 100 and u.column_names == ['x']"
    )
    runs = [
        subprocess.Popen(
            [sys.executable, "-c", script, str(path), str(tmp_path)],
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(20)
    ]
    failed = [(p.wait(timeout=120), p.stderr.read()) for p in runs]
    assert not [f for f in failed if f[0] != 0], failed
    # ... and no module of the package reads parquet through the scanner.
    package = Path(pipeline.__file__).parent
    assert not [p for p in package.rglob("*.py") if "pq.read_table(" in p.read_text()]


def test_open_file_reads_a_local_path_as_bytes_or_text(tmp_path):
    from pipeline import open_file

    (tmp_path / "a.txt").write_bytes("é\n".encode())
    with open_file(tmp_path / "a.txt") as f:
        assert f.read() == "é\n".encode()
    with open_file(str(tmp_path / "a.txt"), "r") as f:
        assert f.read() == "é\n"
    with pytest.raises(ConfigError, match="mode 'w'; expected 'rb' or 'r'"):
        open_file(tmp_path / "a.txt", "w")
    with pytest.raises(ConfigError, match="expected s3://bucket/key"):
        open_file("s3://bucket-only/")


def test_a_local_write_under_a_file_is_one_storage_error(tmp_path):
    # One StorageError, "cannot write ...": the clean-up of the temporary file must not
    # raise a second error (NotADirectoryError) while the first is handled.
    (tmp_path / "a_file").write_text("x")
    with pytest.raises(StorageError, match=r"cannot write .*a_file/x\.csv: "):
        LocalStore(tmp_path).write_bytes("a_file/x.csv", b"1,2\n")
