# The scheduler: an auto-scaling group of exactly one on-demand instance,
# registered with the NLB's target group. If the instance dies, or the NLB's
# /health check fails for longer than the grace period, the group replaces
# it; workers reconnect through the same load balancer address.

locals {
  # Docker log options shared by both roles ($${INSTANCE_ID} is expanded by
  # systemd from /etc/pipeline/node.env).
  log_opts = {
    for role in keys(local.roles) : role => (
      var.enable_cloudwatch_logs
      ? "--log-driver awslogs --log-opt awslogs-region=${local.region} --log-opt awslogs-group=${local.log_group_name} --log-opt awslogs-stream=${role}/$${INSTANCE_ID}"
      : "--log-driver journald"
    )
  }

  bootstrap = {
    for role, cfg in local.roles : role => templatefile("${path.module}/templates/bootstrap.sh.tftpl", {
      role           = role
      name           = var.name
      region         = local.region
      asg_name       = cfg.asg_name
      boot_timeout   = var.health_check_grace_period_seconds - 60
      image          = coalesce(local.image_uri, "image-not-set")
      image_registry = local.image_registry
      dask_env       = local.dask_env
      ssm_prefix     = local.ssm_prefix
      tls_files      = cfg.tls_files
    })
  }

  scheduler_user_data = templatefile("${path.module}/templates/scheduler.sh.tftpl", {
    bootstrap      = local.bootstrap["scheduler"]
    name           = var.name
    image          = coalesce(local.image_uri, "image-not-set")
    log_opts       = local.log_opts["scheduler"]
    scheduler_port = local.scheduler_port
    dashboard_port = local.dashboard_port
    dashboard_flag = var.enable_dashboard ? "--dashboard" : "--no-dashboard"
  })
}

resource "aws_launch_template" "scheduler" {
  name_prefix            = "${var.name}-scheduler-"
  description            = "Dask scheduler of cluster ${var.name}"
  image_id               = local.ami_id
  instance_type          = var.scheduler_instance_type
  key_name               = var.ssh_key_name
  vpc_security_group_ids = [aws_security_group.scheduler.id]
  user_data              = base64encode(local.scheduler_user_data)
  ebs_optimized          = true
  update_default_version = true

  iam_instance_profile {
    arn = aws_iam_instance_profile.this["scheduler"].arn
  }

  # IMDSv2 only. One hop is enough: containers use the host's network.
  metadata_options {
    http_endpoint               = "enabled"
    http_tokens                 = "required"
    http_put_response_hop_limit = 1
    instance_metadata_tags      = "disabled"
  }

  block_device_mappings {
    device_name = "/dev/xvda"

    ebs {
      volume_size           = var.scheduler_root_volume_size_gb
      volume_type           = "gp3"
      encrypted             = true
      delete_on_termination = true
    }
  }

  monitoring {
    enabled = true
  }

  tag_specifications {
    resource_type = "instance"
    tags          = merge(local.tags, { Name = "${var.name}-scheduler", "pipeline:role" = "scheduler" })
  }

  tag_specifications {
    resource_type = "volume"
    tags          = merge(local.tags, { Name = "${var.name}-scheduler", "pipeline:role" = "scheduler" })
  }

  tags = local.tags

  lifecycle {
    precondition {
      condition     = local.image_uri != null
      error_message = "No image: set image_tag (the tag scripts/push-image.sh pushed to the module's ECR repository) or image_uri."
    }
    precondition {
      condition     = length(local.private_subnet_ids) > 0
      error_message = "No private subnets: pass private_subnet_ids when create_vpc is false."
    }
    precondition {
      condition     = var.region == null || var.region == local.region
      error_message = "var.region does not match the AWS provider's region."
    }
    precondition {
      condition     = length(local.scheduler_user_data) < 16384
      error_message = "Scheduler user data exceeds EC2's 16 KB limit."
    }
  }
}

resource "aws_autoscaling_group" "scheduler" {
  name                = local.roles["scheduler"].asg_name
  min_size            = 1
  max_size            = 1
  desired_capacity    = 1
  vpc_zone_identifier = local.private_subnet_ids

  # Replace the scheduler when the NLB says it is unhealthy, not only when
  # EC2 says the instance is: a running VM without a scheduler is no use.
  health_check_type         = "ELB"
  health_check_grace_period = var.health_check_grace_period_seconds
  target_group_arns = concat(
    [aws_lb_target_group.scheduler.arn],
    aws_lb_target_group.dashboard[*].arn,
  )

  # Terraform fails (after this long) instead of waiting forever on a
  # scheduler that never becomes healthy behind the NLB.
  wait_for_capacity_timeout = "${ceil(var.health_check_grace_period_seconds / 60) + 10}m"
  min_elb_capacity          = 1

  launch_template {
    id      = aws_launch_template.scheduler.id
    version = aws_launch_template.scheduler.latest_version
  }

  dynamic "tag" {
    for_each = merge(local.tags, { Name = "${var.name}-scheduler", "pipeline:role" = "scheduler" })

    content {
      key                 = tag.key
      value               = tag.value
      propagate_at_launch = true
    }
  }

  depends_on = [
    aws_iam_role_policy.instance,
    aws_ssm_parameter.tls,
    aws_cloudwatch_log_group.dask,
  ]
}
