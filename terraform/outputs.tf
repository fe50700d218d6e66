locals {
  scheduler_address = "tls://${aws_lb.this.dns_name}:${local.scheduler_port}"
  results_uri       = "s3://${aws_s3_bucket.results.bucket}/${var.results_prefix}"

  client_tls_commands = join("\n", concat(
    ["mkdir -p -m 700 ~/.pipeline/tls"],
    [for f in ["ca.pem", "client.pem", "client-key.pem"] :
      "aws ssm get-parameter --region ${local.region} --with-decryption --name ${local.tls_parameter_names[f]} --query Parameter.Value --output text > ~/.pipeline/tls/${f}"
    ],
    ["chmod 600 ~/.pipeline/tls/*.pem"],
  ))

  driver_env = join("\n", [
    "export PIPELINE_SCHEDULER=${local.scheduler_address}",
    "export PIPELINE_TLS_CA_FILE=~/.pipeline/tls/ca.pem",
    "export PIPELINE_TLS_CERT=~/.pipeline/tls/client.pem",
    "export PIPELINE_TLS_KEY=~/.pipeline/tls/client-key.pem",
  ])
}

output "scheduler_address" {
  description = "Address the driver connects to (PIPELINE_SCHEDULER): the load balancer's DNS name, TCP 8786, Dask mutual TLS end to end."
  value       = local.scheduler_address
}

output "load_balancer_dns_name" {
  description = "DNS name of the Network Load Balancer in front of the scheduler."
  value       = aws_lb.this.dns_name
}

output "dashboard_url" {
  description = "Dask dashboard URL (plain HTTP, reachable from allowed_cidrs), or null when enable_dashboard is false."
  value       = var.enable_dashboard ? "http://${aws_lb.this.dns_name}:${local.dashboard_port}/status" : null
}

output "results_bucket" {
  description = "Name of the results bucket."
  value       = aws_s3_bucket.results.bucket
}

output "results_uri" {
  description = "Where the workers may write: pass it (or a sub-prefix) to `pipeline run --output`."
  value       = local.results_uri
}

output "ecr_repository_url" {
  description = "URL of the module's ECR repository (scripts/push-image.sh pushes here), or null."
  value       = local.ecr_repository_url
}

output "image_uri" {
  description = "Image every instance runs."
  value       = local.image_uri
}

output "tls_parameter_names" {
  description = "SSM SecureString parameter names of the TLS material, by file name (same names as `pipeline certs`)."
  value       = local.tls_parameter_names
}

output "client_tls_commands" {
  description = "Shell commands that fetch the CA and the client certificate and key into ~/.pipeline/tls (needs ssm:GetParameter on them and kms:Decrypt on the cluster key)."
  value       = local.client_tls_commands
}

output "driver_env" {
  description = "Environment for the driver (pipeline run) once client_tls_commands has run."
  value       = local.driver_env
}

output "workers_total" {
  description = "Dask worker processes (one thread each) at the desired worker_count."
  value       = var.worker_count * local.workers_per_instance
}

output "scheduler_asg_name" {
  description = "Auto-scaling group of the scheduler (exactly one instance)."
  value       = aws_autoscaling_group.scheduler.name
}

output "worker_asg_name" {
  description = "Auto-scaling group of the workers."
  value       = aws_autoscaling_group.workers.name
}

output "security_group_ids" {
  description = "Security groups of the load balancer, the scheduler and the workers (add rules to the lb group to let more clients in)."
  value = {
    lb        = aws_security_group.lb.id
    scheduler = aws_security_group.scheduler.id
    workers   = aws_security_group.workers.id
  }
}

output "kms_key_arn" {
  description = "KMS key encrypting the TLS parameters, results, image repository and logs (the driver needs kms:Decrypt on it to fetch the client certificate and read results)."
  value       = local.kms_key_arn
}

output "log_group_name" {
  description = "CloudWatch log group of the Dask containers, or null when enable_cloudwatch_logs is false."
  value       = var.enable_cloudwatch_logs ? local.log_group_name : null
}

output "next_steps" {
  description = "Commands to run next: fetch the client certificate, point the driver at the cluster, run a batch."
  value       = <<-EOT
    # 1. Client certificate for the driver (from SSM, decrypted with the cluster's KMS key):
    ${local.client_tls_commands}

    # 2. Point the driver at the cluster:
    ${local.driver_env}

    # 3. Run a batch; results go under ${local.results_uri}
    pipeline run --output ${local.results_uri}<batch-name>/ ...

    # Watch it: aws logs tail ${local.log_group_name} --follow --region ${local.region}
    # Scale:    terraform apply -var worker_count=N   (0 stops paying for workers)
  EOT
}
