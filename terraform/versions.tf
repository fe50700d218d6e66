terraform {
  # 1.6: the `terraform test` era; nothing here needs a newer language feature
  # (cross-variable checks are preconditions, not 1.9-style variable validations).
  required_version = ">= 1.6"

  required_providers {
    aws = {
      source = "hashicorp/aws"
      # v6 renamed data.aws_region.name to .region, which this module uses.
      version = "~> 6.0"
    }
    tls = {
      source  = "hashicorp/tls"
      version = "~> 4.0"
    }
  }
}
