"""Configuration resolves flag > job file > PIPELINE_* env var > default."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from support.venv_commands import pipeline_command

from pipeline import ConfigError, load_jobs
from pipeline.config.settings import RowsFile


def write(tmp_path, text):
    path = tmp_path / "job.toml"
    path.write_text(text)
    return str(path)


def test_precedence_flag_over_file_over_env_over_default(tmp_path):
    path = write(tmp_path, "cubes = 20\ndim = 7\n")
    env = {"PIPELINE_CUBES": "30", "PIPELINE_DIM": "8", "PIPELINE_SEED": "5"}
    (job,) = load_jobs([path], {"cubes": 10}, environ=env)
    assert job.settings.cubes == 10  # flag
    assert job.settings.dim == 7  # job file
    assert job.settings.seed == 5  # env var
    assert job.settings.cubes_per_shard == 16  # default
    assert job.job_id == "job"  # from the file name


def test_the_workload_resolves_as_settings_do(tmp_path):
    # PIPELINE_WORKLOAD picks the workload like any setting, so the workload's own
    # flags apply (not refused as not applying to a 'cubes' job).
    env = {"PIPELINE_WORKLOAD": "regressions"}
    (job,) = load_jobs([], {"data": "d", "formula": "y ~ x", "chunk_by": "g"}, environ=env)
    assert job.workload == "regressions" and job.settings.formula == "y ~ x"
    (job,) = load_jobs([], {}, workload="map", environ=env)  # the flag first
    assert job.workload == "map"
    plain = write(tmp_path, 'data = "d"\nformula = "y ~ x"\n')  # a job file naming none
    (job,) = load_jobs([plain], {}, environ=env)
    assert job.workload == "regressions"
    (tmp_path / "c.toml").write_text('workload = "cubes"\ncubes = 3\n')  # the file's own
    (job,) = load_jobs([str(tmp_path / "c.toml")], {}, environ=env)
    assert job.workload == "cubes" and job.settings.cubes == 3
    refused = r"^environment PIPELINE_WORKLOAD: 'regression' is not a workload \(did you mean "
    with pytest.raises(ConfigError, match=refused + r"'regressions'\?\), expected one of cubes, "):
        load_jobs([], {}, environ={"PIPELINE_WORKLOAD": "regression"})


def test_env_vars_are_parsed_by_type_and_bad_ones_named(tmp_path):
    (job,) = load_jobs(
        [],
        {},
        environ={
            "PIPELINE_OVERWRITE": "yes",
            "PIPELINE_WORKERS": "3",
            "PIPELINE_TASK_SECONDS": "0.5",
        },
    )
    assert job.options.overwrite is True and job.options.workers == 3
    assert job.options.task_seconds == 0.5
    with pytest.raises(ConfigError, match="environment PIPELINE_WORKERS: 'many' is not an integer"):
        load_jobs([], {}, environ={"PIPELINE_WORKERS": "many"})
    # nan is refused by name: no comparison with it is true, so "at least 0.01" would
    # pass it, and a run with it would never end
    with pytest.raises(ConfigError, match="PIPELINE_TASK_SECONDS: nan is not a finite number"):
        load_jobs([], {}, environ={"PIPELINE_TASK_SECONDS": "nan"})
    with pytest.raises(ConfigError, match="inf is not a finite number"):
        load_jobs([], {"task_seconds": float("inf")}, environ={})
    with pytest.raises(ConfigError, match=r"PIPELINE_GRID: file nofile\.csv does not exist"):
        load_jobs([], {}, workload="map", environ={"PIPELINE_GRID": "nofile.csv"})
    # a range's top end is named with where the value came from, as its bottom is
    with pytest.raises(ConfigError, match=r"PIPELINE_ALPHA: 1\.5 must be less than 1\.0"):
        load_jobs([], {}, workload="regressions", environ={"PIPELINE_ALPHA": "1.5"})


def test_workers_with_a_scheduler_is_refused_unless_an_exported_default(tmp_path):
    # --workers sizes the embedded cluster: with a scheduler it cannot apply, so it is
    # refused rather than ignored.
    with pytest.raises(ConfigError, match=r"workers = 7 \(--workers, PIPELINE_WORKERS\)"):
        load_jobs([], {"scheduler": "tcp://127.0.0.1:8786", "workers": 7}, environ={})
    path = write(tmp_path, 'scheduler = "tcp://127.0.0.1:8786"\n')
    (job,) = load_jobs([path], {}, environ={"PIPELINE_WORKERS": "3"})
    assert job.options.workers is None and job.options.scheduler == "tcp://127.0.0.1:8786"


def test_a_misspelled_variable_is_warned_about(caplog):
    env = {"PIPELINE_WORKRES": "3", "PIPELINE_IMAGE": "x", "PIPELINE_FORMULA": "y ~ x"}
    (job,) = load_jobs([], {}, workload="regressions", environ=env)
    assert job.options.workers is None and job.settings.formula == "y ~ x"
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert warned == [
        "environment variable PIPELINE_WORKRES is not a setting (did you mean "
        "PIPELINE_WORKERS?); ignored"
    ]


def test_a_choice_is_taken_in_any_case_and_stored_as_spelled_in_the_choices(tmp_path):
    path = write(tmp_path, 'workload = "regressions"\nmodel = "glm"\nfamily = "Poisson"\n')
    (job,) = load_jobs([path], {"cov_type": "hc1"}, environ={"PIPELINE_ENGINE": "StatsModels"})
    assert (job.settings.family, job.settings.cov_type) == ("poisson", "HC1")
    assert job.settings.engine == "statsmodels"
    with pytest.raises(ConfigError, match="'Poison' is not one of gaussian, binomial, poisson"):
        load_jobs(
            [write(tmp_path, 'workload = "regressions"\nfamily = "Poison"\n')], {}, environ={}
        )


def test_a_table_setting_is_json_text_or_a_file_of_one(tmp_path):
    grids = {
        "g.toml": "[grid]\nalpha = [0.1, 1]\n",  # a job file's own table
        "h.toml": "alpha = [0.1, 1]\n",  # the whole document
        "g.json": '{"alpha": [0.1, 1]}',
    }
    for name, text in grids.items():
        (tmp_path / name).write_text(text)
        (job,) = load_jobs([], {"grid": str(tmp_path / name)}, workload="map", environ={})
        assert job.settings.grid == {"alpha": [0.1, 1]}, name
    (job,) = load_jobs([], {"grid": '{"alpha": [2]}'}, workload="map", environ={})
    assert job.settings.grid == {"alpha": [2]}
    (tmp_path / "bad.toml").write_text("alpha = [0.1,\n")
    with pytest.raises(ConfigError, match=r"--grid: file .*bad.toml is not a table"):
        load_jobs([], {"grid": str(tmp_path / "bad.toml")}, workload="map", environ={})
    (tmp_path / "list.json").write_text("[1, 2]")
    with pytest.raises(ConfigError, match=r"list.json: item 0 is 1 \(int\); expected a list of"):
        load_jobs([], {"grid": str(tmp_path / "list.json")}, workload="map", environ={})
    (tmp_path / "text.json").write_text('"alpha"')
    with pytest.raises(ConfigError, match=r"text.json holds str, not a table"):
        load_jobs([], {"grid": str(tmp_path / "text.json")}, workload="map", environ={})
    with pytest.raises(ConfigError, match=r"--grid: file nothere\.toml does not exist"):
        load_jobs([], {"grid": "nothere.toml"}, workload="map", environ={})
    with pytest.raises(ConfigError, match=r"'a=1' is not a table .*or a .toml, .json, "):
        load_jobs([], {"grid": "a=1"}, workload="map", environ={})


def test_a_grid_may_be_a_list_of_points_in_any_of_its_forms(tmp_path):
    points = [{"alpha": 0.5, "n": 10}, {"alpha": 2.5, "n": 30}]
    (tmp_path / "job.toml").write_text(
        'workload = "map"\nfunction = "m:f"\n[[grid]]\nalpha = 0.5\nn = 10\n'
        "[[grid]]\nalpha = 2.5\nn = 30\n"
    )
    (tmp_path / "p.toml").write_text(
        "[[grid]]\nalpha = 0.5\nn = 10\n[[grid]]\nalpha = 2.5\nn = 30\n"
    )
    (tmp_path / "p.json").write_text(json.dumps(points))
    (tmp_path / "p.csv").write_text("alpha,n\n0.5,10\n2.5,30\n")
    pq.write_table(pa.Table.from_pylist(points), tmp_path / "p.parquet")
    (job,) = load_jobs([str(tmp_path / "job.toml")], {}, environ={})
    assert job.settings.grid == points
    for given in ("p.toml", "p.json"):
        (job,) = load_jobs([], {"grid": str(tmp_path / given)}, workload="map", environ={})
        assert job.settings.grid == points, given
    # A .csv or .parquet file's rows are read by the job, a part at a time (its
    # points: tests/test_map.py), not here
    for given in ("p.csv", "p.parquet"):
        (job,) = load_jobs([], {"grid": str(tmp_path / given)}, workload="map", environ={})
        assert job.settings.grid == RowsFile(str(tmp_path / given)), given
    for given in (points, {"alpha": [0.5, 2.5]}):  # a variable holds either as JSON
        (job,) = load_jobs([], {}, workload="map", environ={"PIPELINE_GRID": json.dumps(given)})
        assert job.settings.grid == given
    (tmp_path / "mixed.json").write_text('[{"alpha": 1}, [2]]')
    with pytest.raises(ConfigError, match=r"mixed.json: item 1 is \[2\] \(list\)"):
        load_jobs([], {"grid": str(tmp_path / "mixed.json")}, workload="map", environ={})
    (tmp_path / "empty.csv").write_text("alpha,n\n")
    # An empty table is said in its own words, once, not as "not a table".
    no_rows = r"no rows; expected a row per call \(a header line and at least one row, for a CSV\)$"
    with pytest.raises(ConfigError, match=rf"^--grid: file \S*empty.csv has {no_rows}"):
        load_jobs([], {"grid": str(tmp_path / "empty.csv")}, workload="map", environ={})
    pq.write_table(pa.table({"alpha": pa.array([], pa.float64())}), tmp_path / "none.parquet")
    with pytest.raises(ConfigError, match=r"^--grid: file \S*none.parquet has no rows;"):
        load_jobs([], {"grid": str(tmp_path / "none.parquet")}, workload="map", environ={})


def test_a_value_of_another_setting_says_so(tmp_path):
    job = write(tmp_path, 'workload = "regressions"\nfamily = "logit"\n')
    hint = r"'logit' is not one of .*\('logit' is a value of model or link: model = 'logit'\)"
    with pytest.raises(ConfigError, match=hint):
        load_jobs([job], {}, environ={})
    with pytest.raises(ConfigError, match=r"PIPELINE_MODEL: 'bogus' is not one of [^(]*$"):
        load_jobs([], {}, workload="regressions", environ={"PIPELINE_MODEL": "bogus"})


def test_files_the_driver_writes_must_be_local_paths(tmp_path):
    # --report s3://bucket/x made a local folder named "s3:" and wrote there.
    for key in ("report", "profile", "profile_tasks"):
        with pytest.raises(ConfigError, match=rf"{key} = 's3://b/x' .*a local path is expected"):
            load_jobs([], {key: "s3://b/x"}, workload="cubes", environ={})
    (job,) = load_jobs([], {"report": str(tmp_path / "r")}, workload="cubes", environ={})
    assert job.options.report == str(tmp_path / "r")


def test_report_and_profile_paths_are_checked_before_any_task(tmp_path):
    # Output paths the run writes at its end are checked before any task: a bad one
    # found at the end would cost the run's work and leave the job unfinished.
    from pipeline import run_jobs

    (tmp_path / "a_folder").mkdir()
    (tmp_path / "a_file").write_text("x")
    refused = {
        "profile_tasks": ("a_folder", r"is a folder; a file name is expected"),
        "profile": ("a_file/p.pstats", r"cannot be created: .*a_file is a file"),
        "report": ("a_file", r"is a file; a folder is expected"),
    }
    for key, (name, why) in refused.items():
        cli = {"output": str(tmp_path / "out"), key: str(tmp_path / name)}
        flag = "--" + key.replace("_", "-")
        with pytest.raises(ConfigError, match=rf"{key} = '.*{name}' \({flag}\): {why}"):
            run_jobs(load_jobs([], cli, workload="cubes", environ={}))
        assert not (tmp_path / "out").exists()


def test_an_input_inside_the_jobs_own_folder_is_refused(tmp_path):
    # --overwrite empties the job's folder, so inputs kept there would be deleted.
    from pipeline import run_jobs
    from pipeline.storage import LocalStore
    from pipeline.workloads.cubes.frames import write_frames

    frames = tmp_path / "out" / "j" / "frames"
    write_frames(LocalStore(frames), "", count=4, rows=8, cols=8, seed=0)
    cli = {"output": str(tmp_path / "out"), "frames": str(frames), "dim": 4, "cubes": 2}
    with pytest.raises(ConfigError, match=r"frames: this input is inside the job's own folder "
                       r"\(.*out/j\), which --overwrite empties"):  # fmt: skip
        run_jobs(load_jobs([], {**cli, "name": "j", "overwrite": True}, environ={}))
    assert sorted(p.name for p in frames.iterdir())[:1] == ["frame-00000.parquet"]
    (summary,) = run_jobs(load_jobs([], {**cli, "name": "k", "workers": 1, "progress": False},
                                    environ={}), echo=lambda m: None)  # fmt: skip
    assert summary.complete


def test_several_jobs_profiles_need_a_file_each(tmp_path):
    # The second job's task profile silently replaced the first one's.
    from pipeline import run_jobs

    for name in ("a", "b"):
        (tmp_path / f"{name}.toml").write_text(f'workload = "cubes"\nname = "{name}"\n')
    paths = [str(tmp_path / "a.toml"), str(tmp_path / "b.toml")]
    one = {"output": str(tmp_path / "out"), "profile_tasks": str(tmp_path / "all.pstats")}
    with pytest.raises(ConfigError, match=r"all\.pstats: 2 jobs would write it, each over the "
                       r"last; put \{job\} in the name"):  # fmt: skip
        run_jobs(load_jobs(paths, one, environ={}))
    assert not (tmp_path / "out").exists()


def test_a_later_job_files_cluster_settings_must_be_the_firsts(tmp_path):
    # One cluster serves every job of a command: a later job's differing settings are
    # refused, not ignored (the file order would otherwise decide them).
    from pipeline import run_jobs

    (tmp_path / "a.toml").write_text("cubes = 1\n")
    (tmp_path / "b.toml").write_text("cubes = 2\nworkers = 1\n")
    paths = [str(tmp_path / "a.toml"), str(tmp_path / "b.toml")]
    with pytest.raises(ConfigError, match=r"b\.toml: workers = 1, but the jobs of one run share "
                       r"one cluster, the first job's \(.*a\.toml: workers = None\); give "
                       r"--workers for all of them"):  # fmt: skip
        run_jobs(load_jobs(paths, {"output": str(tmp_path / "out")}, environ={}))
    assert not (tmp_path / "out").exists()
    same = load_jobs(paths, {"output": str(tmp_path / "out"), "workers": 1}, environ={})
    assert {j.options.workers for j in same} == {1}


def test_an_exported_input_does_not_join_a_job_files_own(tmp_path):
    # PIPELINE_FILES beside a job file's grid: "a map job takes exactly one input"; and
    # PIPELINE_CHUNK_ROWS: "chunk_rows: applies to a data input only".
    job = tmp_path / "pf.toml"
    job.write_text('workload = "map"\nfunction = "m:f"\n[grid]\nx = [1]\n')
    environ = {"PIPELINE_FILES": "texts", "PIPELINE_CHUNK_ROWS": "5"}
    (loaded,) = load_jobs([str(job)], {}, environ=environ)
    assert loaded.settings.files is None and loaded.settings.chunk_rows is None
    # with a data input of its own the job takes the environment's chunk_rows
    job.write_text('workload = "map"\nfunction = "m:f"\ndata = "d"\n')
    (loaded,) = load_jobs([str(job)], {}, environ=environ)
    assert loaded.settings.files is None and loaded.settings.chunk_rows == 5
    (loaded,) = load_jobs([], {"function": "m:f"}, workload="map", environ=environ)
    assert loaded.settings.files == "texts"  # the environment alone names it


def test_several_job_files_share_flags(tmp_path):
    a = tmp_path / "a.toml"
    b = tmp_path / "b.toml"
    a.write_text("cubes = 1\n")
    b.write_text('cubes = 2\nname = "second"\n')
    jobs = load_jobs([str(a), str(b)], {"output": "elsewhere"}, environ={})
    assert [j.settings.cubes for j in jobs] == [1, 2]
    assert [j.job_id for j in jobs] == ["a", "second"]
    assert {j.options.output for j in jobs} == {"elsewhere"}


def test_a_cube_seed_is_a_64_bit_word():
    # The seed is the Philox key's 64-bit word: a larger one is refused up front, not
    # an OverflowError in every cube.
    from pipeline import CubeJob

    with pytest.raises(ConfigError, match=r"seed=18446744073709551616.*must be less than"):
        CubeJob(seed=2**64)
    assert CubeJob(seed=2**64 - 1).seed == 2**64 - 1


def test_an_empty_job_file_is_refused(tmp_path):
    # Refused, not the default job: that writes 1,000 cubes of 100^3 (8.4 GB).
    for text in ("", "# only a comment\n"):
        (tmp_path / "empty.toml").write_text(text)
        with pytest.raises(ConfigError, match=r"empty\.toml: no settings in it; a job file says "
                           r"which workload it runs \(workload = 'cubes' \| "):  # fmt: skip
            load_jobs([str(tmp_path / "empty.toml")], {}, environ={})


def test_files_a_windows_editor_saved_are_read(tmp_path):
    # UTF-8 with a byte-order mark and CRLF line ends.
    job = tmp_path / "win.toml"
    job.write_bytes(b"\xef\xbb\xbfcubes = 3\r\ndim = 6\r\n")
    grid = tmp_path / "grid.json"
    grid.write_bytes(b'\xef\xbb\xbf{"alpha": [1]}\r\n')
    (cubes,) = load_jobs([str(job)], {}, environ={})
    assert (cubes.settings.cubes, cubes.settings.dim) == (3, 6)
    (mapped,) = load_jobs([], {"grid": str(grid)}, workload="map", environ={})
    assert mapped.settings.grid == {"alpha": [1]}
    job.write_bytes(b'cubes = 3\nname = "\xff"\n')
    with pytest.raises(ConfigError, match=r"win.toml: not valid TOML: 'utf-8' codec"):
        load_jobs([str(job)], {}, environ={})


def test_flags_for_another_workload_are_refused():
    from pipeline.config import RunOptions, check_flags_apply
    from pipeline.workloads.cubes import CubeJob

    with pytest.raises(ConfigError, match="--formula do"):
        check_flags_apply({"formula": "y ~ x"}, "cubes", RunOptions, CubeJob)


def test_workloads_come_from_the_entry_point_registry():
    from pipeline import registry
    from pipeline.workloads.cubes import CubeWorkload
    from pipeline.workloads.regressions import RegressionWorkload

    assert registry.names()[0] == "cubes"  # the default first
    assert {"cubes", "map", "regressions"} <= set(registry.names())
    assert registry.load("cubes") is CubeWorkload
    assert registry.load("regressions") is RegressionWorkload
    assert registry.entry("cubes").package == "pipeline"
    with pytest.raises(ConfigError, match="workload 'nope' is not known; registered"):
        registry.entry("nope")


def _plugin(where, name: str, target: str, source: str | None = None) -> None:
    """A distribution in ``where`` registering ``target`` as workload ``name`` (and,
    with ``source``, the module it names), as ``pip install`` would."""
    dist = where / f"{name}_plugin-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}-plugin\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(f"[pipeline.workloads]\n{name} = {target}\n")
    if source is not None:
        (where / f"{target.split(':')[0]}.py").write_text(source)


@pytest.fixture
def install_plugin(tmp_path, monkeypatch):
    """Installs plug-ins (:func:`_plugin`) into this process for the test alone."""
    from pipeline import registry

    def install(name: str, target: str, source: str | None = None) -> None:
        _plugin(tmp_path, name, target, source)
        registry._entries.cache_clear()
        registry.load.cache_clear()

    monkeypatch.syspath_prepend(str(tmp_path))
    yield install
    monkeypatch.undo()
    registry._entries.cache_clear()
    registry.load.cache_clear()


def test_a_plugin_that_does_not_import_is_named_with_its_error(install_plugin):
    from pipeline import registry

    # A real distribution on sys.path whose entry point names a missing module.
    install_plugin("broken", "no_such_module:W")
    assert "broken" in registry.names()
    with pytest.raises(ConfigError) as info:
        registry.load("broken")
    message = str(info.value)
    assert "from package broken-plugin" in message
    assert "ModuleNotFoundError: No module named 'no_such_module'" in message


def test_a_plugin_that_does_not_import_leaves_every_other_command_working(tmp_path):
    # The CLI loaded every workload for its flags: one broken plug-in made every
    # command, `pipeline --help` too, a traceback.
    _plugin(tmp_path, "broken", "no_such_module:W")
    shown = pipeline_command("--help", paths=[tmp_path])
    assert shown.returncode == 0 and "workloads" in shown.stdout, shown.stderr
    listed = pipeline_command("workloads", paths=[tmp_path])
    assert listed.returncode == 0, listed.stderr
    assert "broken  (no_such_module:W, from package broken-plugin)\n  cannot be loaded: " in (
        listed.stdout
    )
    assert (
        "--function"
        in pipeline_command("run", "--workload", "map", "--help", paths=[tmp_path]).stdout
    )


def test_a_plugin_setting_named_like_a_run_option_is_refused(install_plugin):
    # A plug-in setting must not shadow a run option's flag: the run's --workers
    # would take the plug-in's type for every job, the built-ins' too.
    from pipeline import registry

    install_plugin("clash", "clashmod:ClashWorkload", plugin_source({"workers": "str"}))
    with pytest.raises(ConfigError, match=r"workload 'clash' .*its setting\(s\) workers "
                       "have the name of a run option"):  # fmt: skip
        registry.load("clash")


def plugin_source(settings: dict[str, str], preflight: str = "pass") -> str:
    """A plug-in module: workload ``ClashWorkload``, its settings ``{name: type}`` (each
    "The <name>.", None by default), and this preflight."""
    fields = "".join(
        f"    {name}: {kind} | None = setting(None, {kind}, 'The {name}.')\n"
        for name, kind in settings.items()
    )
    return (
        "import dataclasses\n"
        "from pipeline import InputError, Workload\n"
        "from pipeline.config import setting\n"
        "@dataclasses.dataclass(frozen=True)\n"
        "class ClashJob:\n"
        "    name: str | None = setting(None, str, 'Job id.')\n"
        f"{fields}"
        "class ClashWorkload(Workload):\n"
        "    kind = 'clash'\n"
        "    settings_class = ClashJob\n"
        "    run_task = fingerprint = None\n"
        "    def __init__(self, job, job_id):\n"
        "        self.job, self.job_id, self.n_units = job, job_id, 1\n"
        "    @classmethod\n"
        "    def from_settings(cls, settings, job_id, options=None):\n"
        "        return cls(settings, job_id)\n"
        "    def preflight(self):\n"
        f"        {preflight}\n"
    )


def test_a_plugin_setting_named_like_a_builtins_is_parsed_by_each_ones_type(tmp_path, frames_dir):
    # Workloads' settings of the same name are each parsed by their own type and keep
    # their own help: a plug-in's `dim: str` must not change the cubes' integer --dim.
    said = "raise InputError(f'tagger got dim={self.job.dim!r}, model={self.job.model!r}')"
    _plugin(
        tmp_path,
        "tagger",
        "tagmod:ClashWorkload",
        plugin_source({"dim": "str", "model": "str"}, said),
    )
    cubes = pipeline_command(
        "run",
        "--workload",
        "cubes",
        "--frames",
        frames_dir,
        "--dim",
        5,
        "--cubes",
        10,
        "--output",
        tmp_path / "c",
        "--workers",
        1,
        paths=[tmp_path],
    )
    assert cubes.returncode == 0 and "10 of 10 cubes" in cubes.stdout, cubes.stderr
    tagger = pipeline_command(
        "run",
        "--workload",
        "tagger",
        "--dim",
        5,
        "--model",
        "bert",
        "--output",
        tmp_path / "t",
        "--workers",
        1,
        paths=[tmp_path],
    )
    assert "Error: tagger got dim='5', model='bert'" in tagger.stderr, tagger.stderr
    wrong = pipeline_command("run", "--workload", "cubes", "--dim", "big", paths=[tmp_path])
    assert "Error: --dim: 'big' is not an integer" in wrong.stderr, wrong.stderr
    regressions = pipeline_command(
        "run", "--workload", "regressions", "--help", paths=[tmp_path]
    ).stdout
    assert "--model [ols|" in regressions and "The model." not in regressions
    assert "--dim" not in regressions
    tagger_help = pipeline_command("run", "--workload", "tagger", "--help", paths=[tmp_path]).stdout
    assert "--dim TEXT" in tagger_help and "The dim." in tagger_help
    cubes_help = pipeline_command("run", "--workload", "cubes", "--help", paths=[tmp_path]).stdout
    assert "--dim INTEGER" in cubes_help and "The dim." not in cubes_help
    every = pipeline_command("run", "--help", paths=[tmp_path]).stdout
    assert "--dim" not in every and "tagger" in every  # named where its options are


def test_a_plugin_switch_named_like_a_builtins_value_flag_is_refused(install_plugin):
    # One flag cannot be both: the regressions' --plots switch would have become a
    # flag taking a value (and `--plots job.toml` would have eaten the job file).
    from pipeline import registry

    install_plugin("clash", "switchmod:ClashWorkload", plugin_source({"plots": "str"}))
    with pytest.raises(ConfigError, match=r"workload 'clash' \(switchmod:ClashWorkload, from "
                       r"package clash-plugin\): its setting plots would be a flag that takes a "
                       r"value \(--plots VALUE\), but the built-in 'regressions' workload's "
                       r"plots is an on/off switch"):  # fmt: skip
        registry.load("clash")


def _help(*args: str) -> list[str]:
    """The lines of a ``pipeline`` command's output on an 80-column terminal."""
    from click.testing import CliRunner

    from pipeline.cli import main

    shown = CliRunner().invoke(main, list(args), prog_name="pipeline", terminal_width=80)
    assert shown.exit_code == 0, shown.output
    return shown.output.splitlines()


