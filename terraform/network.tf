# Network: either a VPC made here (public subnets for the NAT gateway and an
# internet-facing load balancer, private subnets for every instance), or the
# caller's VPC and subnets.

data "aws_availability_zones" "available" {
  #checkov:skip=CKV_AWS_394:Only consulted when var.availability_zones is empty, and then only the first az_count names (the provider sorts them) are used, so a zone AWS adds later does not change the result; set availability_zones to pin the zones by name.
  count = var.create_vpc && length(var.availability_zones) == 0 ? 1 : 0
  state = "available"

  filter {
    name   = "opt-in-status"
    values = ["opt-in-not-required"]
  }
}

locals {
  azs = !var.create_vpc ? [] : (
    length(var.availability_zones) > 0 ? var.availability_zones : slice(data.aws_availability_zones.available[0].names, 0, var.az_count)
  )
  az_count = length(local.azs)

  vpc_id             = var.create_vpc ? aws_vpc.this[0].id : var.vpc_id
  private_subnet_ids = var.create_vpc ? aws_subnet.private[*].id : var.private_subnet_ids
  public_subnet_ids  = var.create_vpc ? aws_subnet.public[*].id : var.public_subnet_ids
  lb_subnet_ids      = var.lb_internet_facing ? local.public_subnet_ids : local.private_subnet_ids
}

resource "aws_vpc" "this" {
  count = var.create_vpc ? 1 : 0

  cidr_block           = var.vpc_cidr
  enable_dns_support   = true
  enable_dns_hostnames = true

  tags = merge(local.tags, { Name = var.name })
}

# Take every rule away from the VPC's default security group: nothing in this
# module uses it, and an instance dropped into it by mistake should be cut off.
resource "aws_default_security_group" "this" {
  count  = var.create_vpc ? 1 : 0
  vpc_id = aws_vpc.this[0].id

  tags = merge(local.tags, { Name = "${var.name}-default-unused" })
}

resource "aws_subnet" "public" {
  count = var.create_vpc ? local.az_count : 0

  vpc_id            = aws_vpc.this[0].id
  availability_zone = local.azs[count.index]
  cidr_block        = cidrsubnet(var.vpc_cidr, 4, count.index)
  # Nothing launched here needs a public address: the NAT gateway has an
  # Elastic IP and an internet-facing NLB brings its own.
  map_public_ip_on_launch = false

  tags = merge(local.tags, { Name = "${var.name}-public-${local.azs[count.index]}", "pipeline:tier" = "public" })
}

resource "aws_subnet" "private" {
  count = var.create_vpc ? local.az_count : 0

  vpc_id                  = aws_vpc.this[0].id
  availability_zone       = local.azs[count.index]
  cidr_block              = cidrsubnet(var.vpc_cidr, 4, 8 + count.index)
  map_public_ip_on_launch = false

  tags = merge(local.tags, { Name = "${var.name}-private-${local.azs[count.index]}", "pipeline:tier" = "private" })
}

resource "aws_internet_gateway" "this" {
  count  = var.create_vpc ? 1 : 0
  vpc_id = aws_vpc.this[0].id

  tags = merge(local.tags, { Name = var.name })
}

resource "aws_eip" "nat" {
  count  = var.create_vpc ? 1 : 0
  domain = "vpc"

  tags = merge(local.tags, { Name = "${var.name}-nat" })

  depends_on = [aws_internet_gateway.this]
}

# One NAT gateway: the instances only need it to boot (packages, image pull,
# SSM, logs); S3 traffic goes through the free gateway endpoint below.
resource "aws_nat_gateway" "this" {
  count = var.create_vpc ? 1 : 0

  allocation_id = aws_eip.nat[0].id
  subnet_id     = aws_subnet.public[0].id

  tags = merge(local.tags, { Name = var.name })

  depends_on = [aws_internet_gateway.this]
}

resource "aws_route_table" "public" {
  count  = var.create_vpc ? 1 : 0
  vpc_id = aws_vpc.this[0].id

  route {
    cidr_block = "0.0.0.0/0"
    gateway_id = aws_internet_gateway.this[0].id
  }

  tags = merge(local.tags, { Name = "${var.name}-public" })
}

resource "aws_route_table" "private" {
  count  = var.create_vpc ? 1 : 0
  vpc_id = aws_vpc.this[0].id

  route {
    cidr_block     = "0.0.0.0/0"
    nat_gateway_id = aws_nat_gateway.this[0].id
  }

  tags = merge(local.tags, { Name = "${var.name}-private" })
}

resource "aws_route_table_association" "public" {
  count = var.create_vpc ? local.az_count : 0

  subnet_id      = aws_subnet.public[count.index].id
  route_table_id = aws_route_table.public[0].id
}

resource "aws_route_table_association" "private" {
  count = var.create_vpc ? local.az_count : 0

  subnet_id      = aws_subnet.private[count.index].id
  route_table_id = aws_route_table.private[0].id
}

# Results and the Amazon Linux package repositories are in S3: keep that
# traffic off the NAT gateway (no per-GB NAT charge).
resource "aws_vpc_endpoint" "s3" {
  count = var.create_vpc ? 1 : 0

  vpc_id            = aws_vpc.this[0].id
  service_name      = "com.amazonaws.${local.region}.s3"
  vpc_endpoint_type = "Gateway"
  route_table_ids   = [aws_route_table.private[0].id]

  tags = merge(local.tags, { Name = "${var.name}-s3" })
}

resource "aws_flow_log" "this" {
  count = var.create_vpc && var.enable_flow_logs ? 1 : 0

  vpc_id               = aws_vpc.this[0].id
  traffic_type         = "REJECT"
  log_destination_type = "cloud-watch-logs"
  log_destination      = aws_cloudwatch_log_group.flow_logs[0].arn
  iam_role_arn         = aws_iam_role.flow_logs[0].arn

  tags = merge(local.tags, { Name = var.name })
}
