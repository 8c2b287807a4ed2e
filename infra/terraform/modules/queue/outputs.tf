output "endpoint" {
  description = "Host to connect to (primary endpoint, or the serverless endpoint)."
  value       = local.replication_group ? one(aws_elasticache_replication_group.this[*].primary_endpoint_address) : one(aws_elasticache_serverless_cache.this[*].endpoint[0].address)
}

output "port" {
  description = "Port to connect to."
  value       = local.port
}

output "auth_secret_arn" {
  description = "Secrets Manager secret whose string is the auth token."
  value       = aws_secretsmanager_secret.auth.arn
}

output "security_group_id" {
  description = "Security group of the cache."
  value       = aws_security_group.redis.id
}
