"""``pipeline results`` and ``pipeline verify`` start no native thread that outlives
their work.

A thread of pyarrow's pools that is still running as the interpreter finalizes and then
needs the GIL (to release a Python object its task holds: the bytes a parquet file was
read from, wrapped in a ``PyBuffer``) is ended by Python with ``pthread_exit``, whose
unwinding through Arrow's ``noexcept`` frames aborts the process ("terminate called
without an active exception", exit 134) after the command's work is done
(``scripts/exit_stress.py --widen-us`` reproduces it). A command that converts and
reads on its calling thread starts no such thread. Each command form runs in a
subprocess that lists its threads (``/proc/self/task``) after the command returned,
before the interpreter finalizes: none may be new beyond those the imports start
(OpenBLAS's, jemalloc's).
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from support.cube_jobs import cube_job
from support.cube_jobs import run as run_cubes
from support.map_jobs import FN
from support.map_jobs import run as run_map

import pipeline
from pipeline import RunOptions, run_job
from pipeline.workloads.regressions import RegressionJob, RegressionWorkload

#: Runs ``pipeline ARGS...`` in this process and writes the threads it left to
#: $THREAD_CENSUS: the modules the commands load start their own threads at import
#: (OpenBLAS's workers, jemalloc's), which are the baseline.
CENSUS = r"""
import json, os, sys

import numpy, pandas, pyarrow, pyarrow.compute, pyarrow.parquet  # noqa: F401

def tasks():
    return set(os.listdir("/proc/self/task"))

before = tasks()
from pipeline.cli import main

sys.argv = ["pipeline", *sys.argv[1:]]
try:
    main()
    code = 0
except SystemExit as exc:
    code = exc.code if isinstance(exc.code, int) else 1
new = {}
for t in sorted(tasks() - before):
    try:
        new[t] = open(f"/proc/self/task/{t}/comm").read().strip()
    except OSError:
        pass  # ended meanwhile
with open(os.environ["THREAD_CENSUS"], "w") as f:
    json.dump({"code": code, "new_threads": new}, f)
"""


@pytest.fixture(scope="module")
def outputs(tmp_path_factory, client, frames_dir) -> dict[str, Path]:
    """A finished job of each built-in workload that writes tables or shards."""
    root = tmp_path_factory.mktemp("outputs")
    run_map(client, root / "map", function=f"{FN}:power", grid={"x": list(range(12))})
    data = root / "data"
    data.mkdir()
    frame = pd.DataFrame(
        {
            "chunk": [c for c in range(6) for _ in range(20)],
            "x1": [float((7 * i) % 13) for i in range(120)],
            "y": [float((5 * i) % 11) for i in range(120)],
            "sector": [("a", "b", "c")[i % 3] for i in range(120)],
        }
    )
    pq.write_table(pa.Table.from_pandas(frame, preserve_index=False), data / "p.parquet")
    w = RegressionWorkload(RegressionJob(data=str(data), formula="y ~ x1", chunk_by="chunk"), "reg")
    opts = RunOptions(output=str(root / "regressions"), units_per_task=2, progress=False)
    assert run_job(w, opts, client, echo=lambda m: None).complete
    assert run_cubes(cube_job(root / "cubes", frames_dir), client).complete
    return {"map": root / "map", "regressions": root / "regressions", "cubes": root / "cubes"}


def _forms(outputs: dict, scratch: Path) -> list[tuple[str, list[str], int]]:
    """(name, arguments, expected exit status) of every command form: a cubes job has no
    table (its index is the manifest), which ``results`` says with exit 1."""
    forms = []
    for workload, out in outputs.items():
        table = 1 if workload == "cubes" else 0
        to = scratch / f"{workload}.parquet"
        forms += [
            (f"results {workload}", ["results", str(out)], table),
            (f"results {workload} --out", ["results", str(out), "--out", str(to)], table),
            (f"verify {workload}", ["verify", str(out)], 0),
        ]
    return forms


def test_results_and_verify_leave_no_thread_running_at_exit(outputs, tmp_path):
    assert _threads_left(_forms(outputs, tmp_path), tmp_path) == {}


def test_results_and_verify_of_s3_outputs_leave_no_thread_running_at_exit(
    outputs, tmp_path, s3, s3_bucket
):
    # The same outputs, copied object for object into the bucket (the S3 store's
    # client and its threads are what differs).
    bucket, prefix = s3_bucket.removeprefix("s3://").split("/", 1)
    client, on_s3 = s3.client(), {}
    for workload, out in outputs.items():
        for path in out.rglob("*"):
            if path.is_file():
                key = f"{prefix}/{workload}/{path.relative_to(out)}"
                client.put_object(Bucket=bucket, Key=key, Body=path.read_bytes())
        on_s3[workload] = f"{s3_bucket}/{workload}"
    assert _threads_left(_forms(on_s3, tmp_path), tmp_path) == {}


def _threads_left(forms, tmp_path) -> dict:
    """Each form's threads left running after the command, where it left any."""
    left = {}
    for name, args, expected in forms:
        census = tmp_path / "census.json"
        done = subprocess.run(
            [sys.executable, "-c", CENSUS, *args],
            capture_output=True,
            text=True,
            timeout=300,
            env={**os.environ, "THREAD_CENSUS": str(census)},
        )
        assert done.returncode == 0, (name, done.stderr[-2000:])
        found = json.loads(census.read_text())
        assert found["code"] == expected, (name, done.stdout[-1000:], done.stderr[-2000:])
        if found["new_threads"]:
            left[name] = found["new_threads"]
        census.unlink()
    return left


def test_every_conversion_to_pandas_in_the_package_runs_on_the_calling_thread():
    # to_pandas() converts columns on pyarrow's CPU pool unless told not to; a worker
    # process is one thread anyway, and a command must start no pool thread (above).
    package = Path(pipeline.__file__).parent
    threaded = []
    for path in sorted(package.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "to_pandas"
            ):
                kw = {k.arg: k.value for k in node.keywords}
                off = kw.get("use_threads")
                if not (isinstance(off, ast.Constant) and off.value is False):
                    threaded.append(f"{path.relative_to(package)}:{node.lineno}")
    assert threaded == []
