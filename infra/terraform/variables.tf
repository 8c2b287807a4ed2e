variable "name" {
  description = "Name of this freight deployment; prefixes every resource (lowercase letters, digits, hyphens)."
  type        = string
  default     = "freight"

  validation {
    condition     = can(regex("^[a-z][a-z0-9-]{1,22}[a-z0-9]$", var.name))
    error_message = "name must be 3-24 characters: lowercase letters, digits and hyphens, starting with a letter."
  }
}

variable "region" {
  description = "AWS region to deploy into, e.g. us-east-1."
  type        = string

  validation {
    condition     = can(regex("^[a-z]{2}(-gov)?-[a-z]+-[0-9]$", var.region))
    error_message = "region must be an AWS region name such as us-east-1."
  }
}

variable "tags" {
  description = "Extra tags for every resource."
  type        = map(string)
  default     = {}
}

variable "vpc_id" {
  description = "VPC for the workers, Redis and the autoscaler Lambda."
  type        = string

  validation {
    condition     = can(regex("^vpc-[0-9a-f]{8,17}$", var.vpc_id))
    error_message = "vpc_id must look like vpc-0123456789abcdef0."
  }
}

variable "subnet_ids" {
  description = "Private subnets in at least two Availability Zones, with a NAT route (workers install packages; the Lambda calls AWS APIs)."
  type        = list(string)

  validation {
    condition     = length(var.subnet_ids) >= 2 && alltrue([for s in var.subnet_ids : can(regex("^subnet-[0-9a-f]{8,17}$", s))])
    error_message = "subnet_ids needs at least two subnet ids (subnet-...), in different Availability Zones, so spot capacity can come from several pools."
  }
}

# ---- storage -----------------------------------------------------------------------------------

variable "bucket_name" {
  description = "Name of the S3 bucket for datasets, models and results; null picks a unique name from var.name."
  type        = string
  default     = null

  validation {
    condition     = var.bucket_name == null || can(regex("^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$", var.bucket_name))
    error_message = "bucket_name must be a valid S3 bucket name (3-63 lowercase letters, digits, dots, hyphens)."
  }
}

variable "read_prefixes" {
  description = "Bucket prefixes the workers may read: inputs, models and the freight wheel."
  type        = list(string)
  default     = ["datasets/", "models/", "artifacts/"]

  validation {
    condition     = length(var.read_prefixes) > 0 && alltrue([for p in var.read_prefixes : can(regex("^[A-Za-z0-9._-]+(/[A-Za-z0-9._-]+)*/$", p))])
    error_message = "read_prefixes must be non-empty prefixes such as \"datasets/\" (no leading slash, ending in a slash, no wildcards)."
  }
}

variable "write_prefixes" {
  description = "Bucket prefixes the workers may write: job outputs (results, cost records, partial/ checkpoints)."
  type        = list(string)
  default     = ["jobs/"]

  validation {
    condition     = length(var.write_prefixes) > 0 && alltrue([for p in var.write_prefixes : can(regex("^[A-Za-z0-9._-]+(/[A-Za-z0-9._-]+)*/$", p))])
    error_message = "write_prefixes must be non-empty prefixes such as \"jobs/\" (no leading slash, ending in a slash, no wildcards)."
  }
}

variable "partial_expiry_days" {
  description = "Days after which interrupted-shard checkpoints (objects tagged freight-partial=true) expire."
  type        = number
  default     = 7

  validation {
    condition     = var.partial_expiry_days >= 1 && var.partial_expiry_days <= 365
    error_message = "partial_expiry_days must be between 1 and 365."
  }
}

variable "noncurrent_version_days" {
  description = "Days a replaced or deleted object version is kept (the bucket is versioned)."
  type        = number
  default     = 30

  validation {
    condition     = var.noncurrent_version_days >= 1
    error_message = "noncurrent_version_days must be at least 1."
  }
}

variable "force_destroy_bucket" {
  description = "Let `terraform destroy` delete a non-empty bucket (results included). Keep false outside test stacks."
  type        = bool
  default     = false
}

# ---- queue -------------------------------------------------------------------------------------

variable "queue_mode" {
  description = "replication_group (a small primary + replica group; works with Celery) or serverless (ElastiCache Serverless: cluster mode, which kombu's Redis transport does not support yet: CROSSSLOT errors)."
  type        = string
  default     = "replication_group"

  validation {
    condition     = contains(["replication_group", "serverless"], var.queue_mode)
    error_message = "queue_mode must be replication_group or serverless."
  }
}

