# TLS material for Dask's mutual TLS, generated here and stored as SSM
# SecureString parameters encrypted with the cluster's KMS key.
#
# Instances fetch their own certificate and key with their instance role when
# their service starts (templates/*.sh.tftpl); nothing secret is in user data.
# The driver fetches the client certificate the same way (see the
# client_tls_commands output).
#
# Private keys are therefore in Terraform state: keep the state in an
# encrypted backend with restricted access (README, "TLS"). The CA's private
# key is never written to SSM: nothing on the cluster needs it.
#
# Dask does not check host names (it verifies the peer's chain against the CA
# only), so the names below are informational; the load balancer's DNS name is
# included for clients that do check.

locals {
  ssm_prefix = "/${var.name}/tls"

  # File names match `pipeline certs --out DIR`.
  tls_parameters = {
    "ca.pem"            = tls_self_signed_cert.ca.cert_pem
    "scheduler.pem"     = tls_locally_signed_cert.this["scheduler"].cert_pem
    "scheduler-key.pem" = tls_private_key.this["scheduler"].private_key_pem
    "worker.pem"        = tls_locally_signed_cert.this["worker"].cert_pem
    "worker-key.pem"    = tls_private_key.this["worker"].private_key_pem
    "client.pem"        = tls_locally_signed_cert.this["client"].cert_pem
    "client-key.pem"    = tls_private_key.this["client"].private_key_pem
  }

  tls_parameter_names = { for f in keys(local.tls_parameters) : f => "${local.ssm_prefix}/${f}" }

  # Scheduler and workers both accept connections and open them (the
  # scheduler connects to workers, workers to each other), so their
  # certificates carry both server and client auth.
  tls_identities = {
    scheduler = { dns_names = ["dask-scheduler", aws_lb.this.dns_name] }
    worker    = { dns_names = ["dask-worker"] }
    client    = { dns_names = ["dask-client"] }
  }
}

resource "tls_private_key" "ca" {
  algorithm = "RSA"
  rsa_bits  = 4096
}

resource "tls_self_signed_cert" "ca" {
  private_key_pem       = tls_private_key.ca.private_key_pem
  is_ca_certificate     = true
  set_subject_key_id    = true
  validity_period_hours = 87600

  subject {
    common_name  = "${var.name} Dask cluster CA"
    organization = "pipeline"
  }

  allowed_uses = [
    "cert_signing",
    "crl_signing",
    "digital_signature",
  ]
}

resource "tls_private_key" "this" {
  for_each = local.tls_identities

  algorithm = "RSA"
  rsa_bits  = 3072
}

resource "tls_cert_request" "this" {
  for_each = local.tls_identities

  private_key_pem = tls_private_key.this[each.key].private_key_pem
  dns_names       = each.value.dns_names

  subject {
    common_name  = "dask-${each.key}"
    organization = "pipeline"
  }
}

resource "tls_locally_signed_cert" "this" {
  for_each = local.tls_identities

  cert_request_pem   = tls_cert_request.this[each.key].cert_request_pem
  ca_private_key_pem = tls_private_key.ca.private_key_pem
  ca_cert_pem        = tls_self_signed_cert.ca.cert_pem

  validity_period_hours = var.tls_validity_hours
  early_renewal_hours   = 720
  set_subject_key_id    = true

  allowed_uses = [
    "digital_signature",
    "key_encipherment",
    "server_auth",
    "client_auth",
  ]
}

resource "aws_ssm_parameter" "tls" {
  for_each = local.tls_parameter_names

  name        = each.value
  description = "Dask mutual TLS material (${each.key}) of cluster ${var.name}"
  type        = "SecureString"
  key_id      = local.kms_key_arn
  tier        = "Standard"
  value       = local.tls_parameters[each.key]

  tags = local.tags
}
