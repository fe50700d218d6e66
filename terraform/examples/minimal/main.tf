# Minimal root module: a VPC, an internal NLB, one scheduler and five
# c5.24xlarge workers (480 single-threaded Dask workers), results in S3.
#
#   terraform init
#   terraform apply -target='module.dask_cluster.aws_ecr_repository.this[0]'  # repository first
#   ../../../scripts/push-image.sh                                            # prints the tag
#   terraform apply -var image_tag=<tag> -var 'allowed_cidrs=["10.0.0.0/8"]'

terraform {
  required_version = ">= 1.6"

  required_providers {
    aws = {
      source  = "hashicorp/aws"
      version = "~> 6.0"
    }
    tls = {
      source  = "hashicorp/tls"
      version = "~> 4.0"
    }
  }

  # The state holds the cluster's TLS private keys: keep it in an encrypted,
  # access-controlled backend, e.g.
  # backend "s3" {
  #   bucket       = "my-terraform-state"
  #   key          = "pipeline/dask-cluster.tfstate"
  #   region       = "us-east-1"
  #   encrypt      = true
  #   use_lockfile = true
  # }
}

variable "region" {
  description = "AWS region to create the cluster in."
  type        = string
  default     = "us-east-1"
}

variable "image_tag" {
  description = "Image tag printed by scripts/push-image.sh."
  type        = string
  default     = null
}

variable "allowed_cidrs" {
  description = "Networks the driver runs in (reach the scheduler through the internal NLB, e.g. over VPN or peering)."
  type        = list(string)
  default     = []
}

provider "aws" {
  region = var.region

  default_tags {
    tags = {
      project = "pipeline"
    }
  }
}

module "dask_cluster" {
  source = "../.."

  name          = "pipeline"
  region        = var.region
  image_tag     = var.image_tag
  allowed_cidrs = var.allowed_cidrs

  # Defaults spelled out for the reader:
  worker_instance_type = "c5.24xlarge"
  worker_count         = 5
  worker_capacity_type = "on-demand"
  lb_internet_facing   = false
}

output "scheduler_address" {
  description = "PIPELINE_SCHEDULER for the driver."
  value       = module.dask_cluster.scheduler_address
}

output "results_uri" {
  description = "Where results go."
  value       = module.dask_cluster.results_uri
}

output "ecr_repository_url" {
  description = "Where scripts/push-image.sh pushes."
  value       = module.dask_cluster.ecr_repository_url
}

output "client_tls_commands" {
  description = "Fetch the client certificate: eval \"$(terraform output -raw client_tls_commands)\"."
  value       = module.dask_cluster.client_tls_commands
}

output "driver_env" {
  description = "Environment for pipeline run: eval \"$(terraform output -raw driver_env)\"."
  value       = module.dask_cluster.driver_env
}

output "worker_asg_name" {
  description = "Worker auto-scaling group (manual scaling, instance refresh)."
  value       = module.dask_cluster.worker_asg_name
}

output "next_steps" {
  description = "What to run next."
  value       = module.dask_cluster.next_steps
}