variable "queue_engine" {
  description = "ElastiCache engine: valkey or redis."
  type        = string
  default     = "valkey"

  validation {
    condition     = contains(["valkey", "redis"], var.queue_engine)
    error_message = "queue_engine must be valkey or redis."
  }
}

variable "queue_node_type" {
  description = "Node type of the replication group (queue_mode = replication_group)."
  type        = string
  default     = "cache.t4g.small"

  validation {
    condition     = can(regex("^cache\\.[a-z0-9]+\\.[a-z0-9]+$", var.queue_node_type))
    error_message = "queue_node_type must be an ElastiCache node type such as cache.t4g.small."
  }
}

variable "queue_replicas" {
  description = "Replicas beside the primary (replication group): at least 1, for automatic Multi-AZ failover."
  type        = number
  default     = 1

  validation {
    condition     = var.queue_replicas >= 1 && var.queue_replicas <= 5
    error_message = "queue_replicas must be between 1 and 5 (the queue holds every job's pending shards, so it fails over across AZs)."
  }
}

variable "queue_serverless_max_ecpu" {
  description = "ECPU per second ceiling of the serverless cache (queue_mode = serverless)."
  type        = number
  default     = 5000

  validation {
    condition     = var.queue_serverless_max_ecpu >= 1000
    error_message = "queue_serverless_max_ecpu must be at least 1000."
  }
}

variable "queue_serverless_max_data_gb" {
  description = "Data storage ceiling in GB of the serverless cache (queue_mode = serverless)."
  type        = number
  default     = 5

  validation {
    condition     = var.queue_serverless_max_data_gb >= 1
    error_message = "queue_serverless_max_data_gb must be at least 1."
  }
}

variable "queue_snapshot_retention_days" {
  description = "Days of daily Redis snapshots (the queue and live progress; results live in S3)."
  type        = number
  default     = 1

  validation {
    condition     = var.queue_snapshot_retention_days >= 1 && var.queue_snapshot_retention_days <= 35
    error_message = "queue_snapshot_retention_days must be between 1 and 35."
  }
}

variable "secret_recovery_days" {
  description = "Days a deleted Secrets Manager secret can be recovered (7-30)."
  type        = number
  default     = 7

  validation {
    condition     = var.secret_recovery_days >= 7 && var.secret_recovery_days <= 30
    error_message = "secret_recovery_days must be between 7 and 30."
  }
}

# ---- fleet -------------------------------------------------------------------------------------

variable "ami_ssm_parameter" {
  description = "SSM parameter holding the GPU AMI id: a public AWS one (default: Deep Learning Base OSS Nvidia Driver AMI, Amazon Linux 2023) or your own baked AMI's."
  type        = string
  default     = "/aws/service/deeplearning/ami/x86_64/base-oss-nvidia-driver-gpu-amazon-linux-2023/latest/ami-id"

  validation {
    condition     = can(regex("^/[A-Za-z0-9_.\\-/]+$", var.ami_ssm_parameter))
    error_message = "ami_ssm_parameter must be an SSM parameter path such as /aws/service/deeplearning/ami/x86_64/base-oss-nvidia-driver-gpu-amazon-linux-2023/latest/ami-id."
  }
}

variable "root_device_name" {
  description = "Root device name of the AMI (/dev/xvda on Amazon Linux 2023)."
  type        = string
  default     = "/dev/xvda"

  validation {
    condition     = can(regex("^/dev/(xvd|sd|nvme)[a-z0-9]+$", var.root_device_name))
    error_message = "root_device_name must be a device path such as /dev/xvda."
  }
}

variable "root_volume_gb" {
  description = "Encrypted gp3 root volume size in GiB (packages, model cache)."
  type        = number
  default     = 200

  validation {
    condition     = var.root_volume_gb >= 75 && var.root_volume_gb <= 16384
    error_message = "root_volume_gb must be between 75 (the DLAMI's own size) and 16384."
  }
}

variable "instance_types" {
  description = "GPU instance types the spot fleet may use; several types give price-capacity-optimized more pools."
  type        = list(string)
  default     = ["g6.xlarge", "g6.2xlarge", "g6e.xlarge", "g5.xlarge", "g5.2xlarge"]

  validation {
    condition     = length(var.instance_types) >= 2 && alltrue([for t in var.instance_types : can(regex("^(g[4-9]|p[3-6])[a-z0-9-]*\\.[0-9]*x?large$", t))])
    error_message = "instance_types needs at least two GPU instance types (g4dn-g6e, p3-p6 families), e.g. g6.xlarge."
  }
}

