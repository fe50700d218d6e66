"""The repository's layout rules, read from its files: a test imports helper modules,
never another test module or the conftest (pytest imports those itself, and a second
import runs a module's code twice); code outside the package reaches shared code as
packages, never by putting a repository folder on ``sys.path``."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TESTS = ROOT / "tests"

#: ``sys.path`` edits outside the package, each with its reason.
PATH_EDITS = {
    "benchmarks/bench_estimate.py": "the benchmark's job code, in a temporary folder",
    "scripts/exit_stress.py": "the harness's SeaweedFS, from a script run by its path",
}


def _imported(path: Path) -> set[str]:
    """Top-level names of the modules ``path`` imports (absolute imports)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def _edits_sys_path(path: Path) -> bool:
    """Whether ``path`` changes ``sys.path``: a method call on it (insert, append, ...),
    or an assignment to it or to an item of it."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if ast.unparse(node.func.value) == "sys.path":
                return True
        elif isinstance(node, (ast.Assign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(ast.unparse(t).split("[")[0] == "sys.path" for t in targets):
                return True
    return False


def test_no_test_imports_another_test_module_or_the_conftest():
    assert {"support", "harness"} <= _imported(TESTS / "test_faults.py") | _imported(
        TESTS / "test_tls.py"
    ), "the scan sees the helper imports"
    found = {
        path.name: sorted(n for n in _imported(path) if n.startswith("test_") or n == "conftest")
        for path in [*TESTS.glob("*.py"), *TESTS.glob("support/*.py")]
    }
    assert {name: mods for name, mods in found.items() if mods} == {}


def test_only_the_listed_files_outside_the_package_edit_sys_path(tmp_path):
    edits, reads = tmp_path / "edits.py", tmp_path / "reads.py"
    edits.write_text("import sys\nsys.path.insert(0, 'tests')\n")
    reads.write_text("import sys\nprint(sys.path[0], 'tests' in sys.path)\n")
    assert (_edits_sys_path(edits), _edits_sys_path(reads)) == (True, False)
    files = [
        p for d in ("benchmarks", "harness", "scripts", "tests") for p in ROOT.glob(f"{d}/**/*.py")
    ]
    found = {str(p.relative_to(ROOT)) for p in files if _edits_sys_path(p)}
    assert found == set(PATH_EDITS)
