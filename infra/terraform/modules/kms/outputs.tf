output "key_arn" {
  description = "ARN of the key."
  value       = aws_kms_key.this.arn
}