def test_run_help_fits_a_screen_and_says_where_each_workloads_options_are():
    from pipeline import registry
    from pipeline.cli.run import ESTIMATE_REFUSES
    from pipeline.config import RunOptions, flag_name, settings_of

    for command, refused in (("run", ()), ("estimate", ESTIMATE_REFUSES)):
        lines = _help(command, "--help")
        assert len(lines) <= 60 and max(map(len, lines)) <= 80, "\n".join(lines)
        text = "\n".join(lines)
        assert f"pipeline {command} --workload NAME --help" in text
        assert f"pipeline {command} JOB.toml --help" in text
        assert ", ".join(registry.names()) in text
        assert "a job-file key a_flag and a variable PIPELINE_A_FLAG" in " ".join(text.split())

        # the run's options (those the command takes) and no workload's
        def shown(f) -> str:
            return ("--[no-]" if f.metadata["kind"] is bool else "--") + flag_name(f)

        flags = {line.split()[0] for line in lines if line.startswith("  --")}
        own = {"--workload", "--fleet"} if command == "estimate" else {"--workload"}
        assert flags == {shown(f) for f in settings_of(RunOptions) if f.name not in refused} | own


def test_run_help_for_one_workload_lists_its_settings(tmp_path):
    one = "\n".join(_help("run", "--workload", "map", "--help"))
    assert "Options of the 'map' workload:" in one
    assert "--function TEXT" in one and "--grid" in one and "--retries INTEGER" in one
    assert "--cubes-per-shard" not in one and "--formula" not in one
    assert "--units-per-task" not in one and "pipeline run --help" in one
    # a job file's workload, named by the file or by PIPELINE_WORKLOAD
    job = write(tmp_path, 'workload = "regressions"\ndata = "x"\n')
    from_file = "\n".join(_help("run", job, "--help"))
    assert "Options of the 'regressions' workload:" in from_file and "--formula" in from_file
    assert "--function" not in from_file
    # a .toml file given as an option's value is not a job file
    grid = "\n".join(_help("run", "--workload", "map", "--grid", job, "--help"))
    assert "Options of the 'map' workload:" in grid


