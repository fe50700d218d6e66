"""Bad input: a clear error naming the file and what was expected, before any work,
and nothing written to the output."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline import ConfigError, InputError, StorageError, load_jobs, run_jobs
from pipeline.storage import LocalStore
from pipeline.workloads.cubes.frames import write_frames


def run_cubes(tmp_path, frames, **settings):
    out = tmp_path / "out"
    cli = {
        "output": str(out),
        "frames": str(frames),
        "cubes": 5,
        "dim": 4,
        "progress": False,
        "workers": 1,
        **settings,
    }
    try:
        run_jobs(load_jobs([], cli, environ={}), echo=lambda m: None)
    finally:
        assert not out.exists(), "bad input must leave the output untouched"


def frames_in(tmp_path, **shape):
    path = tmp_path / "frames"
    write_frames(LocalStore(path), "", **{"count": 5, "rows": 6, "cols": 8, "seed": 1, **shape})
    return path


def test_missing_frames_folder(tmp_path):
    with pytest.raises(InputError, match=r"frames folder .*nope is missing or empty"):
        run_cubes(tmp_path, tmp_path / "nope")


def test_empty_frames_folder(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match=r"empty is missing or empty; expected at least 4"):
        run_cubes(tmp_path, tmp_path / "empty")


def test_folder_without_parquet_files(tmp_path):
    (tmp_path / "csv").mkdir()
    (tmp_path / "csv" / "a.csv").write_text("1,2\n")
    with pytest.raises(InputError, match=r"csv has no \.parquet files"):
        run_cubes(tmp_path, tmp_path / "csv")


def test_frames_named_as_a_file_are_told_to_be_a_folder(tmp_path):
    frame = frames_in(tmp_path) / "frame-00000.parquet"
    with pytest.raises(InputError, match=r"frames .*frame-00000\.parquet is a file; frames are a "
                       "folder"):  # fmt: skip
        run_cubes(tmp_path, frame)  # a file given for a folder is named as such


def test_files_named_as_a_writers_own_are_not_frames(tmp_path):
    # _SUCCESS, _tmp.parquet, .part.parquet: a writer's own files, never frames
    from pipeline.workloads.cubes.frames import inspect_frames

    path = frames_in(tmp_path)
    (path / "_tmp.parquet").write_bytes(b"half a file")
    (path / ".frame-9.parquet").write_bytes(b"")
    keys = inspect_frames(str(path), 4).keys
    assert keys == tuple(f"frame-{i:05d}.parquet" for i in range(4)), keys  # (they sort first)


def test_data_frames_refuses_a_folder_of_frames_unless_overwrite(tmp_path):
    # Writing frames into a folder of frames would mix two sets (even of other shapes)
    # in one folder: refused unless --overwrite, which replaces them wholly.
    def frames(*args):
        argv = [sys.executable, "-m", "pipeline", "data", "frames", "--out", str(path), *args]
        return subprocess.run(argv, capture_output=True, text=True, timeout=120)

    path = tmp_path / "fr"
    assert frames("--count", "12", "--rows", "30", "--cols", "20").returncode == 0
    (path / "old").mkdir()
    (path / "old" / "frame-00000.parquet").write_bytes(b"not a frame of this folder")
    (path / "notes.txt").write_text("kept")
    before = (path / "frame-00000.parquet").read_bytes()
    small = ["--count", "3", "--rows", "5", "--cols", "5"]
    refused = frames(*small)
    assert refused.returncode == 1
    assert refused.stderr.strip().endswith(
        f"Error: {path} already holds 12 frames (frame-00000.parquet...); give --overwrite "
        "to replace them, or another --out"
    ), refused.stderr
    assert (path / "frame-00000.parquet").read_bytes() == before
    replaced = frames(*small, "--overwrite")
    assert replaced.returncode == 0, replaced.stderr
    # The folder's frames replaced wholly; what is not one of its frames is kept.
    frame_files = sorted(p.name for p in path.glob("*.parquet"))
    assert frame_files == [f"frame-{i:05d}.parquet" for i in range(3)]
    assert {pd.read_parquet(path / f).shape for f in frame_files} == {(5, 5)}
    assert (path / "notes.txt").exists() and (path / "old" / "frame-00000.parquet").exists()


def test_fewer_frames_than_dim(tmp_path):
    with pytest.raises(InputError, match=r"has 3 frames; a cube of dimension 4 needs at least 4"):
        run_cubes(tmp_path, frames_in(tmp_path, count=3))


def test_fewer_rows_than_dim(tmp_path):
    with pytest.raises(InputError, match=r"frame-00000\.parquet has 3 rows; .*needs at least 4"):
        run_cubes(tmp_path, frames_in(tmp_path, rows=3))


def test_fewer_columns_than_dim(tmp_path):
    # Column 0 is never drawn, so 4 columns leave only 3 to choose from.
    with pytest.raises(InputError, match=r"frame-00000\.parquet has 4 columns; .*at least 5"):
        run_cubes(tmp_path, frames_in(tmp_path, cols=4))


def test_frames_with_different_column_counts(tmp_path):
    path = frames_in(tmp_path)
    pd.DataFrame(np.zeros((6, 9)), columns=[str(i) for i in range(9)]).to_parquet(
        path / "frame-00002.parquet"
    )
    with pytest.raises(InputError, match=r"frame-00002\.parquet has 9 columns; expected 8"):
        run_cubes(tmp_path, path)


def test_non_numeric_column(tmp_path):
    path = frames_in(tmp_path)
    df = pd.read_parquet(path / "frame-00001.parquet")
    df["5"] = "text"
    df.to_parquet(path / "frame-00001.parquet")
    with pytest.raises(
        InputError,
        match=r"frame-00001\.parquet: column '5' has type (large_)?string; "
        r"expected numbers",
    ):
        run_cubes(tmp_path, path)


def test_corrupt_parquet(tmp_path):
    path = frames_in(tmp_path)
    data = (path / "frame-00003.parquet").read_bytes()
    (path / "frame-00003.parquet").write_bytes(data[: len(data) // 2])
    with pytest.raises(InputError, match=r"frame .*frame-00003\.parquet: not a readable parquet"):
        run_cubes(tmp_path, path)


def test_job_file_with_unknown_key(tmp_path):
    job = tmp_path / "job.toml"
    job.write_text('workload = "cubes"\ncubes = 10\ncube_count = 5\n')
    with pytest.raises(
        ConfigError,
        match=r"job\.toml: unknown key\(s\) 'cube_count' for "
        r"workload 'cubes'; known keys: ",
    ):
        load_jobs([str(job)], {}, environ={})
    job.write_text('workload = "regressions"\nmodle = "ols"\nformla = "y ~ x"\n')
    both = r"'formla', 'modle' for workload 'regressions' \(did you mean 'formula' for 'formla', "
    with pytest.raises(ConfigError, match=both + r"'model' for 'modle'\?\)"):
        load_jobs([str(job)], {}, environ={})
    job.write_text('workload = "regressions"\nmodle = "ols"\n')
    with pytest.raises(ConfigError, match=r"'modle' for workload 'regressions' \(did you mean "
                       r"'model'\?\); known keys"):  # fmt: skip
        load_jobs([str(job)], {}, environ={})


def test_job_file_keys_of_another_workload_or_several_jobs_are_explained(tmp_path):
    job = tmp_path / "job.toml"
    job.write_text('function = "m:f"\ngrid = {a = [1, 2]}\n')  # no workload = "map"
    elsewhere = r"\(settings of workload 'map': set workload = \"map\"\); known"
    with pytest.raises(ConfigError, match=r"'function', 'grid' for workload 'cubes' " + elsewhere):
        load_jobs([str(job)], {}, environ={})
    job.write_text('function = "m:f"\n[[grid]]\na = 1\n[[grid]]\na = 2\n')
    with pytest.raises(ConfigError, match=elsewhere):
        load_jobs([str(job)], {}, environ={})
    job.write_text('[[job]]\nworkload = "map"\nfunction = "m:f"\n[[job]]\nworkload = "cubes"\n')
    several = r"\(\[\[job\]\] is a list of TOML tables: a job file holds one job.*a\.toml b\.toml\)"
    with pytest.raises(ConfigError, match=r"'job' for workload 'cubes' " + several):
        load_jobs([str(job)], {}, environ={})


def test_a_value_given_to_an_on_off_flag_is_explained(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    hint = r"\(an on/off flag such as --overwrite takes no value; --no-overwrite is off\)"
    with pytest.raises(ConfigError, match=r"job file false: no such file " + hint):
        load_jobs(["false"], {}, environ={})


def test_two_job_files_writing_one_job_folder_are_refused_before_either_runs(tmp_path):
    a, b = tmp_path / "a.toml", tmp_path / "b.toml"
    a.write_text('workload = "map"\nname = "grid"\nfunction = "m:f"\ngrid = { x = [1] }\n')
    b.write_text('workload = "map"\nname = "grid"\nfunction = "m:f"\ngrid = { x = [2] }\n')
    out = {"output": str(tmp_path / "out")}
    with pytest.raises(ConfigError, match=r"a\.toml and .*b\.toml both write job 'grid' to "):
        load_jobs([str(a), str(b)], out, environ={})
    with pytest.raises(ConfigError, match=r"a\.toml is given twice"):
        load_jobs([str(a), str(a)], out, environ={})
    b.write_text('workload = "map"\nname = "other"\nfunction = "m:f"\ngrid = { x = [2] }\n')
    assert [j.job_id for j in load_jobs([str(a), str(b)], out, environ={})] == ["grid", "other"]


def test_an_error_about_one_of_several_jobs_names_its_file(tmp_path):
    """`pipeline run grid.toml badb.toml` said what was wrong with a job's settings,
    not in which of its files."""
    (tmp_path / "fits.py").write_text("def fit_one(alpha, n, seed):\n    return alpha\n")
    head = 'workload = "map"\nfunction = "fits:fit_one"\n[grid]\nalpha = [1]\n'
    (tmp_path / "grid.toml").write_text(head + "n = [2]\n")
    (tmp_path / "badb.toml").write_text(head + "m = [2]\n")
    proc = subprocess.run(
        [sys.executable, "-m", "pipeline", "run", "grid.toml", "badb.toml", "--output", "out",
         "--workers", "1"],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 1
    assert proc.stderr.splitlines() == [
        "Error: badb.toml: function fits:fit_one(alpha, n, seed) does not accept the grid "
        "key(s) 'm'; its parameters: alpha, n, seed"
    ]
    assert not (tmp_path / "out" / "grid").exists()  # nor the first job ran
    # Settings resolved per file (a job's name), and a job alone: its file goes unsaid
    (tmp_path / "badb.toml").write_text('name = "_b"\n' + head + "n = [2]\n")
    paths = [str(tmp_path / "grid.toml"), str(tmp_path / "badb.toml")]
    with pytest.raises(ConfigError, match=r"^\S*badb\.toml: job name '_b': a job's name is"):
        load_jobs(paths, {}, environ={})
    with pytest.raises(ConfigError, match=r"^job name '_b': a job's name is"):
        load_jobs(paths[1:], {}, environ={})


def test_job_file_with_its_keys_under_a_table(tmp_path):
    job = tmp_path / "job.toml"
    job.write_text('[job]\nworkload = "map"\nfunction = "m:f"\ngrid = { a = [1] }\n')
    with pytest.raises(ConfigError, match=r"job\.toml: a job's keys go at the top level of "
                       r"the file, not under \[job\]"):  # fmt: skip
        load_jobs([str(job)], {}, environ={})
    job.write_text("[settings]\ncubes = 5\n")
    table = r"\(\[settings\] is a TOML table: a job's keys go at the top level\)"
    with pytest.raises(ConfigError, match=r"'settings' for workload 'cubes' " + table):
        load_jobs([str(job)], {}, environ={})


@pytest.mark.parametrize("under", ["", "sub"])
def test_output_that_is_a_file_is_named(tmp_path, under):
    (tmp_path / "afile").write_text("not a folder")
    output = tmp_path / "afile" / under if under else tmp_path / "afile"
    with pytest.raises(StorageError, match=rf"output {output}: {tmp_path / 'afile'} is a file, "
                       r"expected a folder"):  # fmt: skip
        LocalStore(output).preflight()
    assert (tmp_path / "afile").read_text() == "not a folder"


@pytest.mark.parametrize("output", ["", "file://"])
def test_an_output_naming_no_place_is_refused_not_the_working_folder(tmp_path, output):
    """`--output ''` (or `output = ""`) wrote the job's folder and `_locks` into the
    working folder, while PIPELINE_OUTPUT='' meant the default."""
    job = tmp_path / "job.toml"
    job.write_text(f'output = "{output}"\ncubes = 5\n')
    message = rf"output = '{output}' \(--output\) names no place; give a folder or s3://"
    with pytest.raises(ConfigError, match=message):
        load_jobs([str(job)], {}, environ={})
    with pytest.raises(ConfigError, match=message):
        load_jobs([], {"output": output}, environ={})


@pytest.mark.parametrize(
    ("output", "error", "said"),
    [
        ("afile", StorageError, r"output {tmp}/afile: {tmp}/afile is a file, expected a folder"),
        ("s3://", ConfigError, r"S3 URL 's3://' has no bucket"),
    ],
)
def test_default_frames_under_a_bad_output_name_the_output(tmp_path, output, error, said):
    """The frames' write failed as `cannot write .../afile/inputs/frames-.../frame-00000
    .parquet: Not a directory`, and `s3://` as `'s3:/inputs/frames-...' reads as a URL
    missing a '/' (did you mean 's3://inputs/...'?)`: a bucket the user never named."""
    (tmp_path / "afile").write_text("not a folder")
    output = output if "://" in output else str(tmp_path / output)
    cli = {"output": output, "cubes": 2, "dim": 4, "workers": 1, "progress": False}
    with pytest.raises(error, match=said.format(tmp=tmp_path)):
        run_jobs(load_jobs([], cli, environ={}), echo=lambda m: None)
    assert (tmp_path / "afile").read_text() == "not a folder"


def test_job_file_with_wrong_type(tmp_path):
    job = tmp_path / "job.toml"
    job.write_text('cubes = "many"\n')
    with pytest.raises(
        ConfigError,
        match=r"job\.toml: key 'cubes': expected an integer, "
        r"got 'many' \(str\)",
    ):
        load_jobs([str(job)], {}, environ={})


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("dim = 0\n", r"key 'dim': 0 must be at least 1"),
        ('sink = "s3"\n', r"key 'sink': 's3' is not one of store, none"),
        ('workload = "fractals"\n', r"workload = 'fractals' is not known, expected one of cubes"),
        ("cubes = \n", r"not valid TOML"),
        ("overwrite = 1\n", r"key 'overwrite': expected true or false, got 1 \(int\)"),
    ],
)
def test_job_file_values_are_checked(tmp_path, text, message):
    job = tmp_path / "job.toml"
    job.write_text(text)
    with pytest.raises(ConfigError, match=message):
        load_jobs([str(job)], {}, environ={})


def test_missing_job_file(tmp_path):
    with pytest.raises(ConfigError, match=r"job file .*absent\.toml: no such file"):
        load_jobs([str(tmp_path / "absent.toml")], {}, environ={})


def test_cli_reports_bad_input_in_one_line_and_exits_non_zero(tmp_path):
    job = tmp_path / "job.toml"
    job.write_text(f'frames = "{tmp_path / "nope"}"\ndim = 4\ncubes = 3\n')
    proc = subprocess.run(
        [sys.executable, "-m", "pipeline", "run", str(job), "--output", str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1
    assert "Error: frames folder" in proc.stderr and "nope is missing or empty" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "out").exists()


def test_a_dataset_file_in_the_working_directory_is_found(tmp_path, monkeypatch):
    from pipeline.inputs.dataset import discover

    pd.DataFrame({"g": [1, 1, 2], "y": [1.0, 2.0, 3.0]}).to_parquet(tmp_path / "panel.parquet")
    monkeypatch.chdir(tmp_path)
    ds = discover("panel.parquet")
    assert ds.num_rows == 3 and ds.url == str(tmp_path)


def test_a_missing_dataset_is_told_from_one_without_parquet_files(tmp_path):
    from pipeline.inputs.dataset import discover

    with pytest.raises(InputError, match=r"nosuchdir: no such folder or file$"):
        discover(str(tmp_path / "nosuchdir"))  # missing, not "no .parquet files there"
    (tmp_path / "texts").mkdir()
    (tmp_path / "texts" / "a.txt").write_text("x")
    with pytest.raises(InputError, match=r"texts: no \.parquet files there"):
        discover(str(tmp_path / "texts"))


def test_a_column_of_another_type_is_named_with_each_files_own_type(tmp_path):
    """int64 in a.parquet, double in b.parquet, text in c.parquet: the message said
    a.parquet held double, the type the column had been widened to by b.parquet."""
    from pipeline.inputs.dataset import check_columns, discover

    pq.write_table(pa.table({"v": pa.array([1], pa.int64())}), tmp_path / "a.parquet")
    pq.write_table(pa.table({"v": pa.array([1.5])}), tmp_path / "b.parquet")
    pq.write_table(pa.table({"v": pa.array(["s"])}), tmp_path / "c.parquet")
    with pytest.raises(InputError, match=r"column 'v' is (large_)?string in dataset file "
                       r"\S*c\.parquet and int64 in \S*a\.parquet \(needed by f\)"):  # fmt: skip
        check_columns(discover(str(tmp_path)), {"v": "f"})


def test_a_csv_dataset_gets_told_to_become_parquet(tmp_path):
    from pipeline.inputs.dataset import discover

    (tmp_path / "panel.csv").write_text("g,y\n1,1.0\n")
    with pytest.raises(InputError, match=r"only parquet is read.*pd\.read_csv"):
        discover(str(tmp_path / "panel.csv"))


def test_a_job_file_named_like_a_workload_points_to_the_flag(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match=r"no such file \(.*--workload regressions\)"):
        load_jobs(["regressions"], {}, environ={})


def test_bad_input_found_while_the_cluster_starts_prints_one_line(tmp_path):
    # The embedded cluster starts while the inputs are checked; closing it right away
    # made a worker log its in-flight heartbeat's failure (two tracebacks), in about
    # one run of five. Three runs, each must print the error alone.
    pd.DataFrame({"g": [1, 1, 2, 2], "y": [1.0, 2.0, 3.0, 4.0]}).to_parquet(tmp_path / "d.parquet")
    argv = [
        sys.executable, "-m", "pipeline", "run", "--workload", "regressions",
        "--data", str(tmp_path / "d.parquet"), "--chunk-by", "g", "--formula", "y ~ nope",
        "--output", str(tmp_path / "out"),
    ]  # fmt: skip
    for _ in range(3):
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 1, proc.stderr
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("Error: "), proc.stderr
        assert "nope" in lines[0]
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("column", ["id", "x"])
def test_an_int_column_a_float_file_widens_past_2_53_is_named(tmp_path, column):
    """int64 in one file, float64 in another: the dataset reads the column as floats,
    which hold integers up to 2**53 only (two ids would become one); a traceback from
    arrow's cast before, for a chunk_by column and a formula's alike."""
    data = tmp_path / "data"
    data.mkdir()
    big = np.array([2**53, 2**53 + 1] * 10, dtype=np.int64)
    first = {"id": np.repeat([1, 2], 10), "x": np.arange(20.0), "y": np.arange(20.0)}
    first[column] = big
    pd.DataFrame(first).to_parquet(data / "a.parquet", index=False)
    pd.DataFrame({"id": [7.0] * 20, "x": np.arange(20.0), "y": np.arange(20.0)}).to_parquet(
        data / "b.parquet", index=False
    )
    out = tmp_path / "out"
    cli = {"data": str(data), "formula": "y ~ x", "chunk_by": "id", "output": str(out),
           "progress": False, "workers": 1}  # fmt: skip
    with pytest.raises(InputError, match=rf"a.parquet: column '{column}' is int64 here, double in "
                       r"other files of the dataset, and its values do not fit that"):  # fmt: skip
        run_jobs(load_jobs([], cli, workload="regressions", environ={}), echo=lambda m: None)
