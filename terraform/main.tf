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

  # Environment of every Dask container. The image sets the same values; they
  # are repeated here so any image runs correctly on this cluster.
  dask_env = merge({
    MKL_NUM_THREADS                            = "1"
    OMP_NUM_THREADS                            = "1"
    OPENBLAS_NUM_THREADS                       = "1"
    MALLOC_TRIM_THRESHOLD_                     = "67108864"
    MALLOC_MMAP_THRESHOLD_                     = "33554432"
    DASK_DISTRIBUTED__COMM__SOCKET_BACKLOG     = "4096"
    DASK_DISTRIBUTED__COMM__TIMEOUTS__CONNECT  = "60s"
    DASK_DISTRIBUTED__SCHEDULER__WORKER_TTL    = "300s"
    DASK_DISTRIBUTED__COMM__REQUIRE_ENCRYPTION = "True"
    DASK_DISTRIBUTED__NANNY__PRELOAD           = "[\"pipeline.cluster.drain\"]"
    PIPELINE_DRAIN_SECONDS                     = "50"
    AWS_REGION                                 = local.region
    AWS_DEFAULT_REGION                         = local.region
  }, var.dask_env)
}
