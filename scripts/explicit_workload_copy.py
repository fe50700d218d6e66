"""Write a copy of this checkout in which the run object's phases take the workload
as a parameter, for reading the driver's call graph.

``JobRun`` keeps the job's workload as ``self.workload``, and each phase reads it
there. A reader that follows one parameter through the calls that pass it on loses
it at that attribute. In the copy, each method of ``JobRun`` that reads
``self.workload`` (or calls a method that does) takes ``workload`` as its first
parameter instead, and each call of it passes it on, from ``run_validated_job``'s
``JobRun(workload, ...).run(...)`` down (``run`` renamed ``run_with_workload``, a
name no other class defines); nothing else changes. The copy is for
reading only (comments and formatting of the rewritten files are lost).

    python scripts/explicit_workload_copy.py /tmp/explicit-workload
"""

from __future__ import annotations

import argparse
import ast
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RUN = "pipeline/runner/run.py"
JOB = "pipeline/runner/job.py"
CLASS = "JobRun"
#: ``JobRun.run``'s name in the copy, one no other class defines.
ENTRY = "run_with_workload"


def copy_tree(dest: Path) -> None:
    """The checkout's tracked and untracked (not ignored) files, as they are now."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    if dest.exists():
        shutil.rmtree(dest)
    for name in filter(None, listed):
        src = ROOT / name.decode()
        if not src.is_file():
            continue
        target = dest / name.decode()
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, target)
    subprocess.run(["git", "init", "-q"], cwd=dest, check=True)


def _reads_workload(node: ast.AST) -> bool:
    return any(
        isinstance(n, ast.Attribute)
        and n.attr == "workload"
        and isinstance(n.value, ast.Name)
        and n.value.id == "self"
        for n in ast.walk(node)
    )


def _self_calls(node: ast.AST) -> set[str]:
    return {
        n.func.attr
        for n in ast.walk(node)
        if isinstance(n, ast.Call)
        and isinstance(n.func, ast.Attribute)
        and isinstance(n.func.value, ast.Name)
        and n.func.value.id == "self"
    }


def _is_property(fn: ast.FunctionDef) -> bool:
    return any(isinstance(d, ast.Name) and d.id == "property" for d in fn.decorator_list)


class _Explicit(ast.NodeTransformer):
    """``self.workload`` -> ``workload``; ``self.m(...)`` -> ``self.m(workload, ...)``
    for the methods in ``takes``."""

    def __init__(self, takes: set[str]):
        self.takes = takes

    def visit_Attribute(self, node: ast.Attribute):
        self.generic_visit(node)
        if (
            node.attr == "workload"
            and isinstance(node.value, ast.Name)
            and node.value.id == "self"
            and isinstance(node.ctx, ast.Load)
        ):
            return ast.copy_location(ast.Name("workload", ast.Load()), node)
        return node

    def visit_Assign(self, node: ast.Assign):
        """``workload = self.workload`` goes: the parameter is there already."""
        if (
            len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name)
            and node.targets[0].id == "workload"
            and _reads_workload(node.value)
            and isinstance(node.value, ast.Attribute)
        ):
            return None
        return self.generic_visit(node)

    def visit_Call(self, node: ast.Call):
        self.generic_visit(node)
        f = node.func
        if (
            isinstance(f, ast.Attribute)
            and isinstance(f.value, ast.Name)
            and f.value.id == "self"
            and f.attr in self.takes
        ):
            node.args.insert(0, ast.Name("workload", ast.Load()))
        return node


def rewrite_run(path: Path) -> set[str]:
    """``JobRun``'s methods that read the workload take it; returns their names."""
    tree = ast.parse(path.read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == CLASS)
    methods = {n.name: n for n in cls.body if isinstance(n, ast.FunctionDef)}
    takes = {
        name
        for name, fn in methods.items()
        if name != "__init__" and not _is_property(fn) and _reads_workload(fn)
    }
    while True:  # and those that call one that does
        more = {
            name
            for name, fn in methods.items()
            if name not in takes
            and name != "__init__"
            and not _is_property(fn)
            and _self_calls(fn) & takes
        }
        if not more:
            break
        takes |= more
    takes.add("run")  # the entry: run_validated_job hands the workload in here
    # (renamed: several classes define a ``run``, so a reader could not tell which is called)
    methods["run"].name = ENTRY
    lost = [n for n, fn in methods.items() if _is_property(fn) and _reads_workload(fn)]
    if lost:
        print(f"note: properties read self.workload (not followed): {lost}", file=sys.stderr)
    for name in takes:
        fn = methods[name]
        fn.args.args.insert(1, ast.arg("workload"))
    _Explicit(takes).visit(cls)
    path.write_text(ast.unparse(ast.fix_missing_locations(tree)) + "\n")
    return takes


class _PassToRun(ast.NodeTransformer):
    """``JobRun(w, ...).run(...)`` -> ``JobRun(w, ...).run_with_workload(w, ...)``."""

    def __init__(self):
        self.rewritten = 0

    def visit_Call(self, node: ast.Call):
        self.generic_visit(node)
        f = node.func
        if (
            isinstance(f, ast.Attribute)
            and f.attr == "run"
            and isinstance(f.value, ast.Call)
            and isinstance(f.value.func, ast.Name)
            and f.value.func.id == CLASS
        ):
            node.args.insert(0, f.value.args[0])
            f.attr = ENTRY
            self.rewritten += 1
        return node


def rewrite_job(path: Path) -> None:
    """Each ``JobRun(w, ...).run(...)`` passes ``w`` on; refused where there is none (a
    run object made and run in two statements would leave the copy's reader stopped at
    the constructor, with figures that look fine)."""
    passing = _PassToRun()
    tree = passing.visit(ast.parse(path.read_text()))
    if not passing.rewritten:
        raise SystemExit(f"{path}: no {CLASS}(...).run(...) call to pass the workload through")
    path.write_text(ast.unparse(ast.fix_missing_locations(tree)) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dest", type=Path, help="the copy's folder (replaced)")
    dest = parser.parse_args(argv).dest.resolve()
    if dest == ROOT or ROOT in dest.parents:
        parser.error("the copy goes outside the checkout")
    copy_tree(dest)
    takes = rewrite_run(dest / RUN)
    rewrite_job(dest / JOB)
    print(f"{dest}: {CLASS} methods that take the workload: {', '.join(sorted(takes))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