variable "on_demand_base_capacity" {
  description = "Workers that run on demand before any spot capacity (0: all spot)."
  type        = number
  default     = 0

  validation {
    condition     = var.on_demand_base_capacity >= 0
    error_message = "on_demand_base_capacity must be >= 0."
  }
}

variable "drain_timeout_s" {
  description = "Seconds a terminating worker gets (lifecycle hook) to checkpoint its shard and hand it back."
  type        = number
  default     = 300

  validation {
    condition     = var.drain_timeout_s >= 60 && var.drain_timeout_s <= 7200
    error_message = "drain_timeout_s must be between 60 and 7200 seconds."
  }
}

variable "freight_wheel_key" {
  description = "Object key, in the bucket, of the freight wheel the workers install (upload it with `aws s3 cp dist/*.whl`)."
  type        = string
  default     = "artifacts/freight-0.1.0-py3-none-any.whl"

  validation {
    condition     = endswith(var.freight_wheel_key, ".whl") && !startswith(var.freight_wheel_key, "/")
    error_message = "freight_wheel_key must be the key of a .whl object, without a leading slash."
  }
}

variable "worker_queues" {
  description = "Celery queues the workers consume (one per model); empty: freight worker's default."
  type        = list(string)
  default     = []

  validation {
    condition     = alltrue([for q in var.worker_queues : can(regex("^[A-Za-z0-9._:-]+$", q))])
    error_message = "worker_queues entries may hold letters, digits and . _ : - only."
  }
}

variable "worker_environment" {
  description = "Extra non-secret FREIGHT_* settings for the workers (stored in an encrypted SSM parameter, never in user data)."
  type        = map(string)
  default     = {}

  validation {
    condition     = alltrue([for k in keys(var.worker_environment) : can(regex("^FREIGHT_[A-Z0-9_]+$", k)) && k != "FREIGHT_REDIS_URL"])
    error_message = "worker_environment keys must be FREIGHT_* variable names; FREIGHT_REDIS_URL is built at boot from the secret."
  }
}

variable "enable_ssm_sessions" {
  description = "Attach AmazonSSMManagedInstanceCore to the workers so operators can open Session Manager shells and port forwards."
  type        = bool
  default     = false
}

# ---- autoscaler --------------------------------------------------------------------------------

variable "min_workers" {
  description = "Workers kept running with no work (0: the fleet scales to zero)."
  type        = number
  default     = 0

  validation {
    condition     = var.min_workers >= 0
    error_message = "min_workers must be >= 0."
  }
}

variable "max_workers" {
  description = "Most workers the fleet may run (the Auto Scaling group's max size)."
  type        = number
  default     = 8

  validation {
    condition     = var.max_workers >= 1 && var.max_workers <= 1000
    error_message = "max_workers must be between 1 and 1000."
  }
}

variable "scale_in_cooldown_s" {
  description = "Seconds the backlog must ask for fewer workers before the fleet shrinks."
  type        = number
  default     = 300

  validation {
    condition     = var.scale_in_cooldown_s >= 0
    error_message = "scale_in_cooldown_s must be >= 0."
  }
}

variable "idle_to_zero_s" {
  description = "Seconds with no queued or running shard before the fleet goes to min_workers."
  type        = number
  default     = 600

  validation {
    condition     = var.idle_to_zero_s >= 0
    error_message = "idle_to_zero_s must be >= 0."
  }
}

variable "target_drain_s" {
  description = "The fleet is sized to finish the queued tokens within this many seconds (jobs with a deadline get more)."
  type        = number
  default     = 1800

  validation {
    condition     = var.target_drain_s >= 60
    error_message = "target_drain_s must be at least 60 seconds."
  }
}

variable "default_tokens_per_second" {
  description = "Tokens per second one worker is assumed to process until live workers report their own."
  type        = number
  default     = 500

  validation {
    condition     = var.default_tokens_per_second > 0
    error_message = "default_tokens_per_second must be > 0."
  }
}

