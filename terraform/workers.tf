# The workers: an auto-scaling group of worker_count instances from a launch
# template, on-demand or spot. Each instance runs `dask worker --nworkers
# <vCPUs> --nthreads 1` in the project's image, announcing its private
# address on fixed worker and nanny ports.

locals {
  worker_user_data = templatefile("${path.module}/templates/worker.sh.tftpl", {
    bootstrap         = local.bootstrap["workers"]
    name              = var.name
    image             = coalesce(local.image_uri, "image-not-set")
    log_opts          = local.log_opts["workers"]
    scheduler_address = "tls://${aws_lb.this.dns_name}:${local.scheduler_port}"
    nworkers          = local.workers_per_instance
    worker_ports      = "${var.worker_port_range.from}:${var.worker_port_range.to}"
    nanny_ports       = "${var.nanny_port_range.from}:${var.nanny_port_range.to}"
    worker_port_from  = var.worker_port_range.from
    worker_port_to    = var.worker_port_range.to
  })
}

resource "aws_launch_template" "workers" {
  name_prefix            = "${var.name}-workers-"
  description            = "Dask workers of cluster ${var.name}"
  image_id               = local.ami_id
  instance_type          = var.worker_instance_type
  key_name               = var.ssh_key_name
  vpc_security_group_ids = [aws_security_group.workers.id]
  user_data              = base64encode(local.worker_user_data)
  ebs_optimized          = true
  update_default_version = true

  iam_instance_profile {
    arn = aws_iam_instance_profile.this["workers"].arn
  }

  # IMDSv2 only. One hop is enough: containers use the host's network, so
  # tasks writing to S3 get the instance role's credentials directly.
  metadata_options {
    http_endpoint               = "enabled"
    http_tokens                 = "required"
    http_put_response_hop_limit = 1
    instance_metadata_tags      = "disabled"
  }

  block_device_mappings {
    device_name = "/dev/xvda"

    ebs {
      volume_size           = var.worker_root_volume_size_gb
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
    tags          = merge(local.tags, { Name = "${var.name}-worker", "pipeline:role" = "worker" })
  }

  tag_specifications {
    resource_type = "volume"
    tags          = merge(local.tags, { Name = "${var.name}-worker", "pipeline:role" = "worker" })
  }

  tags = local.tags

  lifecycle {
    precondition {
      condition     = local.image_uri != null
      error_message = "No image: set image_tag (the tag scripts/push-image.sh pushed to the module's ECR repository) or image_uri."
    }
    precondition {
      condition     = local.workers_per_instance <= var.worker_port_range.to - var.worker_port_range.from + 1 && local.workers_per_instance <= var.nanny_port_range.to - var.nanny_port_range.from + 1
      error_message = "worker_port_range and nanny_port_range must each hold at least workers_per_instance ports."
    }
    precondition {
      condition     = var.worker_port_range.to < var.nanny_port_range.from || var.nanny_port_range.to < var.worker_port_range.from
      error_message = "worker_port_range and nanny_port_range must not overlap."
    }
    precondition {
      condition     = length(local.worker_user_data) < 16384
      error_message = "Worker user data exceeds EC2's 16 KB limit."
    }
  }
}

resource "aws_autoscaling_group" "workers" {
  name                = local.roles["workers"].asg_name
  min_size            = 0
  max_size            = local.worker_max_count
  desired_capacity    = var.worker_count
  vpc_zone_identifier = local.private_subnet_ids

  health_check_type         = "EC2"
  health_check_grace_period = var.health_check_grace_period_seconds
  # Terraform fails (after this long) instead of waiting forever on workers
  # that never come up.
  wait_for_capacity_timeout = "${ceil(var.health_check_grace_period_seconds / 60) + 10}m"

  # Spot: move work off instances AWS warns it will reclaim.
  capacity_rebalance = var.worker_capacity_type == "spot"

  dynamic "launch_template" {
    for_each = var.worker_capacity_type == "on-demand" ? [1] : []

    content {
      id      = aws_launch_template.workers.id
      version = aws_launch_template.workers.latest_version
    }
  }

  dynamic "mixed_instances_policy" {
    for_each = var.worker_capacity_type == "spot" ? [1] : []

    content {
      instances_distribution {
        on_demand_base_capacity                  = 0
        on_demand_percentage_above_base_capacity = 0
        spot_allocation_strategy                 = "price-capacity-optimized"
      }

      launch_template {
        launch_template_specification {
          launch_template_id = aws_launch_template.workers.id
          version            = aws_launch_template.workers.latest_version
        }
      }
    }
  }

  dynamic "tag" {
    for_each = merge(local.tags, { Name = "${var.name}-worker", "pipeline:role" = "worker" })

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
    aws_lb_listener.scheduler,
  ]
}
