#!/usr/bin/env bash
# Refresh requirements.lock to the newest versions pyproject.toml allows, then run the
# test suite on them (scripts/test.sh installs the lock into .venv):
#
#   bash scripts/lock.sh              # refresh, install, run the whole suite
#   bash scripts/lock.sh -k storage   # ... run only these tests (pytest arguments)
#   LOCK_ONLY=1 bash scripts/lock.sh  # refresh the file, install and test nothing
#
# A failed run means a newer release breaks the project: commit the refreshed lock only
# once the suite passes on it (`git checkout requirements.lock` and `bash scripts/test.sh`
# go back to the versions that passed).
#
# The lock pins every runtime and test dependency (pyproject.toml's dependencies and its
# dev extra) and the dependencies of the torch extra; torch itself is left out: test.sh
# installs torch==2.13.0, the CPU build this machine has on local disk (/opt/wheels,
# which the resolution reads where it exists so as to see that build's dependencies, not
# the CUDA build's). The tool is uv (`uv pip compile`), pinned below, in .venv-tools.
set -euo pipefail
cd "$(dirname "$0")/.."

uv_version=${UV_VERSION:-0.13.9}
venv=${VENV_TOOLS:-.venv-tools}
python=${PYTHON:-python3}
if [ ! -x "$venv/bin/python" ]; then
  "$python" -m venv "$venv"
fi
if [ "$("$venv/bin/python" -m uv --version 2>/dev/null)" != "uv $uv_version" ]; then
  "$venv/bin/python" -m pip install -q "uv==$uv_version"
fi

find_links=()
if [ -d /opt/wheels ]; then
  find_links=(--find-links /opt/wheels)
fi
"$venv/bin/python" -m uv pip compile pyproject.toml \
  --extra dev --extra torch \
  --override <(echo "torch==2.13.0") --no-emit-package torch \
  "${find_links[@]}" \
  --python-version 3.11 --upgrade --quiet \
  --custom-compile-command "bash scripts/lock.sh" \
  --output-file requirements.lock
echo "lock.sh: requirements.lock refreshed ($(grep -c '^[A-Za-z0-9]' requirements.lock) pins); changes:" >&2
git --no-pager diff --stat -- requirements.lock >&2 || true

if [ -n "${LOCK_ONLY:-}" ]; then
  exit 0
fi
exec bash scripts/test.sh "$@"
