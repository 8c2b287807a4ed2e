"""Structural checks of infra/terraform, read with python-hcl2 (Terraform can't download providers
here, so `terraform validate` can't run; these tests stand in for the parts of it that matter)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import hcl2
import pytest

ROOT = Path(__file__).resolve().parents[2] / "infra" / "terraform"
MODULES = sorted(p for p in (ROOT / "modules").iterdir() if p.is_dir())
TF_FILES = sorted(ROOT.rglob("*.tf"))
OPTIONS = hcl2.SerializationOptions(with_comments=False, explicit_blocks=False, strip_string_quotes=True)
# Actions that support no resource-level permission: the only ones allowed on Resource "*".
UNSCOPED_ACTIONS = {
    "autoscaling:DescribeAutoScalingGroups",
    "cloudwatch:PutMetricData",
    "ec2:DescribeNetworkInterfaces",
    "ec2:DescribeSubnets",
}


def parse(path: Path) -> dict:
    with path.open() as f:
        return hcl2.load(f, serialization_options=OPTIONS)


def module_config(folder: Path) -> dict[str, dict]:
    """Blocks of one module by kind: resource/data keyed by (type, name); others by name."""
    config: dict[str, dict] = {k: {} for k in ("resource", "data", "variable", "output", "module", "locals")}
    for path in sorted(folder.glob("*.tf")):
        parsed = parse(path)
        for kind in ("resource", "data"):
            for block in parsed.get(kind, []):
                for rtype, named in block.items():
                    for name, body in named.items():
                        config[kind][(rtype, name)] = body
        for kind in ("variable", "output", "module"):
            for block in parsed.get(kind, []):
                config[kind].update(block)
        for block in parsed.get("locals", []):
            config["locals"].update(block)
    return config


ROOT_CONFIG = module_config(ROOT)
CONFIGS = {folder.name: module_config(folder) for folder in MODULES}


def one(config: dict, rtype: str, name: str) -> dict:
    return config["resource"][(rtype, name)]


def first(blocks: list[dict]) -> dict:
    assert len(blocks) == 1, blocks
    return blocks[0]


def source_without_comments(path: Path) -> str:
    return "\n".join(line for line in path.read_text().splitlines() if not line.lstrip().startswith("#"))


@pytest.mark.parametrize("path", TF_FILES, ids=[str(p.relative_to(ROOT)) for p in TF_FILES])
def test_every_tf_file_parses(path):
    assert isinstance(parse(path), dict)


def test_root_module_composes_the_small_modules():
    assert {"kms", "storage", "queue", "iam", "fleet", "autoscaler"} <= set(CONFIGS)
    assert {n: b["source"] for n, b in ROOT_CONFIG["module"].items()} == {
        n: f"./modules/{n}" for n in CONFIGS
    }


@pytest.mark.parametrize("folder", [ROOT, *MODULES], ids=["root", *[m.name for m in MODULES]])
def test_every_variable_has_description_and_type_and_every_output_a_description(folder):
    config = module_config(folder)
    for name, body in config["variable"].items():
        assert body.get("description", "").strip(), f"variable {name} has no description"
        assert body.get("type"), f"variable {name} has no type"
    for name, body in config["output"].items():
        assert body.get("description", "").strip(), f"output {name} has no description"


def test_root_variables_are_validated():
    for name, body in ROOT_CONFIG["variable"].items():
        if body["type"] in ("bool", "${bool}") or "map" in str(body["type"]):
            continue
        assert body.get("validation"), f"root variable {name} has no validation block"


@pytest.mark.parametrize("folder", [ROOT, *MODULES], ids=["root", *[m.name for m in MODULES]])
def test_references_resolve_within_each_module(folder):
    """var., local., module.X.Y, resource and data references all point at something declared."""
    config = module_config(folder)
    text = "\n".join(source_without_comments(p) for p in sorted(folder.glob("*.tf")))
    for name in set(re.findall(r"\bvar\.([a-z0-9_]+)", text)):
        assert name in config["variable"], f"{folder.name}: var.{name} is not declared"
    for name in set(re.findall(r"\blocal\.([a-z0-9_]+)", text)):
        assert name in config["locals"], f"{folder.name}: local.{name} is not defined"
    for module, output in set(re.findall(r"\bmodule\.([a-z0-9_]+)\.([a-z0-9_]+)", text)):
        assert output in CONFIGS[module]["output"], f"module.{module}.{output} is not an output"
    for rtype, name in set(re.findall(r"(?<![.\w])((?:aws|random)_[a-z0-9_]+)\.([a-z0-9_]+)[.\[]", text)):
        assert (rtype, name) in config["resource"], f"{folder.name}: {rtype}.{name} is not declared"
    for rtype, name in set(re.findall(r"\bdata\.([a-z0-9_]+)\.([a-z0-9_]+)", text)):
        assert (rtype, name) in config["data"], f"{folder.name}: data.{rtype}.{name} is not declared"


@pytest.mark.parametrize("module", sorted(ROOT_CONFIG["module"]))
def test_module_calls_match_module_variables(module):
    call = {k for k in ROOT_CONFIG["module"][module] if k not in ("source", "depends_on", "providers")}
    variables = CONFIGS[module]["variable"]
    assert call - set(variables) == set(), f"module {module} is passed undeclared arguments"
    required = {n for n, b in variables.items() if "default" not in b}
    assert required - call == set(), f"module {module} misses required arguments"


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


def render_user_data() -> str:
    """templatefile() as Terraform does it, with the variables the fleet module passes."""
    fleet_main = (ROOT / "modules" / "fleet" / "main.tf").read_text()
    passed = set(re.findall(r"^\s{4}(\w+)\s+=", fleet_main.split("templatefile(")[1].split("})")[0], re.M))
    template = (ROOT / "modules" / "fleet" / "user_data.sh.tftpl").read_text()
    used = set(re.findall(r"(?<!\$)\$\{(\w+)\}", template))
    assert used == passed, f"template variables {used ^ passed} are used but not passed, or passed but unused"
    values = {name: f"TEST_{name.upper()}" for name in used}
    values["worker_args"] = "--concurrency 1 --queues freight.m"
    values["stop_timeout_s"] = "270"
    rendered = re.sub(r"(?<!\$)\$\{(\w+)\}", lambda m: values[m.group(1)], template)
    return rendered.replace("$${", "${")


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


# ---- IAM -----------------------------------------------------------------------------------------


def policy_statements():
    for module, config in CONFIGS.items():
        for (rtype, name), body in config["data"].items():
            if rtype == "aws_iam_policy_document":
                for statement in body.get("statement", []):
                    yield f"{module}.{name}", statement


def test_no_wildcard_action_or_resource_where_a_narrower_one_exists():
    for where, statement in policy_statements():
        actions = statement.get("actions", [])
        if where == "kms.key":  # a key policy: "*" is the key itself (see the inline checkov skips)
            continue
        if statement.get("effect") == "Deny":
            continue
        for action in actions:
            assert "*" not in action, f"{where}: wildcard action {action}"
        resources = statement.get("resources", [])
        resources = [resources] if isinstance(resources, str) else resources  # an expression
        if "*" in resources:
            assert set(actions) <= UNSCOPED_ACTIONS, f"{where}: Resource '*' for {actions}"


def test_worker_role_touches_only_its_prefixes_and_secrets():
    worker = dict((s.get("sid"), s) for w, s in policy_statements() if w == "iam.worker")
    assert worker["WriteJobOutputs"]["resources"] == "${local.write_objects}"
    assert CONFIGS["iam"]["locals"]["write_objects"].startswith("${[for p in var.write_prefixes")
    assert worker["ReadRedisToken"]["resources"] == ["${var.redis_auth_secret_arn}"]
    assert worker["CompleteOwnTermination"]["resources"] == ["${var.group_arn}"]


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


# ---- examples and style ----------------------------------------------------------------------------


def test_example_tfvars_sets_declared_variables_including_the_required_ones():
    example = parse(ROOT / "terraform.tfvars.example")
    declared = ROOT_CONFIG["variable"]
    assert set(example) <= set(declared)
    required = {n for n, b in declared.items() if "default" not in b}
    assert required <= set(example)


# ---- with the terraform binary: what works offline, without providers -----------------------------

needs_terraform = pytest.mark.skipif(shutil.which("terraform") is None, reason="terraform is not installed")
# no version check against HashiCorp's servers: the machines reach package registries only
TF_ENV = {**os.environ, "CHECKPOINT_DISABLE": "1", "TF_IN_AUTOMATION": "1"}


def terraform(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["terraform", *args, "-no-color"], cwd=cwd, env=TF_ENV, capture_output=True, text=True, timeout=120
    )


@needs_terraform
def test_terraform_fmt_canonical_style():
    result = terraform("fmt", "-check", "-recursive", "-diff", str(ROOT), cwd=ROOT)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.fixture(scope="module")
def variables_only(tmp_path_factory) -> Path:
    """The root module's variables alone: Terraform evaluates their validations with no provider."""
    folder = tmp_path_factory.mktemp("variables")
    shutil.copy(ROOT / "variables.tf", folder / "variables.tf")
    shutil.copy(ROOT / "terraform.tfvars.example", folder / "example.tfvars")
    result = terraform("init", "-input=false", cwd=folder)
    assert result.returncode == 0, result.stderr
    return folder


