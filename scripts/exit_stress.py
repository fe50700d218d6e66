"""Exit statuses of ``pipeline results`` and ``pipeline verify``, many calls of each form.

Makes a finished job of each workload that writes tables or shards (map, regressions,
cubes) with this checkout's code, in a local folder and, with ``--s3``, on a SeaweedFS
S3 server on loopback (``harness/seaweedfs.py``); then runs every command form
(``results OUT``, ``results OUT --out F``, ``verify OUT``) ``--calls`` times, each a
process of this interpreter (``python -m pipeline``), ``--parallel`` at a time, and
counts their exit statuses per form: the expected one (0; 1 for ``results`` of a cubes
job, which has no table), an abort (SIGABRT: -6, or 134 through a shell), a
segmentation fault (-11 / 139), anything else. Exits 1 if any call ended otherwise than
expected.

``--source DIR`` (a tree holding a ``pipeline`` package) or ``--git-ref REF`` (that
commit's ``pipeline/``, taken with ``git archive``) runs the commands with that code
instead (on PYTHONPATH), to measure an older version on the same outputs.

``--widen-us US`` widens the race (a measuring aid: a rare abort becomes a near-certain
one, the same in kind): ``scripts/exit_widen.c``, compiled with ``gcc`` and loaded with
LD_PRELOAD, delays by US microseconds every request for the GIL from a thread other
than the main one, so that a pyarrow pool thread that takes the GIL after its call
returned does so while the interpreter finalizes.

    nice -n 15 .venv/bin/python scripts/exit_stress.py --calls 1000 --s3
    nice -n 15 .venv/bin/python scripts/exit_stress.py --calls 20 --widen-us 50000 \\
        --git-ref 7b94501^
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WIDEN_SOURCE = Path(__file__).with_name("exit_widen.c")

FITS = """import numpy as np


def fit_one(alpha, n, seed):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=n)
    y = alpha * x + rng.normal(size=n)
    slope = float(np.polyfit(x, y, 1)[0])
    return {"slope": slope, "error": slope - alpha}
