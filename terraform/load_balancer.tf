# A Network Load Balancer in front of the scheduler. It forwards TCP: Dask's
# mutual TLS passes through untouched and ends at the scheduler, which checks
# every client's certificate against the cluster CA (and clients check the
# scheduler's). Internal unless lb_internet_facing is set, and then only
# allowed_cidrs get in (its security group above).

resource "aws_lb" "this" {
  #checkov:skip=CKV_AWS_91:NLB access logs are only written for TLS listeners; these listeners are TCP pass-through (TLS ends at the scheduler), so there is nothing to log. Connection-level records: enable_flow_logs.
  #checkov:skip=CKV_AWS_150:Deletion protection is a variable (lb_deletion_protection), off by default because tearing the cluster down with terraform destroy is a normal part of using it.
  name               = "${var.name}-sched"
  load_balancer_type = "network"
  internal           = !var.lb_internet_facing
  subnets            = local.lb_subnet_ids
  security_groups    = [aws_security_group.lb.id]

  # The scheduler sits in one zone; without cross-zone balancing the NLB
  # nodes of the other zones would have no target.
  enable_cross_zone_load_balancing = true
  enable_deletion_protection       = var.lb_deletion_protection

  tags = merge(local.tags, { Name = "${var.name}-scheduler" })

  lifecycle {
    precondition {
      condition     = !var.lb_internet_facing || length(var.allowed_cidrs) > 0
      error_message = "lb_internet_facing = true needs a non-empty allowed_cidrs: an internet-facing scheduler is only opened to listed networks."
    }
    precondition {
      condition     = length(local.lb_subnet_ids) > 0
      error_message = "No subnets for the load balancer: pass private_subnet_ids (internal) or public_subnet_ids (internet-facing) when create_vpc is false."
    }
  }
}

resource "aws_lb_target_group" "scheduler" {
  # A prefix (at most 6 characters), not a name: with create_before_destroy a
  # replacement target group must not collide with the old one's name.
  name_prefix = "sched-"
  port        = local.scheduler_port
  protocol    = "TCP"
  target_type = "instance"
  vpc_id      = local.vpc_id

  # The scheduler does not care where a connection comes from (workers
  # announce their own address); turning preservation off also avoids the
  # NLB hairpin problem if a client ever runs on the scheduler's host.
  preserve_client_ip = "false"

  # A replaced scheduler is a new cluster: cut old connections promptly so
  # workers and clients reconnect to the new one.
  deregistration_delay   = 30
  connection_termination = true

  # The scheduler's HTTP server answers /health ("ok") whether or not the
  # dashboard is on. Checking it, instead of opening TCP connections to the
  # TLS port, tests that Dask is up and keeps failed-handshake noise out of
  # the scheduler's log.
  health_check {
    enabled             = true
    protocol            = "HTTP"
    port                = tostring(local.dashboard_port)
    path                = "/health"
    matcher             = "200"
    interval            = 10
    timeout             = 5
    healthy_threshold   = 2
    unhealthy_threshold = 3
  }

  tags = merge(local.tags, { Name = "${var.name}-scheduler" })

  lifecycle {
    create_before_destroy = true
  }
}

resource "aws_lb_listener" "scheduler" {
  load_balancer_arn = aws_lb.this.arn
  port              = local.scheduler_port
  protocol          = "TCP"

  default_action {
    type             = "forward"
    target_group_arn = aws_lb_target_group.scheduler.arn
  }

  tags = local.tags
}

resource "aws_lb_target_group" "dashboard" {
  count = var.enable_dashboard ? 1 : 0

  name_prefix        = "dash-"
  port               = local.dashboard_port
  protocol           = "TCP"
  target_type        = "instance"
  vpc_id             = local.vpc_id
  preserve_client_ip = "false"

  health_check {
    enabled             = true
    protocol            = "HTTP"
    port                = "traffic-port"
    path                = "/health"
    matcher             = "200"
    interval            = 10
    timeout             = 5
    healthy_threshold   = 2
    unhealthy_threshold = 3
  }

  tags = merge(local.tags, { Name = "${var.name}-dashboard" })

  lifecycle {
    create_before_destroy = true
  }
}

resource "aws_lb_listener" "dashboard" {
  count = var.enable_dashboard ? 1 : 0

  load_balancer_arn = aws_lb.this.arn
  port              = local.dashboard_port
  protocol          = "TCP"

  default_action {
    type             = "forward"
    target_group_arn = aws_lb_target_group.dashboard[0].arn
  }

  tags = local.tags
}
