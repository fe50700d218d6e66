# Shared data sources and locals. Resources live in files named by concern:
# network.tf, security_groups.tf, load_balancer.tf, scheduler.tf, workers.tf,
# storage.tf, iam.tf, tls.tf, kms.tf, logging.tf.

data "aws_region" "current" {}
data "aws_caller_identity" "current" {}
data "aws_partition" "current" {}

data "aws_ec2_instance_type" "worker" {
  instance_type = var.worker_instance_type
}

data "aws_ami" "al2023" {
  count       = var.ami_id == null ? 1 : 0
  most_recent = true
  owners      = ["amazon"]

  filter {
    name   = "name"
    values = ["al2023-ami-2023.*-kernel-*-x86_64"]
  }

  filter {
    name   = "architecture"
    values = ["x86_64"]
  }

  filter {
    name   = "virtualization-type"
    values = ["hvm"]
  }
}

locals {
  region     = data.aws_region.current.region
  account_id = data.aws_caller_identity.current.account_id
  partition  = data.aws_partition.current.partition
  dns_suffix = data.aws_partition.current.dns_suffix

  tags = merge(var.tags, {
    "pipeline:cluster" = var.name
    "managed-by"       = "terraform"
  })

  # Ports. The scheduler listens on 8786 (Dask TLS) and 8787 (HTTP: /health
  # always, the dashboard when enabled). Worker and nanny ports are fixed
  # ranges so the security groups can name them.
  scheduler_port = 8786
  dashboard_port = 8787

  ami_id = var.ami_id != null ? var.ami_id : data.aws_ami.al2023[0].id

  # One single-threaded Dask worker process per vCPU unless told otherwise.
  workers_per_instance = var.workers_per_instance != null ? var.workers_per_instance : data.aws_ec2_instance_type.worker.default_vcpus
  worker_max_count     = var.worker_max_count != null ? max(var.worker_max_count, var.worker_count) : var.worker_count

  # Image: an explicit URI, or the module's ECR repository with a tag.
  ecr_repository_url = var.create_ecr_repository ? aws_ecr_repository.this[0].repository_url : null
  image_uri = (
    var.image_uri != null ? var.image_uri :
    (var.create_ecr_repository && var.image_tag != null ? "${aws_ecr_repository.this[0].repository_url}:${var.image_tag}" : null)
  )
  # Registry host to `docker login` to, when the image lives in ECR.
  image_registry = try(regex("^([0-9]{12}\\.dkr\\.ecr\\.[a-z0-9-]+\\.amazonaws\\.com(?:\\.cn)?)/", local.image_uri)[0], "")
  ecr_repository_arns = concat(
    var.create_ecr_repository ? [aws_ecr_repository.this[0].arn] : [],
    var.extra_ecr_repository_arns,
  )

  kms_key_arn = var.kms_key_arn != null ? var.kms_key_arn : aws_kms_key.this[0].arn

  log_group_name = "/${var.name}/dask"

  # The Dask processes' environment, from its one source in the repository this
  # module is part of (a local path or a git source of the module brings the whole
  # repository along). The image's entrypoint sets the same from the same file; the
  # module passes it too, so that an image of another build runs correctly here.
  worker_env = {
    for kv in [
      for line in split("\n", file("${path.module}/../pipeline/cluster/worker.env")) :
      regex("^([A-Za-z_][A-Za-z0-9_]*)=(.*)$", line) if can(regex("^[A-Za-z_][A-Za-z0-9_]*=", line))
    ] : kv[0] => kv[1]
  }

  # Environment of every Dask container: the above, TLS required (this cluster's
  # transport), the region, then the caller's additions.
  dask_env = merge(local.worker_env, {
    DASK_DISTRIBUTED__COMM__REQUIRE_ENCRYPTION = "True"
    AWS_REGION                                 = local.region
    AWS_DEFAULT_REGION                         = local.region
  }, var.dask_env)
}
