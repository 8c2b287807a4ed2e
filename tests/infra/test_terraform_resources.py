"""What the issue asks of each resource: the spot group, the launch template and its user data, the
bucket, Redis and the autoscaler Lambda, read from the parsed configuration."""

from __future__ import annotations

import subprocess

from tfconfig import (
    CONFIGS,
    ROOT,
    ROOT_CONFIG,
    first,
    one,
    render_user_data,
)

# ---- fleet ---------------------------------------------------------------------------------------


def test_group_is_spot_price_capacity_optimized_from_zero_with_rebalance():
    group = one(CONFIGS["fleet"], "aws_autoscaling_group", "workers")
    assert group["min_size"] == 0 and group["desired_capacity"] == 0
    assert group["capacity_rebalance"] is True
    assert group["vpc_zone_identifier"] == "${var.subnet_ids}"
    assert "desired_capacity" in first(group["lifecycle"])["ignore_changes"]  # the autoscaler owns it
    policy = first(group["mixed_instances_policy"])
    distribution = first(policy["instances_distribution"])
    assert distribution["spot_allocation_strategy"] == "price-capacity-optimized"
    assert distribution["on_demand_percentage_above_base_capacity"] == 0
    override = first(first(policy["launch_template"])["dynamic"])["override"]
    assert override["for_each"] == "${var.instance_types}"
    types = ROOT_CONFIG["variable"]["instance_types"]["default"]
    assert len(types) >= 3 and len({t.split(".")[0] for t in types}) >= 2  # several GPU families
    subnets = ROOT_CONFIG["variable"]["subnet_ids"]["validation"][0]["condition"]
    assert "length(var.subnet_ids) >= 2" in subnets


def test_terminating_lifecycle_hook_gives_the_worker_time():
    hook = first(one(CONFIGS["fleet"], "aws_autoscaling_group", "workers")["initial_lifecycle_hook"])
    assert hook["lifecycle_transition"] == "autoscaling:EC2_INSTANCE_TERMINATING"
    assert hook["default_result"] == "CONTINUE"
    assert hook["heartbeat_timeout"] == "${var.drain_timeout_s}"


def test_launch_template_requires_imdsv2_and_encrypts_the_root_volume():
    template = one(CONFIGS["fleet"], "aws_launch_template", "worker")
    metadata = first(template["metadata_options"])
    assert metadata["http_tokens"] == "required" and metadata["http_put_response_hop_limit"] == 1
    ebs = first(first(template["block_device_mappings"])["ebs"])
    assert ebs["encrypted"] is True
    assert template["image_id"] == "${data.aws_ssm_parameter.ami.insecure_value}"
    assert CONFIGS["fleet"]["data"][("aws_ssm_parameter", "ami")]["name"] == "${var.ami_ssm_parameter}"
    assert ROOT_CONFIG["variable"]["ami_ssm_parameter"]["default"].startswith("/aws/service/")
    assert "network_interfaces" not in template  # no public IP: workers sit in private subnets


def test_user_data_installs_freight_and_starts_freight_worker():
    template = one(CONFIGS["fleet"], "aws_launch_template", "worker")
    assert template["user_data"] == "${base64encode(local.user_data)}"
    assert "templatefile(" in CONFIGS["fleet"]["locals"]["user_data"]
    rendered = render_user_data()
    assert rendered.startswith("#!/bin/bash\n")
    exec_start = [line for line in rendered.splitlines() if line.startswith("ExecStart=")]
    assert (
        exec_start[0] == "ExecStart=/opt/freight/venv/bin/freight worker --concurrency 1 --queues freight.m"
    )
    assert rendered.index("pip install") < rendered.index("systemctl enable --now freight-worker.service")
    assert "complete-lifecycle-action" in rendered  # the drain service finishes the hook


def test_user_data_is_valid_bash_and_python(tmp_path):
    rendered = render_user_data()
    script = tmp_path / "user_data.sh"
    script.write_text(rendered)
    result = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    python = rendered.split("<<'PY'\n")[1].split("\nPY\n")[0]
    compile(python, "user_data:python", "exec")


