output "bucket_name" {
  description = "S3 bucket for datasets (datasets/), models (models/), the freight wheel (artifacts/) and job outputs (jobs/)."
  value       = module.storage.bucket_name
}

output "redis_endpoint" {
  description = "Redis (ElastiCache) endpoint host; reachable from inside the VPC only, TLS required."
  value       = module.queue.endpoint
}

output "redis_port" {
  description = "Redis port."
  value       = module.queue.port
}

output "redis_auth_secret_arn" {
  description = "Secrets Manager secret holding the Redis auth token."
  value       = module.queue.auth_secret_arn
}

output "asg_name" {
  description = "Auto Scaling group of the spot GPU workers (FREIGHT_AUTOSCALE_GROUP)."
  value       = module.fleet.group_name
}

output "worker_settings_parameter" {
  description = "SSM parameter (SecureString, JSON) with the workers' non-secret settings."
  value       = module.fleet.settings_parameter_name
}

output "autoscaler_function_name" {
  description = "Lambda that runs the autoscaler tick on a schedule."
  value       = module.autoscaler.function_name
}

output "worker_role_arn" {
  description = "IAM role of the workers."
  value       = module.iam.worker_role_arn
}

output "kms_key_arn" {
  description = "KMS key that encrypts the bucket, Redis, the secret, the settings parameter and the logs."
  value       = module.kms.key_arn
}

output "redis_url_command" {
  description = "Shell command (run inside the VPC) that prints FREIGHT_REDIS_URL for `freight submit`."
  value       = "echo \"rediss://:$(aws secretsmanager get-secret-value --region ${var.region} --secret-id ${module.queue.auth_secret_arn} --query SecretString --output text)@${module.queue.endpoint}:${module.queue.port}/0?ssl_cert_reqs=required\""
}

output "dashboard_name" {
  description = "CloudWatch dashboard with the backlog and worker counts."
  value       = module.autoscaler.dashboard_name
}

output "api_url" {
  description = "freight serve's base URL for the openai SDK (null without var.api); point the certificate's name at api_dns_name and use that name."
  value       = var.api == null ? null : module.api[0].url
}

output "api_dns_name" {
  description = "DNS name of the API's load balancer (null without var.api)."
  value       = var.api == null ? null : module.api[0].dns_name
}

output "api_store_url" {
  description = "The store of freight serve, for `freight keys create --tenant NAME --store ...` (null without var.api)."
  value       = var.api == null ? null : module.api[0].store_url
}

output "api_key_secret_arns" {
  description = "Per tenant in var.api.tenants, the Secrets Manager secret holding its API key."
  value       = var.api == null ? {} : module.api[0].key_secret_arns
}
