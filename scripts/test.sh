#!/usr/bin/env bash
# Set up everything the test suite needs, then run all of it.
#   bash scripts/test.sh [pytest args]
# Installs: the Debian packages haproxy and chromium (when missing; needs root or sudo), a
# virtualenv .venv with every dependency at the version requirements.lock pins (runtime and
# dev extra: pytest, SeaweedFS's `weed` for the S3 tests, ...), the project, the example
# plug-in and torch, and (through scripts/check-terraform.sh, called by the tests) checkov
# in .venv-tools. scripts/lock.sh refreshes the lock to the newest versions and runs this.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v haproxy >/dev/null 2>&1; then
  echo "test.sh: installing haproxy" >&2
  sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq haproxy >/dev/null
fi

# The report page test (tests/test_report.py) opens the page in headless Chromium.
if ! command -v chromium >/dev/null 2>&1; then
  echo "test.sh: installing chromium" >&2
  sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq chromium >/dev/null
fi

python=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$python" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip >/dev/null
# The versions the suite passes with, then the project and the example workload plug-in
# (the contract tests run it as a third party's) without resolving anything again.
.venv/bin/python -m pip install -q -r requirements.lock
.venv/bin/python -m pip install -q --no-deps -e . -e examples/plugin
# The torch extra's tests (tests/test_torch.py) run when torch is there; the core
# installs and tests without it. 2.13.0 is the CPU build this machine installs
# from local disk (other versions download gigabytes); its dependencies are locked.
.venv/bin/python -m pip install -q torch==2.13.0 -c requirements.lock

set +e
.venv/bin/python -m pytest "$@"
status=$?
set -e
if [ "$status" -eq 5 ]; then
  echo "test.sh: pytest collected no tests; that is a failure here" >&2
  exit 1
fi
exit "$status"
