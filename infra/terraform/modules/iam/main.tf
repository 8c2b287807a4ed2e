# The workers' role: read the bucket's input prefixes, write its output prefixes, read the Redis
# token and the settings parameter, and finish their own termination lifecycle action. Nothing else.

data "aws_partition" "current" {}

locals {
  read_objects  = [for p in distinct(concat(var.read_prefixes, var.write_prefixes)) : "${var.bucket_arn}/${p}*"]
  write_objects = [for p in var.write_prefixes : "${var.bucket_arn}/${p}*"]
  list_prefixes = [for p in distinct(concat(var.read_prefixes, var.write_prefixes)) : "${p}*"]
}

data "aws_iam_policy_document" "assume_ec2" {
  statement {
    actions = ["sts:AssumeRole"]

    principals {
      type        = "Service"
      identifiers = ["ec2.amazonaws.com"]
    }
  }
}

resource "aws_iam_role" "worker" {
  name_prefix        = "${var.name}-worker-"
  description        = "freight ${var.name}: GPU workers"
  assume_role_policy = data.aws_iam_policy_document.assume_ec2.json
}

resource "aws_iam_instance_profile" "worker" {
  name_prefix = "${var.name}-worker-"
  role        = aws_iam_role.worker.name
}

data "aws_iam_policy_document" "worker" {
  statement {
    sid       = "ListOwnPrefixes"
    actions   = ["s3:ListBucket"]
    resources = [var.bucket_arn]

    condition {
      test     = "StringLike"
      variable = "s3:prefix"
      values   = local.list_prefixes
    }
  }

  statement {
    sid       = "ReadInputsModelsAndOutputs"
    actions   = ["s3:GetObject", "s3:GetObjectTagging"]
    resources = local.read_objects
  }

  # results, cost records, partial/ checkpoints (tagged for expiry), finalize's cost.json and _SUCCESS
  statement {
    sid       = "WriteJobOutputs"
    actions   = ["s3:PutObject", "s3:PutObjectTagging", "s3:DeleteObject", "s3:AbortMultipartUpload", "s3:ListMultipartUploadParts"]
    resources = local.write_objects
  }

  statement {
    sid       = "UseDeploymentKeyThroughServices"
    actions   = ["kms:Decrypt", "kms:GenerateDataKey"]
    resources = [var.kms_key_arn]

    condition {
      test     = "StringEquals"
      variable = "kms:ViaService"
      values = [
        "s3.${var.region}.amazonaws.com",
        "secretsmanager.${var.region}.amazonaws.com",
        "ssm.${var.region}.amazonaws.com",
      ]
    }
  }

  statement {
    sid       = "ReadRedisToken"
    actions   = ["secretsmanager:GetSecretValue"]
    resources = [var.redis_auth_secret_arn]
  }

  statement {
    sid       = "ReadWorkerSettings"
    actions   = ["ssm:GetParameter"]
    resources = [var.settings_parameter_arn]
  }

  # the drain service completes the terminating lifecycle hook once the worker has stopped
  statement {
    sid       = "CompleteOwnTermination"
    actions   = ["autoscaling:CompleteLifecycleAction"]
    resources = [var.group_arn]
  }
}

resource "aws_iam_role_policy" "worker" {
  name   = "freight-worker"
  role   = aws_iam_role.worker.id
  policy = data.aws_iam_policy_document.worker.json
}

resource "aws_iam_role_policy_attachment" "ssm_sessions" {
  count = var.enable_ssm_sessions ? 1 : 0

  role       = aws_iam_role.worker.name
  policy_arn = "arn:${data.aws_partition.current.partition}:iam::aws:policy/AmazonSSMManagedInstanceCore"
}
