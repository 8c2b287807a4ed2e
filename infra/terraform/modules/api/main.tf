# `freight serve` (the OpenAI Files + Batches API) on ECS Fargate behind an HTTPS Application Load
# Balancer. The load balancer sits in public subnets and terminates TLS with an ACM certificate; the
# tasks sit in private subnets with no public address and take traffic from the load balancer only.
# Batches run on the deployment's fleet (`freight serve --redis`): the tasks never load a model.
#
# Secrets: the Redis token reaches the container from Secrets Manager (ECS injects it at start; it is
# in no task definition, variable or log). Each tenant in var.tenants gets an API key made here, kept
# in a Secrets Manager secret of its own for the operator to read; the store holds only the key's
# SHA-256 record, as `freight keys create` writes it, so the tasks never read a key.
#
# Least privilege: the task role lists, reads and writes the store's prefix and reads the model
# prefixes (a batch's model is checked before its job is queued), through the deployment's key; the
# execution role pulls the image, writes the log group and reads the Redis token; nothing else.

data "aws_caller_identity" "current" {}
data "aws_partition" "current" {}

locals {
  account   = data.aws_caller_identity.current.account_id
  partition = data.aws_partition.current.partition
  port      = 8000 # freight serve's, inside the task
  # the store: a prefix of the bucket, s3://bucket/prefix
  store_url    = "s3://${var.store.bucket_name}/${trimsuffix(var.store.store_prefix, "/")}"
  store_object = "${var.store.bucket_arn}/${var.store.store_prefix}*"
  model_object = [for p in var.store.model_prefixes : "${var.store.bucket_arn}/${p}*"]
  serve_command = join(" ", concat([
    "exec freight serve --host 0.0.0.0 --port ${local.port} --store ${local.store_url}",
    "--redis \"rediss://:$${FREIGHT_REDIS_TOKEN}@${var.redis.host}:${var.redis.port}/0?ssl_cert_reqs=required\"",
  ], var.service.serve_args))
}

# ---- logs --------------------------------------------------------------------------------------

resource "aws_cloudwatch_log_group" "this" {
  name              = var.log_group_name
  retention_in_days = var.service.log_retention_days
  kms_key_id        = var.store.kms_key_arn
}

# ---- roles -------------------------------------------------------------------------------------

data "aws_iam_policy_document" "assume_ecs_tasks" {
  statement {
    actions = ["sts:AssumeRole"]

    principals {
      type        = "Service"
      identifiers = ["ecs-tasks.amazonaws.com"]
    }

    condition {
      test     = "StringEquals"
      variable = "aws:SourceAccount"
      values   = [local.account]
    }
  }
}

data "aws_iam_policy_document" "execution" {
  statement {
    sid       = "WriteOwnLogs"
    actions   = ["logs:CreateLogStream", "logs:PutLogEvents"]
    resources = ["${aws_cloudwatch_log_group.this.arn}:*"]
  }

  statement {
    sid       = "ReadRedisToken"
    actions   = ["secretsmanager:GetSecretValue"]
    resources = [var.redis.auth_secret_arn]
  }

  statement {
    sid       = "DecryptRedisTokenWithDeploymentKey"
    actions   = ["kms:Decrypt"]
    resources = [var.store.kms_key_arn]

    condition {
      test     = "StringEquals"
      variable = "kms:ViaService"
      values   = ["secretsmanager.${var.region}.amazonaws.com"]
    }
  }

  # a private ECR image: its repository only (GetAuthorizationToken supports no resource)
  dynamic "statement" {
    for_each = var.service.image_repository_arn == null ? [] : [var.service.image_repository_arn]

    content {
      sid       = "PullOwnImage"
      actions   = ["ecr:BatchGetImage", "ecr:GetDownloadUrlForLayer"]
      resources = [statement.value]
    }
  }

  dynamic "statement" {
    for_each = var.service.image_repository_arn == null ? [] : ["ecr"]

    content {
      sid       = "SignInToEcr"
      actions   = ["ecr:GetAuthorizationToken"]
      resources = ["*"]
    }
  }
}

data "aws_iam_policy_document" "task" {
  statement {
    sid       = "ListStoreAndModels"
    actions   = ["s3:ListBucket"]
    resources = [var.store.bucket_arn]

    condition {
      test     = "StringLike"
      variable = "s3:prefix"
      values   = [for p in concat([var.store.store_prefix], var.store.model_prefixes) : "${p}*"]
    }
  }

  # uploads, batch records, keys' records, the batches' jobs and output files; the sweeper deletes
  statement {
    sid       = "ReadWriteStore"
    actions   = ["s3:GetObject", "s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload"]
    resources = [local.store_object]
  }

  statement {
    sid       = "ReadModels"
    actions   = ["s3:GetObject"]
    resources = local.model_object
  }

  statement {
    sid       = "UseDeploymentKeyThroughS3"
    actions   = ["kms:Decrypt", "kms:GenerateDataKey"]
    resources = [var.store.kms_key_arn]

    condition {
      test     = "StringEquals"
      variable = "kms:ViaService"
      values   = ["s3.${var.region}.amazonaws.com"]
    }
  }
}