def test_an_unknown_workload_name_gets_did_you_mean(tmp_path):
    from click.testing import CliRunner

    from pipeline import registry
    from pipeline.cli import main

    for args in (["run", "--workload", "mapp"], ["run", "--workload", "mapp", "--help"]):
        shown = CliRunner().invoke(main, args)
        assert shown.exit_code == 2 and "'mapp' is not" in shown.output, shown.output
        assert "(did you mean 'map'?)" in shown.output, shown.output
    job = write(tmp_path, 'workload = "regresions"\n')
    with pytest.raises(ConfigError, match=r"workload = 'regresions' is not known \(did you "
                       r"mean 'regressions'\?\), expected one of cubes"):  # fmt: skip
        load_jobs([job], {})
    with pytest.raises(ConfigError, match=r"PIPELINE_WORKLOAD: 'Cube' is not a workload \(did "
                       r"you mean 'cubes'\?\)"):  # fmt: skip
        load_jobs([], {}, environ={"PIPELINE_WORKLOAD": "Cube"})
    with pytest.raises(ConfigError, match=r"workload 'mapp' is not known \(did you mean 'map'"):
        registry.load("mapp")
    with pytest.raises(ConfigError, match=r"job file mapp: no such file \(to run the map "
                       r"workload from flags alone: --workload map\)"):  # fmt: skip
        load_jobs(["mapp"], {})
    with pytest.raises(ConfigError, match=r"workload 'fractals' is not known; registered"):
        registry.load("fractals")  # nothing close: no guess


