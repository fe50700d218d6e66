"""The workload contract, for every registered workload: the built-ins, the example
plug-in (installed as a third party's package) and the tests' tiny workload.

Each gets the guarantees the runner gives any workload: the same job gives the same
bytes; a run interrupted part way and run again completes with a clean run's bytes;
a unit that fails is recorded and the run finishes; ``pipeline verify`` finds a
missing, a corrupt and an extra object, and with ``--repair`` a rerun mends them.
"""

from __future__ import annotations

import hashlib
import io
import json
import re

import pyarrow.parquet as pq
import pytest
from support.stored import unnamed

from pipeline import RunOptions, registry, run_job
from pipeline.errors import JobRunning, StorageError
from pipeline.layout import consolidated_manifest_key, lock_key, manifest_key
from pipeline.results import concat_parts, job_tables
from pipeline.storage import LocalStore
from pipeline.summary import summary_lines
from pipeline.verify import verify_output


def cubes(tmp, frames_dir, fail):
    settings = {"frames": str(frames_dir), "cubes": 24, "dim": 6, "cubes_per_shard": 4}
    if fail:  # a file where the shards' folder must go: writing them fails for real
        (tmp / "out" / "job").mkdir(parents=True)
        (tmp / "out" / "job" / "shards").write_text("not a folder")
    return settings


def regressions(tmp, frames_dir, fail):
    from pipeline.workloads.regressions import write_regression_data

    if not (tmp / "data").exists():
        write_regression_data(LocalStore(tmp / "data"), "", chunks=10, rows=30, features=2, seed=3)
    # 300 rows in chunks of 30, or of 37: then the last has 4 rows for 6 parameters.
    formula = "y ~ x1 + x2 + C(sector)"
    return {"data": str(tmp / "data"), "chunk_rows": 37 if fail else 30, "formula": formula}


def map_(tmp, frames_dir, fail):
    grid = {"x": [1, 2, 3, 4, 5, 6]}
    if fail:  # x = 3 raises while the flag file exists
        (tmp / "flag").touch()
        grid["flag"] = [str(tmp / "flag")]
    return {"function": "mapfns.userfns:power", "grid": grid}


def wordcount(tmp, frames_dir, fail):
    folder = tmp / "texts"
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(7):
        (folder / f"t{i}.txt").write_text(" ".join(["a"] * i + ["b"] * (7 - i) + [f"w{i}"]))
    if fail:
        (folder / "t3.txt").write_bytes(b"\xff\xfe not utf-8")
    return {"folder": str(folder)}


def squares(tmp, frames_dir, fail):
    return {"n_units": 12, "fail": "5" if fail else None}


#: A small job for each registered workload: (tmp folder, frames, fail?) -> settings.
JOBS = {"cubes": cubes, "regressions": regressions, "map": map_, "wordcount": wordcount,
        "squares": squares}  # fmt: skip


def test_every_registered_workload_has_a_contract_job():
    assert set(registry.names()) == set(JOBS), "add a small job for the new workload to JOBS"


def build(name, tmp, frames_dir, fail=False):
    cls = registry.load(name)
    settings = cls.settings_class(**JOBS[name](tmp, frames_dir, fail))
    return cls.from_settings(settings, "job", RunOptions(output=str(tmp / "out")))


def run(client, workload, out, units_per_task=3):
    options = RunOptions(output=str(out), units_per_task=units_per_task, progress=False)
    return run_job(workload, options, client, echo=lambda m: None)


def digest(out) -> str:
    """The job's output as a user reads it: its tables in unit order (timings aside),
    or, for a workload without tables, every object but its bookkeeping."""
    store = LocalStore(out)
    h = hashlib.sha256()
    record = json.loads(store.read_bytes("job/job.json"))
    tables = job_tables(store, "job", registry.load(record["workload"]).results.manifest_columns)
    if tables:
        for table in sorted(set(tables) - {"timings"}):  # timings are what they are
            parts = [(f, pq.read_table(store.open_input(k))) for f, k in tables[table]]
            sink = io.BytesIO()
            pq.write_table(concat_parts(store, parts), sink)
            h.update(table.encode() + sink.getvalue())
    else:
        for key in store.list("job"):
            # The manifests record task ranges, which depend on the task sizes.
            if not key.startswith(("job/manifest", "job/job.json")):
                h.update(unnamed(key).encode() + store.read_bytes(key))  # (not its attempt)
    return h.hexdigest()


