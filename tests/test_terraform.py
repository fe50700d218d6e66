"""Static checks of the Terraform module in terraform/.

No provider can be downloaded here, so `terraform init/validate/plan` cannot
run. These tests parse the module with python-hcl2 and assert the topology
the module promises (issue 6): the default fleet, the load balancer, the
scheduler group of one, IMDSv2, encryption, security groups without world
ingress, least-privilege IAM, TLS material only in SSM, small user data
without secrets. Where a `terraform` binary is on PATH they also evaluate the
variable validations and render the user data with `terraform console`,
which needs no provider.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import textwrap
from pathlib import Path

import pytest

from pipeline.cluster.environment import worker_env

# python-hcl2 >= 8 keeps comments (the checkov skips are read from them) and
# marks blocks; older releases shape the parse tree differently.
hcl2 = pytest.importorskip(
    "hcl2", minversion="8.0", reason="python-hcl2>=8 is needed: pip install 'python-hcl2>=8'"
)

REPO = Path(__file__).resolve().parents[1]
TF = REPO / "terraform"
WORKER_ENV = REPO / "pipeline" / "cluster" / "worker.env"
TEMPLATES = TF / "templates"
TERRAFORM = shutil.which("terraform")
USER_DATA_LIMIT = 16 * 1024


# --------------------------------------------------------------------------
# Parsing helpers
# --------------------------------------------------------------------------


def _unquote(value):
    """python-hcl2 >= 7 keeps the quotes of string literals and block labels."""
    if isinstance(value, str) and len(value) >= 2 and value[0] == '"' and value[-1] == '"':
        return value[1:-1]
    return value


def _norm(node):
    if isinstance(node, dict):
        out = {}
        for key, value in node.items():
            if key == "__is_block__":
                continue
            out[_unquote(key)] = _norm(value)
        return out
    if isinstance(node, list):
        return [_norm(v) for v in node]
    return _unquote(node)


def _load(path: Path) -> dict:
    with path.open() as f:
        return _norm(hcl2.load(f))


class Module:
    """All .tf files of one directory, merged by block kind."""

    def __init__(self, directory: Path):
        self.resources: dict[str, dict[str, dict]] = {}
        self.data: dict[str, dict[str, dict]] = {}
        self.variables: dict[str, dict] = {}
        self.outputs: dict[str, dict] = {}
        self.locals: dict[str, object] = {}
        self.terraform: list[dict] = []
        self.modules: dict[str, dict] = {}
        self.providers: list[dict] = []
        self.files = sorted(directory.glob("*.tf"))
        for path in self.files:
            doc = _load(path)
            for block in doc.get("resource", []):
                for rtype, named in block.items():
                    for name, body in named.items():
                        assert name not in self.resources.setdefault(rtype, {}), (
                            f"duplicate {rtype}.{name}"
                        )
                        self.resources[rtype][name] = body
            for block in doc.get("data", []):
                for dtype, named in block.items():
                    for name, body in named.items():
                        self.data.setdefault(dtype, {})[name] = body
            for block in doc.get("variable", []):
                self.variables.update(block)
            for block in doc.get("output", []):
                self.outputs.update(block)
            for block in doc.get("locals", []):
                for key, value in block.items():
                    if key != "__comments__":
                        assert key not in self.locals, f"duplicate local {key}"
                        self.locals[key] = value
            for block in doc.get("module", []):
                self.modules.update(block)
            self.terraform += doc.get("terraform", [])
            self.providers += doc.get("provider", [])

    def resource(self, rtype: str, name: str) -> dict:
        assert rtype in self.resources and name in self.resources[rtype], (
            f"missing resource {rtype}.{name}"
        )
        return self.resources[rtype][name]

    def local_int(self, name: str) -> int:
        value = self.locals[name]
        assert isinstance(value, int), f"local.{name} should be a literal number, got {value!r}"
        return value

    def resolve(self, value):
        """Resolve a bare `${local.x}` reference to a literal local."""
        if isinstance(value, str):
            m = re.fullmatch(r"\$\{local\.([a-z_0-9]+)\}", value)
            if m and m.group(1) in self.locals:
                return self.locals[m.group(1)]
        return value


def _block(body: dict, key: str) -> dict:
    """First instance of a nested block (python-hcl2 gives a list)."""
    value = body.get(key)
    assert value, f"block {key!r} missing"
    return value[0] if isinstance(value, list) else value


def _comments(body: dict) -> list[str]:
    return [c["value"] for c in body.get("__comments__", [])]


@pytest.fixture(scope="module")
def mod() -> Module:
    return Module(TF)


@pytest.fixture(scope="module")
def example() -> Module:
    return Module(TF / "examples" / "minimal")


def _template(name: str) -> str:
    return (TEMPLATES / name).read_text()


# --------------------------------------------------------------------------
# Layout, versions, variables
# --------------------------------------------------------------------------


def test_module_files_by_concern(mod):
    names = {p.name for p in mod.files}
    expected = {
        "versions.tf",
        "variables.tf",
        "outputs.tf",
        "network.tf",
        "security_groups.tf",
        "load_balancer.tf",
        "scheduler.tf",
        "workers.tf",
        "storage.tf",
        "iam.tf",
        "tls.tf",
    }
    assert expected <= names, f"missing: {expected - names}"
    # A reusable module configures no provider: the caller does.
    assert mod.providers == []


def test_versions_pinned(mod):
    (tf,) = mod.terraform
    required = tf["required_version"]
    m = re.fullmatch(r">=\s*(\d+)\.(\d+)(?:\.\d+)?", required)
    assert m and (int(m.group(1)), int(m.group(2))) >= (1, 6), required
    providers = (
        tf["required_providers"][0]
        if isinstance(tf["required_providers"], list)
        else tf["required_providers"]
    )
    assert providers["aws"]["source"] == "hashicorp/aws"
    # Pinned to one major version.
    assert re.fullmatch(r"~>\s*\d+\.\d+", providers["aws"]["version"]), providers["aws"]["version"]
    assert re.fullmatch(r"~>\s*\d+\.\d+", providers["tls"]["version"]), providers["tls"]["version"]


def test_every_variable_has_description_and_type(mod):
    assert len(mod.variables) >= 20
    for name, body in mod.variables.items():
        assert body.get("description", "").strip(), f"variable {name} has no description"
        assert "type" in body, f"variable {name} has no type"


def test_issue_inputs_exist(mod):
    wanted = {
        "region",
        "create_vpc",
        "vpc_id",
        "private_subnet_ids",
        "public_subnet_ids",
        "worker_instance_type",
        "worker_count",
        "workers_per_instance",
        "worker_capacity_type",
        "image_uri",
        "image_tag",
        "allowed_cidrs",
        "results_bucket_name",
        "results_prefix",
        "tags",
        "lb_internet_facing",
        "enable_dashboard",
        "ssh_key_name",
    }
    assert wanted <= set(mod.variables), f"missing: {wanted - set(mod.variables)}"


def test_default_fleet(mod):
    v = mod.variables
    assert v["worker_instance_type"]["default"] == "c5.24xlarge"
    assert v["worker_count"]["default"] == 5
    assert v["workers_per_instance"]["default"] is None
    # ... which means one single-threaded worker per vCPU of the instance type.
    assert (
        mod.data["aws_ec2_instance_type"]["worker"]["instance_type"]
        == "${var.worker_instance_type}"
    )
    assert "data.aws_ec2_instance_type.worker.default_vcpus" in mod.locals["workers_per_instance"]
    assert v["worker_capacity_type"]["default"] == "on-demand"
    cond = v["worker_capacity_type"]["validation"][0]["condition"]
    assert "spot" in cond and "on-demand" in cond
    # Internal, no dashboard, no SSH key unless asked.
    assert v["lb_internet_facing"]["default"] is False
    assert v["enable_dashboard"]["default"] is False
    assert v["ssh_key_name"]["default"] is None


def test_allowed_cidrs_refuse_the_world(mod):
    var = mod.variables["allowed_cidrs"]
    assert var["default"] == []
    conditions = " ".join(val["condition"] for val in var["validation"])
    assert "0.0.0.0/0" in conditions and "::/0" in conditions


# --------------------------------------------------------------------------
# Load balancer
# --------------------------------------------------------------------------


def test_network_load_balancer_internal_by_default(mod):
    lb = mod.resource("aws_lb", "this")
    assert lb["load_balancer_type"] == "network"
    assert lb["internal"] == "${!var.lb_internet_facing}"
    assert lb["security_groups"] == ["${aws_security_group.lb.id}"]
    assert lb["enable_cross_zone_load_balancing"] is True
    # Internet-facing only with allowed CIDRs.
    preconditions = _block(lb, "lifecycle")["precondition"]
    assert any(
        "lb_internet_facing" in p["condition"] and "allowed_cidrs" in p["condition"]
        for p in preconditions
    )


def test_listener_tcp_8786_to_scheduler(mod):
    listener = mod.resource("aws_lb_listener", "scheduler")
    assert mod.resolve(listener["port"]) == 8786
    assert listener["protocol"] == "TCP"  # TLS passes through to the scheduler
    assert "certificate_arn" not in listener and "ssl_policy" not in listener
    action = _block(listener, "default_action")
    assert action["type"] == "forward"
    assert action["target_group_arn"] == "${aws_lb_target_group.scheduler.arn}"
    assert listener["load_balancer_arn"] == "${aws_lb.this.arn}"


def test_target_group_and_health_check(mod):
    tg = mod.resource("aws_lb_target_group", "scheduler")
    assert mod.resolve(tg["port"]) == 8786
    assert tg["protocol"] == "TCP"
    assert tg["target_type"] == "instance"
    hc = _block(tg, "health_check")
    assert hc["enabled"] is True
    assert hc["protocol"] == "HTTP" and hc["path"] == "/health"
    assert "local.dashboard_port" in hc["port"] and mod.local_int("dashboard_port") == 8787
    # The scheduler's HTTP server listens on that port.
    sched = _template("scheduler.sh.tftpl")
    assert "--dashboard-address :${dashboard_port}" in sched
    assert "/health" in sched


def test_dashboard_listener_only_when_enabled(mod):
    for rtype, name in (("aws_lb_listener", "dashboard"), ("aws_lb_target_group", "dashboard")):
        assert mod.resource(rtype, name)["count"] == "${var.enable_dashboard ? 1 : 0}"
    rule = mod.resource("aws_vpc_security_group_ingress_rule", "lb_dashboard_from_cidrs")
    assert "var.enable_dashboard" in rule["for_each"] and "var.allowed_cidrs" in rule["for_each"]


# --------------------------------------------------------------------------
# Scheduler and workers
# --------------------------------------------------------------------------


def test_scheduler_is_an_asg_of_one_behind_the_nlb(mod):
    asg = mod.resource("aws_autoscaling_group", "scheduler")
    assert (asg["min_size"], asg["max_size"], asg["desired_capacity"]) == (1, 1, 1)
    assert asg["health_check_type"] == "ELB"
    assert asg["health_check_grace_period"] == "${var.health_check_grace_period_seconds}"
    assert "aws_lb_target_group.scheduler.arn" in str(asg["target_group_arns"])
    assert asg["vpc_zone_identifier"] == "${local.private_subnet_ids}"
    lt = _block(asg, "launch_template")
    assert lt["id"] == "${aws_launch_template.scheduler.id}"
    # Bounded wait instead of hanging on a scheduler that never comes up.
    assert "wait_for_capacity_timeout" in asg


def test_workers_asg_from_launch_template(mod):
    asg = mod.resource("aws_autoscaling_group", "workers")
    assert asg["desired_capacity"] == "${var.worker_count}"
    assert asg["vpc_zone_identifier"] == "${local.private_subnet_ids}"
    dyn = {k: v for d in asg["dynamic"] for k, v in d.items()}
    assert "on-demand" in dyn["launch_template"]["for_each"]
    assert dyn["launch_template"]["content"][0]["id"] == "${aws_launch_template.workers.id}"
    assert "spot" in dyn["mixed_instances_policy"]["for_each"]
    mip = dyn["mixed_instances_policy"]["content"][0]
    dist = _block(mip, "instances_distribution")
    assert dist["on_demand_percentage_above_base_capacity"] == 0
    spec = _block(_block(mip, "launch_template"), "launch_template_specification")
    assert spec["launch_template_id"] == "${aws_launch_template.workers.id}"


@pytest.mark.parametrize("role", ["scheduler", "workers"])
def test_launch_template_hardening(mod, role):
    lt = mod.resource("aws_launch_template", role)
    md = _block(lt, "metadata_options")
    assert md["http_tokens"] == "required", "IMDSv2 must be required"
    assert md["http_endpoint"] == "enabled"
    assert md["http_put_response_hop_limit"] == 1
    for bdm in lt["block_device_mappings"]:
        ebs = _block(bdm, "ebs")
        assert ebs["encrypted"] is True
        assert ebs["volume_type"] == "gp3"
    assert lt["key_name"] == "${var.ssh_key_name}"
    assert "network_interfaces" not in lt, "no public IP / ENI overrides"
    assert lt["vpc_security_group_ids"] == [f"${{aws_security_group.{role}.id}}"]
    assert (
        lt["iam_instance_profile"][0]["arn"] == f'${{aws_iam_instance_profile.this["{role}"].arn}}'
    )
    user_data_local = {"scheduler": "scheduler_user_data", "workers": "worker_user_data"}[role]
    assert lt["user_data"] == f"${{base64encode(local.{user_data_local})}}"
    # The 16 KB limit is also enforced at plan time.
    conditions = " ".join(p["condition"] for p in _block(lt, "lifecycle")["precondition"])
    assert f"length(local.{user_data_local}) < 16384" in conditions


def test_user_data_is_rendered_from_templates_without_secrets(mod):
    sources = [
        mod.locals["scheduler_user_data"],
        mod.locals["worker_user_data"],
        str(mod.locals["bootstrap"]),
    ]
    for src in sources:
        assert "templatefile(" in src
        for secret in (
            "private_key_pem",
            "cert_pem",
            "aws_ssm_parameter.tls",
            "tls_private_key",
            "tls_locally_signed_cert",
        ):
            assert secret not in src, f"user data must not embed {secret}"


@pytest.mark.parametrize("name", ["bootstrap.sh.tftpl", "scheduler.sh.tftpl", "worker.sh.tftpl"])
def test_templates_have_no_pem_material(name):
    text = _template(name)
    assert "BEGIN" not in text and "PRIVATE KEY" not in text
    assert not re.search(r"MII[A-Za-z0-9+/]{20,}", text), "base64 DER in a template"


def test_user_data_templates_are_small():
    # Rendered = bootstrap + role template + short values (names, image URI,
    # DNS name): keep the raw templates well under the 16 KB limit.
    boot = len(_template("bootstrap.sh.tftpl").encode())
    for role in ("scheduler.sh.tftpl", "worker.sh.tftpl"):
        total = boot + len(_template(role).encode())
        assert total < 10 * 1024, f"{role}: {total} bytes of template"


def test_bootstrap_fails_loudly_and_fetches_tls_from_ssm():
    boot = _template("bootstrap.sh.tftpl")
    assert re.search(r"^set -E?euo pipefail$", boot, re.M)
    assert "set -E" in boot  # the ERR trap also fires inside functions
    assert "trap 'on_error $LINENO' ERR" in boot
    assert "set-instance-health" in boot and "Unhealthy" in boot
    assert "X-aws-ec2-metadata-token" in boot, "IMDSv2 token"
    assert "meta-data/$1" in boot and "local-ipv4" in boot
    assert "aws ssm get-parameter" in boot and "--with-decryption" in boot
    assert "ulimit -n 1048576" in boot
    assert "net.core.somaxconn" in boot


@pytest.mark.parametrize("name", ["scheduler.sh.tftpl", "worker.sh.tftpl"])
def test_role_templates_run_dask_under_systemd(name):
    text = _template(name)
    assert text.startswith("${bootstrap}")
    assert "Restart=always" in text
    assert "LimitNOFILE=1048576" in text and "--ulimit nofile=1048576:1048576" in text
    assert "--env-file /etc/pipeline/dask.env" in text
    assert "--network host" in text
    for flag in ("--tls-ca-file", "--tls-cert", "--tls-key", "--protocol tls"):
        assert flag in text


def test_scheduler_command():
    text = _template("scheduler.sh.tftpl")
    assert "dask scheduler --protocol tls --port ${scheduler_port}" in text
    assert (
        "/etc/pipeline/tls/scheduler.pem" in text and "/etc/pipeline/tls/scheduler-key.pem" in text
    )


def test_worker_command():
    text = _template("worker.sh.tftpl")
    assert "dask worker ${scheduler_address}" in text
    assert "--nworkers ${nworkers} --nthreads 1" in text
    # Registers with the private address read from IMDSv2 (systemd expands it).
    assert "--host $${PRIVATE_IP}" in text
    assert "--worker-port ${worker_ports}" in text and "--nanny-port ${nanny_ports}" in text
    assert "/etc/pipeline/tls/worker.pem" in text and "/etc/pipeline/tls/worker-key.pem" in text


def test_workers_drain_on_stop_and_on_a_spot_notice():
    # SIGTERM (docker stop) drains the workers for up to PIPELINE_DRAIN_SECONDS; docker
    # and systemd must give them longer than that, and a spot interruption or
    # rebalance notice must stop them while the instance still runs.
    text = _template("worker.sh.tftpl")
    stop = int(re.search(r"ExecStop=/usr/bin/docker stop -t (\d+) dask", text).group(1))
    unit = int(re.search(r"TimeoutStopSec=(\d+)", text).group(1))
    drain = int(worker_env()["PIPELINE_DRAIN_SECONDS"])
    assert drain < stop < unit <= 110, (drain, stop, unit)  # within a spot notice's 120 s
    assert "meta-data/$what" in text and "spot/instance-action" in text
    assert "events/recommendations/rebalance" in text
    assert "systemctl stop dask.service" in text
    assert "systemctl enable dask.service pipeline-spot-watch.service" in text


def test_worker_template_inputs(mod):
    src = mod.locals["worker_user_data"]
    assert 'scheduler_address = "tls://${aws_lb.this.dns_name}:${local.scheduler_port}"' in src
    assert (
        "nworkers          = local.workers_per_instance" in src
        or "nworkers = local.workers_per_instance" in src
    )


def test_dask_environment_is_the_repositorys_worker_env(mod):
    # One source: the module reads pipeline/cluster/worker.env by a path inside the
    # repository, and no .tf file or template writes any of its variables again.
    source = "${path.module}/../pipeline/cluster/worker.env"
    assert (TF / ".." / "pipeline" / "cluster" / "worker.env").is_file()
    assert f'file("{source}")' in mod.locals["worker_env"]
    assert mod.locals["dask_env"].startswith("${merge(local.worker_env, {")
    assert mod.locals["dask_env"].endswith("}, var.dask_env)}")
    assert 'DASK_DISTRIBUTED__COMM__REQUIRE_ENCRYPTION = "True"' in mod.locals["dask_env"]
    written = [*TF.rglob("*.tf"), *TEMPLATES.glob("*.tftpl")]
    for key in worker_env():
        assignment = re.compile(rf"\b{key}\s*=")
        assert not [p.name for p in written if assignment.search(p.read_text())], key


# --------------------------------------------------------------------------
# Security groups
# --------------------------------------------------------------------------


WORLD = ("0.0.0.0/0", "::/0")


def test_no_world_open_ingress(mod):
    # No inline rules and no legacy rule resources that could hide one.
    for sg in mod.resources["aws_security_group"].values():
        assert "ingress" not in sg and "egress" not in sg
    assert "aws_security_group_rule" not in mod.resources
    rules = mod.resources["aws_vpc_security_group_ingress_rule"]
    assert rules
    for name, rule in rules.items():
        text = str(rule)
        for world in WORLD:
            assert world not in text, f"ingress rule {name} open to the world"
        if "referenced_security_group_id" not in rule:
            # A CIDR rule: its CIDRs must come from var.allowed_cidrs only.
            assert "var.allowed_cidrs" in rule["for_each"], f"{name}: CIDRs not from allowed_cidrs"
            assert rule["cidr_ipv4"].endswith("each.value}") or "each.value" in rule["cidr_ipv4"]
        assert mod.resolve(rule["from_port"]) != 22 and mod.resolve(rule["to_port"]) != 22


def test_scheduler_reachable_only_through_the_lb(mod):
    rules = mod.resources["aws_vpc_security_group_ingress_rule"]
    into_scheduler = {
        n: r
        for n, r in rules.items()
        if r["security_group_id"] == "${aws_security_group.scheduler.id}"
    }
    assert into_scheduler
    for name, rule in into_scheduler.items():
        assert rule["referenced_security_group_id"] == "${aws_security_group.lb.id}", name
        assert mod.resolve(rule["from_port"]) in (8786, 8787)
    ports = {mod.resolve(r["from_port"]) for r in into_scheduler.values()}
    assert ports == {8786, 8787}
    into_lb = {
        n: r for n, r in rules.items() if r["security_group_id"] == "${aws_security_group.lb.id}"
    }
    assert any(
        r.get("referenced_security_group_id") == "${aws_security_group.workers.id}"
        for r in into_lb.values()
    )
    for rule in into_lb.values():
        assert mod.resolve(rule["from_port"]) in (8786, 8787)


def test_worker_ports_only_inside_the_cluster(mod):
    rules = mod.resources["aws_vpc_security_group_ingress_rule"]
    into_workers = {
        n: r
        for n, r in rules.items()
        if r["security_group_id"] == "${aws_security_group.workers.id}"
    }
    assert into_workers
    for name, rule in into_workers.items():
        assert rule["referenced_security_group_id"] in (
            "${aws_security_group.workers.id}",
            "${aws_security_group.scheduler.id}",
        ), name
        assert rule["for_each"] == "${local.cluster_port_ranges}"
    assert mod.locals["cluster_port_ranges"] == {
        "worker": "${var.worker_port_range}",
        "nanny": "${var.nanny_port_range}",
    }
    assert mod.variables["worker_port_range"]["default"] == {"from": 9000, "to": 9199}
    assert mod.variables["nanny_port_range"]["default"] == {"from": 9200, "to": 9399}


def test_egress_is_port_scoped(mod):
    for name, rule in mod.resources["aws_vpc_security_group_egress_rule"].items():
        assert rule["ip_protocol"] == "tcp", f"{name}: all-protocol egress"
        assert rule.get("from_port") is not None and rule.get("to_port") is not None, name


def test_default_security_group_is_emptied(mod):
    sg = mod.resource("aws_default_security_group", "this")
    assert "ingress" not in sg and "egress" not in sg


# --------------------------------------------------------------------------
# Storage and TLS parameters
# --------------------------------------------------------------------------


def test_results_bucket_encrypted_private_tls_only(mod):
    enc = mod.resource("aws_s3_bucket_server_side_encryption_configuration", "results")
    rule = _block(enc, "rule")
    default = _block(rule, "apply_server_side_encryption_by_default")
    assert default["sse_algorithm"] == "aws:kms"
    assert default["kms_master_key_id"] == "${local.kms_key_arn}"
    pab = mod.resource("aws_s3_bucket_public_access_block", "results")
    for key in (
        "block_public_acls",
        "block_public_policy",
        "ignore_public_acls",
        "restrict_public_buckets",
    ):
        assert pab[key] is True, key
    assert (
        mod.resource("aws_s3_bucket_policy", "results")["policy"]
        == "${data.aws_iam_policy_document.results_bucket.json}"
    )
    doc = mod.data["aws_iam_policy_document"]["results_bucket"]
    denies = [s for s in doc["statement"] if s["effect"] == "Deny"]
    assert any(
        c["variable"] == "aws:SecureTransport" and c["values"] == ["false"]
        for s in denies
        for c in s["condition"]
    ), "bucket policy must deny non-TLS requests"
    own = mod.resource("aws_s3_bucket_ownership_controls", "results")
    assert _block(own, "rule")["object_ownership"] == "BucketOwnerEnforced"


def test_results_bucket_versioning_and_expiry_are_optional(mod):
    ver = mod.resource("aws_s3_bucket_versioning", "results")
    assert "var.results_versioning" in _block(ver, "versioning_configuration")["status"]
    assert mod.variables["results_versioning"]["default"] is False
    lc = mod.resource("aws_s3_bucket_lifecycle_configuration", "results")
    assert _block(lc, "rule")["abort_incomplete_multipart_upload"][0]["days_after_initiation"] == 7
    dyn = lc["dynamic"][0]["rule"]
    assert "var.results_expiration_days > 0" in dyn["for_each"]
    assert mod.variables["results_expiration_days"]["default"] == 0


def test_ecr_repository(mod):
    repo = mod.resource("aws_ecr_repository", "this")
    assert repo["image_tag_mutability"] == "IMMUTABLE"
    assert _block(repo, "image_scanning_configuration")["scan_on_push"] is True
    assert _block(repo, "encryption_configuration")["encryption_type"] == "KMS"


def test_tls_material_in_ssm_securestring(mod):
    param = mod.resource("aws_ssm_parameter", "tls")
    assert param["type"] == "SecureString"
    assert param["key_id"] == "${local.kms_key_arn}"
    assert param["for_each"] == "${local.tls_parameter_names}"
    files = set(
        re.findall(r'"([a-z-]+\.pem)"\s*=', str(mod.locals["tls_parameters"]).replace('\\"', '"'))
    )
    if not files:  # python-hcl2 may give the object as a dict
        files = (
            set(mod.locals["tls_parameters"])
            if isinstance(mod.locals["tls_parameters"], dict)
            else set()
        )
    assert files == {
        "ca.pem",
        "scheduler.pem",
        "scheduler-key.pem",
        "worker.pem",
        "worker-key.pem",
        "client.pem",
        "client-key.pem",
    }
    # The CA's private key is never stored in SSM.
    assert "tls_private_key.ca" not in str(mod.locals["tls_parameters"])
    # Certificates come from one CA generated here.
    ca = mod.resource("tls_self_signed_cert", "ca")
    assert ca["is_ca_certificate"] is True
    leaf = mod.resource("tls_locally_signed_cert", "this")
    assert "server_auth" in leaf["allowed_uses"] and "client_auth" in leaf["allowed_uses"]


def test_kms_key_rotates(mod):
    key = mod.resource("aws_kms_key", "this")
    assert key["enable_key_rotation"] is True


# --------------------------------------------------------------------------
# IAM
# --------------------------------------------------------------------------


def _statements(mod) -> list[dict]:
    doc = mod.data["aws_iam_policy_document"]["instance"]
    statements = list(doc.get("statement", []))
    for dyn in doc.get("dynamic", []):
        statements += dyn["statement"]["content"]
    return statements


def test_instance_roles_least_privilege(mod):
    statements = _statements(mod)
    assert len(statements) >= 8
    unscopable = {"ecr:GetAuthorizationToken"} | {
        a
        for s in statements
        for a in s["actions"]
        if a.split(":")[0] in ("ssmmessages", "ec2messages")
    }
    for s in statements:
        actions = set(s["actions"])
        assert not any(a == "*" or a.endswith(":*") for a in actions), (
            f"wildcard action in {s['sid']}"
        )
        assert not any(
            a.startswith(("iam:", "sts:", "ec2:Run", "s3:PutBucket")) for a in actions
        ), s["sid"]
        if "*" in s["resources"]:
            assert actions <= unscopable, f"{s['sid']} uses Resource * for scopable actions"
        if any(a.startswith("s3:") for a in actions):
            assert all("local.results_bucket_arn" in r for r in s["resources"]), s["sid"]
            assert "*" not in s["resources"]
        if any(a.startswith("ssm:GetParameter") for a in actions):
            assert "aws_ssm_parameter.tls[f].arn" in str(s["resources"])
        if any(a.startswith("kms:") for a in actions):
            assert s["resources"] == ["${local.kms_key_arn}"]
            assert s["condition"][0]["variable"] == "kms:ViaService"
    s3_object = next(s for s in statements if "s3:PutObject" in s["actions"])
    assert s3_object["resources"] == ["${local.results_bucket_arn}/${var.results_prefix}*"]
    s3_list = next(s for s in statements if "s3:ListBucket" in s["actions"])
    assert s3_list["condition"][0]["variable"] == "s3:prefix"
    # Only the workers get S3; each role reads only its own TLS files.
    for dyn in mod.data["aws_iam_policy_document"]["instance"]["dynamic"]:
        content = dyn["statement"]["content"][0]
        if any(a.startswith("s3:") for a in content["actions"]):
            assert dyn["statement"]["for_each"] == '${each.key == "workers" ? [1] : []}'
    roles = mod.locals["roles"]
    assert "scheduler-key.pem" in str(roles["scheduler"]) and "worker-key.pem" not in str(
        roles["scheduler"]
    )
    assert "worker-key.pem" in str(roles["workers"]) and "scheduler-key.pem" not in str(
        roles["workers"]
    )
    assert "client-key.pem" not in str(roles)
    # No broad managed policies (AmazonSSMManagedInstanceCore reads every parameter).
    assert "aws_iam_role_policy_attachment" not in mod.resources
    assert "aws_iam_policy_attachment" not in mod.resources


# --------------------------------------------------------------------------
# Outputs, example, README, checkov skips
# --------------------------------------------------------------------------


def test_outputs(mod):
    for name in (
        "scheduler_address",
        "results_bucket",
        "dashboard_url",
        "client_tls_commands",
        "next_steps",
        "ecr_repository_url",
    ):
        assert name in mod.outputs, name
        assert mod.outputs[name].get("description"), name
    assert mod.outputs["scheduler_address"]["value"] == "${local.scheduler_address}"
    assert (
        mod.locals["scheduler_address"] == "tls://${aws_lb.this.dns_name}:${local.scheduler_port}"
    )
    assert mod.local_int("scheduler_port") == 8786
    assert "var.enable_dashboard" in mod.outputs["dashboard_url"]["value"]
    cmds = str(mod.locals["client_tls_commands"])
    assert "aws ssm get-parameter" in cmds and "--with-decryption" in cmds
    for f in ("ca.pem", "client.pem", "client-key.pem"):
        assert f in cmds
    assert "PIPELINE_SCHEDULER" in str(mod.locals["driver_env"])


def test_example_uses_the_module(example):
    assert example.modules["dask_cluster"]["source"] == "../.."
    assert example.providers and "aws" in example.providers[0]
    assert "scheduler_address" in example.outputs


def test_checkov_skips_are_justified(mod):
    skips = []
    for rtype, named in list(mod.resources.items()) + list(mod.data.items()):
        for name, body in named.items():
            for comment in _comments(body):
                if "checkov:skip" in comment:
                    skips.append((f"{rtype}.{name}", comment))
    assert skips, "expected the documented skips"
    for where, comment in skips:
        m = re.fullmatch(r"checkov:skip=(CKV2?_[A-Z0-9]+_\d+):(.+)", comment.strip())
        assert m, f"{where}: malformed skip {comment!r}"
        assert len(m.group(2).strip()) >= 40, f"{where}: {m.group(1)} needs a real justification"
    # Never skip the checks this module exists to satisfy.
    forbidden = {
        "CKV_AWS_79",
        "CKV_AWS_8",
        "CKV_AWS_145",
        "CKV_AWS_24",
        "CKV_AWS_25",
        "CKV_AWS_260",
        "CKV_AWS_53",
        "CKV_AWS_337",
        "CKV_AWS_46",
    }
    assert not {re.match(r"checkov:skip=([A-Z0-9_]+)", c).group(1) for _, c in skips} & forbidden


def _readme_rows(heading: str) -> list[list[str]]:
    """The body rows of the table under the README's ``## heading``, as cells."""
    text = (TF / "README.md").read_text()
    section = text.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]
    lines = [line.strip() for line in section.splitlines() if line.startswith("| ")]
    return [[c.strip() for c in line.strip("|").split("|")] for line in lines[2:]]


