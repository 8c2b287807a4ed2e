variable "name" {
  description = "Deployment name; prefixes every resource."
  type        = string
}

variable "region" {
  description = "AWS region of the deployment."
  type        = string
}

variable "network" {
  description = "Where the API runs: the load balancer in public_subnet_ids, open to allowed_cidrs on 443; the tasks in private_subnet_ids."
  type = object({
    vpc_id             = string
    public_subnet_ids  = list(string)
    private_subnet_ids = list(string)
    allowed_cidrs      = list(string)
  })
}

variable "service" {
  description = "The service: the image (with freight installed) and its ECR repository ARN (null for a public registry), the ACM certificate, task size and count, extra `freight serve` flags and environment, log retention, deletion protection of the load balancer."
  type = object({
    image                = string
    image_repository_arn = string
    certificate_arn      = string
    cpu                  = number
    memory               = number
    tasks                = number
    serve_args           = list(string)
    environment          = map(string)
    log_retention_days   = number
    deletion_protection  = bool
  })
}

variable "store" {
  description = "The store: the bucket, the prefix freight serve keeps its files, batches and jobs under (ends in /), the model prefixes a batch's model is read from, the deployment's KMS key."
  type = object({
    bucket_name    = string
    bucket_arn     = string
    store_prefix   = string
    model_prefixes = list(string)
    kms_key_arn    = string
  })
}

variable "log_group_name" {
  description = "Name of the tasks' log group (the KMS key policy names its ARN)."
  type        = string
}

variable "tenants" {
  description = "Tenants that get an API key here, each kept in a Secrets Manager secret of its own."
  type        = list(string)
}

variable "secret_recovery_days" {
  description = "Recovery window of the API keys' secrets (0 deletes at once)."
  type        = number
}
