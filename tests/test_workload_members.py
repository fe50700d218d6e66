"""The workload contract stays what a plug-in writes or receives: few members, each in
docs/plugins.md; the output's hooks on ``Workload.results`` alone; nothing the runner
sets on a workload."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from pipeline import RunOptions, TableResults, Workload, run_job

PLUGINS = Path(__file__).resolve().parents[1] / "docs" / "plugins.md"
#: ``Workload``'s members at most (joblib's ParallelBackendBase has a handful; this
#: contract had 39 before its output's hooks went to ``TableResults``, 27 before
#: ``reruns_failed_units`` alone said which tasks a rerun calls again).
MOST_MEMBERS = 26


def members(cls) -> set[str]:
    """The public names ``cls`` defines or declares: attributes, methods, properties,
    and annotated attributes without a default (``job_id``)."""
    declared = {
        n for c in cls.__mro__ if c is not object for n in vars(c).get("__annotations__", {})
    }
    return {n for n in set(dir(cls)) | declared if not n.startswith("_")}


def documented(section: str) -> set[str]:
    """The names in the first cells of the tables of docs/plugins.md's ``section``
    (a ``## `` heading's text, up to the next such heading)."""
    text = PLUGINS.read_text()
    start = text.index(f"## {section}")
    end = text.find("\n## ", start + 1)
    names = set()
    for line in text[start : end if end > 0 else None].splitlines():
        cells = line.split("|")
        if len(cells) > 2:
            names |= {m.group(1) for m in re.finditer(r"`(\w+)", cells[1])}
    return names


def test_every_member_of_the_contract_is_in_the_plugin_docs():
    assert members(Workload) - documented("The contract") == set()
    assert members(TableResults) - documented("Its results") == set()


def test_the_workload_contract_stays_small():
    assert len(members(Workload)) <= MOST_MEMBERS, sorted(members(Workload))


@pytest.mark.parametrize("hook", ["default_table", "verify_job", "finalize", "table_bytes"])
def test_a_workload_that_defines_an_output_hook_on_itself_is_refused_naming_it(hook):
    with pytest.raises(TypeError, match=rf"OldStyle defines {hook}: .*TableResults"):
        type("OldStyle", (Workload,), {hook: None})


def test_a_workload_that_defines_tasks_to_retry_is_refused_naming_its_replacement():
    with pytest.raises(TypeError, match=r"OldStyle defines tasks_to_retry: .*reruns_failed_units"):
        type("OldStyle", (Workload,), {"tasks_to_retry": lambda self, store, tasks: set()})


def test_the_runner_sets_nothing_on_the_workload(tmp_path, client):
    # The code version each task records travels with the tasks, not on the workload
    # (a plug-in's object, pickled to every worker).
    from support.workloads import VersionedWorkload

    workload = VersionedWorkload("v", 6, "1.0")
    before = dict(vars(workload))
    options = RunOptions(output=str(tmp_path), units_per_task=2, progress=False)
    assert run_job(workload, options, client, echo=lambda m: None).complete
    assert vars(workload) == before