def test_connect_takes_the_variables_or_keywords_as_pipeline_run_does(monkeypatch):
    import pipeline

    def workers(client) -> int:
        return len(client.scheduler_info(n_workers=-1)["workers"])

    monkeypatch.setenv("PIPELINE_WORKERS", "1")
    with pipeline.connect() as client:  # the embedded cluster, PIPELINE_WORKERS's size
        assert workers(client) == 1
    with pipeline.connect(workers=2) as client:  # a keyword over the variable
        assert workers(client) == 2
    with pipeline.connect(pipeline.RunOptions(workers=2)) as client:
        assert workers(client) == 2
    unknown = r"connect\(\): worker is not a connection's setting \(did you mean 'workers'\?\)"
    with pytest.raises(ConfigError, match=unknown + "; those are scheduler, workers"):
        pipeline.connect(worker=2).__enter__()
    with pytest.raises(ConfigError, match=r"pipeline.connect\(\): workers given beside a "
                       "RunOptions"):  # fmt: skip
        pipeline.connect(pipeline.RunOptions(), workers=2).__enter__()
    monkeypatch.setenv("PIPELINE_WORKERS", "two")
    with pytest.raises(ConfigError, match=r"pipeline.connect\(\): environment PIPELINE_WORKERS: "
                       "'two' is not an integer"):  # fmt: skip
        pipeline.connect().__enter__()


