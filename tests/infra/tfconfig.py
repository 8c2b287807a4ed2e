"""python-hcl2 view of infra/terraform shared by the structural tests: each module's blocks by kind."""

from __future__ import annotations

import re
from pathlib import Path

import hcl2

ROOT = Path(__file__).resolve().parents[2] / "infra" / "terraform"
MODULES = sorted(p for p in (ROOT / "modules").iterdir() if p.is_dir())
TF_FILES = sorted(ROOT.rglob("*.tf"))
OPTIONS = hcl2.SerializationOptions(with_comments=False, explicit_blocks=False, strip_string_quotes=True)


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


def policy_statements():
    for module, config in CONFIGS.items():
        for (rtype, name), body in config["data"].items():
            if rtype == "aws_iam_policy_document":
                for statement in body.get("statement", []):
                    yield f"{module}.{name}", statement
                for dynamic in body.get("dynamic", []):  # statements made per for_each value
                    for statement in dynamic.get("statement", {}).get("content", []):
                        yield f"{module}.{name}", statement
