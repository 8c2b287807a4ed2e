# The spot GPU fleet: a launch template (GPU AMI from a public SSM parameter, IMDSv2 only, encrypted
# root volume, user data that installs freight and runs `freight worker`) and an Auto Scaling group
# that starts at zero and is sized by the autoscaler.

data "aws_ssm_parameter" "ami" {
  name = var.ami_ssm_parameter
}

# ---- network -----------------------------------------------------------------------------------

resource "aws_security_group" "worker" {
  name_prefix = "${var.name}-worker-"
  description = "freight ${var.name}: GPU workers (no inbound; HTTPS and Redis outbound)"
  vpc_id      = var.vpc_id

  lifecycle {
    create_before_destroy = true
  }
}

resource "aws_vpc_security_group_egress_rule" "https" {
  security_group_id = aws_security_group.worker.id
  ip_protocol       = "tcp"
  from_port         = 443
  to_port           = 443
  cidr_ipv4         = "0.0.0.0/0"
  description       = "HTTPS: S3, Secrets Manager, SSM, Auto Scaling, package index"
}

resource "aws_vpc_security_group_egress_rule" "redis" {
  security_group_id            = aws_security_group.worker.id
  ip_protocol                  = "tcp"
  from_port                    = var.redis.port
  to_port                      = var.redis.port
  referenced_security_group_id = var.redis.security_group_id
  description                  = "Redis over TLS"
}

# ---- settings ----------------------------------------------------------------------------------

# Non-secret settings, read at boot into the worker's environment file. The Redis token is not
# here: the user data reads it from Secrets Manager and builds FREIGHT_REDIS_URL on the instance.
resource "aws_ssm_parameter" "settings" {
  name        = "/freight/${var.name}/worker-settings"
  description = "freight ${var.name}: worker settings (JSON of environment variables)"
  type        = "SecureString"
  key_id      = var.kms_key_arn
  value = jsonencode(merge(var.worker_environment, {
    FREIGHT_REDIS_HOST = var.redis.host
    FREIGHT_REDIS_PORT = tostring(var.redis.port)
    FREIGHT_BUCKET     = var.bucket_name
    FREIGHT_LOG_FORMAT = "json"
    AWS_DEFAULT_REGION = var.region
  }))
}

# ---- launch template ---------------------------------------------------------------------------

locals {
  hook_name = "drain-on-terminate"
  user_data = templatefile("${path.module}/user_data.sh.tftpl", {
    region             = var.region
    settings_parameter = aws_ssm_parameter.settings.name
    auth_secret_arn    = var.redis.auth_secret_arn
    wheel_url          = "s3://${var.bucket_name}/${var.freight_wheel_key}"
    wheel_name         = basename(var.freight_wheel_key)
    worker_args        = join(" ", concat(["--concurrency", "1"], length(var.worker_queues) > 0 ? ["--queues", join(",", var.worker_queues)] : []))
    group_name         = var.group_name
    hook_name          = local.hook_name
    stop_timeout_s     = var.drain_timeout_s - 30
  })
}

resource "aws_launch_template" "worker" {
  name_prefix            = "${var.name}-worker-"
  description            = "freight ${var.name}: GPU worker"
  image_id               = data.aws_ssm_parameter.ami.insecure_value
  update_default_version = true
  ebs_optimized          = true
  vpc_security_group_ids = [aws_security_group.worker.id]
  user_data              = base64encode(local.user_data)

  iam_instance_profile {
    arn = var.instance_profile_arn
  }

  metadata_options {
    http_endpoint               = "enabled"
    http_tokens                 = "required"
    http_put_response_hop_limit = 1
    instance_metadata_tags      = "disabled"
  }

  block_device_mappings {
    device_name = var.root_device_name

    ebs {
      volume_size           = var.root_volume_gb
      volume_type           = "gp3"
      encrypted             = true
      delete_on_termination = true
    }
  }

  monitoring {
    enabled = true
  }

  tag_specifications {
    resource_type = "instance"
    tags = {
      Name = "${var.name}-worker"
    }
  }

  tag_specifications {
    resource_type = "volume"
    tags = {
      Name = "${var.name}-worker"
    }
  }
}

# ---- Auto Scaling group ------------------------------------------------------------------------

resource "aws_autoscaling_group" "workers" {
  name                  = var.group_name
  min_size              = 0
  max_size              = var.max_workers
  desired_capacity      = 0
  vpc_zone_identifier   = var.subnet_ids
  capacity_rebalance    = true
  health_check_type     = "EC2"
  protect_from_scale_in = false
  # the autoscaler sets the capacity; its own cooldown paces scale-in
  default_cooldown = 0

  mixed_instances_policy {
    instances_distribution {
      on_demand_base_capacity                  = var.on_demand_base_capacity
      on_demand_percentage_above_base_capacity = 0
      spot_allocation_strategy                 = "price-capacity-optimized"
    }

    launch_template {
      launch_template_specification {
        launch_template_id = aws_launch_template.worker.id
        version            = aws_launch_template.worker.latest_version
      }

      dynamic "override" {
        for_each = var.instance_types

        content {
          instance_type = override.value
        }
      }
    }
  }

  # A terminating worker (scale-in or rebalance) gets drain_timeout_s to hand its shard back; the
  # drain service on the instance completes the action once `freight worker` has stopped.
  initial_lifecycle_hook {
    name                 = local.hook_name
    lifecycle_transition = "autoscaling:EC2_INSTANCE_TERMINATING"
    default_result       = "CONTINUE"
    heartbeat_timeout    = var.drain_timeout_s
  }

  tag {
    key                 = "Name"
    value               = "${var.name}-worker"
    propagate_at_launch = true
  }

  lifecycle {
    # the autoscaler owns the desired capacity
    ignore_changes = [desired_capacity]
  }
}