@pytest.fixture(params=sorted(JOBS))
def name(request):
    return request.param


def test_the_same_job_gives_the_same_bytes_whatever_the_task_sizes(
    name, tmp_path, client, frames_dir
):
    a = run(client, build(name, tmp_path / "a", frames_dir), tmp_path / "a" / "out", 2)
    b = run(client, build(name, tmp_path / "b", frames_dir), tmp_path / "b" / "out", 4)
    assert a.complete and b.complete and a.units_failed == b.units_failed == 0, a.failures
    assert digest(tmp_path / "a" / "out") == digest(tmp_path / "b" / "out")


@pytest.mark.parametrize("how", ["killed before an entry", "a failing task"])
def test_an_interrupted_run_run_again_gives_a_clean_runs_bytes(
    name, how, tmp_path, client, frames_dir
):
    clean = tmp_path / "clean" / "out"
    run(client, build(name, tmp_path / "clean", frames_dir), clean)
    out = tmp_path / "r" / "out"
    workload = build(name, tmp_path / "r", frames_dir)
    if how == "a failing task":
        # A folder where task 1's manifest entry must go: that task fails for real.
        blocker = out / manifest_key("job", 1)
        (blocker / "x").mkdir(parents=True)
        first = run(client, workload, out)
        assert not first.complete and first.units_failed > 0
        (blocker / "x").rmdir()
        blocker.rmdir()
    else:
        first = run(client, workload, out)
        # As if the driver had been killed before task 1 wrote its entry.
        (out / manifest_key("job", 1)).unlink()
        (out / consolidated_manifest_key("job")).unlink()
    again = run(client, build(name, tmp_path / "r", frames_dir), out)
    assert again.complete and again.tasks_skipped == first.tasks - 1
    assert digest(out) == digest(clean)
    (check,) = verify_output(str(out))
    assert check.ok, check


def test_a_failing_unit_is_recorded_and_the_run_finishes(name, tmp_path, client, frames_dir):
    s = run(client, build(name, tmp_path, frames_dir, fail=True), tmp_path / "out")
    assert s.units_failed >= 1 and s.failures, s
    assert s.units_run == s.units  # every other unit ran
    assert {"unit", "error_type", "message"} <= set(s.failures[0])


def test_verify_finds_a_missing_a_corrupt_and_an_extra_object(name, tmp_path, client, frames_dir):
    out = tmp_path / "out"
    run(client, build(name, tmp_path, frames_dir), out)
    (check,) = verify_output(str(out))
    assert check.ok, check
    manifest = pq.read_table(out / consolidated_manifest_key("job")).to_pandas()
    column = "shard" if "shard" in manifest else "object"
    listed = sorted(set(manifest[column]))
    assert len(listed) >= 2
    (out / listed[0]).unlink()
    with open(out / listed[-1], "r+b") as f:
        f.seek(-1, 2)
        last = f.read(1)
        f.seek(-1, 2)
        f.write(bytes([last[0] ^ 0xFF]))
    (out / "job" / "notes.txt").write_text("not listed anywhere")
    (check,) = verify_output(str(out))
    assert not check.ok
    assert any(listed[0] in m for m in check.missing), check
    assert any(listed[-1] in c for c in check.corrupt), check
    assert check.extra == [f"{out}/job/notes.txt"]


