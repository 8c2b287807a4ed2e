variable "name" {
  description = "Deployment name (alias/<name>)."
  type        = string
}

variable "region" {
  description = "AWS region of the deployment (the root module's var.region)."
  type        = string
}

variable "log_group_arns" {
  description = "ARNs of the log groups CloudWatch Logs may encrypt with this key, and no other."
  type        = list(string)

  validation {
    condition     = length(var.log_group_arns) > 0 && alltrue([for a in var.log_group_arns : can(regex("^arn:[a-z-]+:logs:", a))])
    error_message = "log_group_arns must be one or more CloudWatch Logs log group ARNs."
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