@needs_terraform
def test_example_tfvars_pass_every_validation(variables_only):
    result = terraform("plan", "-input=false", "-var-file=example.tfvars", cwd=variables_only)
    assert result.returncode == 0, result.stderr


@needs_terraform
@pytest.mark.parametrize(
    ("var", "message"),
    [
        ('subnet_ids=["subnet-0123456789abcdef0"]', "at least two subnet ids"),
        ('instance_types=["m5.large","g6.xlarge"]', "at least two GPU instance types"),
        ("queue_mode=cluster", "queue_mode must be"),
        ("queue_replicas=0", "queue_replicas must be between 1 and 5"),
        ("name=Freight_Prod", "name must be 3-24 characters"),
        ('worker_environment={FREIGHT_REDIS_URL="redis://x"}', "FREIGHT_REDIS_URL is built at boot"),
        ('read_prefixes=["/datasets"]', "read_prefixes must be"),
        ("log_retention_days=10", "log_retention_days must be"),
        ("vpc_id=my-vpc", "vpc_id must look like"),
    ],
)
def test_bad_values_are_refused_with_a_message(variables_only, var, message):
    result = terraform("plan", "-input=false", "-var-file=example.tfvars", "-var", var, cwd=variables_only)
    assert result.returncode != 0
    assert message in " ".join(result.stderr.split()), result.stderr