variable "autoscaler_schedule" {
  description = "EventBridge schedule of the autoscaler tick."
  type        = string
  default     = "rate(1 minute)"

  validation {
    condition     = can(regex("^(rate\\(.+\\)|cron\\(.+\\))$", var.autoscaler_schedule))
    error_message = "autoscaler_schedule must be an EventBridge rate(...) or cron(...) expression."
  }
}

variable "autoscaler_package_dir" {
  description = "Folder built by `python infra/build_autoscaler.py` (jobs/autoscale + redis + structlog); zipped for the Lambda."
  type        = string
  default     = "../build/autoscaler"

  validation {
    condition     = length(var.autoscaler_package_dir) > 0
    error_message = "autoscaler_package_dir must name the folder that infra/build_autoscaler.py wrote."
  }
}

variable "metric_namespace" {
  description = "CloudWatch namespace of the backlog metrics (QueuedShards, EstimatedTokensQueued, DesiredWorkers, ...)."
  type        = string
  default     = "Freight"

  validation {
    condition     = can(regex("^[A-Za-z0-9._/#:-]{1,255}$", var.metric_namespace)) && !startswith(var.metric_namespace, "AWS/")
    error_message = "metric_namespace must be a custom CloudWatch namespace (not AWS/...)."
  }
}

variable "log_retention_days" {
  description = "Days the autoscaler's logs are kept."
  type        = number
  default     = 365

  validation {
    condition     = contains([1, 3, 5, 7, 14, 30, 60, 90, 120, 150, 180, 365, 400, 545, 731, 1096, 1827, 2192, 2557, 2922, 3288, 3653], var.log_retention_days)
    error_message = "log_retention_days must be a CloudWatch Logs retention value (1, 3, 5, 7, 14, 30, 60, 90, ..., 365, ...)."
  }
}

# ---- API (freight serve) -----------------------------------------------------------------------

variable "api" {
  description = <<-EOT
    freight serve, the OpenAI Files + Batches API, on ECS Fargate behind an HTTPS load balancer; its
    batches run on this fleet. null (the default) deploys none. image: a container image with freight
    installed (image_repository_arn: its private ECR repository, else null); certificate_arn: the ACM
    certificate of the HTTPS listener; public_subnet_ids: the load balancer's subnets (the tasks run in
    subnet_ids); allowed_cidrs: who may reach it; store_prefix: where freight serve keeps files, batches
    and their jobs in the bucket; model_prefixes: where the checkpoints batches name are (read only);
    tenants: each gets an API key in Secrets Manager.
  EOT
  type = object({
    image                = string
    image_repository_arn = optional(string)
    certificate_arn      = string
    public_subnet_ids    = list(string)
    allowed_cidrs        = optional(list(string), ["0.0.0.0/0"])
    store_prefix         = optional(string, "api/")
    model_prefixes       = optional(list(string), ["models/"])
    tenants              = optional(list(string), [])
    cpu                  = optional(number, 1024)
    memory               = optional(number, 2048)
    tasks                = optional(number, 1)
    serve_args           = optional(list(string), [])
    environment          = optional(map(string), {})
    deletion_protection  = optional(bool, true)
  })
  default = null

  validation {
    condition = var.api == null ? true : (
      can(regex("^arn:[a-z-]+:acm:", var.api.certificate_arn)) &&
      length(var.api.public_subnet_ids) >= 2 &&
      alltrue([for s in var.api.public_subnet_ids : can(regex("^subnet-[0-9a-f]{8,17}$", s))]) &&
      alltrue([for c in var.api.allowed_cidrs : can(cidrhost(c, 0))]) &&
      alltrue([for p in concat([var.api.store_prefix], var.api.model_prefixes) : can(regex("^[A-Za-z0-9._-]+(/[A-Za-z0-9._-]+)*/$", p))]) &&
      alltrue([for t in var.api.tenants : can(regex("^[a-z0-9][a-z0-9_-]{0,63}$", t))]) &&
      var.api.tasks >= 1 && contains([256, 512, 1024, 2048, 4096], var.api.cpu) && var.api.memory >= 512
    )
    error_message = "api: certificate_arn must be an ACM certificate ARN; public_subnet_ids at least two subnet ids; allowed_cidrs CIDR blocks; store_prefix and model_prefixes prefixes such as \"api/\"; tenants 1-64 lowercase letters, digits, _ or -; tasks at least 1; cpu 256, 512, 1024, 2048 or 4096 units with memory (MiB) Fargate allows for it."
  }
}
