# Instance roles, one per role, each allowed only what its boot and its work
# need:
#   both       pull the image (ECR: the token call cannot be scoped, the
#              layer calls are scoped to the repositories), read its own TLS
#              parameters and decrypt them (KMS, via SSM only), write its
#              container logs, mark its own instance unhealthy in its own
#              auto-scaling group when boot fails, and (optional) Session
#              Manager.
#   workers    additionally read/write/list the results prefix of the bucket
#              (KMS via S3 only). The scheduler never touches results.
# Nothing here is "*" except the actions AWS does not let anyone scope
# (ecr:GetAuthorizationToken, the Session Manager channel calls).

locals {
  roles = {
    scheduler = {
      tls_files = ["ca.pem", "scheduler.pem", "scheduler-key.pem"]
      asg_name  = "${var.name}-scheduler"
    }
    workers = {
      tls_files = ["ca.pem", "worker.pem", "worker-key.pem"]
      asg_name  = "${var.name}-workers"
    }
  }

  results_bucket_arn = aws_s3_bucket.results.arn
}

data "aws_iam_policy_document" "ec2_assume" {
  statement {
    actions = ["sts:AssumeRole"]

    principals {
      type        = "Service"
      identifiers = ["ec2.${local.dns_suffix}"]
    }
  }
}

resource "aws_iam_role" "this" {
  for_each = local.roles

  name_prefix          = "${var.name}-${each.key}-"
  description          = "Dask ${each.key} instances of cluster ${var.name}"
  assume_role_policy   = data.aws_iam_policy_document.ec2_assume.json
  max_session_duration = 3600

  tags = local.tags
}

resource "aws_iam_instance_profile" "this" {
  for_each = local.roles

  name_prefix = "${var.name}-${each.key}-"
  role        = aws_iam_role.this[each.key].name

  tags = local.tags
}

data "aws_iam_policy_document" "instance" {
  for_each = local.roles

  statement {
    sid       = "ReadOwnTlsParameters"
    actions   = ["ssm:GetParameter"]
    resources = [for f in each.value.tls_files : aws_ssm_parameter.tls[f].arn]
  }

  statement {
    sid       = "DecryptViaSsmAndEcr"
    actions   = ["kms:Decrypt"]
    resources = [local.kms_key_arn]

    condition {
      test     = "StringEquals"
      variable = "kms:ViaService"
      values = [
        "ssm.${local.region}.${local.dns_suffix}",
        "ecr.${local.region}.${local.dns_suffix}",
      ]
    }
  }

  statement {
    sid       = "EcrLogin"
    actions   = ["ecr:GetAuthorizationToken"]
    resources = ["*"] # not resource-scoped by AWS
  }

  dynamic "statement" {
    for_each = length(local.ecr_repository_arns) > 0 ? [1] : []

    content {
      sid = "EcrPull"
      actions = [
        "ecr:BatchCheckLayerAvailability",
        "ecr:BatchGetImage",
        "ecr:GetDownloadUrlForLayer",
      ]
      resources = local.ecr_repository_arns
    }
  }

  dynamic "statement" {
    for_each = var.enable_cloudwatch_logs ? [1] : []

    content {
      sid       = "ContainerLogs"
      actions   = ["logs:CreateLogStream", "logs:PutLogEvents"]
      resources = ["arn:${local.partition}:logs:${local.region}:${local.account_id}:log-group:${local.log_group_name}:log-stream:${each.key}/*"]
    }
  }

  statement {
    sid       = "ReportOwnBootFailure"
    actions   = ["autoscaling:SetInstanceHealth"]
    resources = ["arn:${local.partition}:autoscaling:${local.region}:${local.account_id}:autoScalingGroup:*:autoScalingGroupName/${each.value.asg_name}"]
  }

  dynamic "statement" {
    for_each = var.enable_session_manager ? [1] : []

    content {
      sid       = "SessionManagerRegistration"
      actions   = ["ssm:UpdateInstanceInformation"]
      resources = ["arn:${local.partition}:ec2:${local.region}:${local.account_id}:instance/*"]
    }
  }

  dynamic "statement" {
    for_each = var.enable_session_manager ? [1] : []

    content {
      sid = "SessionManagerChannels"
      actions = [
        "ssmmessages:CreateControlChannel",
        "ssmmessages:CreateDataChannel",
        "ssmmessages:OpenControlChannel",
        "ssmmessages:OpenDataChannel",
        "ec2messages:AcknowledgeMessage",
        "ec2messages:DeleteMessage",
        "ec2messages:FailMessage",
        "ec2messages:GetEndpoint",
        "ec2messages:GetMessages",
        "ec2messages:SendReply",
      ]
      resources = ["*"] # not resource-scoped by AWS
    }
  }

  dynamic "statement" {
    for_each = each.key == "workers" ? [1] : []

    content {
      sid       = "ListResultsPrefix"
      actions   = ["s3:ListBucket"]
      resources = [local.results_bucket_arn]

      condition {
        test     = "StringLike"
        variable = "s3:prefix"
        values   = [var.results_prefix, "${var.results_prefix}*"]
      }
    }
  }

  dynamic "statement" {
    for_each = each.key == "workers" ? [1] : []

    content {
      sid = "ReadWriteResultsPrefix"
      actions = [
        "s3:GetObject",
        "s3:PutObject",
        "s3:DeleteObject",
        "s3:AbortMultipartUpload",
        "s3:ListMultipartUploadParts",
      ]
      resources = ["${local.results_bucket_arn}/${var.results_prefix}*"]
    }
  }

  dynamic "statement" {
    for_each = each.key == "workers" ? [1] : []

    content {
      sid       = "EncryptResultsViaS3"
      actions   = ["kms:GenerateDataKey", "kms:Decrypt"]
      resources = [local.kms_key_arn]

      condition {
        test     = "StringEquals"
        variable = "kms:ViaService"
        values   = ["s3.${local.region}.${local.dns_suffix}"]
      }
    }
  }
}

resource "aws_iam_role_policy" "instance" {
  for_each = local.roles

  name   = "dask-${each.key}"
  role   = aws_iam_role.this[each.key].id
  policy = data.aws_iam_policy_document.instance[each.key].json
}
