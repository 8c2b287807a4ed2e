output "function_name" {
  description = "Name of the autoscaler Lambda."
  value       = aws_lambda_function.this.function_name
}

output "security_group_id" {
  description = "Security group of the autoscaler Lambda."
  value       = aws_security_group.this.id
}

output "log_group_name" {
  description = "Log group of the autoscaler."
  value       = aws_cloudwatch_log_group.this.name
}

output "dashboard_name" {
  description = "CloudWatch dashboard of the backlog and the fleet."
  value       = aws_cloudwatch_dashboard.fleet.dashboard_name
}
