# freight on AWS: a bucket, a Redis queue, a spot GPU fleet that sits at zero machines until work
# arrives, the autoscaler that sizes it from the backlog, and (with var.api) `freight serve` behind
# an HTTPS load balancer. Each part is a small module.

data "aws_caller_identity" "current" {}
data "aws_partition" "current" {}

locals {
  group_name = "${var.name}-workers"
  # ARN of the Auto Scaling group, known before the group exists (IAM policies name it).
  group_arn = format(
    "arn:%s:autoscaling:%s:%s:autoScalingGroup:*:autoScalingGroupName/%s",
    data.aws_partition.current.partition, var.region,
    data.aws_caller_identity.current.account_id, local.group_name,
  )
  function_name = "${var.name}-autoscaler"
  # the autoscaler's log group; the key lets CloudWatch Logs encrypt it and nothing else
  log_group_arn = format(
    "arn:%s:logs:%s:%s:log-group:/aws/lambda/%s",
    data.aws_partition.current.partition, var.region, data.aws_caller_identity.current.account_id,
    local.function_name,
  )
  # freight serve's log group (modules/api); the key policy names it whether or not var.api is set
  api_log_group_name = "/ecs/${var.name}-api"
  api_log_group_arn = format(
    "arn:%s:logs:%s:%s:log-group:%s",
    data.aws_partition.current.partition, var.region, data.aws_caller_identity.current.account_id,
    local.api_log_group_name,
  )
}

locals {
  # the API's batches are fleet jobs under its store prefix: the workers read their inputs and write
  # their outputs there
  api_prefixes = var.api == null ? [] : [var.api.store_prefix]
}

module "kms" {
  source = "./modules/kms"

  region         = var.region
  name           = var.name
  log_group_arns = [local.log_group_arn, local.api_log_group_arn]
}

module "storage" {
  source = "./modules/storage"

  name                    = var.name
  bucket_name             = var.bucket_name
  kms_key_arn             = module.kms.key_arn
  partial_expiry_days     = var.partial_expiry_days
  noncurrent_version_days = var.noncurrent_version_days
  force_destroy           = var.force_destroy_bucket
}

module "queue" {
  source = "./modules/queue"

  name                      = var.name
  mode                      = var.queue_mode
  engine                    = var.queue_engine
  node_type                 = var.queue_node_type
  replicas                  = var.queue_replicas
  serverless_max_ecpu       = var.queue_serverless_max_ecpu
  serverless_max_data_gb    = var.queue_serverless_max_data_gb
  snapshot_retention_days   = var.queue_snapshot_retention_days
  vpc_id                    = var.vpc_id
  subnet_ids                = var.subnet_ids
  kms_key_arn               = module.kms.key_arn
  auth_secret_recovery_days = var.secret_recovery_days
  client_security_group_ids = merge(
    { workers = module.fleet.security_group_id, autoscaler = module.autoscaler.security_group_id },
    var.api == null ? {} : { api = module.api[0].task_security_group_id },
  )
}

module "iam" {
  source = "./modules/iam"

  region                 = var.region
  name                   = var.name
  bucket_arn             = module.storage.bucket_arn
  read_prefixes          = var.read_prefixes
  write_prefixes         = concat(var.write_prefixes, local.api_prefixes)
  kms_key_arn            = module.kms.key_arn
  redis_auth_secret_arn  = module.queue.auth_secret_arn
  settings_parameter_arn = module.fleet.settings_parameter_arn
  group_arn              = local.group_arn
  enable_ssm_sessions    = var.enable_ssm_sessions
}

module "fleet" {
  source = "./modules/fleet"

  region                  = var.region
  name                    = var.name
  group_name              = local.group_name
  vpc_id                  = var.vpc_id
  subnet_ids              = var.subnet_ids
  ami_ssm_parameter       = var.ami_ssm_parameter
  root_device_name        = var.root_device_name
  root_volume_gb          = var.root_volume_gb
  instance_types          = var.instance_types
  max_workers             = var.max_workers
  on_demand_base_capacity = var.on_demand_base_capacity
  drain_timeout_s         = var.drain_timeout_s
  instance_profile_arn    = module.iam.worker_instance_profile_arn
  kms_key_arn             = module.kms.key_arn
  bucket_name             = module.storage.bucket_name
  freight_wheel_key       = var.freight_wheel_key
  worker_queues           = var.worker_queues
  worker_environment      = var.worker_environment
  redis                   = module.queue.connection
}

module "autoscaler" {
  source = "./modules/autoscaler"

  region               = var.region
  name                 = var.name
  function_name        = local.function_name
  group_name           = local.group_name
  group_arn            = local.group_arn
  package_dir          = var.autoscaler_package_dir
  schedule_expression  = var.autoscaler_schedule
  vpc_id               = var.vpc_id
  subnet_ids           = var.subnet_ids
  kms_key_arn          = module.kms.key_arn
  log_retention_days   = var.log_retention_days
  redis                = module.queue.connection
  metric_namespace     = var.metric_namespace
  min_workers          = var.min_workers
  max_workers          = var.max_workers
  scale_in_cooldown_s  = var.scale_in_cooldown_s
  idle_to_zero_s       = var.idle_to_zero_s
  target_drain_s       = var.target_drain_s
  default_tokens_per_s = var.default_tokens_per_second
}

module "api" {
  source = "./modules/api"
  count  = var.api == null ? 0 : 1

  name                 = var.name
  region               = var.region
  log_group_name       = local.api_log_group_name
  secret_recovery_days = var.secret_recovery_days
  tenants              = var.api.tenants
  redis                = module.queue.connection
  # each object takes the attributes of var.api its type names
  network = merge(var.api, { vpc_id = var.vpc_id, private_subnet_ids = var.subnet_ids })
  service = merge(var.api, { log_retention_days = var.log_retention_days })
  store = merge(var.api, {
    bucket_name = module.storage.bucket_name
    bucket_arn  = module.storage.bucket_arn
    kms_key_arn = module.kms.key_arn
  })
}
