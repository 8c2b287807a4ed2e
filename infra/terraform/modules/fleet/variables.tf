variable "name" {
  description = "Deployment name; prefixes the launch template, security group and parameter."
  type        = string
}

variable "region" {
  description = "AWS region of the deployment (the root module's var.region)."
  type        = string
}

variable "group_name" {
  description = "Name of the Auto Scaling group."
  type        = string
}

variable "vpc_id" {
  description = "VPC of the workers."
  type        = string
}

variable "subnet_ids" {
  description = "Subnets (several AZs) the group launches into."
  type        = list(string)
}

variable "ami_ssm_parameter" {
  description = "Public SSM parameter with the GPU AMI id."
  type        = string
}

variable "root_device_name" {
  description = "Root device name of the AMI."
  type        = string
}

variable "root_volume_gb" {
  description = "Root volume size in GiB."
  type        = number
}

variable "instance_types" {
  description = "GPU instance types of the mixed instances policy."
  type        = list(string)
}

variable "max_workers" {
  description = "Max size of the group."
  type        = number
}

variable "on_demand_base_capacity" {
  description = "On-demand workers before spot."
  type        = number
}

variable "drain_timeout_s" {
  description = "Heartbeat timeout of the terminating lifecycle hook."
  type        = number
}

variable "instance_profile_arn" {
  description = "Instance profile of the workers."
  type        = string
}

variable "kms_key_arn" {
  description = "KMS key of the settings parameter."
  type        = string
}

variable "bucket_name" {
  description = "The deployment's bucket."
  type        = string
}

variable "freight_wheel_key" {
  description = "Key of the freight wheel in the bucket."
  type        = string
}

variable "worker_queues" {
  description = "Celery queues for `freight worker --queues` (empty: its default)."
  type        = list(string)
}

variable "worker_environment" {
  description = "Extra non-secret FREIGHT_* settings."
  type        = map(string)
}
