"""Fixtures for the fleet tests: a real Redis database of their own, and moto's AWS APIs."""

from __future__ import annotations

import os
from collections.abc import Iterator

import boto3
import pytest
import redis
from moto import mock_aws

from tests.redis_db import flushed_db

# DB 13 belongs to these tests; flushed before and after each one.
REDIS_URL = os.environ.get("FREIGHT_TEST_INFRA_REDIS_URL", "redis://127.0.0.1:6379/13")
REGION = "us-east-1"


@pytest.fixture
def redis_url() -> Iterator[str]:
    with flushed_db(REDIS_URL) as url:
        yield url


@pytest.fixture
def rdb(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    yield client
    client.close()


@pytest.fixture
def aws_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fake credentials and a region, so no test can ever reach a real account."""
    for name, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_SESSION_TOKEN": "testing",
        "AWS_DEFAULT_REGION": REGION,
        "AWS_REGION": REGION,
    }.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)


def _make_group(name: str = "freight-workers", max_size: int = 8, desired: int = 0) -> None:
    """A launch template and an Auto Scaling group like the Terraform fleet's, in moto."""
    ec2 = boto3.client("ec2", region_name=REGION)
    subnets = [s["SubnetId"] for s in ec2.describe_subnets()["Subnets"]][:2]
    template = ec2.create_launch_template(
        LaunchTemplateName=f"{name}-lt",
        LaunchTemplateData={"ImageId": "ami-12c6146b", "InstanceType": "g6.xlarge"},
    )["LaunchTemplate"]["LaunchTemplateId"]
    boto3.client("autoscaling", region_name=REGION).create_auto_scaling_group(
        AutoScalingGroupName=name,
        MinSize=0,
        MaxSize=max_size,
        DesiredCapacity=desired,
        VPCZoneIdentifier=",".join(subnets),
        MixedInstancesPolicy={
            "LaunchTemplate": {
                "LaunchTemplateSpecification": {"LaunchTemplateId": template, "Version": "$Latest"},
                "Overrides": [{"InstanceType": t} for t in ("g6.xlarge", "g5.xlarge", "g6e.xlarge")],
            },
            "InstancesDistribution": {
                "OnDemandBaseCapacity": 0,
                "OnDemandPercentageAboveBaseCapacity": 0,
                "SpotAllocationStrategy": "price-capacity-optimized",
            },
        },
        CapacityRebalance=True,
    )


@pytest.fixture
def aws(aws_env: None) -> Iterator[None]:
    with mock_aws():
        yield


@pytest.fixture
def make_group(aws: None):
    """Inside moto: a function that creates the group (`make_group(max_size=6, desired=2)`)."""
    return _make_group