def _readme_table(heading: str) -> dict[str, list[str]]:
    """The README's table under ``## heading``: each name (in backticks) to its cells."""
    rows = {}
    for name, *cells in _readme_rows(heading):
        assert name.startswith("`") and name.strip("`") not in rows, (heading, name)
        rows[name.strip("`")] = cells
    return rows


def _hcl(value) -> str:
    """A default as the README writes it (HCL)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, list):
        return "[" + ", ".join(_hcl(v) for v in value) + "]"
    if isinstance(value, dict):
        pairs = ", ".join(f"{k} = {_hcl(v)}" for k, v in value.items())
        return f"{{ {pairs} }}" if pairs else "{}"
    return str(value)


def _description(body: dict) -> str:
    return body["description"].replace('\\"', '"')


def test_readme_tables_are_the_modules_inputs_and_outputs(mod):
    inputs = _readme_table("Inputs")
    assert set(inputs) == set(mod.variables)
    for name, body in mod.variables.items():
        kind = re.sub(r"^\$\{(.*)\}$", r"\1", body["type"])
        default = _hcl(body.get("default"))
        assert inputs[name] == [_description(body), f"`{kind}`", f"`{default}`"], name
    outputs = _readme_table("Outputs")
    assert set(outputs) == set(mod.outputs)
    for name, body in mod.outputs.items():
        assert outputs[name] == [_description(body)], name


def test_readme_cost_table_is_the_default_fleet_at_the_packaged_prices(mod):
    import tomllib

    prices = tomllib.loads((REPO / "pipeline" / "costs" / "prices.toml").read_text())["instances"]
    v = mod.variables
    worker, scheduler = (
        v["worker_instance_type"]["default"],
        v["scheduler_instance_type"]["default"],
    )
    count, rate = v["worker_count"]["default"], prices[worker]["usd_per_hour"]
    rows = _readme_rows("Cost of an hour")
    items = {r[0]: r[1:] for r in rows}
    assert items[f"Workers, {worker} on-demand"] == [
        str(count), f"${rate:g}/hour", f"${count * rate:.2f}"
    ]  # fmt: skip
    sched = prices[scheduler]["usd_per_hour"]
    assert items[f"Scheduler, {scheduler} on-demand"] == ["1", f"${sched:g}/hour", f"${sched:g}"]
    *parts, (total, fleet, _, hourly) = rows
    per_hour = sum(float(re.sub(r"[^0-9.]", "", p[3])) for p in parts)
    assert total == "**Total, default fleet**"
    assert fleet == f"{count * prices[worker]['vcpus']} Dask workers"
    assert hourly == f"**≈ ${per_hour:.2f}/hour**"


def test_readme_commands_name_what_the_example_has(mod, example):
    """The quick start's commands run in terraform/examples/minimal: the variables they
    set, the outputs they read and the resources they target exist there."""
    readme = (TF / "README.md").read_text()
    assert "cd terraform/examples/minimal" in readme and (TF / "examples" / "minimal").is_dir()
    set_vars = set(re.findall(r"-var '?([a-z_]+)=", readme))
    assert set_vars and set_vars <= set(mod.variables), set_vars - set(mod.variables)
    outputs = set(re.findall(r"terraform output (?:-raw )?([a-z_]+)", readme))
    assert outputs and outputs <= set(example.outputs), outputs - set(example.outputs)
    targets = re.findall(r"-(?:target|replace)='?module\.([a-z_]+)\.([a-z_]+)\.([a-z_]+)", readme)
    assert targets
    for module, rtype, name in targets:
        assert module in example.modules
        mod.resource(rtype, name)


def test_scripts_exist_and_are_strict():
    for name in ("push-image.sh", "check-terraform.sh"):
        path = REPO / "scripts" / name
        text = path.read_text()
        assert text.startswith("#!/usr/bin/env bash") and "set -euo pipefail" in text
        assert os.access(path, os.X_OK), f"{name} is not executable"
    push = (REPO / "scripts" / "push-image.sh").read_text()
    assert "docker build -t pipeline:latest" in push
    assert (
        "aws ecr get-login-password" in push
        and "terraform" in push
        and "output -raw ecr_repository_url" in push
    )


# --------------------------------------------------------------------------
# With a terraform binary: evaluate validations, render user data
# --------------------------------------------------------------------------

needs_terraform = pytest.mark.skipif(TERRAFORM is None, reason="no terraform binary on PATH")


def _console(workdir: Path, expr: str, *args: str) -> subprocess.CompletedProcess:
    env = dict(
        os.environ,
        TF_CLI_CONFIG_FILE=str(workdir / "terraformrc"),
        TF_IN_AUTOMATION="1",
        CHECKPOINT_DISABLE="1",
    )
    (workdir / "terraformrc").touch()
    return subprocess.run(
        [TERRAFORM, "console", *args],
        input=expr + "\n",
        cwd=workdir,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


@needs_terraform
@pytest.mark.parametrize(
    ("args", "ok"),
    [
        ((), True),
        (('-var=allowed_cidrs=["10.20.0.0/16","192.168.1.0/24"]',), True),
        (('-var=allowed_cidrs=["0.0.0.0/0"]',), False),
        (('-var=allowed_cidrs=["::/0"]',), False),
        (('-var=allowed_cidrs=["not-a-cidr"]',), False),
        (("-var=worker_capacity_type=spot",), True),
        (("-var=worker_capacity_type=reserved",), False),
        (("-var=workers_per_instance=0",), False),
        (("-var=workers_per_instance=96",), True),
        (("-var=name=Bad_Name",), False),
        (("-var=image_uri=123456789012.dkr.ecr.us-east-1.amazonaws.com/pipeline:abc123",), True),
        (("-var=image_uri=pipeline",), False),
        (("-var=results_prefix=/abs/",), False),
        (("-var=worker_port_range={from=80,to=100}",), False),
    ],
)
def test_variable_validations(tmp_path, args, ok):
    shutil.copy(TF / "variables.tf", tmp_path / "variables.tf")
    result = _console(tmp_path, "var.worker_instance_type", *args)
    output = re.sub(r"\x1b\[[0-9;]*m", "", result.stdout + result.stderr)
    # `terraform console` reports a failed validation but may still exit 0.
    failed = result.returncode != 0 or "Invalid value for variable" in output or "Error:" in output
    assert failed != ok, output
    if ok:
        assert '"c5.24xlarge"' in result.stdout


def _module_with_worker_env(tmp_path: Path, files: str) -> Path:
    """A folder ``terraform`` under ``tmp_path`` with ``files`` (main.tf's worker_env
    local added), and the repository's worker.env where the module reads it."""
    module = tmp_path / "terraform"
    shutil.copytree(TEMPLATES, module / "templates")
    (tmp_path / "pipeline" / "cluster").mkdir(parents=True)
    shutil.copy(WORKER_ENV, tmp_path / "pipeline" / "cluster" / "worker.env")
    main = (TF / "main.tf").read_text()
    local = re.search(r"^  worker_env = \{\n.*?^  \}\n", main, re.S | re.M).group(0)
    (module / "worker_env.tf").write_text("locals {\n" + local + "}\n")
    (module / "render.tf").write_text(files)
    return module


