# ---------------------------------------------------------------------------
# Naming, region, tags
# ---------------------------------------------------------------------------

variable "name" {
  description = "Name of the cluster. Prefixes every resource name, the SSM parameter path (/<name>/tls/...) and the CloudWatch log group. Lower-case letters, digits and hyphens; short, because load balancer and target group names are limited to 32 characters."
  type        = string
  default     = "pipeline"

  validation {
    condition     = can(regex("^[a-z][a-z0-9-]{1,18}[a-z0-9]$", var.name))
    error_message = "name must be 3-20 characters of lower-case letters, digits and hyphens, start with a letter and not end with a hyphen."
  }
}

variable "region" {
  description = "AWS region the cluster runs in. The module inherits its provider from the caller; when set, this must equal the provider's region (a precondition checks it). Leave null to use the provider's region."
  type        = string
  default     = null

  validation {
    condition     = var.region == null || can(regex("^[a-z]{2}(-gov|-iso[a-z]*)?-[a-z]+-[0-9]$", var.region))
    error_message = "region must look like an AWS region name, e.g. us-east-1."
  }
}

variable "tags" {
  description = "Tags added to every resource that takes tags (and propagated to the instances the auto-scaling groups launch)."
  type        = map(string)
  default     = {}
}

# ---------------------------------------------------------------------------
# Network
# ---------------------------------------------------------------------------

variable "create_vpc" {
  description = "Create a VPC (public subnets for the NAT gateway and an internet-facing load balancer, private subnets for the instances, one NAT gateway, an S3 gateway endpoint). Set false and pass vpc_id and subnet ids to use an existing network."
  type        = bool
  default     = true
}

variable "vpc_cidr" {
  description = "CIDR block of the VPC when create_vpc is true. Cut into 16 equal subnets (a /16 gives /20s): public ones first, then private ones."
  type        = string
  default     = "10.42.0.0/16"

  validation {
    condition     = can(cidrhost(var.vpc_cidr, 0)) && try(tonumber(split("/", var.vpc_cidr)[1]) <= 24, false)
    error_message = "vpc_cidr must be a valid IPv4 CIDR block of size /24 or larger."
  }
}

variable "az_count" {
  description = "Number of availability zones the created VPC spans when availability_zones is empty (the scheduler lives in one of them, workers are spread over all)."
  type        = number
  default     = 2

  validation {
    condition     = var.az_count >= 2 && var.az_count <= 6 && floor(var.az_count) == var.az_count
    error_message = "az_count must be a whole number from 2 to 6."
  }
}

variable "availability_zones" {
  description = "Availability zones of the created VPC, by name (e.g. [\"us-east-1a\", \"us-east-1b\"]). Empty means the first az_count available zones of the region."
  type        = list(string)
  default     = []

  validation {
    condition     = length(var.availability_zones) == 0 || (length(var.availability_zones) >= 2 && length(var.availability_zones) <= 6 && alltrue([for z in var.availability_zones : can(regex("^[a-z]{2}(-gov)?-[a-z]+-[0-9][a-z]$", z))]))
    error_message = "availability_zones must be empty or list 2 to 6 zone names such as us-east-1a."
  }
}

variable "vpc_id" {
  description = "ID of an existing VPC (only when create_vpc is false)."
  type        = string
  default     = null

  validation {
    condition     = var.vpc_id == null || can(regex("^vpc-[0-9a-f]+$", var.vpc_id))
    error_message = "vpc_id must look like vpc-0123456789abcdef0."
  }
}

variable "private_subnet_ids" {
  description = "Existing private subnets for the scheduler, the workers and an internal load balancer (only when create_vpc is false). They need outbound HTTPS (NAT or VPC endpoints for ECR, S3, SSM, CloudWatch Logs) to pull the image and fetch the TLS material."
  type        = list(string)
  default     = []

  validation {
    condition     = alltrue([for s in var.private_subnet_ids : can(regex("^subnet-[0-9a-f]+$", s))])
    error_message = "private_subnet_ids must be subnet ids (subnet-...)."
  }
}