def test_verify_repair_reruns_only_the_damaged_tasks_to_the_same_bytes(
    name, tmp_path, client, frames_dir
):
    out = tmp_path / "out"
    first = run(client, build(name, tmp_path, frames_dir), out)
    clean = digest(out)
    manifest = pq.read_table(out / consolidated_manifest_key("job")).to_pandas()
    listed = sorted(set(manifest["shard" if "shard" in manifest else "object"]))
    before = {key: (out / key).read_bytes() for key in listed}
    (out / listed[0]).unlink()
    (out / listed[-1]).write_bytes(before[listed[-1]][:-1] + b"\x00")
    (check,) = verify_output(str(out))
    assert not check.ok and check.damaged_units and not check.repaired
    (check,) = verify_output(str(out), repair=True)
    assert 1 <= len(check.repaired) <= 2, check.repaired
    assert not (out / consolidated_manifest_key("job")).exists()
    assert not (out / listed[0]).exists() and not (out / listed[-1]).exists()
    again = run(client, build(name, tmp_path, frames_dir), out)
    assert again.complete and again.tasks_skipped == first.tasks - len(check.repaired)
    assert digest(out) == clean
    # The same bytes, task by task (a rerun task's objects carry its new attempt's
    # name); timings are what they are.
    manifest = pq.read_table(out / consolidated_manifest_key("job")).to_pandas()
    now = sorted(set(manifest["shard" if "shard" in manifest else "object"]))
    assert {unnamed(k): (out / k).read_bytes() for k in now if "/timings/" not in k} == {
        unnamed(k): data for k, data in before.items() if "/timings/" not in k
    }
    (check,) = verify_output(str(out))
    assert check.ok, check


@pytest.mark.parametrize("damage", ["footer", "page"])
def test_an_object_damaged_before_the_job_completes_is_said_with_its_repair(
    name, damage, tmp_path, client, frames_dir
):
    # Killed before its run consolidated the manifest, then a stored object damaged:
    # the run that finishes the job read it back with a traceback, on every rerun. (A
    # bad footer is pyarrow's ArrowInvalid, a bad page header a plain OSError.)
    out = tmp_path / "out"
    run(client, build(name, tmp_path, frames_dir), out)
    clean = digest(out)
    (out / consolidated_manifest_key("job")).unlink()
    entry = out / manifest_key("job", 1)
    data = entry.read_bytes()
    bad_page = data[:4] + b"\xff" * 16 + data[20:]
    entry.write_bytes(b"PAR1 not a table" if damage == "footer" else bad_page)
    with pytest.raises(StorageError) as err:
        run(client, build(name, tmp_path, frames_dir), out)
    assert f"pipeline verify {out} --repair" in str(err.value), err.value
    assert "manifest/part-000001.parquet" in str(err.value), err.value
    verify_output(str(out), repair=True)
    assert run(client, build(name, tmp_path, frames_dir), out).complete
    assert digest(out) == clean
    (check,) = verify_output(str(out))
    assert check.ok, check


def test_verify_repair_waits_for_no_run_of_the_job(tmp_path, client, frames_dir):
    out = tmp_path / "out"
    run(client, build("squares", tmp_path, frames_dir), out)
    manifest = pq.read_table(out / consolidated_manifest_key("job")).to_pandas()
    (out / manifest["object"][0]).unlink()
    with (
        LocalStore(out).hold(lock_key("job"), "a run"),
        pytest.raises(JobRunning, match="is running"),
    ):
        verify_output(str(out), repair=True)
    assert (out / manifest_key("job", 0)).exists()  # nothing deleted


def test_the_example_plugin_records_an_unreadable_file_and_completes(tmp_path, client, frames_dir):
    """The template for plug-in authors: a file it cannot read was a task-level failure,
    so the task's other files were never written and the job could never complete."""
    from pipeline import results_table

    out = tmp_path / "out"
    s = run(client, build("wordcount", tmp_path, frames_dir, fail=True), out)
    assert s.complete and s.units_failed == 1, s
    assert s.failures[0]["key"] == "t3.txt" and s.failures[0]["error_type"] == "UnicodeDecodeError"
    assert sorted(set(results_table(str(out), "counts").column("file").to_pylist())) == [
        f"t{i}.txt" for i in range(7) if i != 3
    ]
    assert results_table(str(out), "failures").column("file").to_pylist() == ["t3.txt"]
    (check,) = verify_output(str(out))
    assert check.ok and check.units_ok == 7, check
    assert (check.failed_units, check.failures_table) == (1, "failures")
    again = run(client, build("wordcount", tmp_path, frames_dir, fail=True), out)
    assert again.units_run == 0 and again.units_failed == 1
    # A job whose files were all read has no failures: an empty table, not an unknown one
    clean = tmp_path / "clean"
    run(client, build("wordcount", clean, frames_dir), clean / "out")
    assert results_table(str(clean / "out"), "failures").num_rows == 0