@needs_terraform
def test_terraform_reads_worker_env_as_the_package_does(tmp_path):
    module = _module_with_worker_env(tmp_path, "")
    result = _console(module, "jsonencode(local.worker_env)")
    assert result.returncode == 0, result.stderr
    assert json.loads(json.loads(result.stdout.strip())) == worker_env()


RENDER = textwrap.dedent(
    """
    locals {
      region = "ap-southeast-2"
      name   = "pipeline-cluster-01"
      registry = "123456789012.dkr.ecr.ap-southeast-2.amazonaws.com"
      tag      = "0123456789ab-dirty-20261121000000"
      image    = "${local.registry}/a-rather-long-repository-name/pipeline:${local.tag}"
      dask_env = merge(local.worker_env, {
        DASK_DISTRIBUTED__COMM__REQUIRE_ENCRYPTION = "True"
        AWS_REGION                                 = local.region
        AWS_DEFAULT_REGION                         = local.region
      })
      files = {
        scheduler = ["ca.pem", "scheduler.pem", "scheduler-key.pem"]
        workers   = ["ca.pem", "worker.pem", "worker-key.pem"]
      }
      boot = { for role, f in local.files : role => templatefile(
        "${path.module}/templates/bootstrap.sh.tftpl", {
          role           = role
          name           = local.name
          region         = local.region
          asg_name       = "${local.name}-${role}"
          boot_timeout   = 840
          image          = local.image
          image_registry = local.registry
          dask_env       = local.dask_env
          ssm_prefix     = "/${local.name}/tls"
          tls_files      = f
      }) }
      log_opts = join(" ", [
        "--log-driver awslogs --log-opt awslogs-region=${local.region}",
        "--log-opt awslogs-group=/${local.name}/dask",
        "--log-opt awslogs-stream=workers/$${INSTANCE_ID}",
      ])
      scheduler = templatefile("${path.module}/templates/scheduler.sh.tftpl", {
        bootstrap      = local.boot["scheduler"]
        name           = local.name
        image          = local.image
        log_opts       = local.log_opts
        scheduler_port = 8786
        dashboard_port = 8787
        dashboard_flag = "--dashboard"
      })
      worker = templatefile("${path.module}/templates/worker.sh.tftpl", {
        bootstrap         = local.boot["workers"]
        name              = local.name
        image             = local.image
        log_opts          = local.log_opts
        scheduler_address = "tls://${local.name}-sched-0123456789abcdef.elb.${local.region}.amazonaws.com:8786"
        nworkers          = 192
        worker_ports      = "9000:9199"
        nanny_ports       = "9200:9399"
        worker_port_from  = 9000
        worker_port_to    = 9199
      })
    }
    """
)


