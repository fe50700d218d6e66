#!/bin/sh
# The image's entrypoint: exports each variable of the Dask processes' environment
# (WORKER_ENV_FILE, default /etc/pipeline/worker.env: pipeline/cluster/worker.env of the
# repository) that the container was not given, then runs the command as given. A
# variable the container was given (docker run -e, --env-file, Compose) is kept: the
# file holds defaults. exec: the command gets the container's signals (docker stop).
set -eu
env_file=${WORKER_ENV_FILE:-/etc/pipeline/worker.env}
while IFS= read -r line || [ -n "$line" ]; do
  case $line in '' | '#'*) continue ;; esac
  key=${line%%=*}
  case $key in
    '' | [0-9]* | *[!A-Za-z0-9_]*)
      echo "worker-env: $env_file: not KEY=VALUE: $line" >&2
      exit 1
      ;;
  esac
  eval "given=\${$key+set}"
  [ -n "$given" ] || export "$line"
done <"$env_file"
exec "$@"
