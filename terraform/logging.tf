# CloudWatch Logs: the Dask containers' output (Docker's awslogs driver, one
# stream per role and instance) and, optionally, the VPC's rejected flows.

resource "aws_cloudwatch_log_group" "dask" {
  #checkov:skip=CKV_AWS_338:Retention is a variable (log_retention_days, default 30): Dask logs are for debugging a running cluster, a year of 500 worker processes' output is cost without use. Set 365 or more where policy requires it.
  count = var.enable_cloudwatch_logs ? 1 : 0

  name              = local.log_group_name
  retention_in_days = var.log_retention_days
  kms_key_id        = local.kms_key_arn

  tags = local.tags
}

resource "aws_cloudwatch_log_group" "flow_logs" {
  #checkov:skip=CKV_AWS_338:Retention is a variable (log_retention_days, default 30), shared with the Dask logs; flow logs are off by default.
  count = var.create_vpc && var.enable_flow_logs ? 1 : 0

  name              = "/${var.name}/vpc-flow-logs"
  retention_in_days = var.log_retention_days
  kms_key_id        = local.kms_key_arn

  tags = local.tags
}

data "aws_iam_policy_document" "flow_logs_assume" {
  statement {
    actions = ["sts:AssumeRole"]

    principals {
      type        = "Service"
      identifiers = ["vpc-flow-logs.amazonaws.com"]
    }

    condition {
      test     = "StringEquals"
      variable = "aws:SourceAccount"
      values   = [local.account_id]
    }
  }
}

resource "aws_iam_role" "flow_logs" {
  count = var.create_vpc && var.enable_flow_logs ? 1 : 0

  name_prefix        = "${var.name}-flow-logs-"
  assume_role_policy = data.aws_iam_policy_document.flow_logs_assume.json

  tags = local.tags
}

resource "aws_iam_role_policy" "flow_logs" {
  count = var.create_vpc && var.enable_flow_logs ? 1 : 0

  name = "write-flow-logs"
  role = aws_iam_role.flow_logs[0].id
  policy = jsonencode({
    Version = "2012-10-17"
    Statement = [
      {
        Effect = "Allow"
        Action = [
          "logs:CreateLogStream",
          "logs:PutLogEvents",
          "logs:DescribeLogStreams",
        ]
        Resource = [
          aws_cloudwatch_log_group.flow_logs[0].arn,
          "${aws_cloudwatch_log_group.flow_logs[0].arn}:*",
        ]
      },
    ]
  })
}
