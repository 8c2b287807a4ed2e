"""What the terraform binary checks offline, without providers: canonical fmt style, the root
variables' validations, templatefile() on the real user data, the worker policy's ARN locals."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from tfconfig import ROOT, render_user_data

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


@needs_terraform
def test_example_tfvars_in_canonical_style(tmp_path):
    example = tmp_path / "example.tfvars"  # fmt reads only .tf/.tfvars names
    shutil.copy(ROOT / "terraform.tfvars.example", example)
    result = terraform("fmt", "-check", "-diff", str(example), cwd=tmp_path)
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


@needs_terraform
@pytest.mark.parametrize(
    ("queues", "expected"),
    [
        ("[]", "--concurrency 1"),
        ('["freight-a", "freight-b"]', "--concurrency 1 --queues freight-a,freight-b"),
    ],
)
def test_worker_args_evaluate_as_intended(tmp_path, queues, expected):
    """The fleet's `freight worker` arguments, from the expression in modules/fleet/main.tf."""
    fleet_main = (ROOT / "modules" / "fleet" / "main.tf").read_text()
    expression = re.search(r"^\s+worker_args\s+=\s+(.+)$", fleet_main, re.M).group(1)
    (tmp_path / "main.tf").write_text(
        'variable "worker_queues" {\n  type = list(string)\n}\n\n'
        f'output "worker_args" {{\n  value = {expression}\n}}\n'
    )
    assert terraform("init", "-input=false", cwd=tmp_path).returncode == 0
    applied = terraform(
        "apply", "-input=false", "-auto-approve", "-var", f"worker_queues={queues}", cwd=tmp_path
    )
    assert applied.returncode == 0, applied.stderr
    assert terraform("output", "-raw", "worker_args", cwd=tmp_path).stdout == expected


@needs_terraform
def test_root_arns_evaluate_as_intended(tmp_path):
    """The group and log group ARNs that IAM and the key policy name, before those resources exist."""
    root_main = (ROOT / "main.tf").read_text()
    locals_block = re.search(r"^locals \{\n.*?^\}\n", root_main, re.S | re.M).group(0)
    locals_block = locals_block.replace("data.aws_partition.current.partition", '"aws"')
    locals_block = locals_block.replace("data.aws_caller_identity.current.account_id", '"123456789012"')
    (tmp_path / "main.tf").write_text(
        'variable "name" {\n  type = string\n}\n\nvariable "region" {\n  type = string\n}\n\n'
        + locals_block
        + "".join(f'output "{n}" {{\n  value = local.{n}\n}}\n' for n in ("group_arn", "log_group_arn"))
    )
    assert terraform("init", "-input=false", cwd=tmp_path).returncode == 0
    applied = terraform(
        "apply",
        "-input=false",
        "-auto-approve",
        "-var",
        "name=freight",
        "-var",
        "region=us-east-1",
        cwd=tmp_path,
    )
    assert applied.returncode == 0, applied.stderr
    values = json.loads(terraform("output", "-json", cwd=tmp_path).stdout)
    assert values["group_arn"]["value"] == (
        "arn:aws:autoscaling:us-east-1:123456789012:autoScalingGroup:*:autoScalingGroupName/freight-workers"
    )
    assert values["log_group_arn"]["value"] == (
        "arn:aws:logs:us-east-1:123456789012:log-group:/aws/lambda/freight-autoscaler"
    )


@needs_terraform
def test_api_container_command_is_a_freight_serve_invocation(tmp_path):
    """The api module's container command, as Terraform renders it and sh splits it: the flags exist on
    `freight serve` and say what the module means (the store's URL, the fleet's Redis over TLS)."""
    import shlex

    import typer

    from freight_cli import app

    module_main = (ROOT / "modules" / "api" / "main.tf").read_text()
    locals_block = re.search(r"^locals \{\n.*?^\}\n", module_main, re.S | re.M).group(0)
    locals_block = locals_block.replace("data.aws_partition.current.partition", '"aws"')
    locals_block = locals_block.replace("data.aws_caller_identity.current.account_id", '"123456789012"')
    (tmp_path / "main.tf").write_text(
        'variable "store" {\n  type = any\n}\n\nvariable "redis" {\n  type = any\n}\n\n'
        'variable "service" {\n  type = any\n}\n\n' + locals_block
        + 'output "serve_command" {\n  value = local.serve_command\n}\n'
    )  # fmt: skip
    (tmp_path / "test.tfvars.json").write_text(json.dumps({
        "store": {"bucket_name": "b", "bucket_arn": "arn:aws:s3:::b", "store_prefix": "api/", "model_prefixes": ["models/"]},
        "redis": {"host": "r.cache.amazonaws.com", "port": 6379},
        "service": {"serve_args": ["--max-upload", "100MiB", "--shard-rows", "128"]},
    }))  # fmt: skip
    assert terraform("init", "-input=false", cwd=tmp_path).returncode == 0
    applied = terraform("apply", "-input=false", "-auto-approve", "-var-file=test.tfvars.json", cwd=tmp_path)
    assert applied.returncode == 0, applied.stderr
    command = terraform("output", "-raw", "serve_command", cwd=tmp_path).stdout
    words = shlex.split(command.replace("${FREIGHT_REDIS_TOKEN}", "TOKEN"))  # as sh -c expands and splits it
    assert words[:3] == ["exec", "freight", "serve"]
    serve = typer.main.get_command(app).commands["serve"]  # type: ignore[attr-defined]
    params = serve.make_context("serve", words[3:]).params  # unknown or malformed flags raise here
    assert params["store"] == "s3://b/api" and params["host"] == "0.0.0.0" and params["port"] == 8000
    assert params["redis"] == "rediss://:TOKEN@r.cache.amazonaws.com:6379/0?ssl_cert_reqs=required"
    # every request is logged (the load balancer keeps no access log of its own)
    assert (params["max_upload"], params["shard_rows"], params["access_log"]) == ("100MiB", 128, True)
