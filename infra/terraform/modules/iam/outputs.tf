output "worker_role_arn" {
  description = "ARN of the workers' role."
  value       = aws_iam_role.worker.arn
}

output "worker_instance_profile_arn" {
  description = "ARN of the workers' instance profile."
  value       = aws_iam_instance_profile.worker.arn
}
