# One customer managed key for the deployment's data at rest: the bucket, Redis, the auth secret,
# the workers' settings parameter, the Lambda environment, the API keys' secrets and the logs.

data "aws_caller_identity" "current" {}
data "aws_partition" "current" {}

locals {
  account_root = "arn:${data.aws_partition.current.partition}:iam::${data.aws_caller_identity.current.account_id}:root"
}

data "aws_iam_policy_document" "key" {
  #checkov:skip=CKV_AWS_109:A key policy's Resource "*" is this key alone; kms:* for the account root is AWS's default key policy, which leaves every grant to IAM policies.
  #checkov:skip=CKV_AWS_111:Same statement: write access to this key only, delegated to the account's IAM policies, which name the key's ARN.
  #checkov:skip=CKV_AWS_356:In a key policy the only valid Resource is "*", meaning the key the policy is attached to.
  # The account administers the key; every other use is granted by IAM policies of named roles
  # (the worker and autoscaler roles name this key's ARN).
  statement {
    sid       = "AccountAdministersKeyThroughIam"
    actions   = ["kms:*"]
    resources = ["*"] # in a key policy "*" means this key

    principals {
      type        = "AWS"
      identifiers = [local.account_root]
    }
  }

  # CloudWatch Logs encrypts the deployment's log groups with this key (the autoscaler's, the API's),
  # and no other log group.
  statement {
    sid       = "CloudWatchLogsForOwnLogGroups"
    actions   = ["kms:Encrypt*", "kms:Decrypt*", "kms:ReEncrypt*", "kms:GenerateDataKey*", "kms:Describe*"]
    resources = ["*"] # in a key policy "*" means this key

    principals {
      type        = "Service"
      identifiers = ["logs.${var.region}.amazonaws.com"]
    }

    condition {
      test     = "ArnEquals"
      variable = "kms:EncryptionContext:aws:logs:arn"
      values   = var.log_group_arns
    }
  }
}

resource "aws_kms_key" "this" {
  description             = "freight ${var.name}: bucket, Redis, secrets, parameters and logs"
  enable_key_rotation     = true
  deletion_window_in_days = var.deletion_window_days
  policy                  = data.aws_iam_policy_document.key.json
}

resource "aws_kms_alias" "this" {
  name          = "alias/${var.name}"
  target_key_id = aws_kms_key.this.key_id
}