# two roles: ECS's to start the tasks (execution), freight serve's own (task)
locals {
  roles = {
    execution = { about = "ECS starts the API's tasks", policy = data.aws_iam_policy_document.execution.json }
    task      = { about = "freight serve (the store's prefix, the models)", policy = data.aws_iam_policy_document.task.json }
  }
}

resource "aws_iam_role" "this" {
  for_each = local.roles

  name_prefix        = "${var.name}-api-${each.key}-"
  description        = "freight ${var.name}: ${each.value.about}"
  assume_role_policy = data.aws_iam_policy_document.assume_ecs_tasks.json
}

resource "aws_iam_role_policy" "this" {
  for_each = local.roles

  name   = "freight-api-${each.key}"
  role   = aws_iam_role.this[each.key].id
  policy = each.value.policy
}

# ---- network -----------------------------------------------------------------------------------

resource "aws_security_group" "lb" {
  name_prefix = "${var.name}-api-lb-"
  description = "freight ${var.name}: API load balancer (HTTPS in, the tasks out)"
  vpc_id      = var.network.vpc_id

  lifecycle {
    create_before_destroy = true
  }
}

resource "aws_vpc_security_group_ingress_rule" "https" {
  for_each = toset(var.network.allowed_cidrs)

  security_group_id = aws_security_group.lb.id
  ip_protocol       = "tcp"
  from_port         = 443
  to_port           = 443
  cidr_ipv4         = each.value
  description       = "HTTPS from API clients"
}

resource "aws_vpc_security_group_egress_rule" "lb_to_tasks" {
  security_group_id            = aws_security_group.lb.id
  ip_protocol                  = "tcp"
  from_port                    = local.port
  to_port                      = local.port
  referenced_security_group_id = aws_security_group.task.id
  description                  = "HTTP to freight serve in the tasks"
}

resource "aws_security_group" "task" {
  name_prefix = "${var.name}-api-task-"
  description = "freight ${var.name}: API tasks (the load balancer in; HTTPS and Redis out)"
  vpc_id      = var.network.vpc_id

  lifecycle {
    create_before_destroy = true
  }
}

resource "aws_vpc_security_group_ingress_rule" "from_lb" {
  security_group_id            = aws_security_group.task.id
  ip_protocol                  = "tcp"
  from_port                    = local.port
  to_port                      = local.port
  referenced_security_group_id = aws_security_group.lb.id
  description                  = "freight serve from the load balancer"
}

resource "aws_vpc_security_group_egress_rule" "task" {
  for_each = {
    https = { port = 443, description = "HTTPS: S3, Secrets Manager, ECR, CloudWatch Logs" }
    redis = { port = var.redis.port, description = "Redis over TLS" }
  }

  security_group_id            = aws_security_group.task.id
  ip_protocol                  = "tcp"
  from_port                    = each.value.port
  to_port                      = each.value.port
  cidr_ipv4                    = each.key == "https" ? "0.0.0.0/0" : null
  referenced_security_group_id = each.key == "redis" ? var.redis.security_group_id : null
  description                  = each.value.description
}

# ---- load balancer -----------------------------------------------------------------------------

resource "aws_lb" "this" {
  #checkov:skip=CKV_AWS_91:freight serve logs every request itself (method, path, status, time, bytes; never a key) to the encrypted log group; ALB access logs would need a second, SSE-S3 bucket.
  #checkov:skip=CKV2_AWS_28:A WAF web ACL is the operator's choice of rules and cost; every request needs an API key, and an ACL attaches to this load balancer by its ARN (output lb_arn).
  name                       = "${var.name}-api"
  internal                   = false
  load_balancer_type         = "application"
  subnets                    = var.network.public_subnet_ids
  security_groups            = [aws_security_group.lb.id]
  drop_invalid_header_fields = true
  enable_deletion_protection = var.service.deletion_protection
  idle_timeout               = 300 # a 200 MB upload or a large output download on a slow link
}

resource "aws_lb_target_group" "this" {
  #checkov:skip=CKV_AWS_378:TLS ends at the load balancer; the hop to the task stays inside the VPC, on a security group that admits the load balancer only.
  name_prefix          = "fapi-"
  port                 = local.port
  protocol             = "HTTP"
  target_type          = "ip"
  vpc_id               = var.network.vpc_id
  deregistration_delay = 60

  health_check {
    path                = "/health"
    matcher             = "200"
    interval            = 15
    healthy_threshold   = 2
    unhealthy_threshold = 3
  }

  lifecycle {
    create_before_destroy = true
  }
}