variable "public_subnet_ids" {
  description = "Existing public subnets for an internet-facing load balancer (only when create_vpc is false and lb_internet_facing is true)."
  type        = list(string)
  default     = []

  validation {
    condition     = alltrue([for s in var.public_subnet_ids : can(regex("^subnet-[0-9a-f]+$", s))])
    error_message = "public_subnet_ids must be subnet ids (subnet-...)."
  }
}

variable "enable_flow_logs" {
  description = "Record VPC flow logs (rejected traffic only) of the created VPC into the cluster's CloudWatch log group. Off by default: Dask's intra-cluster traffic is heavy and flow log ingestion is billed per GB."
  type        = bool
  default     = false
}

variable "egress_cidrs" {
  description = "Destinations the instances may reach on TCP 443 (ECR, S3, SSM, CloudWatch Logs, package repositories, and whatever HTTPS endpoints your tasks read). Egress only: nothing here opens a port."
  type        = list(string)
  default     = ["0.0.0.0/0"]

  validation {
    condition     = length(var.egress_cidrs) > 0 && alltrue([for c in var.egress_cidrs : can(cidrhost(c, 0))])
    error_message = "egress_cidrs must be a non-empty list of valid CIDR blocks."
  }
}

# ---------------------------------------------------------------------------
# Access to the scheduler
# ---------------------------------------------------------------------------

variable "allowed_cidrs" {
  description = "CIDR blocks allowed to reach the scheduler (8786) and, if enabled, the dashboard (8787) through the load balancer: where the driver runs. Workers are always allowed. The world (0.0.0.0/0, ::/0) is refused: Dask's mutual TLS is the only lock on the door, and it should not be the only one."
  type        = list(string)
  default     = []

  validation {
    condition     = alltrue([for c in var.allowed_cidrs : can(cidrhost(c, 0))])
    error_message = "allowed_cidrs must contain valid CIDR blocks."
  }

  validation {
    condition     = alltrue([for c in var.allowed_cidrs : !contains(["0.0.0.0/0", "::/0"], c) && !endswith(c, "/0")])
    error_message = "allowed_cidrs must not contain 0.0.0.0/0 or ::/0; list the networks your drivers run in."
  }
}

variable "lb_internet_facing" {
  description = "Make the load balancer internet-facing (in public subnets). Internal by default; when true, allowed_cidrs must be non-empty and only those CIDRs are let in."
  type        = bool
  default     = false
}

variable "lb_deletion_protection" {
  description = "Turn on deletion protection of the load balancer (terraform destroy then fails until it is turned off)."
  type        = bool
  default     = false
}

variable "enable_dashboard" {
  description = "Run the Dask dashboard on the scheduler and add a TCP listener for it (8787) on the load balancer, open to allowed_cidrs. Plain HTTP without authentication: keep the load balancer internal or allowed_cidrs tight."
  type        = bool
  default     = false
}

# ---------------------------------------------------------------------------
# Image
# ---------------------------------------------------------------------------

variable "create_ecr_repository" {
  description = "Create an ECR repository (immutable tags, scan on push, KMS-encrypted) for the project's image. scripts/push-image.sh builds and pushes into it."
  type        = bool
  default     = true
}

variable "image_uri" {
  description = "Full URI of the image every role runs (e.g. 123456789012.dkr.ecr.us-east-1.amazonaws.com/pipeline:3f2c1ab). Leave null to use the module's ECR repository with image_tag."
  type        = string
  default     = null

  validation {
    condition     = var.image_uri == null || can(regex("^[a-zA-Z0-9.-]+(:[0-9]+)?/[a-z0-9._/-]+(:[A-Za-z0-9_.-]+|@sha256:[0-9a-f]{64})$", var.image_uri))
    error_message = "image_uri must be REGISTRY/REPOSITORY:TAG or REGISTRY/REPOSITORY@sha256:DIGEST."
  }
}