PLUGIN = r"workload 'mistaken' \(support.workloads:MistakenWorkload\)"


@pytest.mark.parametrize(
    "mistake, said",
    [
        # pyarrow's "Must pass at least one table" at the job's end
        ("no units", "its preflight left n_units = 0; a job has at least one unit"),
        # a bare traceback, naming no plug-in
        ("a ValueError in preflight", "its preflight failed: ValueError: threshold must be"),
        # (the input failing, not the plug-in: a StorageError, not a WorkloadError)
        ("an unreadable input", r"its inputs could not be read: .*inputs/a\.csv"),
        # a memory address, another each run: every rerun would be "other settings"
        ("an object in the fingerprint", r"fingerprint\(\) key 'obj' holds "
         r"<support.workloads.Opaque object at 0x[0-9a-f]+>, "
         r"which the job's record \(JSON\) cannot keep"),
    ],
)  # fmt: skip
def test_a_plugins_mistake_before_any_task_is_named(mistake, said, tmp_path, client):
    from support.workloads import MistakenWorkload

    from pipeline import StorageError, WorkloadError

    error = StorageError if mistake == "an unreadable input" else WorkloadError
    with pytest.raises(error, match=f"^{PLUGIN}: {said}"):
        run(client, MistakenWorkload("job", 12, mistake), tmp_path / "out")
    assert not (tmp_path / "out" / "job" / "values").exists()  # no task ran


def test_a_plugin_may_write_verify_job_as_a_staticmethod(tmp_path, client):
    # verify_job may be a staticmethod: the entry check must not need __func__.
    from support.workloads import StaticVerifyWorkload

    out = tmp_path / "out"
    assert run(client, StaticVerifyWorkload("job", 12), out, units_per_task=3).complete
    (check,) = verify_output(str(out))
    assert check.ok, check


@pytest.mark.parametrize(
    "mistake, said",
    [
        # FileNotFoundError of the entry, in the driver, at the job's end
        ("no manifest entry", r"no manifest entry \(TaskOutput.manifest\)"),
        # "6 of 6", then verify's AttributeError
        ("objects alone", "a manifest entry without checksum, unit_start, unit_stop"),
        # "12 of 12", then verify: every object corrupt, and --repair and reruns for ever
        ("sha256 checksums", r"a manifest entry whose checksum is not pipeline.checksum\(data\)"),
        # "12 of 12", and only verify found units duplicated
        (
            "overlapping ranges",
            r"a manifest entry whose ranges \(unit_start..unit_stop: (\d+)..\d+\) "
            r"do not cover the task's, \1..\d+, once each",
        ),
        # a TypeError in the check, and a rerun advised for ever
        ("null ranges", r"a manifest entry whose ranges \(unit_start..unit_stop: none\)"),
        # the part overwritten by the task's entry, <job>/manifest/part-NNNNNN.parquet
        ("a table named manifest", r"a table named 'manifest'; a table's kind is a name"),
        ("a list for a table", r"table 'values' of type list, not a pyarrow.Table"),
        # an object --overwrite and verify never see
        ("a file outside the job's folder", r"a file at 'elsewhere/x', outside the job's folder"),
        # the runner's entry checked as one given by hand
        (
            "files whose units overlap",
            r"a manifest entry whose ranges \(unit_start..unit_stop: (\d+)..\d+\) "
            r"do not cover the task's, \1..\d+, once each",
        ),
        ("files and an entry", r"tables or files and a manifest entry of its own"),
    ],
)
def test_a_plugins_mistake_in_a_task_fails_the_task_naming_it(mistake, said, tmp_path, client):
    from support.workloads import MistakenWorkload

    s = run(client, MistakenWorkload("job", 12, mistake), tmp_path / "out", units_per_task=3)
    assert not s.complete and s.units_failed == 12 and s.units_ok == 0, s
    first = s.failures[0]
    assert first["error_type"] == "WorkloadError", first
    assert re.match(f"{PLUGIN}: task [0-3] returned {said}", first["message"]), first["message"]
    assert not (tmp_path / "out" / consolidated_manifest_key("job")).exists()
    failed = next(line for line, _ in summary_lines(s) if line.startswith("  FAILED"))
    assert "did not keep the workload contract, as said below; a rerun fails" in failed


