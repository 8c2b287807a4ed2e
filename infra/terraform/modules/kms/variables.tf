variable "name" {
  description = "Deployment name (alias/<name>)."
  type        = string
}

variable "region" {
  description = "AWS region of the deployment (the root module's var.region)."
  type        = string
}

variable "log_group_arn" {
  description = "ARN of the one log group CloudWatch Logs may encrypt with this key."
  type        = string

  validation {
    condition     = can(regex("^arn:[a-z-]+:logs:", var.log_group_arn))
    error_message = "log_group_arn must be a CloudWatch Logs log group ARN."
  }
}

variable "deletion_window_days" {
  description = "Days before a scheduled key deletion takes effect (7-30)."
  type        = number
  default     = 30

  validation {
    condition     = var.deletion_window_days >= 7 && var.deletion_window_days <= 30
    error_message = "deletion_window_days must be between 7 and 30."
  }
}
