"""Issue 45 point 5's figures for a git ref and the working tree, side by side in one run:
the driver's tasks as joblib calls on the ``pipeline`` backend must make none worse.

For each figure, rounds alternate the two trees (before, after, before, after, ...),
each in a process of its own with its tree's ``pipeline`` first on the import path
(the same virtualenv: this interpreter):

- ``cubes``: ``pipeline run --sink none`` cubes/s (benchmarks/bench_cubes.py's (d):
  ``--cubes`` cubes of ``--dim``, one frames folder shared by both);
- ``regressions``: ``benchmarks/bench_regressions.py --case default``: the runner's
  fits/s, statsmodels engine (c) and engine auto (d'), and each run against its loop
  measured beside it: (c)/(b) and (d')/(d), the batched engine serially (targets
  0.85 and 0.6);
- ``map``: ``benchmarks/bench_map.py --units N``: units/s over the whole command and
  the driver's peak RSS (bars: >= 100,000 units/s, <= 2 GB at 10,000,000 units);
- ``fleet``: ``benchmarks/fleet/scale-sim --workers N --planned``: the job's
  efficiency against the ideal (bar: >= 0.8 at 500 workers).

::

    python -m benchmarks.bench_joblib_path --before main            # the issue's sizes
    python -m benchmarks.bench_joblib_path --before main --small    # a quick check
    python -m benchmarks.bench_joblib_path --before main --figures map,fleet --rounds 3

Prints each round's figures, then per figure the best of each side and after/before.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: The issue's sizes, and a quick check's.
SIZES = {
    "full": {"dim": 100, "cubes": 20_000, "chunks": None, "units": 10_000_000, "fleet": 500},
    "small": {"dim": 20, "cubes": 2_000, "chunks": 400, "units": 200_000, "fleet": 20},
}

CUBES = """
import json, sys
from pathlib import Path
from benchmarks.bench_cubes import runner
frames, dim, n, out, workers = sys.argv[1:]
r = runner(Path(frames), int(dim), int(n), "none", Path(out), int(workers))
print("FIGURES", json.dumps({"cubes/s": r["cubes_per_s"], "tasks": r["tasks"]}))
"""


def run_in(tree: Path, command: list[str], timeout: float) -> str:
    """``command`` run in ``tree`` with its ``pipeline`` first; its stdout (raises on
    failure, with its stderr's end)."""
    env = dict(os.environ, PYTHONPATH=str(tree), PYTHON=sys.executable)
    done = subprocess.run(command, cwd=tree, env=env, capture_output=True, text=True,
                          timeout=timeout, check=False)  # fmt: skip
    if done.returncode:
        raise SystemExit(f"{' '.join(command)} in {tree} exited {done.returncode}:\n"
                         f"{done.stderr[-3000:]}")  # fmt: skip
    return done.stdout


def cubes(tree: Path, args, size: dict, scratch: Path) -> dict:
    frames = scratch / "frames"
    if not frames.exists():
        from pipeline.storage import LocalStore
        from pipeline.workloads.cubes.frames import write_frames

        write_frames(LocalStore(frames), "", count=size["dim"], rows=1000, cols=1000, seed=0)
    out = scratch / f"out-{tree.name}"
    command = [sys.executable, "-c", CUBES, str(frames), str(size["dim"]), str(size["cubes"]),
               str(out), str(args.workers)]  # fmt: skip
    text = run_in(tree, command, args.timeout)
    shutil.rmtree(out, ignore_errors=True)
    return json.loads(text.split("FIGURES", 1)[1])


def regressions(tree: Path, args, size: dict, scratch: Path) -> dict:
    command = [sys.executable, "-m", "benchmarks.bench_regressions", "--case", "default",
               "--workers", str(args.workers)]  # fmt: skip
    if size["chunks"]:
        command += ["--chunks", str(size["chunks"])]
    text = run_in(tree, command, args.timeout)
    figures = {}
    for label, pattern in (("(c) fits/s", r"\(c\) runner, statsmodels engine\s+([\d.]+)"),
                           ("(d') fits/s", r"\(d'\) runner, engine auto\s+([\d.]+)"),
                           ("(c)/(b)", r"\(c\) / \(b\), paired: ([\d.]+)"),
                           ("(d')/(d)", r"\(d'\) / \(d\), paired: ([\d.]+)")):  # fmt: skip
        found = re.search(pattern, text)
        if found:
            figures[label] = float(found.group(1))
    return figures


def map_units(tree: Path, args, size: dict, scratch: Path) -> dict:
    command = [sys.executable, "-m", "benchmarks.bench_map", "--units", str(size["units"]),
               "--workers", str(args.workers)]  # fmt: skip
    text = run_in(tree, command, args.timeout)
    # the row: grid, units, wall, units/s, RSS MB, ...
    row = re.search(r"^\s*range\s+([\d,]+)\s+([\d.]+)s\s+([\d,]+)\s+([\d,]+)", text, re.M)
    if row is None:
        raise SystemExit(f"no figures in bench_map's output:\n{text}")
    return {"units/s": float(row.group(3).replace(",", "")),
            "driver RSS MB": float(row.group(4).replace(",", ""))}  # fmt: skip


def fleet(tree: Path, args, size: dict, scratch: Path) -> dict:
    out = scratch / f"fleet-{tree.name}.json"
    run_in(tree, [str(tree / "benchmarks" / "fleet" / "scale-sim"), "--workers",
                  str(size["fleet"]), "--planned", "--out", str(out)], args.timeout)  # fmt: skip
    figures = json.loads(out.read_text())
    return {"efficiency": figures["efficiency"]}


FIGURES = {"cubes": cubes, "regressions": regressions, "map": map_units, "fleet": fleet}
#: Figures where less is better (the rest: more is better).
LOWER_IS_BETTER = {"driver RSS MB"}
BARS = {"tasks": "(the plan: the same)", "units/s": ">= 100,000 (at 10,000,000 units)",
        "driver RSS MB": "<= 2,000",
        "efficiency": ">= 0.8 (at 500 workers)", "(c)/(b)": ">= 0.85",
        "(d')/(d)": ">= 0.6"}  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--before", required=True, help="the git ref to compare with (e.g. main)")
    p.add_argument("--figures", default=",".join(FIGURES), help="comma-separated")
    p.add_argument("--rounds", type=int, default=2, help="runs of each side, alternating")
    p.add_argument("--small", action="store_true", help="small sizes: a quick check")
    p.add_argument("--workers", type=int, default=os.cpu_count() or 2)
    p.add_argument("--timeout", type=float, default=3600.0, help="seconds per command")
    args = p.parse_args()
    size = SIZES["small" if args.small else "full"]
    names = args.figures.split(",")
    with tempfile.TemporaryDirectory(prefix="bench-joblib-path-") as tmp:
        scratch = Path(tmp)
        before = scratch / "before"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "-q",
                        str(before), args.before], check=True)  # fmt: skip
        trees = {"before": before, "after": ROOT}
        best: dict[str, dict[str, dict[str, float]]] = {}
        print(f"before = {args.before}, after = the working tree; {os.cpu_count()} cores, "
              f"load {os.getloadavg()[0]:.1f}; sizes {size}", flush=True)  # fmt: skip
        try:
            for name in names:
                for round_ in range(args.rounds):
                    for side, tree in trees.items():
                        t0 = time.perf_counter()
                        got = FIGURES[name](tree, args, size, scratch)
                        print(f"{name:<12} round {round_ + 1} {side:<6} "
                              f"({time.perf_counter() - t0:.0f} s): {got}", flush=True)  # fmt: skip
                        mine = best.setdefault(name, {}).setdefault(side, {})
                        for k, v in got.items():
                            pick = min if k in LOWER_IS_BETTER else max
                            mine[k] = pick(mine.get(k, v), v)
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force",
                            str(before)], check=False)  # fmt: skip
    print(f"\n{'figure':<28} {'before':>12} {'after':>12} {'after/before':>13}  bar")
    for name, sides in best.items():
        for k, v in sides.get("after", {}).items():
            b = sides.get("before", {}).get(k)
            ratio = f"{v / b:.3f}" if b else "n/a"
            print(f"{name + ' ' + k:<28} {b if b is not None else float('nan'):>12,.2f} "
                  f"{v:>12,.2f} {ratio:>13}  {BARS.get(k, 'no worse')}")  # fmt: skip


if __name__ == "__main__":
    main()