def test_the_runner_lists_a_tasks_tables_and_files_in_its_entry(tmp_path, client, frames_dir):
    """A task returns its tables and files; the runner writes them and lists each, in the
    order given, with its kind, units, size and checksum: the entry workloads built."""
    from support.workloads import SquaresWorkload

    from pipeline import checksum

    out = tmp_path / "out"
    run(client, build("wordcount", tmp_path, frames_dir, fail=True), out, units_per_task=3)
    run(client, SquaresWorkload("sq", 5), out, units_per_task=3)
    columns = ["object", "kind", "unit_start", "unit_stop", "size", "checksum"]
    types = ["string", "string", "int64", "int64", "int64", "string"]
    for job, task, listed in [
        ("job", 1, [("job/counts/part-000001.parquet", "counts", 3, 6),
                    ("job/failures/part-000001.parquet", "failures", 3, 6)]),
        ("sq", 1, [("sq/values/00003", "values", 3, 5), ("sq/values/00004", "values", 3, 5)]),
    ]:  # fmt: skip
        entry = pq.read_table(out / manifest_key(job, task))
        assert entry.column_names == columns
        assert [str(t) for t in entry.schema.types] == types
        rows = entry.to_pylist()
        # (each object named by the attempt that wrote it: ".a" and 8 hex digits)
        unnamed = [(re.sub(r"\.a[0-9a-f]{8}", "", r["object"]), r["kind"], r["unit_start"],
                    r["unit_stop"]) for r in rows]  # fmt: skip
        assert unnamed == listed
        for r in rows:
            data = (out / r["object"]).read_bytes()
            assert (r["size"], r["checksum"]) == (len(data), checksum(data))


def test_a_task_may_write_its_files_itself(tmp_path, client):
    # The runner reads such a file back for its checksum: the same entries as for the
    # bytes it writes itself.
    from support.workloads import SquaresWorkload

    given, itself = tmp_path / "given", tmp_path / "itself"
    assert run(client, SquaresWorkload("job", 12), given).complete
    assert run(client, SquaresWorkload("job", 12, writes_itself=True), itself).complete
    for out in (given, itself):
        (check,) = verify_output(str(out))
        assert check.ok and check.units_ok == 12, check
    # The same entries but for the objects' names (the runner's carry its attempt)
    given_rows, itself_rows = (
        pq.read_table(out / consolidated_manifest_key("job")).to_pylist() for out in (given, itself)
    )
    for row in given_rows:
        row["object"] = unnamed(row["object"])
    assert itself_rows == given_rows


def test_the_plugin_docs_show_the_example_plugin_as_it_is():
    """docs/plugins.md shows the whole example plug-in: its code, but for the module's
    docstring and its __future__ import, as examples/plugin holds it."""
    from pathlib import Path

    import wordcount

    code = Path(wordcount.__file__).read_text().split("from __future__ import annotations\n\n")[1]
    docs = Path(__file__).parents[1] / "docs" / "plugins.md"
    shown = docs.read_text().split("```python\n", 1)[1].split("```\n", 1)[0]
    assert shown == code
