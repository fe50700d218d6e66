"""Cube jobs into S3 (SeaweedFS on loopback) on the embedded cluster: preflight errors
and S3 answering 500/503/SlowDown through a fault-injecting proxy."""

from __future__ import annotations

import functools
import subprocess
import sys
import time

import pytest
import support.cube_jobs as cube_jobs
from support.fault_proxy import FaultProxy
from support.s3_server import BUCKET, DUMMY_SECRET, clear_store_cache
from support.stored import cube_manifest

from pipeline import RunOptions, StorageError, connect, run_job, run_jobs
from pipeline.verify import verify_output

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


#: The cube jobs these tests run (tests/support/cube_jobs.py's, a little larger, on 2 workers).
cube_job = functools.partial(cube_jobs.cube_job, cubes=48, seed=2, units_per_task=8, workers=2)


def test_preflight_missing_bucket_names_it_and_runs_nothing(s3, frames_dir):
    with pytest.raises(StorageError, match="no-such-bucket") as info:
        run_jobs([cube_job("s3://no-such-bucket/out", frames_dir)], echo=lambda m: None)
    assert s3.endpoint in str(info.value)


def test_preflight_unreachable_endpoint_names_it(s3, frames_dir, monkeypatch):
    monkeypatch.setenv("PIPELINE_S3_ENDPOINT_URL", "http://127.0.0.1:9")
    clear_store_cache()
    with pytest.raises(StorageError, match=r"127\.0\.0\.1:9"):
        run_jobs([cube_job(f"s3://{BUCKET}/out", frames_dir)], echo=lambda m: None)


def test_preflight_rejected_credentials_via_cli(s3, s3_bucket, frames_dir, monkeypatch):
    wrong = "pipeline-wrong-secret-0c5e"
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", wrong)  # the admin's key id, another secret
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pipeline",
            "run",
            "--frames",
            str(frames_dir),
            "--dim",
            "10",
            "--cubes",
            "4",
            "--output",
            s3_bucket.split("/root")[0] + "/x",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1
    assert "credentials were rejected" in proc.stderr, proc.stderr
    assert BUCKET in proc.stderr and "Traceback" not in proc.stderr
    assert wrong not in proc.stderr + proc.stdout and DUMMY_SECRET not in proc.stderr + proc.stdout
    assert "cubes in" not in proc.stdout  # no task ran


def test_missing_input_on_s3_is_named(s3, s3_bucket):
    from pipeline import InputError

    with pytest.raises(InputError, match=rf"s3://{BUCKET}/nothing-here is missing or empty"):
        run_jobs([cube_job(s3_bucket, f"s3://{BUCKET}/nothing-here")], echo=lambda m: None)


def test_s3_errors_and_slowdowns_lose_nothing(s3, s3_bucket, frames_dir, monkeypatch):
    with connect(RunOptions(workers=2)) as client:
        clean = cube_job(f"s3://{BUCKET}/clean", frames_dir)
        assert run_job(clean.build(), clean.options, client, echo=lambda m: None).complete
    with FaultProxy(s3.endpoint, fail_every=4) as proxy:
        # Workers inherit the endpoint when the cluster starts: every S3 request they
        # and the driver make goes through the proxy, and one in four fails.
        monkeypatch.setenv("PIPELINE_S3_ENDPOINT_URL", proxy.url)
        clear_store_cache()
        with connect(RunOptions(workers=2)) as client:
            job = cube_job(f"s3://{BUCKET}/faulted", frames_dir)
            summary = run_job(job.build(), job.options, client, echo=lambda m: None)
        injected = proxy.failures_injected
    assert injected > 10
    assert summary.complete and summary.units_failed == 0
    monkeypatch.setenv("PIPELINE_S3_ENDPOINT_URL", s3.endpoint)
    clear_store_cache()
    (check,) = verify_output(f"s3://{BUCKET}/faulted")
    assert check.ok and check.units_ok == 48
    body = {
        p: s3.client().get_object(Bucket=BUCKET, Key=f"{p}/cubes/manifest.parquet")["Body"].read()
        for p in ("clean", "faulted")
    }
    assert cube_manifest(body["clean"]).equals(cube_manifest(body["faulted"]))


def _has_s3_client(url: str) -> bool:
    from pipeline.storage import open_store

    return open_store(url)._client_obj is not None


def test_workers_open_the_jobs_stores_while_the_cluster_starts(s3, s3_bucket):
    # A process's first S3 client loads botocore's models (0.2-0.3 s of CPU): made on
    # every worker while the driver validates, not by each worker's first task.
    from pipeline.cluster.connect import ClusterStart

    data, out = s3.url(prefix="data"), s3.url(prefix="out")
    with ClusterStart(RunOptions(workers=2), urls=(data,)) as start:
        client = start.client()
        assert client.run(_has_s3_client, data) and all(client.run(_has_s3_client, data).values())
        assert not any(client.run(_has_s3_client, out).values())


