variable "name" {
  description = "Deployment name."
  type        = string
}

variable "region" {
  description = "AWS region of the deployment (the root module's var.region)."
  type        = string
}

variable "function_name" {
  description = "Name of the Lambda function."
  type        = string
}

variable "group_name" {
  description = "Auto Scaling group the autoscaler sizes."
  type        = string
}

variable "group_arn" {
  description = "ARN (pattern) of that group."
  type        = string
}

variable "package_dir" {
  description = "Folder written by infra/build_autoscaler.py, relative to the root module."
  type        = string
}

variable "schedule_expression" {
  description = "EventBridge rate(...) or cron(...) expression."
  type        = string
}

variable "vpc_id" {
  description = "VPC of the function."
  type        = string
}

variable "subnet_ids" {
  description = "Subnets of the function (need a route to the AWS APIs)."
  type        = list(string)
}

variable "kms_key_arn" {
  description = "KMS key for the environment and the logs."
  type        = string
}

variable "log_retention_days" {
  description = "Days of log retention."
  type        = number
}

variable "metric_namespace" {
  description = "CloudWatch namespace of the backlog metrics."
  type        = string
}

variable "min_workers" {
  description = "Policy: workers kept with no work."
  type        = number
}

variable "max_workers" {
  description = "Policy: most workers."
  type        = number
}

variable "scale_in_cooldown_s" {
  description = "Policy: scale-in cooldown in seconds."
  type        = number
}

variable "idle_to_zero_s" {
  description = "Policy: idle seconds before going to min_workers."
  type        = number
}

variable "target_drain_s" {
  description = "Policy: seconds to drain the queued tokens in."
  type        = number
}

variable "default_tokens_per_s" {
  description = "Policy: assumed tokens per second per worker until workers report."
  type        = number
}