resource "aws_lb_listener" "https" {
  load_balancer_arn = aws_lb.this.arn
  port              = 443
  protocol          = "HTTPS"
  ssl_policy        = "ELBSecurityPolicy-TLS13-1-2-2021-06"
  certificate_arn   = var.service.certificate_arn

  default_action {
    type             = "forward"
    target_group_arn = aws_lb_target_group.this.arn
  }
}

# ---- service -----------------------------------------------------------------------------------

resource "aws_ecs_cluster" "this" {
  name = "${var.name}-api"

  setting {
    name  = "containerInsights"
    value = "enabled"
  }
}

resource "aws_ecs_task_definition" "this" {
  family                   = "${var.name}-api"
  requires_compatibilities = ["FARGATE"]
  network_mode             = "awsvpc"
  cpu                      = var.service.cpu
  memory                   = var.service.memory
  execution_role_arn       = aws_iam_role.this["execution"].arn
  task_role_arn            = aws_iam_role.this["task"].arn

  runtime_platform {
    operating_system_family = "LINUX"
    cpu_architecture        = "X86_64"
  }

  volume {
    name = "tmp" # task storage: an upload's spool and the batch process's scratch; the root stays read-only
  }

  container_definitions = jsonencode([{
    name                   = "freight-serve"
    image                  = var.service.image
    essential              = true
    readonlyRootFilesystem = true
    entryPoint             = ["/bin/sh", "-c"]
    command                = [local.serve_command]
    portMappings           = [{ containerPort = local.port, protocol = "tcp" }]
    mountPoints            = [{ sourceVolume = "tmp", containerPath = "/tmp", readOnly = false }]
    stopTimeout            = 60 # SIGTERM: uvicorn finishes requests, the batch process stops where it can resume
    environment = [for k, v in merge(var.service.environment, {
      FREIGHT_LOG_FORMAT = "json"
      FREIGHT_CACHE_DIR  = "/tmp/freight"
      AWS_DEFAULT_REGION = var.region
      HOME               = "/tmp"
    }) : { name = k, value = v }]
    secrets = [{ name = "FREIGHT_REDIS_TOKEN", valueFrom = var.redis.auth_secret_arn }]
    logConfiguration = {
      logDriver = "awslogs"
      options = {
        awslogs-group         = aws_cloudwatch_log_group.this.name
        awslogs-region        = var.region
        awslogs-stream-prefix = "serve"
      }
    }
  }])
}

resource "aws_ecs_service" "this" {
  name             = "${var.name}-api"
  cluster          = aws_ecs_cluster.this.id
  task_definition  = aws_ecs_task_definition.this.arn
  desired_count    = var.service.tasks
  launch_type      = "FARGATE"
  platform_version = "LATEST"

  network_configuration {
    subnets          = var.network.private_subnet_ids
    security_groups  = [aws_security_group.task.id]
    assign_public_ip = false
  }

  load_balancer {
    target_group_arn = aws_lb_target_group.this.arn
    container_name   = "freight-serve"
    container_port   = local.port
  }

  deployment_circuit_breaker {
    enable   = true
    rollback = true
  }

  depends_on = [aws_lb_listener.https, aws_iam_role_policy.this]
}

# ---- tenants' keys -----------------------------------------------------------------------------

# A key as `freight keys create` makes one: fk- and 43 URL-safe characters (letters and digits here).
resource "random_password" "key" {
  for_each = toset(var.tenants)

  length  = 43
  special = false
}

resource "aws_secretsmanager_secret" "key" {
  #checkov:skip=CKV2_AWS_57:A freight API key is rotated by making a new one and revoking the old (`freight keys create`, `freight keys revoke`), which no Secrets Manager rotation function can do for the tenant's clients.
  for_each = toset(var.tenants)

  name_prefix             = "${var.name}/api-key/${each.key}-"
  description             = "freight ${var.name}: the API key of tenant ${each.key} (Authorization: Bearer <key>)"
  kms_key_id              = var.store.kms_key_arn
  recovery_window_in_days = var.secret_recovery_days
}

resource "aws_secretsmanager_secret_version" "key" {
  for_each = toset(var.tenants)

  secret_id     = aws_secretsmanager_secret.key[each.key].id
  secret_string = "fk-${random_password.key[each.key].result}"
}

resource "time_static" "key" {
  for_each = toset(var.tenants)
}

# the store's record of each key (jobs/api/keys.py KeyRecord at keys/<sha256 of the key>.json)
resource "aws_s3_object" "key" {
  for_each = toset(var.tenants)

  bucket       = var.store.bucket_name
  key          = "${var.store.store_prefix}keys/${sha256(aws_secretsmanager_secret_version.key[each.key].secret_string)}.json"
  content_type = "application/json"
  kms_key_id   = var.store.kms_key_arn
  content = jsonencode({
    key_id     = substr(sha256(aws_secretsmanager_secret_version.key[each.key].secret_string), 0, 12)
    tenant     = each.key
    name       = "terraform"
    created_at = time_static.key[each.key].unix
  })
}