def test_a_job_on_s3_is_held_by_a_lease_that_a_dead_run_gives_up(s3, s3_bucket, monkeypatch):
    from support.lock_holders import lock_held_elsewhere
    from support.workloads import SquaresWorkload

    from pipeline import JobRunning
    from pipeline.layout import lock_key
    from pipeline.storage import open_store, s3_lease

    store = open_store(s3_bucket)
    opts = RunOptions(output=s3_bucket, progress=False, workers=1)
    again = RunOptions(output=s3_bucket, progress=False, workers=1, overwrite=True)
    with connect(opts) as client:  # workers started now, with the S3 endpoint
        held = pytest.raises(JobRunning, match=r"already running \(pid 1 on elsewhere \(its")
        with store.hold(lock_key("sq"), "pid 1 on elsewhere"), held:
            run_job(SquaresWorkload("sq", 4), opts, client)
        assert store.list("_locks") == []  # let go on leaving
        s = run_job(SquaresWorkload("sq", 4), opts, client, echo=lambda m: None)
        assert s.complete and store.list("_locks") == []
        # A run killed on this host: its pid is gone, so its lease is taken over at once.
        with lock_held_elsewhere(s3_bucket, "sq", "pid 5 here") as holder:
            with pytest.raises(JobRunning, match="pid 5 here"):
                run_job(SquaresWorkload("sq", 4), again, client)
            holder.kill()  # SIGKILL
            holder.wait(10)
        s = run_job(SquaresWorkload("sq", 4), again, client, echo=lambda m: None)
        assert s.complete and store.list("_locks") == []
        # A run lost with its machine: its lease stays, unrenewed, until TTL old.
        bucket, key = store.bucket, store._key(lock_key("sq"))
        lost = b'{"owner": "pid 2 on lost", "host": "lost", "pid": 2, "started": 0}'
        s3_lease._acquire(store._client(), bucket, key, lost)
        with pytest.raises(JobRunning, match="pid 2 on lost"):
            run_job(SquaresWorkload("sq", 4), again, client)
        assert store.exists("sq/job.json")  # --overwrite waited for the lock
        monkeypatch.setattr(s3_lease, "TTL", 1.0)
        time.sleep(2.1)  # S3's clock counts whole seconds
        s = run_job(SquaresWorkload("sq", 4), again, client, echo=lambda m: None)
        assert s.complete and store.list("_locks") == []
        # A live holder renews its lease: held past the TTL, it is still held.
        monkeypatch.setattr(s3_lease, "TTL", 3.0)
        monkeypatch.setattr(s3_lease, "RENEW", 0.3)
        with store.hold(lock_key("sq"), "pid 3 on alive"):
            time.sleep(4.5)
            with (
                pytest.raises(BlockingIOError, match="pid 3 on alive"),
                store.hold(lock_key("sq"), "pid 4"),
            ):
                pass


def test_a_map_over_files_on_s3_reads_them_with_open_file(s3, s3_bucket):
    from mapfns.userfns import line_count

    import pipeline

    store = pipeline.open_store(s3.url(prefix="texts"))
    for i in range(3):
        store.write_bytes(f"t{i}.txt", b"line\n" * i)
    summary = pipeline.map(line_count, files=s3.url(prefix="texts"),
                           output=s3.url(prefix="out"), workers=2, progress=False)  # fmt: skip
    assert summary.units_failed == 0, summary.failures
    table = pipeline.results_table(s3.url(prefix="out"))
    assert table.column("lines").to_pylist() == [0, 1, 2]
    assert table.column("file").to_pylist() == [s3.url(prefix=f"texts/t{i}.txt") for i in range(3)]
    with pipeline.open_file(s3.url(prefix="texts/t2.txt")) as f:
        assert f.read() == b"line\nline\n" and not isinstance(f.read(), str)


#: Files under texts/, here and on S3; a glob matches the same of them in either place.
TREE = ["f00.txt", "f01.txt", "f09.txt", "f10.txt", "f0.csv", "g.txt", ".hidden.txt",
        "sub/h.txt", "sub/.x.txt", "sub/deep/i.txt", ".dot/j.txt", "f0x/k.txt"]  # fmt: skip
GLOBS = ["*.txt", "f0?.txt", "f[01]*", "[!f]*", "f0*", "**/*.txt", "**", "sub/*", "*/*.txt",
         ".hidden*", "sub/.x*", ".dot/*", "**/i.txt", "*/**/*.txt", "sub/**", "f0*/*"]  # fmt: skip


