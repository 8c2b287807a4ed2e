variable "name" {
  description = "Deployment name; prefixes the role and instance profile."
  type        = string
}

variable "region" {
  description = "Region of the services that may use the key on the workers' behalf."
  type        = string
}

variable "bucket_arn" {
  description = "ARN of the deployment's bucket."
  type        = string
}

variable "read_prefixes" {
  description = "Prefixes the workers read (each ends in /)."
  type        = list(string)
}

variable "write_prefixes" {
  description = "Prefixes the workers write (each ends in /)."
  type        = list(string)
}

variable "kms_key_arn" {
  description = "The deployment's KMS key."
  type        = string
}

variable "redis_auth_secret_arn" {
  description = "Secret holding the Redis auth token."
  type        = string
}

variable "settings_parameter_arn" {
  description = "SSM parameter with the workers' settings."
  type        = string
}

variable "group_arn" {
  description = "ARN (pattern) of the workers' Auto Scaling group."
  type        = string
}

variable "enable_ssm_sessions" {
  description = "Attach AmazonSSMManagedInstanceCore for Session Manager access."
  type        = bool
  default     = false
}
