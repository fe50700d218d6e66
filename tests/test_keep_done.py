"""A fix to a job's code keeps what is done (``--keep-done``): only failed and missing
units run with the new code, the manifest records which code made each task, and
``pipeline results`` and ``verify`` tell them apart. The default stays a refusal that
names the option."""

from __future__ import annotations

import functools
import importlib.util
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import support.stored as stored
from support.regression_fits import FORMULA, panel, write

from pipeline import ConfigError, RunOptions, run_job
from pipeline.results import results_table
from pipeline.verify import verify_output
from pipeline.workloads.regressions import RegressionJob, RegressionWorkload

#: The user's function before the fix: every 7th point from 3 on raises. Each call
#: leaves a file, so the test counts calls per point.
BROKEN = """
import os, uuid

def fit(x, calls):
    open(os.path.join(calls, f"{x}-{uuid.uuid4().hex}"), "w").close()
    if x % 7 == 3:
        raise ValueError(f"bug at {x}")
    return {"y": 2 * x}
"""
FIXED = BROKEN.replace('    if x % 7 == 3:\n        raise ValueError(f"bug at {x}")\n', "")
FAILING = [3, 10, 17]


def _pipeline(*args, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pipeline", *map(str, args)],
                          capture_output=True, text=True, timeout=300, cwd=cwd)  # fmt: skip


def _calls(folder: Path) -> list[int]:
    return sorted(int(p.name.split("-")[0]) for p in folder.iterdir())


def _code(path: Path) -> list[str]:
    return pq.read_table(path).column("code").to_pylist()


def test_a_fixed_function_keeps_the_units_done_and_runs_the_rest(tmp_path):
    jobs, calls, out = tmp_path / "jobs", tmp_path / "calls", tmp_path / "out"
    jobs.mkdir()
    calls.mkdir()
    (jobs / "flaky_fns.py").write_text(BROKEN)
    (jobs / "flaky.toml").write_text(textwrap.dedent(f"""
        workload = "map"
        function = "flaky_fns:fit"
        [grid]
        x = {{start = 0, stop = 20}}
        calls = [{str(calls)!r}]
    """))  # fmt: skip
    run = ("run", jobs / "flaky.toml", "--output", out, "--workers", "1", "--units-per-task", 4)
    first = _pipeline(*run, cwd=tmp_path)
    assert first.returncode != 0 and "17 of 20 points" in first.stdout, first
    assert _calls(calls) == list(range(20))
    job = out / "flaky"
    # A run stopped before task 3 (units 12..15) wrote its entry: those units are missing.
    (job / "manifest" / "part-000003.parquet").unlink()
    (job / "manifest.parquet").unlink(missing_ok=True)
    kept_part = stored.part(job / "results", 1).read_bytes()  # no failure in it
    old_code = _code(job / "manifest" / "part-000001.parquet")[0]

    (jobs / "flaky_fns.py").write_text(FIXED)
    refused = _pipeline(*run, cwd=tmp_path)
    assert refused.returncode != 0
    said = refused.stderr
    assert "other settings (function_source)" in said and "--keep-done" in said, said
    assert _calls(calls) == list(range(20))  # refused before any call

    kept = _pipeline(*run, "--keep-done", cwd=tmp_path)
    assert kept.returncode == 0, kept.stderr
    assert "complete" in kept.stdout, kept.stdout
    again = sorted([*FAILING, 12, 13, 14, 15])
    assert _calls(calls) == sorted([*range(20), *again])  # failed and missing units alone
    assert stored.part(job / "results", 1).read_bytes() == kept_part
    assert not (job / "failures").exists() or not list((job / "failures").iterdir())

    record = json.loads((job / "job.json").read_text())
    (new_code,) = set(record["code_versions"]) - {old_code}
    assert set(record["code_versions"]) == {old_code, new_code}
    codes = dict(zip(*(pq.read_table(job / "manifest.parquet").column(c).to_pylist()
                       for c in ("unit_start", "code")), strict=False))  # fmt: skip
    both = "+".join(sorted([old_code, new_code]))
    assert codes == {0: both, 4: old_code, 8: both, 12: new_code, 16: both}, codes

    # The rows are those a clean run of the fixed function gives.
    rows = results_table(str(out)).to_pydict()
    assert rows["x"] == list(range(20)) and rows["y"] == [2 * x for x in range(20)]
    (check,) = verify_output(str(out))
    assert check.ok, check
    assert check.code_versions == {old_code: 1, new_code: 1, both: 3}
    shown = _pipeline("verify", out, cwd=tmp_path)
    assert shown.returncode == 0, shown.stdout
    assert f"code versions: tasks 3 by {old_code} and {new_code} (rows of both)" in shown.stdout
    assert f"1 by {new_code}" in shown.stdout and f"1 by {old_code}" in shown.stdout
    assert results_table(str(out), code=new_code[:8]).column("x").to_pylist() == [
        *range(4), *range(8, 20)
    ]  # fmt: skip
    assert results_table(str(out), code=old_code).column("x").to_pylist() == [
        *range(12), *range(16, 20)
    ]  # fmt: skip
    only_new = _pipeline("results", out, "--code", new_code, cwd=tmp_path)
    assert "16 rows" in only_new.stdout, only_new.stdout + only_new.stderr
    unknown = _pipeline("results", out, "--code", "ffff", cwd=tmp_path)
    assert unknown.returncode != 0 and "no task made by code version 'ffff'" in unknown.stderr

    # The new code is the job's now: the same command, without the option, is complete.
    plain = _pipeline(*run, cwd=tmp_path)
    assert plain.returncode == 0 and "complete" in plain.stdout, plain.stdout + plain.stderr
    assert len(_calls(calls)) == 20 + len(again)


