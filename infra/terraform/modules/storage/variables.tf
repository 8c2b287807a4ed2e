variable "name" {
  description = "Deployment name; the bucket name prefix when bucket_name is null."
  type        = string
}

variable "bucket_name" {
  description = "Exact bucket name, or null for a unique name starting with var.name."
  type        = string
  default     = null
}

variable "kms_key_arn" {
  description = "KMS key for SSE-KMS (with an S3 bucket key, so request costs stay low)."
  type        = string
}

variable "partial_expiry_days" {
  description = "Days after which objects tagged freight-partial=true expire."
  type        = number
}

variable "noncurrent_version_days" {
  description = "Days a noncurrent object version is kept."
  type        = number
}

variable "force_destroy" {
  description = "Allow destroying a non-empty bucket."
  type        = bool
  default     = false
}
