# Three security groups, and nothing is open to the world:
#
#   lb         the NLB. In: 8786 (and 8787 if the dashboard is on) from
#              allowed_cidrs, 8786 from the workers. Out: 8786/8787 to the
#              scheduler (forwarded traffic and health checks).
#   scheduler  In: 8786/8787 from the lb group only. With NLB security groups,
#              targets that reference the lb group accept its traffic whether
#              or not the client IP is preserved, so nobody reaches the
#              scheduler except through the load balancer.
#              Out: worker and nanny ports to the workers, 443 to egress_cidrs.
#   workers    In: worker and nanny ports from the scheduler and from the
#              workers themselves (peer-to-peer transfers). Out: the same
#              ports to the workers, 8786 to the lb group, 443 to egress_cidrs.
#
# Workers reach the scheduler through the NLB on 8786; the scheduler reaches
# the workers directly on their private addresses (dask worker --host).

resource "aws_security_group" "lb" {
  name_prefix = "${var.name}-lb-"
  description = "Dask scheduler NLB: 8786 from allowed CIDRs and workers"
  vpc_id      = local.vpc_id

  tags = merge(local.tags, { Name = "${var.name}-lb" })

  lifecycle {
    create_before_destroy = true
  }
}

resource "aws_security_group" "scheduler" {
  name_prefix = "${var.name}-scheduler-"
  description = "Dask scheduler: 8786 and 8787 from the NLB only"
  vpc_id      = local.vpc_id

  tags = merge(local.tags, { Name = "${var.name}-scheduler" })

  lifecycle {
    create_before_destroy = true
  }
}

resource "aws_security_group" "workers" {
  name_prefix = "${var.name}-workers-"
  description = "Dask workers: worker and nanny ports inside the cluster only"
  vpc_id      = local.vpc_id

  tags = merge(local.tags, { Name = "${var.name}-workers" })

  lifecycle {
    create_before_destroy = true
  }
}

# ---------------------------------------------------------------- lb ------

resource "aws_vpc_security_group_ingress_rule" "lb_scheduler_from_cidrs" {
  for_each = toset(var.allowed_cidrs)

  security_group_id = aws_security_group.lb.id
  description       = "Dask scheduler (TLS) from an allowed CIDR"
  ip_protocol       = "tcp"
  from_port         = local.scheduler_port
  to_port           = local.scheduler_port
  cidr_ipv4         = strcontains(each.value, ":") ? null : each.value
  cidr_ipv6         = strcontains(each.value, ":") ? each.value : null

  tags = local.tags
}

resource "aws_vpc_security_group_ingress_rule" "lb_dashboard_from_cidrs" {
  for_each = var.enable_dashboard ? toset(var.allowed_cidrs) : toset([])

  security_group_id = aws_security_group.lb.id
  description       = "Dask dashboard (HTTP) from an allowed CIDR"
  ip_protocol       = "tcp"
  from_port         = local.dashboard_port
  to_port           = local.dashboard_port
  cidr_ipv4         = strcontains(each.value, ":") ? null : each.value
  cidr_ipv6         = strcontains(each.value, ":") ? each.value : null

  tags = local.tags
}

resource "aws_vpc_security_group_ingress_rule" "lb_scheduler_from_workers" {
  security_group_id            = aws_security_group.lb.id
  description                  = "Dask scheduler (TLS) from the workers"
  ip_protocol                  = "tcp"
  from_port                    = local.scheduler_port
  to_port                      = local.scheduler_port
  referenced_security_group_id = aws_security_group.workers.id

  tags = local.tags
}

resource "aws_vpc_security_group_egress_rule" "lb_to_scheduler" {
  security_group_id            = aws_security_group.lb.id
  description                  = "Forward Dask traffic to the scheduler"
  ip_protocol                  = "tcp"
  from_port                    = local.scheduler_port
  to_port                      = local.scheduler_port
  referenced_security_group_id = aws_security_group.scheduler.id

  tags = local.tags
}

resource "aws_vpc_security_group_egress_rule" "lb_to_scheduler_http" {
  security_group_id            = aws_security_group.lb.id
  description                  = "Health checks (/health) and the dashboard, to the scheduler"
  ip_protocol                  = "tcp"
  from_port                    = local.dashboard_port
  to_port                      = local.dashboard_port
  referenced_security_group_id = aws_security_group.scheduler.id

  tags = local.tags
}

# --------------------------------------------------------- scheduler ------

resource "aws_vpc_security_group_ingress_rule" "scheduler_from_lb" {
  security_group_id            = aws_security_group.scheduler.id
  description                  = "Dask scheduler (TLS) from the NLB"
  ip_protocol                  = "tcp"
  from_port                    = local.scheduler_port
  to_port                      = local.scheduler_port
  referenced_security_group_id = aws_security_group.lb.id

  tags = local.tags
}