def test_keep_done_from_python_and_a_changed_meaning_still_refused(tmp_path, client):
    import pipeline

    calls = tmp_path / "calls"
    calls.mkdir()
    load = functools.partial(_fit_of, tmp_path / "fitmod.py")
    grid = {"x": list(range(8)), "calls": [str(calls)]}
    common = {"grid": grid, "output": str(tmp_path / "out"), "name": "fit", "client": client,
              "progress": False, "units_per_task": 4}  # fmt: skip
    first = pipeline.map(load(BROKEN), **common)
    assert first.units_failed == 1
    fixed = {"fit": load(FIXED)}
    with pytest.raises(ConfigError, match=r"function_source.*keep_done=True from Python"):
        pipeline.map(fixed["fit"], **common)
    with pytest.raises(
        ConfigError, match=r"\(function_source, seed\); use --overwrite.*only the code differs"
    ):
        pipeline.map(fixed["fit"], seed=4, keep_done=True, **common)
    second = pipeline.map(fixed["fit"], keep_done=True, **common)
    assert second.complete and second.units_run == 1 and second.units_failed == 0
    assert _calls(calls) == sorted([*range(8), 3])


def test_keep_done_on_a_complete_job_records_the_new_code(tmp_path, client):
    """It said the job complete, without recording the new code: the same command
    without --keep-done was refused again, each time."""
    import pipeline

    calls = tmp_path / "calls"
    calls.mkdir()
    load = functools.partial(_fit_of, tmp_path / "fitmod.py")
    grid = {"x": list(range(8)), "calls": [str(calls)]}
    common = {"grid": grid, "output": str(tmp_path / "out"), "name": "fit", "client": client,
              "progress": False, "units_per_task": 4, "verbose": 0}  # fmt: skip
    assert pipeline.map(load(FIXED), **common).complete
    edited = load(FIXED.replace("def fit(x, calls):\n", 'def fit(x, calls):\n    """Doc."""\n'))
    with pytest.raises(ConfigError, match=r"other settings \(function_source\)"):
        pipeline.map(edited, **common)
    kept = pipeline.map(edited, keep_done=True, **common)
    assert kept.complete and kept.units_run == 0
    again = pipeline.map(edited, **common)
    assert again.complete and again.units_run == 0
    assert _calls(calls) == list(range(8))
    record = json.loads((tmp_path / "out" / "fit" / "job.json").read_text())
    assert len(record["code_versions"]) == 2
    (check,) = verify_output(str(tmp_path / "out"))
    assert check.ok and len(check.code_versions) == 1  # (every task by the first code)