variable "image_tag" {
  description = "Tag of the image in the module's ECR repository (scripts/push-image.sh prints it; it defaults to the git commit). Required unless image_uri is set. The repository's tags are immutable, so each build gets its own tag."
  type        = string
  default     = null

  validation {
    condition     = var.image_tag == null || can(regex("^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$", var.image_tag))
    error_message = "image_tag must be a valid Docker tag."
  }
}

variable "extra_ecr_repository_arns" {
  description = "ARNs of other ECR repositories the instances may pull from (when image_uri points outside the module's repository)."
  type        = list(string)
  default     = []

  validation {
    condition     = alltrue([for a in var.extra_ecr_repository_arns : can(regex("^arn:aws[a-z-]*:ecr:[a-z0-9-]+:[0-9]{12}:repository/.+$", a))])
    error_message = "extra_ecr_repository_arns must be ECR repository ARNs."
  }
}

# ---------------------------------------------------------------------------
# Scheduler
# ---------------------------------------------------------------------------

variable "scheduler_instance_type" {
  description = "Instance type of the scheduler. The scheduler is one event loop holding the task graph: favour memory and single-core speed."
  type        = string
  default     = "m5.2xlarge"

  validation {
    condition     = can(regex("^[a-z][a-z0-9-]*\\.[a-z0-9]+$", var.scheduler_instance_type))
    error_message = "scheduler_instance_type must be an EC2 instance type such as m5.2xlarge."
  }
}

variable "scheduler_root_volume_size_gb" {
  description = "Size of the scheduler's encrypted gp3 root volume in GiB (holds the image)."
  type        = number
  default     = 50

  validation {
    condition     = var.scheduler_root_volume_size_gb >= 20 && var.scheduler_root_volume_size_gb <= 16384
    error_message = "scheduler_root_volume_size_gb must be between 20 and 16384."
  }
}

# ---------------------------------------------------------------------------
# Workers
# ---------------------------------------------------------------------------

variable "worker_instance_type" {
  description = "Instance type of the workers."
  type        = string
  default     = "c5.24xlarge"

  validation {
    condition     = can(regex("^[a-z][a-z0-9-]*\\.[a-z0-9]+$", var.worker_instance_type))
    error_message = "worker_instance_type must be an EC2 instance type such as c5.24xlarge."
  }
}

variable "worker_count" {
  description = "Number of worker instances (desired capacity of the worker auto-scaling group)."
  type        = number
  default     = 5

  validation {
    condition     = var.worker_count >= 0 && var.worker_count <= 500 && floor(var.worker_count) == var.worker_count
    error_message = "worker_count must be a whole number from 0 to 500."
  }
}

variable "worker_max_count" {
  description = "Maximum size of the worker auto-scaling group, for scaling out by hand (aws autoscaling set-desired-capacity) between applies. Null means worker_count."
  type        = number
  default     = null

  validation {
    condition     = var.worker_max_count == null || (coalesce(var.worker_max_count, 0) >= 0 && coalesce(var.worker_max_count, 0) <= 500)
    error_message = "worker_max_count must be null or a number from 0 to 500."
  }
}

variable "workers_per_instance" {
  description = "Dask worker processes per instance (dask worker --nworkers), each with one thread. Null means one per vCPU of worker_instance_type (96 on c5.24xlarge)."
  type        = number
  default     = null

  validation {
    condition     = var.workers_per_instance == null || (coalesce(var.workers_per_instance, 1) >= 1 && coalesce(var.workers_per_instance, 1) <= 200 && floor(coalesce(var.workers_per_instance, 1)) == coalesce(var.workers_per_instance, 1))
    error_message = "workers_per_instance must be null or a whole number from 1 to 200."
  }
}