@needs_terraform
def test_terraform_renders_user_data_to_valid_bash(tmp_path):
    """templatefile() by Terraform itself, on the real template, then `bash -n`."""
    template = tmp_path / "user_data.sh.tftpl"
    shutil.copy(ROOT / "modules" / "fleet" / "user_data.sh.tftpl", template)
    names = set(re.findall(r"(?<!\$)\$\{(\w+)\}", template.read_text()))
    values = {name: f"TEST_{name.upper()}" for name in names}
    values.update(worker_args="--concurrency 1 --queues freight.m", stop_timeout_s="270")
    args = ", ".join(f'{k} = "{v}"' for k, v in sorted(values.items()))
    (tmp_path / "main.tf").write_text(
        f'output "user_data" {{\n  value = templatefile("user_data.sh.tftpl", {{ {args} }})\n}}\n'
    )
    assert terraform("init", "-input=false", cwd=tmp_path).returncode == 0
    applied = terraform("apply", "-input=false", "-auto-approve", cwd=tmp_path)
    assert applied.returncode == 0, applied.stderr
    rendered = terraform("output", "-raw", "user_data", cwd=tmp_path).stdout
    assert rendered == render_user_data()  # the test's own renderer agrees with Terraform's
    (tmp_path / "user_data.sh").write_text(rendered)
    assert subprocess.run(["bash", "-n", str(tmp_path / "user_data.sh")]).returncode == 0


@needs_terraform
def test_worker_policy_arns_evaluate_as_intended(tmp_path):
    """The iam module's locals, evaluated by Terraform itself: object ARNs and list prefixes."""
    iam_main = (ROOT / "modules" / "iam" / "main.tf").read_text()
    locals_block = re.search(r"^locals \{\n.*?^\}\n", iam_main, re.S | re.M).group(0)
    shutil.copy(ROOT / "modules" / "iam" / "variables.tf", tmp_path / "variables.tf")
    outputs = "".join(
        f'output "{name}" {{\n  value = local.{name}\n}}\n'
        for name in ("read_objects", "write_objects", "list_prefixes")
    )
    (tmp_path / "main.tf").write_text(locals_block + outputs)
    (tmp_path / "test.tfvars").write_text(
        'name = "f"\nregion = "us-east-1"\nbucket_arn = "arn:aws:s3:::b"\n'
        'read_prefixes = ["datasets/", "models/"]\nwrite_prefixes = ["jobs/"]\n'
        'kms_key_arn = "k"\nredis_auth_secret_arn = "s"\nsettings_parameter_arn = "p"\ngroup_arn = "g"\n'
    )
    assert terraform("init", "-input=false", cwd=tmp_path).returncode == 0
    applied = terraform("apply", "-input=false", "-auto-approve", "-var-file=test.tfvars", cwd=tmp_path)
    assert applied.returncode == 0, applied.stderr
    values = json.loads(terraform("output", "-json", cwd=tmp_path).stdout)
    assert values["read_objects"]["value"] == [
        "arn:aws:s3:::b/datasets/*",
        "arn:aws:s3:::b/models/*",
        "arn:aws:s3:::b/jobs/*",
    ]
    assert values["write_objects"]["value"] == ["arn:aws:s3:::b/jobs/*"]
    assert values["list_prefixes"]["value"] == ["datasets/*", "models/*", "jobs/*"]
