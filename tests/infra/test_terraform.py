"""Structural checks of infra/terraform, read with python-hcl2 (Terraform can't download providers
here, so `terraform validate` can't run; these tests stand in for the parts of it that matter):
parsing, module wiring, variables, references, IAM scope."""

from __future__ import annotations

import re

import pytest
from tfconfig import (
    CONFIGS,
    MODULES,
    ROOT,
    ROOT_CONFIG,
    TF_FILES,
    module_config,
    parse,
    policy_statements,
    source_without_comments,
)

# Actions that support no resource-level permission: the only ones allowed on Resource "*".
UNSCOPED_ACTIONS = {
    "autoscaling:DescribeAutoScalingGroups",
    "cloudwatch:PutMetricData",
    "ec2:DescribeNetworkInterfaces",
    "ec2:DescribeSubnets",
    "ecr:GetAuthorizationToken",
}


@pytest.mark.parametrize("path", TF_FILES, ids=[str(p.relative_to(ROOT)) for p in TF_FILES])
def test_every_tf_file_parses(path):
    assert isinstance(parse(path), dict)


def test_root_module_composes_the_small_modules():
    assert {"kms", "storage", "queue", "iam", "fleet", "autoscaler", "api"} <= set(CONFIGS)
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
    meta = ("source", "depends_on", "providers", "count", "for_each")
    call = {k for k in ROOT_CONFIG["module"][module] if k not in meta}
    variables = CONFIGS[module]["variable"]
    assert call - set(variables) == set(), f"module {module} is passed undeclared arguments"
    required = {n for n, b in variables.items() if "default" not in b}
    assert required - call == set(), f"module {module} misses required arguments"


# ---- IAM -----------------------------------------------------------------------------------------


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


# ---- examples and style ----------------------------------------------------------------------------


def test_example_tfvars_sets_declared_variables_including_the_required_ones():
    example = parse(ROOT / "terraform.tfvars.example")
    declared = ROOT_CONFIG["variable"]
    assert set(example) <= set(declared)
    required = {n for n, b in declared.items() if "default" not in b}
    assert required <= set(example)
