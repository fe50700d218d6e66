"""The production topology with real processes: a driver reaching a TLS `dask scheduler`
through HAProxy, two `dask worker --nthreads 1` processes, S3 on SeaweedFS.

Certificates come from `pipeline certs`, frames from `pipeline data frames --out s3://`,
and results are checked with `pipeline verify`.
"""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys

import pytest
from support.map_jobs import gated_job
from support.s3_server import BUCKET, DUMMY_ACCESS_KEY_ID, DUMMY_SECRET, REGION, s3_process
from support.stored import cube_manifest, unnamed
from support.waiting import wait_for

from harness.cluster_procs import tls_cluster

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

FRAMES = f"s3://{BUCKET}/frames"


def aws_env(endpoint: str, cache: str) -> dict[str, str]:
    return {
        "AWS_ACCESS_KEY_ID": DUMMY_ACCESS_KEY_ID,
        "AWS_SECRET_ACCESS_KEY": DUMMY_SECRET,
        "AWS_DEFAULT_REGION": REGION,
        "AWS_CONFIG_FILE": "/nonexistent/config",
        "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent/credentials",
        "AWS_EC2_METADATA_DISABLED": "true",
        "PIPELINE_S3_ENDPOINT_URL": endpoint,
        "NO_PROXY": "127.0.0.1,localhost",
        "PIPELINE_CACHE_DIR": cache,
    }


def pipeline_cli(args, env, timeout=240):
    return subprocess.run(
        [sys.executable, "-m", "pipeline", *map(str, args)],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


class Remote:
    def __init__(self, cluster, env, tmp):
        self.cluster, self.env, self.tmp = cluster, env, tmp
        certs = cluster.certs
        self.driver_flags = [
            "--scheduler",
            cluster.address,
            "--tls-ca-file",
            certs["ca"],
            "--tls-cert",
            certs["client"],
            "--tls-key",
            certs["client-key"],
        ]

    def s3(self):
        import boto3

        return boto3.session.Session().client(
            "s3",
            endpoint_url=self.env["PIPELINE_S3_ENDPOINT_URL"],
            region_name=REGION,
            aws_access_key_id=DUMMY_ACCESS_KEY_ID,
            aws_secret_access_key=DUMMY_SECRET,
        )

    def keys(self, prefix):
        pages = self.s3().get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix)
        return [o["Key"] for page in pages for o in page.get("Contents", ())]

    def cube_args(self, output, cubes=60, **extra):
        args = [
            "run",
            "--frames",
            FRAMES,
            "--cubes",
            cubes,
            "--dim",
            10,
            "--seed",
            5,
            "--cubes-per-shard",
            4,
            "--name",
            "cubes",
            "--output",
            output,
            "--no-progress",
            *self.driver_flags,
        ]
        for k, v in extra.items():
            args += [f"--{k.replace('_', '-')}", v]
        return args


