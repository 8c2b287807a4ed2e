"""Every user error of `freight run` exits non-zero with one clear line and writes nothing under OUT."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest
from pipeline_data import prompts_table, write_parquet
from typer.testing import CliRunner

from jobs.cli import app


def _run(args: list[str]) -> tuple[int, str]:
    result = CliRunner().invoke(app, args)
    return result.exit_code, result.output


@pytest.fixture
def dataset(tmp_path: Path) -> Path:
    return write_parquet(prompts_table(8), tmp_path / "in.parquet")


def _case(tmp_path: Path, demo_model_dir: Path, dataset: Path, case: str) -> tuple[list[str], str]:
    out = str(tmp_path / "out")
    model = str(demo_model_dir)
    if case == "missing input":
        return [str(tmp_path / "nope.parquet"), "--model", model, "--output", out], "does not exist"
    if case == "not parquet":
        bad = tmp_path / "notes.parquet"
        bad.write_text("hello, not parquet")
        return [str(bad), "--model", model, "--output", out], "not a readable Parquet file"
    if case == "missing prompt column":
        return [
            str(dataset),
            "--model",
            model,
            "--output",
            out,
            "--prompt-column",
            "text",
        ], "columns: id, prompt"
    if case == "wrong column type":
        p = write_parquet(pa.table({"prompt": [1, 2, 3]}), tmp_path / "ints.parquet")
        return [str(p), "--model", model, "--output", out], "has type int64"
    if case == "empty dataset":
        p = write_parquet(pa.table({"prompt": pa.array([], pa.string())}), tmp_path / "empty.parquet")
        return [str(p), "--model", model, "--output", out], "empty"
    if case == "unknown model":
        return [str(dataset), "--model", str(tmp_path / "no-model"), "--output", out], "config.json"
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
        return [str(dataset), "--model", str(broken), "--output", out], expected
    if case == "bad option":
        return [str(dataset), "--model", model, "--output", out, "--max-tokens", "0"], "max_tokens"
    if case == "unknown instance type":
        return [
            str(dataset),
            "--model",
            model,
            "--output",
            out,
            "--instance-type",
            "z9.huge",
        ], "--price-per-hour"
    if case == "unsupported url":
        return [str(dataset), "--model", model, "--output", "gs://bucket/out"], "only local paths and s3://"
    if case == "bad jsonl":
        p = tmp_path / "batch.jsonl"
        p.write_text('{"custom_id": "a", "body": {"prompt": "hi"}}\nnot json\n')
        return [str(p), "--model", model, "--output", out], "line 2 is not JSON"
    if case == "jsonl with column flags":
        p = tmp_path / "batch.jsonl"
        p.write_text('{"custom_id": "a", "body": {"prompt": "hi"}}\n')
        return [str(p), "--model", model, "--output", out, "--id-column", "key"], "drop --id-column"
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
    "bad jsonl",
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
    assert "sampling.max_tokens: 4 != 5" in output and len(output.strip().splitlines()) == 1
    assert (
        sorted(p.name for p in out.iterdir()) == before and (out / "manifest.json").read_bytes() == manifest
    )
    assert json.loads(manifest)["job_id"] == spec.job_id


def test_status_of_a_folder_without_a_job(tmp_path: Path) -> None:
    code, output = _run(["status", str(tmp_path)])
    assert code == 2 and "holds no freight job" in output