def test_user_data_holds_no_secret():
    template = (ROOT / "modules" / "fleet" / "user_data.sh.tftpl").read_text()
    fleet = (ROOT / "modules" / "fleet" / "main.tf").read_text()
    assert "secretsmanager get-secret-value" in template and "ssm get-parameter" in template
    for leak in ("random_password", "auth_token", ".result", "password"):
        assert leak not in fleet and leak not in template, leak
    settings = one(CONFIGS["fleet"], "aws_ssm_parameter", "settings")
    assert settings["type"] == "SecureString"


# ---- storage -------------------------------------------------------------------------------------


def test_bucket_is_private_encrypted_owner_enforced_and_versioned():
    storage = CONFIGS["storage"]
    block = one(storage, "aws_s3_bucket_public_access_block", "this")
    assert all(
        block[k] is True
        for k in ("block_public_acls", "block_public_policy", "ignore_public_acls", "restrict_public_buckets")
    )
    owner = first(one(storage, "aws_s3_bucket_ownership_controls", "this")["rule"])
    assert owner["object_ownership"] == "BucketOwnerEnforced"
    assert (
        first(one(storage, "aws_s3_bucket_versioning", "this")["versioning_configuration"])["status"]
        == "Enabled"
    )
    sse = first(
        first(one(storage, "aws_s3_bucket_server_side_encryption_configuration", "this")["rule"])[
            "apply_server_side_encryption_by_default"
        ]
    )
    assert sse["sse_algorithm"] == "aws:kms"
    all_resources = [k for c in [ROOT_CONFIG, *CONFIGS.values()] for k in c["resource"]]
    assert not [
        r for r in all_resources if r[0] in ("aws_s3_bucket_acl", "aws_s3_bucket_website_configuration")
    ]


def test_bucket_policy_only_denies():
    policy = CONFIGS["storage"]["data"][("aws_iam_policy_document", "tls_only")]
    for statement in policy["statement"]:
        assert statement["effect"] == "Deny"


def test_bucket_lifecycle_aborts_uploads_and_expires_partial_checkpoints():
    rules = {
        r["id"]: r for r in one(CONFIGS["storage"], "aws_s3_bucket_lifecycle_configuration", "this")["rule"]
    }
    abort = first(rules["abort-incomplete-multipart-uploads"]["abort_incomplete_multipart_upload"])
    assert abort["days_after_initiation"] >= 1
    partial = rules["expire-partial-checkpoints"]
    assert first(first(partial["filter"])["tag"]) == {"key": "freight-partial", "value": "true"}
    assert first(partial["expiration"])["days"] == "${var.partial_expiry_days}"
    assert all(r["status"] == "Enabled" for r in rules.values())


# ---- queue ---------------------------------------------------------------------------------------


def test_redis_is_encrypted_authenticated_and_never_evicts():
    queue = CONFIGS["queue"]
    group = one(queue, "aws_elasticache_replication_group", "this")
    assert group["at_rest_encryption_enabled"] is True and group["transit_encryption_enabled"] is True
    assert group["auth_token"] == "${random_password.auth.result}"
    assert group["automatic_failover_enabled"] is True
    params = first(one(queue, "aws_elasticache_parameter_group", "this")["parameter"])
    assert params == {"name": "maxmemory-policy", "value": "noeviction"}
    serverless = one(queue, "aws_elasticache_serverless_cache", "this")
    assert serverless["kms_key_id"] == "${var.kms_key_arn}"
    assert (
        one(queue, "aws_secretsmanager_secret_version", "auth")["secret_string"]
        == "${random_password.auth.result}"
    )
    assert ROOT_CONFIG["variable"]["queue_mode"]["default"] == "replication_group"


def test_autoscaler_lambda_is_scheduled_with_its_own_role():
    autoscaler = CONFIGS["autoscaler"]
    function = one(autoscaler, "aws_lambda_function", "this")
    assert function["role"] == "${aws_iam_role.this.arn}"
    assert function["handler"] == "jobs.autoscale.lambda_handler.handler"
    assert function["reserved_concurrent_executions"] == 1
    assert one(autoscaler, "aws_cloudwatch_event_target", "tick")["arn"] == "${aws_lambda_function.this.arn}"
    package = autoscaler["data"][("archive_file", "package")]
    assert package["type"] == "zip"
    env = first(function["environment"])["variables"]
    assert env["FREIGHT_AUTOSCALE_GROUP"] == "${var.group_name}"
    assert "FREIGHT_REDIS_URL" not in env  # the token stays in Secrets Manager