@pytest.mark.integration
@pytest.mark.timeout(180)
def test_connect_with_no_arguments_reaches_the_tls_scheduler_the_variables_name(
    tmp_path, monkeypatch
):
    import pipeline
    from harness.cluster_procs import tls_cluster

    with tls_cluster(tmp_path, n_workers=1, nanny=False) as cluster:
        monkeypatch.setenv("PIPELINE_SCHEDULER", cluster.address)
        monkeypatch.setenv("PIPELINE_TLS_CA_FILE", str(cluster.certs["ca"]))
        monkeypatch.setenv("PIPELINE_TLS_CERT", str(cluster.certs["client"]))
        monkeypatch.setenv("PIPELINE_TLS_KEY", str(cluster.certs["client-key"]))
        monkeypatch.setenv("PIPELINE_WORKERS", "4")  # the embedded cluster's: outranked
        with pipeline.connect() as client:
            assert client.scheduler.address == cluster.address
            assert client.submit(lambda: 1 + 1, pure=False).result(timeout=30) == 2


def test_settings_made_in_python_are_checked_as_flags_are(tmp_path):
    import numpy as np

    from pipeline import CubeJob, MapJob, RunOptions

    with pytest.raises(ConfigError, match=r"CubeJob\(cubes=0\): 0 must be at least 1"):
        CubeJob(cubes=0)
    with pytest.raises(ConfigError, match=r"CubeJob\(dim=-5\): -5 must be at least 1"):
        CubeJob(dim=-5)  # a ZeroDivisionError or dying producers, before
    with pytest.raises(ConfigError, match=r"RunOptions\(workers=True\): expected an integer"):
        RunOptions(workers=True)
    with pytest.raises(ConfigError, match=r"MapJob\(retries=-1\): -1 must be at least 0"):
        MapJob(function="m:f", grid={"x": [1]}, retries=-1)
    # numpy's numbers and paths are taken, and stored as a job record holds them.
    job = CubeJob(cubes=np.int64(7), frames=tmp_path)
    assert (job.cubes, job.frames) == (7, str(tmp_path)) and type(job.cubes) is int
    assert RunOptions(task_seconds=np.float32(0.5)).task_seconds == 0.5