def test_files_on_s3_are_globbed_as_local_files(s3, s3_bucket, tmp_path):
    """A glob on S3 said "no files there", and so did a partial name (texts/f0 for
    f00..f09), without saying what was looked for."""
    import pipeline
    from pipeline import ConfigError, InputError
    from pipeline.workloads.map.inputs import FilesInput

    texts = s3.url(prefix="texts")
    store = pipeline.open_store(texts)
    for name in TREE:
        store.write_bytes(name, b"line\n" * len(name))
        (tmp_path / "texts" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "texts" / name).write_bytes(b"line\n" * len(name))
    here = str(tmp_path / "texts")

    def names(where: str, root: str) -> list[str]:
        return [p[len(root) + 1 :] for p in FilesInput(where).paths]

    for pattern in GLOBS:
        local = names(f"{here}/{pattern}", here)
        assert local, pattern
        assert names(f"{texts}/{pattern}", texts) == local, pattern
    assert names(texts, texts) == names(here, here)  # a prefix, as a folder
    assert [k for k, _ in store.listed_versions("f0")] == ["f0.csv", "f00.txt", "f01.txt",
                                                           "f09.txt", "f0x/k.txt"]  # fmt: skip
    assert FilesInput(f"{texts}/g.txt").paths == (f"{texts}/g.txt",)  # one object
    with pytest.raises(InputError, match=rf"^files = '{texts}/f0': no files there \(an s3:// "
                       rf"prefix is taken as a folder, and no object is under {texts}/f0/, nor "
                       rf"named {texts}/f0\); for the files whose names begin with 'f0' "
                       rf"\(f0\.csv, \.\.\.\), give a glob: {texts}/f0\*$"):  # fmt: skip
        FilesInput(f"{texts}/f0")
    with pytest.raises(InputError, match=r"no files match this glob \(of the objects under "):
        FilesInput(f"{texts}/*.json")
    with pytest.raises(ConfigError, match=r"the bucket of an s3:// glob is named as it is"):
        FilesInput("s3://pipeline-*/texts/*.txt")


def test_an_empty_prefix_as_a_dataset_says_it_holds_no_objects(s3, s3_bucket):
    from mapfns.userfns import chunk_stats

    import pipeline
    from pipeline import InputError

    with pytest.raises(InputError, match=rf"^dataset {s3.url(prefix='none')}: no objects there"):
        pipeline.map(chunk_stats, data=s3.url(prefix="none"), chunk_rows=2, output=s3_bucket)


def test_a_resume_after_an_object_changed_on_s3_is_refused(s3, s3_bucket):
    """A job over files resumes while they are the same; an object's new contents
    went unnoticed (only its name was recorded)."""
    from mapfns.userfns import line_count

    import pipeline
    from pipeline import ConfigError

    texts = s3.url(prefix="texts")
    store = pipeline.open_store(texts)
    for name in ("f00.txt", "f01.txt", "f09.txt", "g.txt"):
        store.write_bytes(name, b"line\n" * 7)
    out = s3.url(prefix="out")
    with pipeline.connect(RunOptions(workers=1)) as client:  # workers see the S3 endpoint
        for _ in range(2):
            summary = pipeline.map(line_count, files=f"{texts}/f0?.txt", output=out,
                                   client=client, progress=False)  # fmt: skip
            assert summary.complete and summary.units == 3
        assert summary.units_run == 0
        assert pipeline.results_table(out).column("lines").to_pylist() == [7, 7, 7]
        store.write_bytes("f01.txt", b"LINE\n" * 7)  # the same size, other contents
        changed = r"holds job 'line_count' whose input files changed since \(their sizes, times or"
        with pytest.raises(ConfigError, match=changed):
            pipeline.map(line_count, files=f"{texts}/f0?.txt", output=out, client=client)


def test_a_shard_deleted_on_s3_is_repaired_to_its_bytes(s3, s3_bucket, frames_dir):
    output = f"s3://{BUCKET}/repaired"
    with connect(RunOptions(workers=2)) as client:
        job = cube_job(output, frames_dir)
        assert run_job(job.build(), job.options, client, echo=lambda m: None).complete
        key = _s3_shard(s3, "repaired/cubes", 5)
        original = s3.client().get_object(Bucket=BUCKET, Key=key)["Body"].read()
        s3.client().delete_object(Bucket=BUCKET, Key=key)
        (check,) = verify_output(output, repair=True)
        assert not check.ok and [(t.start, t.stop) for t in check.repaired] == [(16, 24)]
        again = cube_job(output, frames_dir)
        summary = run_job(again.build(), again.options, client, echo=lambda m: None)
    assert summary.complete and summary.units_run == 8 and summary.units_skipped == 40
    again_key = _s3_shard(s3, "repaired/cubes", 5)
    assert again_key != key  # written by the rerun's attempt
    assert s3.client().get_object(Bucket=BUCKET, Key=again_key)["Body"].read() == original
    (check,) = verify_output(output)
    assert check.ok and check.units_ok == 48


def _s3_shard(s3, job: str, shard: int) -> str:
    """The key of shard ``shard`` of the job at ``job`` (named by its attempt)."""
    listed = s3.client().list_objects_v2(Bucket=BUCKET, Prefix=f"{job}/shards/{shard:06d}.a")
    (key,) = [o["Key"] for o in listed.get("Contents", [])]
    return key