@pytest.fixture(scope="module")
def remote(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("remote")
    server = s3_process()
    server.reset()
    env = aws_env(server.endpoint, str(tmp / "cache"))
    made = pipeline_cli(["certs", "--out", tmp / "certs", "--days", 2], env)
    assert made.returncode == 0, made.stderr
    from pipeline.cluster.tls import expected_files

    certs = expected_files(tmp / "certs")
    assert oct(certs["client-key"].stat().st_mode & 0o777) == "0o600"
    with tls_cluster(tmp, n_workers=2, certs=certs, worker_env=env) as cluster:
        r = Remote(cluster, env, tmp)
        r.s3().create_bucket(Bucket=BUCKET)
        made = pipeline_cli(
            [
                "data",
                "frames",
                "--count",
                12,
                "--rows",
                30,
                "--cols",
                25,
                "--out",
                FRAMES,
                "--seed",
                1,
            ],
            env,
        )
        assert made.returncode == 0, made.stderr
        yield r


def test_cube_job_through_the_load_balancer_into_s3_verifies(remote):
    out = f"s3://{BUCKET}/run1"
    proc = pipeline_cli(remote.cube_args(out), remote.env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "60 of 60 cubes" in proc.stdout
    assert remote.cluster.address in proc.stderr  # the job ran through the load balancer
    ok = pipeline_cli(["verify", out], remote.env)
    assert ok.returncode == 0, ok.stdout
    assert (
        "cubes (cubes): OK: 60 of 60 units verified in 15 objects; 0 missing, 0 extra, "
        "0 corrupt" in ok.stdout
    )
    # Credentials never reach what the run writes.
    for key in remote.keys("run1/"):
        if key.endswith((".json", ".parquet")):
            body = remote.s3().get_object(Bucket=BUCKET, Key=key)["Body"].read()
            assert DUMMY_SECRET.encode() not in body and DUMMY_ACCESS_KEY_ID.encode() not in body

    # Damage the output three ways; verify names each and fails.
    s3 = remote.s3()

    def shard_key(n: int) -> str:  # (named by the attempt that wrote it)
        listed = s3.list_objects_v2(Bucket=BUCKET, Prefix=f"run1/cubes/shards/{n:06d}.a")
        (key,) = [o["Key"] for o in listed["Contents"]]
        return key

    shard, gone = shard_key(2), shard_key(5)
    data = bytearray(s3.get_object(Bucket=BUCKET, Key=shard)["Body"].read())
    data[-1] ^= 0xFF
    s3.put_object(Bucket=BUCKET, Key=shard, Body=bytes(data))
    s3.delete_object(Bucket=BUCKET, Key=gone)
    s3.put_object(Bucket=BUCKET, Key="run1/cubes/shards/stray.npy", Body=b"x")
    bad = pipeline_cli(["verify", out], remote.env)
    assert bad.returncode == 1
    assert "FAILED" in bad.stdout and "1 missing, 1 extra, 1 corrupt" in bad.stdout
    assert f"missing: s3://{BUCKET}/{gone}" in bad.stdout
    assert f"extra: {out}/cubes/shards/stray.npy" in bad.stdout
    assert f"corrupt: s3://{BUCKET}/{shard}[3] (cube 11)" in bad.stdout


def test_killed_driver_resumes_writing_only_what_is_missing(remote, tmp_path):
    # The killed driver's tasks are held on the scheduler for its reconnection; the
    # rerun lets go of them as it starts, so it counts exactly the units stored
    # before the kill (0-4: the others wait on a gate) and runs only the rest.
    log, gate = tmp_path / "log", tmp_path / "gate"
    log.mkdir()
    # Units 0-4 run at once; the others wait for the test's gate.
    job = gated_job(tmp_path, "x = {stop = 40}\nfree_below = [5]", gate, log)
    out = f"s3://{BUCKET}/run2"
    args = ["run", job, "--output", out, "--no-progress", "--units-per-task", 1,
            *remote.driver_flags]  # fmt: skip
    driver = subprocess.Popen(
        [sys.executable, "-m", "pipeline", *map(str, args)],
        env={**os.environ, **remote.env},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )

    def five_done_seven_started() -> bool:
        assert driver.poll() is None, "the driver finished before it could be killed"
        done = len(remote.keys("run2/gated/manifest/"))
        return done >= 5 and len(list(log.glob("started-*"))) >= 7

    wait_for("5 tasks done and 7 started", five_done_seven_started, 120, interval=0.05)
    driver.send_signal(signal.SIGKILL)
    driver.wait()
    assert len(remote.keys("run2/gated/manifest/")) == 5
    said = tmp_path / "rerun.stderr"
    rerun = subprocess.Popen(
        [sys.executable, "-m", "pipeline", *map(str, args)],
        env={**os.environ, **remote.env},
        stdout=subprocess.PIPE,
        stderr=said.open("w"),
        text=True,
    )
    try:
        # The gate opens once the rerun has counted what is complete (the units the
        # killed driver left running, 5 and 6, are still waiting on it).
        def counted() -> bool:
            assert rerun.poll() is None, said.read_text()
            return "resuming:" in said.read_text()

        wait_for("the rerun to count what is complete", counted, 120, interval=0.05)
        gate.touch()
        stdout, _ = rerun.communicate(timeout=180)
    finally:
        if rerun.poll() is None:
            rerun.kill()
    stderr = said.read_text()
    assert rerun.returncode == 0, stdout + stderr
    assert "resuming: 5 of 40 points already complete" in stderr, stderr
    assert "35 of 35 points" in stdout, stdout
    ok = pipeline_cli(["verify", out], remote.env)
    assert ok.returncode == 0 and "40 of 40 units verified" in ok.stdout, ok.stdout


def test_worker_killed_mid_run_loses_and_duplicates_nothing(remote, monkeypatch):
    from pipeline import RunOptions, connect, load_jobs, run_job
    from pipeline.runner import entries

    for k, v in remote.env.items():
        monkeypatch.setenv(k, v)
    from pipeline.storage import _open_store

    _open_store.cache_clear()
    certs = remote.cluster.certs
    opts = {
        "scheduler": remote.cluster.address,
        "tls_ca_file": str(certs["ca"]),
        "tls_cert": str(certs["client"]),
        "tls_key": str(certs["client-key"]),
    }

    def job(output):
        cli = {
            "frames": FRAMES,
            "cubes": 600,
            "dim": 10,
            "seed": 5,
            "cubes_per_shard": 4,
            "units_per_task": 4,
            "output": output,
            "progress": False,
            **opts,
        }
        (j,) = load_jobs([], cli, environ={})
        return j

    with connect(RunOptions(**opts)) as client:
        clean = job(f"s3://{BUCKET}/clean")
        assert run_job(clean.build(), clean.options, client, echo=lambda m: None).complete
        faulted = job(f"s3://{BUCKET}/faulted")
        parts_at_kill = []
        heard = []
        read_ahead = entries.EntriesReadAhead.add

        def kill_mid_run(self, receipt):
            # The fifth receipt in: worker 0 is killed from the run's own receipt loop,
            # so the run cannot end before it (a thread watching the store could be
            # outrun by the whole job).
            read_ahead(self, receipt)
            heard.append(receipt.index)
            if len(heard) == 5:
                remote.cluster.kill_worker(0)
                parts_at_kill.append(len(remote.keys("faulted/cubes/manifest/")))

        monkeypatch.setattr(entries.EntriesReadAhead, "add", kill_mid_run)
        summary = run_job(faulted.build(), faulted.options, client, echo=lambda m: None)
        assert parts_at_kill and parts_at_kill[0] < 150, "the worker was not killed mid-run"
        assert not remote.cluster.workers[0].alive()
        assert len(client.scheduler_info()["workers"]) == 1
    assert summary.complete and summary.units_failed == 0
    s3 = remote.s3()
    manifests = [
        s3.get_object(Bucket=BUCKET, Key=f"{p}/cubes/manifest.parquet")["Body"].read()
        for p in ("clean", "faulted")
    ]
    assert cube_manifest(manifests[0]).equals(cube_manifest(manifests[1]))
    import pyarrow.parquet as pq

    ids = pq.read_table(io.BytesIO(manifests[1]))["cube_id"].to_pylist()
    assert ids == list(range(600))
    assert sorted(map(unnamed, remote.keys("faulted/cubes/shards/"))) == sorted(
        unnamed(k.replace("clean/", "faulted/")) for k in remote.keys("clean/cubes/shards/")
    )
    remote.cluster.add_worker("w2", env=remote.env)
    remote.cluster.wait_for_workers(2)


def test_map_code_is_shipped_to_the_workers_and_its_hash_guards_resume(remote, tmp_path):
    # A module only the driver's folder has: the workers get it from `code`.
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    (jobs / "shipped_fns.py").write_text("def triple(x):\n    return {'y': 3 * x}\n")
    job = jobs / "shipped.toml"
    job.write_text(
        'workload = "map"\nfunction = "shipped_fns:triple"\ncode = "'
        + str(jobs / "shipped_fns.py")
        + '"\n[grid]\nx = [1, 2, 3, 4, 5, 6]\n'
    )
    out = f"s3://{BUCKET}/map1"
    # Without `code`, the workers cannot import it: said before any task runs.
    bare = jobs / "bare.toml"
    bare.write_text(job.read_text().replace("code =", "# code ="))
    unshipped = pipeline_cli(["run", bare, "--output", f"s3://{BUCKET}/map0", "--no-progress",
                              *remote.driver_flags], remote.env)  # fmt: skip
    assert unshipped.returncode == 1
    assert "workers cannot import the function" in unshipped.stderr, unshipped.stderr
    assert "No module named 'shipped_fns'" in unshipped.stderr
    assert "points in" not in unshipped.stdout  # no task ran

    args = ["run", job, "--output", out, "--no-progress", *remote.driver_flags]
    proc = pipeline_cli([*args, "--report", tmp_path / "report"], remote.env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "6 of 6 points" in proc.stdout
    # The code went out (a round trip to every worker) in the cluster's start, beside
    # the input checks: the run's clock starts with it on the workers.
    summary = json.loads((tmp_path / "report" / "shipped-summary.json").read_text())
    assert summary["startup"]["cluster set-up"] > 0, summary["startup"]
    shown = pipeline_cli(["results", out], remote.env)
    assert "table 'results', 6 rows" in shown.stdout, shown.stderr
    ok = pipeline_cli(["verify", out], remote.env)
    assert ok.returncode == 0, ok.stdout

    # A worker that joins later gets the code too.
    late = remote.cluster.add_worker("late")
    remote.cluster.wait_for_workers(3)
    from distributed import Client

    with Client(remote.cluster.address, security=remote.cluster.security(), timeout=30) as c:
        addresses = [a for a, info in c.scheduler_info()["workers"].items()
                     if info.get("name") == "late"]  # fmt: skip
        found = c.run(lambda: __import__("shipped_fns").triple(2), workers=addresses)
    assert list(found.values()) == [{"y": 6}]
    late.stop()

    # Changed code: resuming is refused (its hash is part of the job's settings).
    (jobs / "shipped_fns.py").write_text("def triple(x):\n    return {'y': 30 * x}\n")
    refused = pipeline_cli(args, remote.env)
    assert refused.returncode == 1
    assert "other settings (code" in refused.stderr and "--overwrite" in refused.stderr


def test_shipped_package_and_folder_of_modules_run_their_current_code(remote, tmp_path):
    # A package whose helper module changes between runs: the rerun's results come from
    # the new code, not from the modules the workers imported the first time.
    pkg = tmp_path / "lib" / "shippedpkg"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(
        "from .helpers import sq\n\ndef fn(x):\n    return {'y': sq(x)}\n"
    )
    (pkg / "helpers.py").write_text("def sq(x):\n    return x * x\n")
    out = f"s3://{BUCKET}/shippedpkg"
    args = ["run", "--workload", "map", "--function", "shippedpkg:fn", "--code", pkg,
            "--grid", '{"x": [1, 2, 3]}', "--output", out, "--name", "pkg", "--no-progress",
            *remote.driver_flags]  # fmt: skip

    def ys() -> list:
        shown = pipeline_cli(["results", out, "--job", "pkg", "--out", tmp_path / "r.csv"],
                             remote.env)  # fmt: skip
        assert shown.returncode == 0, shown.stderr
        return [int(line.split(",")[-1]) for line in (tmp_path / "r.csv").read_text().split()[1:]]

    first = pipeline_cli(args, remote.env)
    assert first.returncode == 0, first.stdout + first.stderr
    assert ys() == [1, 4, 9]
    (pkg / "helpers.py").write_text("def sq(x):\n    return -x\n")
    again = pipeline_cli([*args, "--overwrite"], remote.env)
    assert again.returncode == 0, again.stdout + again.stderr
    assert ys() == [-1, -2, -3]

    # A folder of modules (not a package) imports on the workers as on the driver, not
    # on the nannies' import path only.
    mods = tmp_path / "mods"
    mods.mkdir()
    (mods / "modfn.py").write_text(
        "from modhelper import inc\n\ndef fn(x):\n    return {'y': inc(x)}\n"
    )
    (mods / "modhelper.py").write_text("def inc(x):\n    return x + 1\n")
    ran = pipeline_cli(["run", "--workload", "map", "--function", "modfn:fn", "--code", mods,
                        "--grid", '{"x": [1, 2, 3]}', "--output", out, "--name", "mods",
                        "--no-progress", *remote.driver_flags], remote.env)  # fmt: skip
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert "3 of 3 points" in ran.stdout