variable "worker_capacity_type" {
  description = "Buy worker instances on-demand or as spot (price-capacity-optimized, capacity rebalancing on). The scheduler is always on-demand."
  type        = string
  default     = "on-demand"

  validation {
    condition     = contains(["on-demand", "spot"], var.worker_capacity_type)
    error_message = "worker_capacity_type must be \"on-demand\" or \"spot\"."
  }
}

variable "worker_root_volume_size_gb" {
  description = "Size of each worker's encrypted gp3 root volume in GiB (the image plus Dask's spill directory for every worker process)."
  type        = number
  default     = 200

  validation {
    condition     = var.worker_root_volume_size_gb >= 20 && var.worker_root_volume_size_gb <= 16384
    error_message = "worker_root_volume_size_gb must be between 20 and 16384."
  }
}

variable "worker_port_range" {
  description = "Fixed port range of the Dask worker processes (dask worker --worker-port FROM:TO). Opened only inside the workers' security group and to the scheduler. Must hold at least workers_per_instance ports."
  type = object({
    from = number
    to   = number
  })
  default = { from = 9000, to = 9199 }

  validation {
    condition     = var.worker_port_range.from >= 1024 && var.worker_port_range.to <= 32767 && var.worker_port_range.from <= var.worker_port_range.to
    error_message = "worker_port_range must satisfy 1024 <= from <= to <= 32767 (below Linux's ephemeral range)."
  }
}

variable "nanny_port_range" {
  description = "Fixed port range of the Dask nannies (dask worker --nanny-port FROM:TO). Same rules as worker_port_range; must not overlap it."
  type = object({
    from = number
    to   = number
  })
  default = { from = 9200, to = 9399 }

  validation {
    condition     = var.nanny_port_range.from >= 1024 && var.nanny_port_range.to <= 32767 && var.nanny_port_range.from <= var.nanny_port_range.to
    error_message = "nanny_port_range must satisfy 1024 <= from <= to <= 32767 (below Linux's ephemeral range)."
  }
}

# ---------------------------------------------------------------------------
# Instances (both roles)
# ---------------------------------------------------------------------------

variable "ami_id" {
  description = "AMI for both roles. Null means the latest Amazon Linux 2023 x86_64 AMI (the user data uses dnf, the AWS CLI and systemd from it)."
  type        = string
  default     = null

  validation {
    condition     = var.ami_id == null || can(regex("^ami-[0-9a-f]+$", var.ami_id))
    error_message = "ami_id must look like ami-0123456789abcdef0."
  }
}

variable "ssh_key_name" {
  description = "Name of an EC2 key pair to put on the instances. Null (the default) means no SSH key: use SSM Session Manager (aws ssm start-session --target i-...). No security group rule opens port 22 either way."
  type        = string
  default     = null
}

variable "enable_session_manager" {
  description = "Grant the instance roles the few actions SSM Session Manager needs (UpdateInstanceInformation, ssmmessages, ec2messages), so you can open a shell without SSH."
  type        = bool
  default     = true
}

variable "health_check_grace_period_seconds" {
  description = "Seconds an instance gets to boot, pull the image and start Dask before its health counts. After it, an unhealthy scheduler (load balancer check) or a dead instance is replaced instead of waited on."
  type        = number
  default     = 900

  validation {
    condition     = var.health_check_grace_period_seconds >= 60 && var.health_check_grace_period_seconds <= 7200
    error_message = "health_check_grace_period_seconds must be between 60 and 7200."
  }
}

variable "dask_env" {
  description = "Extra environment variables for the Dask containers (added after the module's own: those of the repository's pipeline/cluster/worker.env (thread pinning, glibc's heap, Dask's settings for large fleets, the preloads, the drain time; docs/scale.md gives the settings for 500 to 2,000 workers), DASK_DISTRIBUTED__COMM__REQUIRE_ENCRYPTION=True and the region). Never put secrets here: they end up in user data."
  type        = map(string)
  default     = {}

  validation {
    condition     = alltrue([for k, v in var.dask_env : can(regex("^[A-Za-z_][A-Za-z0-9_]*$", k)) && !can(regex("[\n\r]", v))])
    error_message = "dask_env keys must be valid variable names and values must be single-line."
  }
}

