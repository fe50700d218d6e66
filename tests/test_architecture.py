"""docs/architecture.md's table of the parts, held against the package: every module
in one row, every import (a function's own and a type checker's too) pointing to its
own row or one below it, no import circle; no module over 400 lines; the core names
no workload; no file of the repository points outside it."""

from __future__ import annotations

import ast
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "pipeline"
TABLE = ROOT / "docs" / "architecture.md"
MAX_LINES = 400


def _modules() -> dict[str, Path]:
    """Dotted name -> file, for every module of the package."""
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The package's modules that ``name`` imports, anywhere in its file."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parts = parts[: len(parts) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            named = [f"{base}.{alias.name}" for alias in node.names]
            targets = [t for t in named if t in modules] or [base]
        else:
            continue
        for target in targets:
            while target and target not in modules:
                target = target.rpartition(".")[0]
            # a package's __init__ re-exporting its own modules is not an import across
            if target and target != name and not target.startswith(name + "."):
                found.add(target)
    return found


def _rows() -> list[list[str]]:
    """The table's rows, top first: each a list of path patterns (``dispatch/``,
    ``runner.py``, ``workloads/{cubes,map}/``) relative to the package."""
    text = TABLE.read_text()
    table = text[text.index("## The parts") : text.index("## The path of a job")]
    rows = []
    for line in table.splitlines():
        cells = line.split("|")
        if len(cells) < 3 or not cells[1].strip().startswith("`"):
            continue
        paths = []
        for token in re.findall(r"`([^`]+)`", cells[1]):
            braces = re.fullmatch(r"(.*)\{([^}]*)\}(.*)", token)
            if braces:
                head, options, tail = braces.groups()
                paths += [head + option + tail for option in options.split(",")]
            else:
                paths.append(token)
        rows.append(paths)
    return rows


def _row_of(name: str, rows: list[list[str]]) -> int | None:
    """The row of module ``name``: that of the longest pattern naming it (a file listed
    on its own has the row it is listed in, not its folder's)."""
    relative = "/".join(name.split(".")[1:])
    candidates = {relative + ".py", relative + "/__init__.py"} if relative else {"__init__.py"}
    best, best_length = None, -1
    for number, paths in enumerate(rows):
        for pattern in paths:
            if pattern.endswith("/"):
                hit = any(c.startswith(pattern) for c in candidates)
            else:
                hit = pattern in candidates
            if hit and len(pattern) > best_length:
                best, best_length = number, len(pattern)
    return best


def test_every_module_has_a_row_and_every_import_points_down_the_table():
    modules, rows = _modules(), _rows()
    assert len(rows) > 10 and ["errors.py"] in rows, rows
    unplaced = sorted(name for name in modules if _row_of(name, rows) is None)
    assert unplaced == [], "modules in no row of docs/architecture.md's table"
    upward = []
    for name, path in modules.items():
        here = _row_of(name, rows)
        for target in _imports(name, path, modules):
            there = _row_of(target, rows)
            if there < here:
                upward.append(f"{name} (row {here + 1}) imports {target} (row {there + 1})")
    assert sorted(upward) == []


def test_the_scan_sees_function_level_and_type_only_imports(tmp_path):
    package = tmp_path / "pipeline"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "low.py").write_text("")
    (package / "high.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from . import low\n"
        "def f():\n    from .low import x\n"
    )
    modules = {"pipeline": package / "__init__.py", "pipeline.low": package / "low.py"}
    modules["pipeline.high"] = package / "high.py"
    assert _imports("pipeline.high", package / "high.py", modules) == {"pipeline.low"}


def test_no_import_circle():
    modules = _modules()
    graph = {name: _imports(name, path, modules) for name, path in modules.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles = []

    def visit(node: str) -> None:  # Tarjan's strongly connected components
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in graph[node]:
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for name in graph:
        if name not in index:
            visit(name)
    assert circles == []


def test_no_module_over_the_line_limit():
    long = {
        str(path.relative_to(ROOT)): n
        for path in PACKAGE.rglob("*.py")
        if (n := len(path.read_text().splitlines())) > MAX_LINES
    }
    assert long == {}


def test_the_core_names_no_workload():
    pattern = re.compile(r"""["'](cube_id|chunk_start|chunk_stop|cubes|regressions)["']""")
    hits = [
        f"{path.relative_to(ROOT)}:{number}"
        for path in PACKAGE.rglob("*.py")
        if "workloads" not in path.relative_to(PACKAGE).parts
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if pattern.search(line.split("#", 1)[0])
    ]
    assert hits == []


def test_no_file_points_outside_the_repository():
    # .ci/run is the workplace's entry point, which starts the workplace's Docker engine.
    files = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT, capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    # the workplace's shared folder beside the checkout, and this machine's root for it
    outside = re.compile(r"\.\./" + "shared" + "|" + "/wo" + "rk/")
    hits = []
    for name in files:
        path = ROOT / name
        if name.startswith(".ci/") or not path.is_file() or path.stat().st_size > 2_000_000:
            continue
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        lines = enumerate(text.splitlines(), 1)
        hits += [f"{name}:{n}" for n, line in lines if outside.search(line)]
    assert hits == []


def test_no_function_imports_what_its_module_already_imports_at_the_top():
    def names(node) -> set[tuple]:
        module = "." * node.level + (node.module or "") if isinstance(node, ast.ImportFrom) else ""
        return {(module, alias.name, alias.asname) for alias in node.names}

    repeated = []
    for path in PACKAGE.rglob("*.py"):
        tree = ast.parse(path.read_text(), str(path))
        top = set()
        for node in tree.body:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                top |= names(node)
        for function in ast.walk(tree):
            if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(function):
                if isinstance(node, (ast.Import, ast.ImportFrom)) and names(node) & top:
                    repeated.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert sorted(set(repeated)) == []


def test_every_declared_marker_is_used():
    import tomllib

    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    declared = {line.split(":")[0].strip() for line in config["markers"]}
    text = "\n".join(p.read_text() for p in (ROOT / "tests").rglob("*.py"))
    assert {m for m in declared if f"mark.{m}" not in text} == set()


def test_each_module_logs_under_its_own_name():
    named = re.compile(r"""getLogger\(\s*["'](pipeline[^"']*)["']""")
    hits = [
        f"{path.relative_to(ROOT)} logs as {match.group(1)!r}"
        for path in PACKAGE.rglob("*.py")
        for match in named.finditer(path.read_text())
    ]
    assert hits == []


def test_no_module_imports_another_modules_private_name():
    private = []
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and (
                node.level or "pipeline" in (node.module or "")
            ):
                names = [a.name for a in node.names if re.match(r"_[^_]", a.name)]
                private += [f"{path.relative_to(ROOT)}: {name}" for name in names]
    assert sorted(private) == []
