# One customer-managed KMS key for the cluster's data at rest: the TLS
# parameters, the results bucket, the ECR repository and the log groups.
# (EBS root volumes use the account's aws/ebs key instead: a customer key
# would need grants for the Auto Scaling service-linked role, a classic cause
# of instances that never launch.)

resource "aws_kms_key" "this" {
  count = var.kms_key_arn == null ? 1 : 0

  description             = "Dask cluster ${var.name}: TLS parameters, results bucket, ECR, logs"
  enable_key_rotation     = true
  deletion_window_in_days = 30

  policy = jsonencode({
    Version = "2012-10-17"
    Statement = [
      {
        # Standard account statement: lets IAM policies in this account
        # grant use of the key (the instance roles' policies do, narrowly).
        Sid       = "AccountIAMPolicies"
        Effect    = "Allow"
        Principal = { AWS = "arn:${local.partition}:iam::${local.account_id}:root" }
        Action    = "kms:*"
        Resource  = "*"
      },
      {
        Sid       = "CloudWatchLogsOfThisCluster"
        Effect    = "Allow"
        Principal = { Service = "logs.${local.region}.${local.dns_suffix}" }
        Action = [
          "kms:Encrypt*",
          "kms:Decrypt*",
          "kms:ReEncrypt*",
          "kms:GenerateDataKey*",
          "kms:Describe*",
        ]
        Resource = "*"
        Condition = {
          ArnLike = {
            "kms:EncryptionContext:aws:logs:arn" = "arn:${local.partition}:logs:${local.region}:${local.account_id}:log-group:/${var.name}/*"
          }
        }
      },
    ]
  })

  tags = merge(local.tags, { Name = var.name })
}

resource "aws_kms_alias" "this" {
  count = var.kms_key_arn == null ? 1 : 0

  name          = "alias/${var.name}-dask"
  target_key_id = aws_kms_key.this[0].key_id
}
