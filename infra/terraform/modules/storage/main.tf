# The bucket for datasets, models, the freight wheel and job outputs. Private, encrypted with the
# deployment's key, owner-enforced (no ACLs), versioned, TLS only, with lifecycle rules that clean
# up what interrupted work leaves behind.

resource "aws_s3_bucket" "this" {
  #checkov:skip=CKV_AWS_18:Server access logs need a separate log bucket that the operator's logging account owns; CloudTrail S3 data events are the audit trail for this bucket.
  #checkov:skip=CKV_AWS_144:Cross-region replication doubles storage cost for data that is either an input copy or reproducible job output; enable it per deployment if required.
  #checkov:skip=CKV2_AWS_62:No consumer of S3 event notifications: job completion is read from OUT/_SUCCESS and Redis progress.
  bucket        = var.bucket_name
  bucket_prefix = var.bucket_name == null ? "${var.name}-" : null
  force_destroy = var.force_destroy
}

resource "aws_s3_bucket_ownership_controls" "this" {
  bucket = aws_s3_bucket.this.id

  rule {
    object_ownership = "BucketOwnerEnforced"
  }
}

resource "aws_s3_bucket_public_access_block" "this" {
  bucket                  = aws_s3_bucket.this.id
  block_public_acls       = true
  block_public_policy     = true
  ignore_public_acls      = true
  restrict_public_buckets = true
}

resource "aws_s3_bucket_versioning" "this" {
  bucket = aws_s3_bucket.this.id

  versioning_configuration {
    status = "Enabled"
  }
}

resource "aws_s3_bucket_server_side_encryption_configuration" "this" {
  bucket = aws_s3_bucket.this.id

  rule {
    bucket_key_enabled = true

    apply_server_side_encryption_by_default {
      sse_algorithm     = "aws:kms"
      kms_master_key_id = var.kms_key_arn
    }
  }
}

resource "aws_s3_bucket_lifecycle_configuration" "this" {
  bucket = aws_s3_bucket.this.id

  # Uploads of large result shards cut off by a spot interruption.
  rule {
    id     = "abort-incomplete-multipart-uploads"
    status = "Enabled"

    filter {}

    abort_incomplete_multipart_upload {
      days_after_initiation = 1
    }
  }

  # OUT/partial/ checkpoints of interrupted shards: the next attempt reads them; leftovers of jobs
  # that never finished expire. partial/ sits under each job's output prefix, which a prefix filter
  # cannot match, so writers tag those objects freight-partial=true.
  # jobs/storage/s3.py S3Store.put does so for every partial/ key.
  rule {
    id     = "expire-partial-checkpoints"
    status = "Enabled"

    filter {
      tag {
        key   = "freight-partial"
        value = "true"
      }
    }

    expiration {
      days = var.partial_expiry_days
    }

    noncurrent_version_expiration {
      noncurrent_days = 1
    }
  }

  # Versions replaced or deleted (re-run jobs, removed datasets).
  rule {
    id     = "expire-noncurrent-versions"
    status = "Enabled"

    filter {}

    noncurrent_version_expiration {
      noncurrent_days = var.noncurrent_version_days
    }
  }

  depends_on = [aws_s3_bucket_versioning.this]
}

data "aws_iam_policy_document" "tls_only" {
  statement {
    sid       = "DenyPlainHttp"
    effect    = "Deny"
    actions   = ["s3:*"]
    resources = [aws_s3_bucket.this.arn, "${aws_s3_bucket.this.arn}/*"]

    principals {
      type        = "*"
      identifiers = ["*"]
    }

    condition {
      test     = "Bool"
      variable = "aws:SecureTransport"
      values   = ["false"]
    }
  }
}

resource "aws_s3_bucket_policy" "this" {
  bucket = aws_s3_bucket.this.id
  policy = data.aws_iam_policy_document.tls_only.json

  depends_on = [aws_s3_bucket_public_access_block.this]
}
