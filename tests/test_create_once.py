"""``Store.create_once``: of writers racing on one key exactly one makes the object,
and nothing overwrites it, on a local folder and on S3 (SeaweedFS honours
``If-None-Match: *``). Writers are separate processes, as a task's attempts are."""

from __future__ import annotations

import subprocess
import sys

import pytest

from pipeline.storage import LocalStore, open_store

pytestmark = pytest.mark.timeout(120)

RACE = """
import sys, time
from pipeline.storage import open_store
url, key, me, start = sys.argv[1:5]
while time.time() < float(start):  # (all start together; the outcome is not timed)
    time.sleep(0.001)
print(open_store(url).create_once(key, me.encode() * 1000))
"""

WRITERS = 6


def _race(url: str, key: str) -> list[bool]:
    import time

    start = str(time.time() + 2)
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", RACE, url, key, f"w{i}", start],
            stdout=subprocess.PIPE,
            text=True,
        )
        for i in range(WRITERS)
    ]
    return [p.communicate(timeout=60)[0].strip() == "True" for p in procs]


@pytest.fixture(params=["local", pytest.param("s3", marks=pytest.mark.integration)])
def url(request, tmp_path):
    if request.param == "local":
        return str(tmp_path / "out")
    return request.getfixturevalue("s3_bucket")


def test_one_writer_of_many_makes_the_object_and_it_stays(url, monkeypatch):
    won = _race(url, "job/manifest/part-000003.parquet")
    assert sum(won) == 1, won
    store = open_store(url)
    winner = won.index(True)
    assert store.read_bytes("job/manifest/part-000003.parquet") == f"w{winner}".encode() * 1000
    assert not store.create_once("job/manifest/part-000003.parquet", b"late")
    assert store.read_bytes("job/manifest/part-000003.parquet") == f"w{winner}".encode() * 1000
    assert store.list("job") == ["job/manifest/part-000003.parquet"]  # no temporary left


def test_a_folder_where_the_object_goes_is_an_error_not_a_lost_race(tmp_path):
    from pipeline.errors import StorageError

    store = LocalStore(tmp_path)
    (tmp_path / "job" / "entry").mkdir(parents=True)
    with pytest.raises(StorageError, match="a folder is there"):
        store.create_once("job/entry", b"x")