# ---------------------------------------------------------------------------
# TLS
# ---------------------------------------------------------------------------

variable "tls_validity_hours" {
  description = "Validity of the scheduler, worker and client certificates the module signs (the CA lives 10 years). A terraform apply within 30 days of expiry re-issues them; restart the services to pick them up."
  type        = number
  default     = 8760

  validation {
    condition     = var.tls_validity_hours >= 744 && var.tls_validity_hours <= 87600
    error_message = "tls_validity_hours must be between 744 (31 days) and 87600 (10 years)."
  }
}

# ---------------------------------------------------------------------------
# Storage, encryption, logs
# ---------------------------------------------------------------------------

variable "results_bucket_name" {
  description = "Exact name of the results bucket. Null means a unique name starting with \"<name>-results-\"."
  type        = string
  default     = null

  validation {
    condition     = var.results_bucket_name == null || can(regex("^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$", var.results_bucket_name))
    error_message = "results_bucket_name must be a valid S3 bucket name (3-63 lower-case letters, digits, dots, hyphens)."
  }
}

variable "results_prefix" {
  description = "Key prefix inside the bucket the workers may read and write (the driver's --output is s3://<bucket>/<results_prefix>). Ends with a slash."
  type        = string
  default     = "results/"

  validation {
    condition     = can(regex("^[A-Za-z0-9!_.*'()-]+(/[A-Za-z0-9!_.*'()-]+)*/$", var.results_prefix))
    error_message = "results_prefix must be a relative key prefix ending with \"/\", e.g. results/ or team/batches/."
  }
}

variable "results_versioning" {
  description = "Turn on object versioning of the results bucket (noncurrent versions then expire after results_expiration_days, when that is set)."
  type        = bool
  default     = false
}

variable "results_expiration_days" {
  description = "Delete result objects this many days after they were written. 0 keeps them forever."
  type        = number
  default     = 0

  validation {
    condition     = var.results_expiration_days >= 0 && floor(var.results_expiration_days) == var.results_expiration_days
    error_message = "results_expiration_days must be a whole number, 0 or more."
  }
}

variable "results_force_destroy" {
  description = "Let terraform destroy delete the results bucket even when it holds objects. Off by default so results survive a tear-down."
  type        = bool
  default     = false
}

variable "kms_key_arn" {
  description = "ARN of an existing KMS key for the SSM parameters, the results bucket, the ECR repository and the log group. Null means the module creates one (rotation on). Its key policy must let this account's IAM policies use it."
  type        = string
  default     = null

  validation {
    condition     = var.kms_key_arn == null || can(regex("^arn:aws[a-z-]*:kms:[a-z0-9-]+:[0-9]{12}:key/.+$", var.kms_key_arn))
    error_message = "kms_key_arn must be a KMS key ARN."
  }
}

variable "enable_cloudwatch_logs" {
  description = "Send the Dask containers' output to CloudWatch Logs (group /<name>/dask, stream per role and instance) with Docker's awslogs driver. When false, the output stays in the instance's journal."
  type        = bool
  default     = true
}

variable "log_retention_days" {
  description = "Days CloudWatch keeps the Dask logs (and flow logs)."
  type        = number
  default     = 30

  validation {
    condition     = contains([1, 3, 5, 7, 14, 30, 60, 90, 120, 150, 180, 365, 400, 545, 731, 1096, 1827, 2192, 2557, 2922, 3288, 3653], var.log_retention_days)
    error_message = "log_retention_days must be one of the values CloudWatch Logs accepts (1, 3, 5, 7, 14, 30, 60, 90, 120, 150, 180, 365, ...)."
  }
}
