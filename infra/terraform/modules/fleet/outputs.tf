output "group_name" {
  description = "Name of the Auto Scaling group."
  value       = aws_autoscaling_group.workers.name
}

output "security_group_id" {
  description = "Security group of the workers."
  value       = aws_security_group.worker.id
}

output "settings_parameter_arn" {
  description = "ARN of the workers' settings parameter."
  value       = aws_ssm_parameter.settings.arn
}

output "settings_parameter_name" {
  description = "Name of the workers' settings parameter."
  value       = aws_ssm_parameter.settings.name
}

output "launch_template_id" {
  description = "Launch template of the workers."
  value       = aws_launch_template.worker.id
}
