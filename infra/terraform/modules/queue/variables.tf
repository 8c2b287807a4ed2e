# The root module validates what its users give (variables.tf: queue_mode, queue_engine,
# queue_replicas, ...); this module takes those values as they are.

variable "name" {
  description = "Deployment name; prefixes the cache, its groups and the secret."
  type        = string
}

variable "mode" {
  description = "replication_group or serverless."
  type        = string
}

variable "engine" {
  description = "valkey or redis."
  type        = string
}

variable "node_type" {
  description = "Node type of the replication group."
  type        = string
}

variable "replicas" {
  description = "Replicas beside the primary (replication group); at least one, for Multi-AZ failover."
  type        = number
}

variable "serverless_max_ecpu" {
  description = "ECPU per second ceiling (serverless)."
  type        = number
}

variable "serverless_max_data_gb" {
  description = "Data storage ceiling in GB (serverless)."
  type        = number
}

variable "snapshot_retention_days" {
  description = "Days of daily snapshots."
  type        = number
}

variable "vpc_id" {
  description = "VPC of the cache's security group."
  type        = string
}

variable "subnet_ids" {
  description = "Subnets of the cache (several AZs)."
  type        = list(string)
}

variable "kms_key_arn" {
  description = "KMS key for data at rest and the auth secret."
  type        = string
}

variable "auth_secret_recovery_days" {
  description = "Recovery window of the auth token secret."
  type        = number
}

variable "client_security_group_ids" {
  description = "Security groups allowed to connect, by a name used in the rule description."
  type        = map(string)
}