def test_a_column_or_option_listed_twice_is_refused_wherever_it_is_given(tmp_path):
    # chunk_by "a,a" reached pyarrow as a traceback; columns "y,y" gave the function a
    # frame with two y columns, and chunk["y"] a frame instead of a column.
    from pipeline import MapJob
    from pipeline.workloads.regressions import RegressionJob

    with pytest.raises(ConfigError, match=r"MapJob\(chunk_by=.*\): 'ticker' is listed twice"):
        MapJob(function="m:f", data="d", chunk_by=["ticker", "ticker"])
    with pytest.raises(ConfigError, match=r"'y' is listed twice"):
        MapJob(function="m:f", data="d", chunk_by="k", columns="y, y")
    with pytest.raises(ConfigError, match=r"'maxiter' is listed twice"):
        RegressionJob(data="d", formula="y ~ x", chunk_by="k", fit_options="maxiter=5,maxiter=9")
    job = tmp_path / "j.toml"
    job.write_text('workload = "map"\nfunction = "m:f"\ndata = "d"\nchunk_by = ["a", "a"]\n')
    with pytest.raises(ConfigError, match=r"j.toml: key 'chunk_by': 'a' is listed twice"):
        load_jobs([str(job)], {})
    assert MapJob(function="m:f", data="d", chunk_by="a, b").chunk_by == "a, b"


def test_a_job_name_is_one_folder_beside_the_outputs_own(tmp_path):
    # 'inputs' holds the default frames, which an --overwrite of a job named so deleted
    for name in ("a/b", "..", "_locks", ".hidden", "tab\there", "inputs", " ", "x "):
        with pytest.raises(ConfigError, match="a job's name is one folder under the output"):
            load_jobs([], {"name": name}, environ={})
    draft = tmp_path / "_draft.toml"
    draft.write_text("cubes = 1\n")
    with pytest.raises(ConfigError, match=r"job name '_draft'.*set name = "):
        load_jobs([str(draft)], {}, environ={})
    (job,) = load_jobs([str(draft)], {"name": "my draft"}, environ={})
    assert job.job_id == "my draft"
