"""Every user error of `freight run` exits non-zero with one clear line and writes nothing under OUT."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pyarrow as pa
import pytest
from pipeline_data import prompts_table, write_parquet
from typer.testing import CliRunner

from freight_cli import app
from jobs.settings import Settings, get_settings


def _run(args: list[str]) -> tuple[int, str]:
    result = CliRunner().invoke(app, args)
    return result.exit_code, result.output


@pytest.fixture
def dataset(tmp_path: Path) -> Path:
    return write_parquet(prompts_table(8), tmp_path / "in.parquet")


def _case(tmp_path: Path, demo_model_dir: Path, dataset: Path, case: str) -> tuple[list[str], str]:
    out = str(tmp_path / "out")

    def job(data: Path, *options: str, model: Path = demo_model_dir, output: str = out) -> list[str]:
        return [str(data), "--model", str(model), "--output", output, *options]

    if case == "missing input":
        return job(tmp_path / "nope.parquet"), "does not exist"
    if case == "not parquet":
        bad = tmp_path / "notes.parquet"
        bad.write_text("hello, not parquet")
        return job(bad), "not a readable Parquet file"
    if case == "missing prompt column":
        return job(dataset, "--prompt-column", "text"), "columns: id, prompt"
    if case == "wrong column type":
        return job(write_parquet(pa.table({"prompt": [1, 2, 3]}), tmp_path / "ints.parquet")), "has type int64"
    if case == "empty dataset":
        return job(write_parquet(pa.table({"prompt": pa.array([], pa.string())}), tmp_path / "empty.parquet")), "empty"
    if case == "unknown model":
        return job(dataset, model=tmp_path / "no-model"), "config.json"
    if case in ("pickle-only model", "model without weights", "broken config.json"):
        broken = tmp_path / "broken-model"
        broken.mkdir()
        (broken / "config.json").write_text("{not json" if case == "broken config.json" else "{}")
        if case == "pickle-only model":
            (broken / "pytorch_model.bin").write_bytes(b"\x80\x02pickle")
        expected = {
            "pickle-only model": "refuses to load",
            "model without weights": "no safetensors weights",
            "broken config.json": "not valid JSON",
        }[case]
        return job(dataset, model=broken), expected
    if case == "bad option":
        return job(dataset, "--max-tokens", "0"), "--max-tokens 0: input should be greater than or equal to 1"
    if case == "unknown instance type":
        return job(dataset, "--instance-type", "z9.huge"), "--price-per-hour"
    if case == "unsupported url":
        return job(dataset, output="gs://bucket/out"), "only local paths and s3://"
    if case == "not jsonl":  # one bad line is that row's error; no good line refuses the file
        p = tmp_path / "batch.jsonl"
        p.write_text("id,prompt\nnot json\n")
        return job(p), "is an OpenAI-Batch request; line 1: not JSON"
    if case == "jsonl with column flags":
        p = tmp_path / "batch.jsonl"
        p.write_text('{"custom_id": "a", "body": {"prompt": "hi"}}\n')
        return job(p, "--id-column", "key"), "drop --id-column"
    raise AssertionError(case)


CASES = [
    "missing input",
    "not parquet",
    "missing prompt column",
    "wrong column type",
    "empty dataset",
    "unknown model",
    "pickle-only model",
    "model without weights",
    "broken config.json",
    "bad option",
    "unknown instance type",
    "not jsonl",
    "jsonl with column flags",
    "unsupported url",
]


@pytest.mark.parametrize("case", CASES)
def test_user_errors_exit_nonzero_with_one_line_and_write_nothing(
    case: str, tmp_path: Path, demo_model_dir: Path, dataset: Path
) -> None:
    args, expected = _case(tmp_path, demo_model_dir, dataset, case)
    code, output = _run(["run", *args])
    assert code == 2, output
    lines = [line for line in output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), output
    assert expected in output
    assert not (tmp_path / "out").exists()


def test_out_of_another_job_is_refused_naming_the_difference(
    tmp_path: Path, demo_model_dir: Path, dataset: Path
) -> None:
    from jobs.planner import prepare_job
    from jobs.spec import JobSpec, SamplingSpec

    out = tmp_path / "out"
    spec = JobSpec(
        input=str(dataset), model=str(demo_model_dir), output=str(out), sampling=SamplingSpec(max_tokens=4)
    )
    prepare_job(spec)
    before = sorted(p.name for p in out.iterdir())
    manifest = (out / "manifest.json").read_bytes()
    code, output = _run(
        ["run", str(dataset), "--model", str(demo_model_dir), "--output", str(out), "--max-tokens", "5"]
    )
    assert code == 2
    assert "--max-tokens was 4, now 5" in output and len(output.strip().splitlines()) == 1
    assert (
        sorted(p.name for p in out.iterdir()) == before and (out / "manifest.json").read_bytes() == manifest
    )
    assert json.loads(manifest)["job_id"] == spec.job_id


def test_status_of_a_folder_without_a_job(tmp_path: Path) -> None:
    code, output = _run(["status", str(tmp_path)])
    assert code == 2 and "holds no freight job" in output


@pytest.mark.parametrize(
    ("env", "expected"),
    [({"FREIGHT_SUBMIT_REDIS_RETRY_S": "-1"}, "FREIGHT_SUBMIT_REDIS_RETRY_S='-1': input should be greater"),
     ({"FREIGHT_NOTIFY_REDELIVER_GRACE_S": "soon"}, "FREIGHT_NOTIFY_REDELIVER_GRACE_S='soon': input should be a valid number")],
)  # fmt: skip
def test_a_bad_setting_is_one_line_naming_the_variable(
    env: dict[str, str], expected: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    get_settings.cache_clear()
    try:
        code, output = _run(["status", str(tmp_path)])
    finally:
        monkeypatch.undo()
        get_settings.cache_clear()
    _one_error_line(code, output, expected)
    assert "fix or unset it" in output


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _one_error_line(code: int, output: str, expected: str) -> None:
    assert code == 2, output
    lines = [line for line in output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and expected in lines[0], output


S3_CASES = {
    "bucket missing": ("s3://no-such-bucket/out", {}, "bucket 'no-such-bucket' does not exist"),
    "endpoint unreachable": ("s3://freight-test/out", {"FREIGHT_S3_ENDPOINT_URL": "CLOSED"}, "cannot reach http://127.0.0.1:"),
    "no credentials": (
        "s3://freight-test/out",
        {"AWS_ACCESS_KEY_ID": None, "AWS_SECRET_ACCESS_KEY": None, "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent",
         "AWS_CONFIG_FILE": "/nonexistent", "AWS_EC2_METADATA_DISABLED": "true"},
        "no AWS credentials",
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(S3_CASES))
@pytest.mark.parametrize("command", ["run", "status", "cost", "results"])
def test_s3_problems_are_one_line(
    case: str, command: str, s3_env: Settings, monkeypatch: pytest.MonkeyPatch, demo_model_dir: Path, dataset: Path
) -> None:  # fmt: skip
    import boto3

    out, env, expected = S3_CASES[case]
    out = out.replace("/out", f"/{case.replace(' ', '-')}-{command}/out")
    monkeypatch.setattr(boto3, "DEFAULT_SESSION", None)  # a session caches the credentials it found
    for key, value in env.items():
        if value is None:
            monkeypatch.delenv(key, raising=False)
        else:  # a port nothing listens on: connection refused at once
            monkeypatch.setenv(key, f"http://127.0.0.1:{_free_port()}" if value == "CLOSED" else value)
    get_settings.cache_clear()
    args = [command, out]
    if command == "run":
        args = ["run", str(dataset), "--model", str(demo_model_dir), "--output", out, "--max-tokens", "2"]
    code, output = _run(args)
    _one_error_line(code, output, expected)


def test_s3_input_in_a_missing_bucket(s3_env: Settings, tmp_path: Path, demo_model_dir: Path) -> None:
    code, output = _run(["run", "s3://no-such-bucket/in.parquet", "--model", str(demo_model_dir),
                         "--output", str(tmp_path / "out")])  # fmt: skip
    _one_error_line(code, output, "bucket 'no-such-bucket' does not exist")
    assert not (tmp_path / "out").exists()


def test_output_naming_an_existing_file(tmp_path: Path, demo_model_dir: Path, dataset: Path) -> None:
    target = tmp_path / "results.parquet"
    target.write_bytes(b"keep me")
    code, output = _run(["run", str(dataset), "--model", str(demo_model_dir), "--output", str(target)])
    _one_error_line(code, output, "is a file")
    assert target.read_bytes() == b"keep me"


def test_demo_model_refuses_a_file_and_a_non_empty_folder(tmp_path: Path) -> None:
    afile = tmp_path / "model"
    afile.write_text("notes")
    _one_error_line(*_run(["demo-model", str(afile)]), "is a file")
    assert afile.read_text() == "notes"
    folder = tmp_path / "checkpoint"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    _one_error_line(*_run(["demo-model", str(folder)]), "is not empty")
    assert [p.name for p in folder.iterdir()] == ["config.json"]
    empty = tmp_path / "empty"
    empty.mkdir()
    code, output = _run(["demo-model", str(empty)])
    assert code == 0, output
    assert (empty / "model.safetensors").is_file()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temp folder left


def test_truncated_weights_are_one_line(tmp_path: Path, demo_model_dir: Path, dataset: Path) -> None:
    import shutil

    model = tmp_path / "model"
    shutil.copytree(demo_model_dir, model)
    data = (model / "model.safetensors").read_bytes()
    (model / "model.safetensors").write_bytes(data[: len(data) - 1000])
    code, output = _run(["run", str(dataset), "--model", str(model), "--output", str(tmp_path / "out")])
    _one_error_line(code, output, "model.safetensors is truncated")
    assert not (tmp_path / "out").exists()
