"""`freight estimate` against real runs: after `freight profile` the estimate of a job is within 15% of
its cost.json, and its token counts are the run's (the shared system prompt computed once, bad rows
counted as error rows with no tokens); `--max-cost` refuses a job over it with nothing written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pipeline_data import prompts_table, write_parquet
from typer.testing import CliRunner

from jobs.cli import app

pytestmark = pytest.mark.usefixtures("shared_kernels")
ROWS, SHARD_ROWS, MAX_TOKENS = 64, 16, 64


def _job(data: Path, model: Path) -> list[str]:
    return [str(data), "--model", str(model), "--max-tokens", str(MAX_TOKENS), "--shard-rows", str(SHARD_ROWS)]


def _estimate(data: Path, model: Path) -> dict:
    result = CliRunner().invoke(app, ["estimate", *_job(data, model), "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.output.strip().splitlines()[-1])


def test_estimate_after_profile_is_within_15_percent_of_the_run(tmp_path: Path, demo_model_dir: Path) -> None:
    data = write_parquet(prompts_table(ROWS), tmp_path / "in.parquet")  # half share a system prompt; 3 bad
    before = _estimate(data, demo_model_dir)
    assert before["confidence"] == "default"
    profiled = CliRunner().invoke(app, ["profile", str(demo_model_dir)])
    assert profiled.exit_code == 0, profiled.output
    est = _estimate(data, demo_model_dir)
    assert est["confidence"] == "measured"
    out = tmp_path / "out"
    run = CliRunner().invoke(app, ["run", *_job(data, demo_model_dir), "--output", str(out)])
    assert run.exit_code == 0, run.output
    report = json.loads((out / "cost.json").read_text())
    # tokens: exactly what the run computed
    assert est["rows"] == report["rows"] == ROWS and est["rows_bad"] == report["rows_failed"] == 3
    assert est["prompt_tokens"] == report["prompt_tokens"]
    assert est["computed_prompt_tokens"] == report["prompt_tokens"] - report["cached_tokens"]
    assert est["computed_prompt_tokens"] < est["prompt_tokens"] / 2  # the system prompt once, not 32 times
    assert est["max_completion_tokens"] == (ROWS - 3) * MAX_TOKENS
    assert est["completion_tokens"] == pytest.approx(report["completion_tokens"], rel=0.15)
    # dollars: the target
    assert est["cost_usd"] == pytest.approx(report["cost_usd"], rel=0.15), (est, report)


def test_estimate_table_and_max_cost(tmp_path: Path, demo_model_dir: Path) -> None:
    data = write_parquet(prompts_table(8), tmp_path / "in.parquet")
    table = CliRunner().invoke(app, ["estimate", *_job(data, demo_model_dir)], env={"COLUMNS": "200"})
    assert table.exit_code == 0 and "default profile" in table.output and "8 (3)" in table.output, table.output
    out = tmp_path / "out"
    refused = CliRunner().invoke(app, ["run", *_job(data, demo_model_dir), "--output", str(out), "--max-cost", "0"])
    assert refused.exit_code == 2 and "--max-cost 0: the job is estimated at $" in refused.output, refused.output
    assert not out.exists()  # nothing written
    negative = CliRunner().invoke(app, ["run", *_job(data, demo_model_dir), "--output", str(out), "--max-cost", "-1"])
    assert negative.exit_code == 2 and negative.output.count("error") == 1 and "--max-cost" in negative.output
    assert not out.exists()
    ok = CliRunner().invoke(app, ["run", *_job(data, demo_model_dir), "--output", str(out), "--max-cost", "100"])
    assert ok.exit_code == 0, ok.output
