"""The Lambda package that Terraform deploys: built by infra/build_autoscaler.py, imported in a
Python that sees only the package and what the Lambda runtime provides (boto3), and run as Lambda
runs it, against real Redis (DB 13) and moto's server."""

from __future__ import annotations

import importlib.util
import json
import os
import runpy
import subprocess
import sys
from pathlib import Path

import boto3
import pytest
import redis
from moto.server import ThreadedMotoServer

from jobs.autoscale.config import AutoscaleConfig

REPO = Path(__file__).resolve().parents[2]
BUILD = REPO / "infra" / "build_autoscaler.py"
# What the AWS Lambda Python runtime ships beside the function's own code.
RUNTIME_PACKAGES = ["boto3", "botocore", "s3transfer", "jmespath", "dateutil", "six", "urllib3"]
GROUP = "freight-workers"


@pytest.fixture(scope="module")
def package(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("lambda") / "autoscaler"
    runpy.run_path(str(BUILD), run_name="build")["build"](out)
    return out


@pytest.fixture(scope="module")
def runtime(tmp_path_factory) -> Path:
    """A folder with links to the runtime's packages only (no pydantic, no typer, no torch)."""
    folder = tmp_path_factory.mktemp("runtime")
    for name in RUNTIME_PACKAGES:
        spec = importlib.util.find_spec(name)
        src = (
            Path(spec.submodule_search_locations[0]) if spec.submodule_search_locations else Path(spec.origin)
        )
        (folder / src.name).symlink_to(src)
    return folder


def run_isolated(code: str, package: Path, runtime: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    # -S: no site-packages; -I would also drop PYTHONPATH, so the path is set in the code itself
    prelude = f"import sys; sys.path[:0] = [{str(package)!r}, {str(runtime)!r}]\n"
    return subprocess.run(
        [sys.executable, "-S", "-c", prelude + code], capture_output=True, text=True, env=env, timeout=60
    )


def test_package_holds_only_what_the_handler_needs(package):
    files = {p.relative_to(package).as_posix() for p in package.rglob("*.py")}
    assert {"jobs/autoscale/lambda_handler.py", "jobs/log.py", "jobs/progress.py"} <= files
    assert not any(f.startswith(("worker/", "kernels/", "freight_cli/")) for f in files)
    assert not list(package.rglob("*.so"))
    build = json.loads((package / "BUILD.json").read_text())
    assert build["dependencies"] == {"redis": "8.1.0", "structlog": "26.1.0"}


def test_handler_imports_without_the_project_environment(package, runtime):
    code = (
        "import jobs.autoscale.lambda_handler as h, sys; print(h.handler.__name__, 'pydantic' in sys.modules)"
    )
    result = run_isolated(code, package, runtime, {"PATH": os.environ.get("PATH", "")})
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["handler", "False"]


def test_handler_ticks_against_redis_and_moto_server(package, runtime, redis_url, rdb, aws_env):
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        endpoint = f"http://{host}:{port}"
        ec2 = boto3.client("ec2", endpoint_url=endpoint)
        subnets = [s["SubnetId"] for s in ec2.describe_subnets()["Subnets"]][:2]
        template = ec2.create_launch_template(
            LaunchTemplateName="lt",
            LaunchTemplateData={"ImageId": "ami-12c6146b", "InstanceType": "g6.xlarge"},
        )["LaunchTemplate"]["LaunchTemplateId"]
        asg = boto3.client("autoscaling", endpoint_url=endpoint)
        asg.create_auto_scaling_group(
            AutoScalingGroupName=GROUP,
            MinSize=0,
            MaxSize=4,
            DesiredCapacity=0,
            VPCZoneIdentifier=",".join(subnets),
            LaunchTemplate={"LaunchTemplateId": template, "Version": "$Latest"},
        )
        rdb.sadd("freight:queues", "freight.tiny")
        rdb.rpush("freight.tiny", "s0", "s1", "s2")
        rdb.hset("freight:job:j", mapping={"state": "queued", "shards_queued": 3, "est_tokens_queued": 0})
        env = {
            "PATH": os.environ.get("PATH", ""),
            "AWS_ENDPOINT_URL": endpoint,
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": "us-east-1",
            "FREIGHT_REDIS_URL": redis_url,
            "FREIGHT_AUTOSCALE_GROUP": GROUP,
            "FREIGHT_AUTOSCALE_MAX_WORKERS": "4",
        }
        code = "import json; from jobs.autoscale.lambda_handler import handler; print(json.dumps(handler({}, None)))"
        result = run_isolated(code, package, runtime, env)
        assert result.returncode == 0, result.stderr
        summary = json.loads(result.stdout.strip().splitlines()[-1])
        assert (summary["desired"], summary["reason"], summary["queued_shards"]) == (3, "scale_out", 3)
        group = asg.describe_auto_scaling_groups(AutoScalingGroupNames=[GROUP])["AutoScalingGroups"][0]
        assert group["DesiredCapacity"] == 3
        metrics = boto3.client("cloudwatch", endpoint_url=endpoint).list_metrics(Namespace="Freight")[
            "Metrics"
        ]
        assert "QueuedShards" in {m["MetricName"] for m in metrics}
        assert '"event": "autoscale.tick"' in result.stderr  # JSON log lines for CloudWatch Logs
    finally:
        server.stop()


def test_redis_url_from_the_secret(aws):
    token = "Abc123" * 8
    sm = boto3.client("secretsmanager", region_name="us-east-1")
    arn = sm.create_secret(Name="freight/redis-auth", SecretString=token + "\n")["ARN"]
    config = AutoscaleConfig.from_env(
        {
            "FREIGHT_AUTOSCALE_GROUP": GROUP,
            "FREIGHT_REDIS_HOST": "master.freight-redis.abc.use1.cache.amazonaws.com",
            "FREIGHT_REDIS_AUTH_SECRET_ARN": arn,
        }
    )
    url = config.resolve_redis_url(sm)
    kwargs = redis.Redis.from_url(url).connection_pool.connection_kwargs
    assert kwargs["password"] == token
    assert kwargs["host"] == "master.freight-redis.abc.use1.cache.amazonaws.com" and kwargs["port"] == 6379
    assert kwargs["ssl_cert_reqs"] == "required"
    assert url.startswith("rediss://")


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({}, "FREIGHT_AUTOSCALE_GROUP"),
        ({"FREIGHT_AUTOSCALE_GROUP": "g"}, "no Redis"),
        (
            {
                "FREIGHT_AUTOSCALE_GROUP": "g",
                "FREIGHT_REDIS_URL": "redis://x",
                "FREIGHT_AUTOSCALE_MAX_WORKERS": "many",
            },
            "MAX_WORKERS",
        ),
        (
            {
                "FREIGHT_AUTOSCALE_GROUP": "g",
                "FREIGHT_REDIS_URL": "redis://x",
                "FREIGHT_AUTOSCALE_MIN_WORKERS": "9",
            },
            "max_workers",
        ),
        (
            {
                "FREIGHT_AUTOSCALE_GROUP": "g",
                "FREIGHT_REDIS_HOST": "h",
                "FREIGHT_REDIS_AUTH_SECRET_ARN": "a",
                "FREIGHT_REDIS_PORT": "x",
            },
            "PORT",
        ),
    ],
)
def test_config_errors_say_what_to_set(env, message):
    with pytest.raises(ValueError, match=message):
        AutoscaleConfig.from_env(env)