resource "aws_vpc_security_group_ingress_rule" "scheduler_http_from_lb" {
  security_group_id            = aws_security_group.scheduler.id
  description                  = "Scheduler HTTP (health check, dashboard) from the NLB"
  ip_protocol                  = "tcp"
  from_port                    = local.dashboard_port
  to_port                      = local.dashboard_port
  referenced_security_group_id = aws_security_group.lb.id

  tags = local.tags
}

resource "aws_vpc_security_group_egress_rule" "scheduler_to_worker_ports" {
  security_group_id            = aws_security_group.scheduler.id
  description                  = "Scheduler to Dask worker ports"
  ip_protocol                  = "tcp"
  from_port                    = var.worker_port_range.from
  to_port                      = var.worker_port_range.to
  referenced_security_group_id = aws_security_group.workers.id

  tags = local.tags
}

resource "aws_vpc_security_group_egress_rule" "scheduler_to_nanny_ports" {
  security_group_id            = aws_security_group.scheduler.id
  description                  = "Scheduler to Dask nanny ports"
  ip_protocol                  = "tcp"
  from_port                    = var.nanny_port_range.from
  to_port                      = var.nanny_port_range.to
  referenced_security_group_id = aws_security_group.workers.id

  tags = local.tags
}

resource "aws_vpc_security_group_egress_rule" "scheduler_https" {
  for_each = toset(var.egress_cidrs)

  security_group_id = aws_security_group.scheduler.id
  description       = "HTTPS out: ECR, S3, SSM, CloudWatch Logs, packages"
  ip_protocol       = "tcp"
  from_port         = 443
  to_port           = 443
  cidr_ipv4         = strcontains(each.value, ":") ? null : each.value
  cidr_ipv6         = strcontains(each.value, ":") ? each.value : null

  tags = local.tags
}

# ----------------------------------------------------------- workers ------

resource "aws_vpc_security_group_ingress_rule" "workers_from_scheduler" {
  for_each = local.cluster_port_ranges

  security_group_id            = aws_security_group.workers.id
  description                  = "Dask ${each.key} ports from the scheduler"
  ip_protocol                  = "tcp"
  from_port                    = each.value.from
  to_port                      = each.value.to
  referenced_security_group_id = aws_security_group.scheduler.id

  tags = local.tags
}

resource "aws_vpc_security_group_ingress_rule" "workers_from_workers" {
  for_each = local.cluster_port_ranges

  security_group_id            = aws_security_group.workers.id
  description                  = "Dask ${each.key} ports from other workers"
  ip_protocol                  = "tcp"
  from_port                    = each.value.from
  to_port                      = each.value.to
  referenced_security_group_id = aws_security_group.workers.id

  tags = local.tags
}

resource "aws_vpc_security_group_egress_rule" "workers_to_workers" {
  for_each = local.cluster_port_ranges

  security_group_id            = aws_security_group.workers.id
  description                  = "Dask ${each.key} ports of other workers"
  ip_protocol                  = "tcp"
  from_port                    = each.value.from
  to_port                      = each.value.to
  referenced_security_group_id = aws_security_group.workers.id

  tags = local.tags
}

resource "aws_vpc_security_group_egress_rule" "workers_to_lb" {
  security_group_id            = aws_security_group.workers.id
  description                  = "Dask scheduler (TLS) through the NLB"
  ip_protocol                  = "tcp"
  from_port                    = local.scheduler_port
  to_port                      = local.scheduler_port
  referenced_security_group_id = aws_security_group.lb.id

  tags = local.tags
}

resource "aws_vpc_security_group_egress_rule" "workers_https" {
  for_each = toset(var.egress_cidrs)

  security_group_id = aws_security_group.workers.id
  description       = "HTTPS out: ECR, S3, SSM, CloudWatch Logs, packages, task data"
  ip_protocol       = "tcp"
  from_port         = 443
  to_port           = 443
  cidr_ipv4         = strcontains(each.value, ":") ? null : each.value
  cidr_ipv6         = strcontains(each.value, ":") ? each.value : null

  tags = local.tags
}

locals {
  cluster_port_ranges = {
    worker = var.worker_port_range
    nanny  = var.nanny_port_range
  }
}

# With the module's VPC, S3 (results, package repositories, ECR layers) is
# reached through the gateway endpoint: allow it even if egress_cidrs is
# narrowed to something that does not cover S3's public ranges.
resource "aws_vpc_security_group_egress_rule" "s3_endpoint" {
  for_each = var.create_vpc ? {
    scheduler = aws_security_group.scheduler.id
    workers   = aws_security_group.workers.id
  } : {}

  security_group_id = each.value
  description       = "HTTPS to S3 through the VPC gateway endpoint"
  ip_protocol       = "tcp"
  from_port         = 443
  to_port           = 443
  prefix_list_id    = aws_vpc_endpoint.s3[0].prefix_list_id

  tags = local.tags
}
