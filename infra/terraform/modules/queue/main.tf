# Redis (ElastiCache, Valkey or Redis OSS engine) for the Celery queue and freight's live state.
# TLS in transit, KMS at rest, an auth token kept in Secrets Manager, and noeviction: a queue must
# refuse writes when full rather than silently drop queued shards.

locals {
  replication_group = var.mode == "replication_group"
  serverless        = var.mode == "serverless"
  # engine version and parameter group family per engine
  engine_version = var.engine == "valkey" ? "8.0" : "7.1"
  major_version  = var.engine == "valkey" ? "8" : "7"
  family         = var.engine == "valkey" ? "valkey8" : "redis7"
  # serverless also serves reads on port + 1
  port      = 6379
  port_last = local.serverless ? 6380 : 6379
  endpoint  = local.replication_group ? one(aws_elasticache_replication_group.this[*].primary_endpoint_address) : one(aws_elasticache_serverless_cache.this[*].endpoint[0].address)
}

# ---- auth token --------------------------------------------------------------------------------

resource "random_password" "auth" {
  length  = 64
  special = false # ElastiCache tokens forbid @, " and /; letters and digits also need no URL quoting
}

resource "aws_secretsmanager_secret" "auth" {
  #checkov:skip=CKV2_AWS_57:Rotating an ElastiCache auth token needs a coordinated ROTATE/SET on the group and a restart of every worker; rotate by tainting random_password.auth and applying.
  name_prefix             = "${var.name}/redis-auth-"
  description             = "freight ${var.name}: Redis auth token (the workers and the autoscaler read it at start)"
  kms_key_id              = var.kms_key_arn
  recovery_window_in_days = var.auth_secret_recovery_days
}

resource "aws_secretsmanager_secret_version" "auth" {
  secret_id     = aws_secretsmanager_secret.auth.id
  secret_string = random_password.auth.result
}

# ---- network -----------------------------------------------------------------------------------

resource "aws_security_group" "redis" {
  name_prefix = "${var.name}-redis-"
  description = "freight ${var.name}: Redis, reachable from the workers and the autoscaler only"
  vpc_id      = var.vpc_id

  lifecycle {
    create_before_destroy = true
  }
}

resource "aws_vpc_security_group_ingress_rule" "clients" {
  for_each = var.client_security_group_ids

  security_group_id            = aws_security_group.redis.id
  referenced_security_group_id = each.value
  ip_protocol                  = "tcp"
  from_port                    = local.port
  to_port                      = local.port_last
  description                  = "Redis over TLS from the ${each.key}"
}

resource "aws_elasticache_subnet_group" "this" {
  name        = "${var.name}-redis"
  description = "freight ${var.name}: Redis subnets"
  subnet_ids  = var.subnet_ids
}

# ---- replication group (default) ---------------------------------------------------------------

resource "aws_elasticache_parameter_group" "this" {
  count = local.replication_group ? 1 : 0

  name        = "${var.name}-${local.family}-noeviction"
  family      = local.family
  description = "freight ${var.name}: never evict queued shards"

  parameter {
    name  = "maxmemory-policy"
    value = "noeviction"
  }
}

resource "aws_elasticache_replication_group" "this" {
  count = local.replication_group ? 1 : 0

  replication_group_id       = "${var.name}-redis"
  description                = "freight ${var.name}: Celery broker and live job state"
  engine                     = var.engine
  engine_version             = local.engine_version
  node_type                  = var.node_type
  num_cache_clusters         = var.replicas + 1
  automatic_failover_enabled = true
  multi_az_enabled           = true
  port                       = local.port
  parameter_group_name       = aws_elasticache_parameter_group.this[0].name
  subnet_group_name          = aws_elasticache_subnet_group.this.name
  security_group_ids         = [aws_security_group.redis.id]
  at_rest_encryption_enabled = true
  kms_key_id                 = var.kms_key_arn
  transit_encryption_enabled = true
  auth_token                 = random_password.auth.result
  snapshot_retention_limit   = var.snapshot_retention_days
  auto_minor_version_upgrade = true
  apply_immediately          = false
}

# ---- serverless --------------------------------------------------------------------------------

# Serverless caches authenticate through a user group; its "default" user carries the same token,
# so clients connect the same way in both modes (AUTH <token>).
resource "aws_elasticache_user" "default" {
  count = local.serverless ? 1 : 0

  user_id       = "${var.name}-default"
  user_name     = "default"
  engine        = var.engine
  access_string = "on ~* &* +@all"

  authentication_mode {
    type      = "password"
    passwords = [random_password.auth.result]
  }
}

resource "aws_elasticache_user_group" "this" {
  count = local.serverless ? 1 : 0

  user_group_id = "${var.name}-users"
  engine        = var.engine
  user_ids      = [aws_elasticache_user.default[0].user_id]
}

resource "aws_elasticache_serverless_cache" "this" {
  count = local.serverless ? 1 : 0

  name                     = "${var.name}-redis"
  description              = "freight ${var.name}: Celery broker and live job state"
  engine                   = var.engine
  major_engine_version     = local.major_version
  kms_key_id               = var.kms_key_arn
  security_group_ids       = [aws_security_group.redis.id]
  subnet_ids               = var.subnet_ids
  user_group_id            = aws_elasticache_user_group.this[0].user_group_id
  snapshot_retention_limit = var.snapshot_retention_days

  cache_usage_limits {
    data_storage {
      maximum = var.serverless_max_data_gb
      unit    = "GB"
    }

    ecpu_per_second {
      maximum = var.serverless_max_ecpu
    }
  }
}
