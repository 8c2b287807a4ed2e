# The autoscaler: a Python Lambda built from this repository (jobs/autoscale), run every minute by
# an EventBridge schedule. It reads the backlog from Redis, sets the group's desired capacity,
# protects busy instances from scale-in and publishes the backlog as CloudWatch metrics.

data "aws_caller_identity" "current" {}
data "aws_partition" "current" {}

locals {
  account   = data.aws_caller_identity.current.account_id
  partition = data.aws_partition.current.partition
  region    = var.region
}

data "archive_file" "package" {
  type        = "zip"
  source_dir  = abspath("${path.root}/${var.package_dir}")
  output_path = "${path.root}/.terraform/${var.function_name}.zip"
  excludes    = ["**/__pycache__/**"]

  lifecycle {
    precondition {
      condition     = fileexists("${path.root}/${var.package_dir}/jobs/autoscale/lambda_handler.py")
      error_message = "The autoscaler package is missing: run `.venv/bin/python infra/build_autoscaler.py` from the repository root first."
    }
  }
}

# ---- logs --------------------------------------------------------------------------------------

resource "aws_cloudwatch_log_group" "this" {
  name              = "/aws/lambda/${var.function_name}"
  retention_in_days = var.log_retention_days
  kms_key_id        = var.kms_key_arn
}

# ---- role --------------------------------------------------------------------------------------

data "aws_iam_policy_document" "assume_lambda" {
  statement {
    actions = ["sts:AssumeRole"]

    principals {
      type        = "Service"
      identifiers = ["lambda.amazonaws.com"]
    }

    condition {
      test     = "StringEquals"
      variable = "aws:SourceAccount"
      values   = [local.account]
    }
  }
}

resource "aws_iam_role" "this" {
  name_prefix        = "${var.name}-autoscaler-"
  description        = "freight ${var.name}: backlog autoscaler Lambda"
  assume_role_policy = data.aws_iam_policy_document.assume_lambda.json
}

data "aws_iam_policy_document" "this" {
  statement {
    sid       = "WriteOwnLogs"
    actions   = ["logs:CreateLogStream", "logs:PutLogEvents"]
    resources = ["${aws_cloudwatch_log_group.this.arn}:*"]
  }

  # DescribeAutoScalingGroups supports no resource-level permission.
  statement {
    sid       = "DescribeGroups"
    actions   = ["autoscaling:DescribeAutoScalingGroups"]
    resources = ["*"]
  }

  statement {
    sid       = "SizeAndProtectTheWorkerGroup"
    actions   = ["autoscaling:SetDesiredCapacity", "autoscaling:SetInstanceProtection"]
    resources = [var.group_arn]
  }

  # PutMetricData supports no resource-level permission; the namespace condition narrows it.
  statement {
    sid       = "PublishBacklogMetrics"
    actions   = ["cloudwatch:PutMetricData"]
    resources = ["*"]

    condition {
      test     = "StringEquals"
      variable = "cloudwatch:namespace"
      values   = [var.metric_namespace]
    }
  }

  statement {
    sid       = "ReadRedisToken"
    actions   = ["secretsmanager:GetSecretValue"]
    resources = [var.redis.auth_secret_arn]
  }

  # the secret and the function's environment are encrypted with the deployment's key
  statement {
    sid       = "DecryptWithDeploymentKey"
    actions   = ["kms:Decrypt"]
    resources = [var.kms_key_arn]
  }

  # Network interfaces in the VPC, the way Lambda attaches a function to its subnets.
  # The Describe calls support no resource-level permission.
  statement {
    sid       = "DescribeNetworkInterfaces"
    actions   = ["ec2:DescribeNetworkInterfaces", "ec2:DescribeSubnets"]
    resources = ["*"]
  }

  statement {
    sid     = "CreateInterfacesInOwnSubnetsAndGroup"
    actions = ["ec2:CreateNetworkInterface"]
    resources = concat(
      ["arn:${local.partition}:ec2:${local.region}:${local.account}:network-interface/*"],
      [for s in var.subnet_ids : "arn:${local.partition}:ec2:${local.region}:${local.account}:subnet/${s}"],
      [aws_security_group.this.arn],
    )
  }

  statement {
    sid       = "ManageOwnInterfaces"
    actions   = ["ec2:DeleteNetworkInterface", "ec2:AssignPrivateIpAddresses", "ec2:UnassignPrivateIpAddresses"]
    resources = ["arn:${local.partition}:ec2:${local.region}:${local.account}:network-interface/*"]
  }
}

resource "aws_iam_role_policy" "this" {
  name   = "freight-autoscaler"
  role   = aws_iam_role.this.id
  policy = data.aws_iam_policy_document.this.json
}

# ---- network -----------------------------------------------------------------------------------

resource "aws_security_group" "this" {
  name_prefix = "${var.name}-autoscaler-"
  description = "freight ${var.name}: autoscaler Lambda (HTTPS and Redis outbound)"
  vpc_id      = var.vpc_id

  lifecycle {
    create_before_destroy = true
  }
}

resource "aws_vpc_security_group_egress_rule" "https" {
  security_group_id = aws_security_group.this.id
  ip_protocol       = "tcp"
  from_port         = 443
  to_port           = 443
  cidr_ipv4         = "0.0.0.0/0"
  description       = "HTTPS: Auto Scaling, CloudWatch, Secrets Manager APIs"
}

