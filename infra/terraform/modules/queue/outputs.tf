output "endpoint" {
  description = "Host to connect to (primary endpoint, or the serverless endpoint)."
  value       = local.endpoint
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

output "connection" {
  description = "What a client of the queue needs: host, port, the security group to allow egress to, and the auth token's secret."
  value = {
    host              = local.endpoint
    port              = local.port
    security_group_id = aws_security_group.redis.id
    auth_secret_arn   = aws_secretsmanager_secret.auth.arn
  }
}