@needs_terraform
@pytest.mark.parametrize("role", ["scheduler", "worker"])
def test_rendered_user_data(tmp_path, role):
    module = _module_with_worker_env(tmp_path, RENDER)
    result = _console(module, f"jsonencode(local.{role})")
    assert result.returncode == 0, result.stderr
    rendered = json.loads(json.loads(result.stdout.strip()))
    assert len(rendered.encode()) < USER_DATA_LIMIT * 0.6, len(rendered.encode())
    assert rendered.startswith("#!/bin/bash\n")
    assert "BEGIN" not in rendered and "PRIVATE KEY" not in rendered
    assert "${" not in rendered.replace("${INSTANCE_ID}", "").replace("${PRIVATE_IP}", "")
    # The container's --env-file: every variable of worker.env, and TLS required.
    env_file = rendered.split("<<'DASKENV'\n", 1)[1].split("DASKENV\n", 1)[0]
    lines = env_file.splitlines()
    assert {f"{k}={v}" for k, v in worker_env().items()} <= set(lines), env_file
    assert "DASK_DISTRIBUTED__COMM__REQUIRE_ENCRYPTION=True" in lines
    if role == "worker":
        assert "--nworkers 192 --nthreads 1" in rendered
        assert "--host ${PRIVATE_IP}" in rendered
        assert "fetch '/pipeline-cluster-01/tls/worker-key.pem' 'worker-key.pem'" in rendered
        assert "scheduler-key.pem" not in rendered
    else:
        assert "dask scheduler --protocol tls --port 8786" in rendered
        assert "scheduler-key.pem" in rendered and "worker-key.pem" not in rendered
    script = tmp_path / "user-data.sh"
    script.write_text(rendered)
    syntax = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert syntax.returncode == 0, syntax.stderr


# --------------------------------------------------------------------------
# The full static check (checkov + fmt)
# --------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.timeout(900)  # the first run installs checkov into .venv-tools
def test_check_terraform_script_passes():
    result = subprocess.run(
        ["bash", str(REPO / "scripts" / "check-terraform.sh")],
        cwd=REPO,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    assert "Failed checks: 0" in result.stdout
    assert "check-terraform: OK" in result.stdout


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_check_terraform_script_fails_on_unjustified_or_removed_skip(tmp_path):
    module = tmp_path / "terraform"
    shutil.copytree(TF, module, ignore=shutil.ignore_patterns(".terraform*", "*.tfstate*"))
    storage = module / "storage.tf"
    text = storage.read_text()
    # Drop the versioning skip: checkov must now fail CKV_AWS_21.
    text = re.sub(r"^\s*#checkov:skip=CKV_AWS_21:.*\n", "", text, flags=re.M)
    storage.write_text(text)
    result = subprocess.run(
        ["bash", str(REPO / "scripts" / "check-terraform.sh")],
        cwd=REPO,
        env=dict(os.environ, TF_MODULE_DIR=str(module)),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert result.returncode != 0
    assert "CKV_AWS_21" in result.stdout