"""
GRID = """workload = "map"
function = "fits:fit_one"
name = "grid"
seed = 7
[grid]
alpha = [0.5, 1.0, 2.0]
n = [100, 1000, 10000]
"""


#: ``python -m pipeline`` with the finalization hold of --widen-us imported first.
HELD = (
    "import runpy, sys; sys.path.insert(0, sys.argv.pop(1)); import exit_widen_hold; "
    "sys.argv[0] = 'pipeline'; runpy.run_module('pipeline', run_name='__main__', alter_sys=True)"
)


def _pipeline(args: list[str], env: dict, cwd: Path, timeout: float = 600):
    start = ["-m", "pipeline"]
    if "LD_PRELOAD" in env:
        start = ["-c", HELD, str(WIDEN_SOURCE.parent)]
    return subprocess.run(
        [sys.executable, *start, *args],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip


def _checked(done: subprocess.CompletedProcess, what: str) -> None:
    if done.returncode != 0:
        sys.exit(f"{what} failed (exit {done.returncode}):\n{done.stderr[-3000:]}")


def make_outputs(work: Path, base: str, env: dict) -> dict[str, str]:
    """A finished map, regressions and cubes job under ``base`` (a folder or s3://); those
    a previous call in the same --workdir made are kept."""
    outputs = {w: f"{base}/{w}" for w in ("map", "regressions", "cubes")}
    made = work / f"made-{base.replace('/', '_')}"
    if made.exists():
        return outputs
    (work / "fits.py").write_text(FITS)
    (work / "grid.toml").write_text(GRID)
    data = work / "regressions-data"
    if not data.exists():
        _checked(_pipeline(["data", "regressions", "--chunks", "200", "--rows", "50",
                            "--features", "3", "--out", str(data), "--seed", "0"],
                           env, work), "pipeline data regressions")  # fmt: skip
    common = ["--workers", "2", "--no-progress", "--overwrite"]
    runs = {
        "map": ["run", "grid.toml", "--output", outputs["map"]],
        "regressions": ["run", "--workload", "regressions", "--name", "regressions",
                        "--data", str(data), "--formula", "y ~ x1 + x2 + x3",
                        "--chunk-by", "chunk", "--output", outputs["regressions"]],
        "cubes": ["run", "--workload", "cubes", "--name", "cubes", "--cubes", "20",
                  "--dim", "20", "--output", outputs["cubes"]],
    }  # fmt: skip
    for workload, args in runs.items():
        _checked(_pipeline([*args, *common], env, work), f"the {workload} job")
    made.touch()
    return outputs


def command_forms(outputs: dict[str, str], where: str, scratch: Path):
    """(name, arguments, expected exit status) of each form on each output."""
    forms = []
    for workload, out in outputs.items():
        table = 1 if workload == "cubes" else 0  # a cubes job has no table, said with exit 1
        to = scratch / f"{where}-{workload}.parquet"
        forms += [
            (f"{where} results {workload}", ["results", out], table),
            (f"{where} results {workload} --out F", ["results", out, "--out", str(to)], table),
            (f"{where} verify {workload}", ["verify", out], 0),
        ]
    return forms


def classify(code: int, expected: int) -> str:
    if code == expected:
        return "expected"
    if code in (-6, 134):
        return "abort"
    if code in (-11, 139):
        return "segfault"
    return f"signal {-code}" if code < 0 else f"exit {code}"


def s3_environment(work: Path):
    """A SeaweedFS server, a bucket, and the environment that points the pipeline at it."""
    sys.path.insert(0, str(ROOT))
    from harness.seaweedfs import ADMIN, REGION, SeaweedS3

    server = SeaweedS3().start()
    server.client(ADMIN).create_bucket(Bucket="exit-stress")
    env = {
        "AWS_ACCESS_KEY_ID": ADMIN.key_id,
        "AWS_SECRET_ACCESS_KEY": ADMIN.secret,
        "AWS_DEFAULT_REGION": REGION,
        "AWS_CONFIG_FILE": "/nonexistent/aws-config",
        "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent/aws-credentials",
        "AWS_EC2_METADATA_DISABLED": "true",
        "PIPELINE_S3_ENDPOINT_URL": server.endpoint,
        "NO_PROXY": "127.0.0.1,localhost",
    }
    return server, env


def source_tree(args, work: Path) -> str | None:
    if args.git_ref:
        tree = work / "source"
        shutil.rmtree(tree, ignore_errors=True)
        tree.mkdir()
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", args.git_ref, "pipeline"],
                                 capture_output=True, check=True).stdout  # fmt: skip
        subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
        return str(tree)
    return str(Path(args.source).resolve()) if args.source else None


def widen_library(us: int, work: Path) -> str:
    lib = work / "exit_widen.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-O2", "-o", str(lib), str(WIDEN_SOURCE), "-ldl"],
                   check=True)  # fmt: skip
    return str(lib)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--calls", type=int, default=100, help="calls of each form")
    p.add_argument("--parallel", type=int, default=os.cpu_count() or 1)
    p.add_argument("--s3", action="store_true", help="also on SeaweedFS S3")
    p.add_argument("--no-local", action="store_true", help="only on S3")
    p.add_argument("--source", help="run the commands with the pipeline package of DIR")
    p.add_argument("--git-ref", help="run the commands with this commit's pipeline/")
    p.add_argument("--widen-us", type=int, default=0,
                   help="widen the race: delay other threads' GIL requests by US µs")  # fmt: skip
    p.add_argument("--workdir", help="where outputs go (kept; default: a temporary one)")
    p.add_argument("--json", help="write the counts here")
    p.add_argument("--workloads", default="map,regressions,cubes",
                   help="the jobs whose outputs the commands read (comma-separated)")  # fmt: skip
    args = p.parse_args()

    work = Path(args.workdir or tempfile.mkdtemp(prefix="exit-stress-")).resolve()
    work.mkdir(parents=True, exist_ok=True)
    base_env = {k: v for k, v in os.environ.items() if not k.startswith(("PIPELINE_", "AWS_"))}
    base_env.pop("PYTHONPATH", None)
    server = None
    try:
        forms, envs = [], {}
        if not args.no_local:
            outputs = make_outputs(work, str(work / "local"), base_env)
            for form in command_forms(outputs, "local", work):
                forms.append(form)
                envs[form[0]] = base_env
        if args.s3:
            server, s3_env = s3_environment(work)
            env = {**base_env, **s3_env}
            outputs = make_outputs(work, "s3://exit-stress/out", env)
            for form in command_forms(outputs, "s3", work):
                forms.append(form)
                envs[form[0]] = env
        measured = {}
        source = source_tree(args, work)
        if source:
            measured["PYTHONPATH"] = source
        if args.widen_us:
            measured["LD_PRELOAD"] = widen_library(args.widen_us, work)
            measured["WIDEN_US"] = str(args.widen_us)
        probe = subprocess.run(
            [sys.executable, "-c", "import pipeline; print(pipeline.__file__)"],
            env={**base_env, **measured}, cwd=work, capture_output=True, text=True, check=True,
        )  # fmt: skip
        print(f"commands run {probe.stdout.strip()}"
              + (f", GIL requests of other threads delayed {args.widen_us} µs"
                 if args.widen_us else ""), flush=True)  # fmt: skip

        def call(form):
            name, argv, expected = form
            t0 = time.perf_counter()
            done = _pipeline(argv, {**envs[name], **measured}, work)
            outcome = classify(done.returncode, expected)
            return name, outcome, done.stderr[-400:], time.perf_counter() - t0

        wanted = set(args.workloads.split(","))
        forms = [f for f in forms if f[0].split()[2] in wanted]
        jobs = [f for f in forms for _ in range(args.calls)]
        counts = {name: Counter() for name, _, _ in forms}
        examples: dict[tuple[str, str], str] = {}
        t0 = time.perf_counter()
        with ThreadPoolExecutor(args.parallel) as pool:
            for done, (name, outcome, stderr, _s) in enumerate(pool.map(call, jobs), 1):
                counts[name][outcome] += 1
                if done % 100 == 0:  # a tally as it goes: a run stopped early still says
                    bad = sum(n for c in counts.values() for k, n in c.items() if k != "expected")
                    print(f"{done} of {len(jobs)} calls, {bad} not as expected", flush=True)
                if outcome != "expected":
                    examples.setdefault((name, outcome), stderr)
        wall = time.perf_counter() - t0
    finally:
        if server is not None:
            server.stop()

    width = max(len(n) for n in counts)
    print(f"{'form':{width}}  calls  expected  abort  segfault  other")
    for name, c in counts.items():
        other = sum(v for k, v in c.items() if k not in ("expected", "abort", "segfault"))
        print(f"{name:{width}}  {sum(c.values()):5}  {c['expected']:8}  {c['abort']:5}  "
              f"{c['segfault']:8}  {other:5}")  # fmt: skip
    bad = {n: dict(c) for n, c in counts.items() if set(c) != {"expected"}}
    total = sum(sum(c.values()) for c in counts.values())
    verdict = "every one as expected" if not bad else "NOT as expected: " + json.dumps(bad)
    print(f"{total} calls in {wall:.0f} s; {verdict}")
    for (name, outcome), stderr in examples.items():
        print(f"--- {name}: {outcome}, stderr ends:\n{stderr}")
    if args.json:
        Path(args.json).write_text(json.dumps({
            "calls_per_form": args.calls, "source": source, "widen_us": args.widen_us,
            "counts": {n: dict(c) for n, c in counts.items()}, "wall_seconds": wall,
        }, indent=1))  # fmt: skip
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
