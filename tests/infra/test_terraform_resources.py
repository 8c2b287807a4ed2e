"""What the deployment requires of each resource: the spot group, the launch template and its user data, the
bucket, Redis, the autoscaler Lambda and the API service, read from the parsed configuration."""

from __future__ import annotations

import re
import subprocess

from tfconfig import (
    CONFIGS,
    ROOT,
    ROOT_CONFIG,
    first,
    one,
    policy_statements,
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


# ---- api (freight serve) ---------------------------------------------------------------------------


def test_api_is_off_by_default_and_wired_behind_one_variable():
    assert ROOT_CONFIG["variable"]["api"]["default"] is None
    call = ROOT_CONFIG["module"]["api"]
    assert call["count"] == "${var.api == null ? 0 : 1}"
    assert call["redis"] == "${module.queue.connection}"
    assert call["network"] == "${merge(var.api, {vpc_id = var.vpc_id, private_subnet_ids = var.subnet_ids})}"
    # the fleet runs the API's batches: it reads and writes under the API's store prefix
    assert ROOT_CONFIG["module"]["iam"]["write_prefixes"] == "${concat(var.write_prefixes, local.api_prefixes)}"
    assert "module.api[0].task_security_group_id" in ROOT_CONFIG["module"]["queue"]["client_security_group_ids"]
    assert ROOT_CONFIG["module"]["kms"]["log_group_arns"] == ["${local.log_group_arn}", "${local.api_log_group_arn}"]
    assert call["log_group_name"] == "${local.api_log_group_name}"


def test_api_tasks_are_private_behind_an_https_load_balancer():
    api = CONFIGS["api"]
    service = one(api, "aws_ecs_service", "this")
    network = first(service["network_configuration"])
    assert network["subnets"] == "${var.network.private_subnet_ids}" and network["assign_public_ip"] is False
    assert service["launch_type"] == "FARGATE"
    lb = one(api, "aws_lb", "this")
    assert lb["subnets"] == "${var.network.public_subnet_ids}" and lb["drop_invalid_header_fields"] is True
    (listener,) = [body for (rtype, _), body in api["resource"].items() if rtype == "aws_lb_listener"]
    assert (listener["port"], listener["protocol"]) == (443, "HTTPS")  # no plain-HTTP listener at all
    assert listener["certificate_arn"] == "${var.service.certificate_arn}"
    assert listener["ssl_policy"].startswith("ELBSecurityPolicy-TLS13")
    assert first(one(api, "aws_lb_target_group", "this")["health_check"])["path"] == "/health"
    # the tasks take traffic from the load balancer only; the load balancer reaches the tasks only
    ingress = [body for (rtype, _), body in api["resource"].items() if rtype == "aws_vpc_security_group_ingress_rule"]
    into_tasks = [r for r in ingress if r["security_group_id"] == "${aws_security_group.task.id}"]
    assert [r["referenced_security_group_id"] for r in into_tasks] == ["${aws_security_group.lb.id}"]
    assert one(api, "aws_vpc_security_group_egress_rule", "lb_to_tasks")["referenced_security_group_id"] == (
        "${aws_security_group.task.id}")  # fmt: skip


def test_api_secrets_come_from_secrets_manager_and_keys_are_stored_as_hashes():
    from jobs.api.keys import KEY_PREFIX, KeyRecord
    from jobs.api.layout import KEYS_PREFIX

    api = CONFIGS["api"]
    container = one(api, "aws_ecs_task_definition", "this")["container_definitions"]
    assert 'secrets = [{name = "FREIGHT_REDIS_TOKEN", valueFrom = var.redis.auth_secret_arn}]' in container
    assert "readonlyRootFilesystem = true" in container
    assert "$${FREIGHT_REDIS_TOKEN}" in (ROOT / "modules" / "api" / "main.tf").read_text()  # sh expands it, Terraform not
    # a key as `freight keys create` makes it: fk- and 43 URL-safe characters, in a KMS-encrypted secret
    password = one(api, "random_password", "key")
    assert (password["length"], password["special"]) == (43, False)
    version = one(api, "aws_secretsmanager_secret_version", "key")
    assert version["secret_string"] == KEY_PREFIX + "${random_password.key[each.key].result}"
    assert one(api, "aws_secretsmanager_secret", "key")["kms_key_id"] == "${var.store.kms_key_arn}"
    # the store holds the key's record at keys/<sha256>.json, the fields KeyRecord reads
    record = one(api, "aws_s3_object", "key")
    digest = "sha256(aws_secretsmanager_secret_version.key[each.key].secret_string)"
    assert record["key"] == "${var.store.store_prefix}" + KEYS_PREFIX + "${" + digest + "}.json"
    fields = set(re.findall(r"(\w+) = ", record["content"]))
    required = {n for n, f in KeyRecord.model_fields.items() if f.is_required()}
    assert required <= fields <= set(KeyRecord.model_fields)
    assert f"key_id = substr({digest}, 0, 12)" in record["content"]


def test_api_roles_touch_only_the_store_the_models_and_the_redis_token():
    statements = {}
    for where, statement in policy_statements():
        if where.startswith("api."):
            statements[(where, statement.get("sid"))] = statement
    task = {sid: s for (where, sid), s in statements.items() if where == "api.task"}
    assert set(task) == {"ListStoreAndModels", "ReadWriteStore", "ReadModels", "UseDeploymentKeyThroughS3"}
    assert task["ReadWriteStore"]["resources"] == ["${local.store_object}"]
    assert CONFIGS["api"]["locals"]["store_object"] == "${var.store.bucket_arn}/${var.store.store_prefix}*"
    assert not any(a.startswith("secretsmanager:") for s in task.values() for a in s["actions"])  # keys: hashes only
    execution = {sid: s for (where, sid), s in statements.items() if where == "api.execution"}
    assert execution["ReadRedisToken"]["resources"] == ["${var.redis.auth_secret_arn}"]
    assert {a for s in execution.values() for a in s["actions"]} <= {
        "logs:CreateLogStream", "logs:PutLogEvents", "secretsmanager:GetSecretValue", "kms:Decrypt",
        "ecr:BatchGetImage", "ecr:GetDownloadUrlForLayer", "ecr:GetAuthorizationToken",
    }  # fmt: skip