resource "aws_vpc_security_group_egress_rule" "redis" {
  security_group_id            = aws_security_group.this.id
  ip_protocol                  = "tcp"
  from_port                    = var.redis.port
  to_port                      = var.redis.port
  referenced_security_group_id = var.redis.security_group_id
  description                  = "Redis over TLS"
}

# ---- function ----------------------------------------------------------------------------------

resource "aws_lambda_function" "this" {
  #checkov:skip=CKV_AWS_116:Scheduled every minute; a failed tick is superseded by the next one, so there is nothing to redrive from a dead-letter queue (retries are off below).
  #checkov:skip=CKV_AWS_272:Built from this repository's source by infra/build_autoscaler.py at apply time; there is no signing profile in the deployment.
  #checkov:skip=CKV_AWS_50:A one-second tick; its JSON logs and the backlog metrics show what it did, so X-Ray tracing would only add a wildcard xray:PutTraceSegments grant.
  function_name                  = var.function_name
  description                    = "freight ${var.name}: size ${var.group_name} from the Redis backlog"
  role                           = aws_iam_role.this.arn
  runtime                        = "python3.12"
  architectures                  = ["x86_64"]
  handler                        = "jobs.autoscale.lambda_handler.handler"
  filename                       = data.archive_file.package.output_path
  source_code_hash               = data.archive_file.package.output_base64sha256
  timeout                        = 50
  memory_size                    = 256
  reserved_concurrent_executions = 1 # one tick at a time
  kms_key_arn                    = var.kms_key_arn

  vpc_config {
    subnet_ids         = var.subnet_ids
    security_group_ids = [aws_security_group.this.id]
  }

  environment {
    variables = {
      FREIGHT_AUTOSCALE_GROUP                     = var.group_name
      FREIGHT_AUTOSCALE_MIN_WORKERS               = tostring(var.min_workers)
      FREIGHT_AUTOSCALE_MAX_WORKERS               = tostring(var.max_workers)
      FREIGHT_AUTOSCALE_SCALE_IN_COOLDOWN_S       = tostring(var.scale_in_cooldown_s)
      FREIGHT_AUTOSCALE_IDLE_TO_ZERO_S            = tostring(var.idle_to_zero_s)
      FREIGHT_AUTOSCALE_TARGET_DRAIN_S            = tostring(var.target_drain_s)
      FREIGHT_AUTOSCALE_DEFAULT_TOKENS_PER_SECOND = tostring(var.default_tokens_per_s)
      FREIGHT_AUTOSCALE_NAMESPACE                 = var.metric_namespace
      FREIGHT_REDIS_HOST                          = var.redis.host
      FREIGHT_REDIS_PORT                          = tostring(var.redis.port)
      FREIGHT_REDIS_AUTH_SECRET_ARN               = var.redis.auth_secret_arn
    }
  }

  depends_on = [aws_cloudwatch_log_group.this, aws_iam_role_policy.this]
}

resource "aws_lambda_function_event_invoke_config" "this" {
  function_name                = aws_lambda_function.this.function_name
  maximum_retry_attempts       = 0
  maximum_event_age_in_seconds = 60
}

# ---- dashboard ---------------------------------------------------------------------------------

locals {
  # The dashboard's graphs, two to a row: each plots the maximum a minute of its metrics (published
  # by the autoscaler per Auto Scaling group).
  graphs = [
    { title = "Backlog (shards)", metrics = ["QueuedShards", "RunningShards"] },
    { title = "Workers", metrics = ["DesiredWorkers", "LiveWorkers", "BusyWorkers", "DemandWorkers"] },
    { title = "Estimated tokens queued", metrics = ["EstimatedTokensQueued"] },
  ]
}

resource "aws_cloudwatch_dashboard" "fleet" {
  dashboard_name = "${var.name}-fleet"
  dashboard_body = jsonencode({
    widgets = [
      for i, graph in local.graphs : {
        type   = "metric"
        x      = 12 * (i % 2)
        y      = 6 * floor(i / 2)
        width  = 12
        height = 6
        properties = {
          title   = graph.title
          region  = local.region
          stat    = "Maximum"
          period  = 60
          metrics = [for metric in graph.metrics : [var.metric_namespace, metric, "AutoScalingGroupName", var.group_name]]
        }
      }
    ]
  })
}

# ---- schedule ----------------------------------------------------------------------------------

resource "aws_cloudwatch_event_rule" "tick" {
  name                = "${var.function_name}-tick"
  description         = "freight ${var.name}: autoscaler tick"
  schedule_expression = var.schedule_expression
}

resource "aws_cloudwatch_event_target" "tick" {
  rule = aws_cloudwatch_event_rule.tick.name
  arn  = aws_lambda_function.this.arn
}

resource "aws_lambda_permission" "events" {
  statement_id  = "AllowEventBridgeSchedule"
  action        = "lambda:InvokeFunction"
  function_name = aws_lambda_function.this.function_name
  principal     = "events.amazonaws.com"
  source_arn    = aws_cloudwatch_event_rule.tick.arn
}
