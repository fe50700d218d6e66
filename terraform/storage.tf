# Results bucket (KMS-encrypted, private, TLS-only) and the image repository.

resource "aws_s3_bucket" "results" {
  #checkov:skip=CKV_AWS_18:Server access logs would need a second bucket per cluster; object-level auditing belongs to CloudTrail data events, which accounts enable centrally.
  #checkov:skip=CKV_AWS_144:Results are reproducible batch outputs; cross-region replication doubles storage cost and is a choice for the caller (add aws_s3_bucket_replication_configuration in the root module).
  #checkov:skip=CKV2_AWS_62:Nothing in the pipeline consumes bucket event notifications; the driver knows when a batch is written.
  #checkov:skip=CKV_AWS_21:Versioning is a variable (results_versioning), off by default: results are overwritten by re-running a batch, and old versions of large outputs only cost money.
  bucket        = var.results_bucket_name
  bucket_prefix = var.results_bucket_name == null ? "${var.name}-results-" : null
  force_destroy = var.results_force_destroy

  tags = merge(local.tags, { Name = "${var.name}-results" })
}

resource "aws_s3_bucket_public_access_block" "results" {
  bucket = aws_s3_bucket.results.id

  block_public_acls       = true
  block_public_policy     = true
  ignore_public_acls      = true
  restrict_public_buckets = true
}

resource "aws_s3_bucket_ownership_controls" "results" {
  bucket = aws_s3_bucket.results.id

  rule {
    object_ownership = "BucketOwnerEnforced"
  }
}

resource "aws_s3_bucket_server_side_encryption_configuration" "results" {
  bucket = aws_s3_bucket.results.id

  rule {
    apply_server_side_encryption_by_default {
      sse_algorithm     = "aws:kms"
      kms_master_key_id = local.kms_key_arn
    }
    # One data key per bucket instead of one KMS call per object.
    bucket_key_enabled = true
  }
}

resource "aws_s3_bucket_versioning" "results" {
  bucket = aws_s3_bucket.results.id

  versioning_configuration {
    status = var.results_versioning ? "Enabled" : "Suspended"
  }
}

resource "aws_s3_bucket_lifecycle_configuration" "results" {
  bucket = aws_s3_bucket.results.id

  # Always: failed multipart uploads (killed workers) do not linger.
  rule {
    id     = "abort-incomplete-uploads"
    status = "Enabled"

    filter {}

    abort_incomplete_multipart_upload {
      days_after_initiation = 7
    }
  }

  dynamic "rule" {
    for_each = var.results_expiration_days > 0 ? [var.results_expiration_days] : []

    content {
      id     = "expire-results"
      status = "Enabled"

      filter {
        prefix = var.results_prefix
      }

      expiration {
        days = rule.value
      }

      noncurrent_version_expiration {
        noncurrent_days = rule.value
      }
    }
  }

  depends_on = [aws_s3_bucket_versioning.results]
}

data "aws_iam_policy_document" "results_bucket" {
  statement {
    sid     = "DenyInsecureTransport"
    effect  = "Deny"
    actions = ["s3:*"]
    resources = [
      aws_s3_bucket.results.arn,
      "${aws_s3_bucket.results.arn}/*",
    ]

    principals {
      type        = "*"
      identifiers = ["*"]
    }

    condition {
      test     = "Bool"
      variable = "aws:SecureTransport"
      values   = ["false"]
    }
  }

  statement {
    sid     = "DenyTLSBelow12"
    effect  = "Deny"
    actions = ["s3:*"]
    resources = [
      aws_s3_bucket.results.arn,
      "${aws_s3_bucket.results.arn}/*",
    ]

    principals {
      type        = "*"
      identifiers = ["*"]
    }

    condition {
      test     = "NumericLessThan"
      variable = "s3:TlsVersion"
      values   = ["1.2"]
    }
  }
}

resource "aws_s3_bucket_policy" "results" {
  bucket = aws_s3_bucket.results.id
  policy = data.aws_iam_policy_document.results_bucket.json

  # A bucket policy written before the public access block can be refused.
  depends_on = [aws_s3_bucket_public_access_block.results]
}

# ------------------------------------------------------------------ ECR ------

resource "aws_ecr_repository" "this" {
  count = var.create_ecr_repository ? 1 : 0

  name = var.name
  # Every build gets its own tag (scripts/push-image.sh uses the git commit),
  # so a tag always means the same image on every instance.
  image_tag_mutability = "IMMUTABLE"

  image_scanning_configuration {
    scan_on_push = true
  }

  encryption_configuration {
    encryption_type = "KMS"
    kms_key         = local.kms_key_arn
  }

  tags = merge(local.tags, { Name = var.name })
}

resource "aws_ecr_lifecycle_policy" "this" {
  count = var.create_ecr_repository ? 1 : 0

  repository = aws_ecr_repository.this[0].name
  policy = jsonencode({
    rules = [
      {
        rulePriority = 1
        description  = "Keep the 30 most recent images"
        selection = {
          tagStatus   = "any"
          countType   = "imageCountMoreThan"
          countNumber = 30
        }
        action = { type = "expire" }
      },
    ]
  })
}
