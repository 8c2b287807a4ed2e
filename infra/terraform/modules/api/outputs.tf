output "url" {
  description = "Base URL for the openai SDK (base_url); the certificate's name should point at dns_name."
  value       = "https://${aws_lb.this.dns_name}/v1"
}

output "dns_name" {
  description = "DNS name of the load balancer (a CNAME or alias target for the certificate's name)."
  value       = aws_lb.this.dns_name
}

output "lb_arn" {
  description = "ARN of the load balancer (to attach a WAF web ACL)."
  value       = aws_lb.this.arn
}

output "store_url" {
  description = "The store of freight serve (`freight keys create --store` takes it)."
  value       = local.store_url
}

output "key_secret_arns" {
  description = "Per tenant, the Secrets Manager secret holding its API key."
  value       = { for t, s in aws_secretsmanager_secret.key : t => s.arn }
}

output "task_role_arn" {
  description = "IAM role of freight serve's tasks."
  value       = aws_iam_role.this["task"].arn
}

output "task_security_group_id" {
  description = "Security group of the tasks (Redis admits it)."
  value       = aws_security_group.task.id
}