def _fit_of(source, text: str):
    """``fit`` of a module of the test's own, written to ``source`` (not in sys.modules:
    its function travels by value)."""
    source.write_text(text)
    spec = importlib.util.spec_from_file_location("fitmod", source)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.fit


def _regressions(data, engine: str, **settings) -> RegressionWorkload:
    job = RegressionJob(data=data, formula=FORMULA, chunk_by="chunk", engine=engine, **settings)
    return RegressionWorkload(job, "reg")


def test_a_regression_job_resumes_with_another_engine_not_another_model(tmp_path, client):
    data = write(panel(chunks=8), tmp_path / "data")
    out = tmp_path / "out"

    def options(**more) -> RunOptions:
        return RunOptions(output=str(out), units_per_task=2, progress=False, **more)

    quiet = {"echo": lambda m: None}
    first = run_job(_regressions(data, "statsmodels"), options(), client, **quiet)
    assert first.complete
    job = out / "reg"
    kept = {p.name: p.read_bytes() for p in (job / "coefficients").iterdir()}
    (job / "manifest" / "part-000002.parquet").unlink()  # task 2's chunks: missing
    (job / "manifest.parquet").unlink()
    with pytest.raises(ConfigError, match=r"other settings \(engine\).*--keep-done"):
        run_job(_regressions(data, "auto"), options(), client, **quiet)
    with pytest.raises(
        ConfigError, match=r"\(cov_type, engine\).*differs \(engine\), not cov_type"
    ):
        run_job(_regressions(data, "auto", cov_type="HC1"), options(keep_done=True), client,
                **quiet)  # fmt: skip
    second = run_job(_regressions(data, "auto"), options(keep_done=True), client, **quiet)
    assert second.complete and second.units_run == 2 and second.units_skipped == 6, second
    for name, data_bytes in kept.items():
        if stored.unnamed(name) != "part-000002.parquet":  # (task 2 ran again)
            assert (job / "coefficients" / name).read_bytes() == data_bytes, name
    models = results_table(str(out), "models").to_pandas()
    assert sorted(set(models.engine)) == ["batched", "statsmodels"]
    assert set(models[models.chunk_id.isin([4, 5])].engine) == {"batched"}
    (check,) = verify_output(str(out))
    assert check.ok and sorted(check.code_versions.values()) == [1, 3], check


def test_a_plugins_own_code_setting_keeps_the_tasks_done(tmp_path, client):
    from support.workloads import VersionedWorkload

    options = RunOptions(output=str(tmp_path), units_per_task=2, progress=False)
    quiet = {"echo": lambda m: None}
    first = run_job(VersionedWorkload("v", 10, "1.0", fail=[3]), options, client, **quiet)
    assert not first.complete and first.units_failed == 1
    fixed = VersionedWorkload("v", 10, "1.1")
    with pytest.raises(ConfigError, match=r"other settings \(version\); use --keep-done"):
        run_job(fixed, options, client, **quiet)
    keep = RunOptions(output=str(tmp_path), units_per_task=2, progress=False, keep_done=True)
    second = run_job(VersionedWorkload("v", 10, "1.1"), keep, client, **quiet)
    assert second.complete and second.units_run == 2 and second.units_skipped == 8, second
    (check,) = verify_output(str(tmp_path))
    assert check.ok and sorted(check.code_versions.values()) == [1, 4], check
    entry = pq.read_table(tmp_path / "v" / "manifest" / "part-000001.parquet")
    (made,) = set(entry.column("code").to_pylist())
    assert check.code_versions[made] == 1
