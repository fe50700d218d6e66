"""Configuration resolves flag > job file > PIPELINE_* env var > default."""

from __future__ import annotations

import pytest

from pipeline import ConfigError, load_jobs


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


def test_several_job_files_share_flags(tmp_path):
    a = tmp_path / "a.toml"
    b = tmp_path / "b.toml"
    a.write_text("cubes = 1\n")
    b.write_text('cubes = 2\nname = "second"\n')
    jobs = load_jobs([str(a), str(b)], {"output": "elsewhere"}, environ={})
    assert [j.settings.cubes for j in jobs] == [1, 2]
    assert [j.job_id for j in jobs] == ["a", "second"]
    assert {j.options.output for j in jobs} == {"elsewhere"}


def test_flags_for_another_workload_are_refused():
    from pipeline.config import RunOptions, check_flags_apply
    from pipeline.cubes import CubeJob

    with pytest.raises(ConfigError, match="--formula do"):
        check_flags_apply({"formula": "y ~ x"}, "cubes", RunOptions, CubeJob)
