"""The cost report counts only the tokens of rows that ran, and prices input and output tokens by the
engine time each side took (prefill vs decode)."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.dataset as pads
import pytest
from pipeline_data import write_parquet
from typer.testing import CliRunner

from freight_cli import app
from jobs.cost import split_cost


def test_rows_refused_as_too_long_count_no_tokens(tmp_path: Path, demo_model_dir: Path) -> None:
    data = write_parquet(
        pa.table({"id": ["ok", "long"], "prompt": ["def f(x):", "word " * 5000]}), tmp_path / "in.parquet"
    )
    out = tmp_path / "out"
    args = ["run", str(data), "--model", str(demo_model_dir), "--output", str(out), "--max-tokens", "8", "--id-column", "id"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    rows = {r["id"]: r for r in pads.dataset(out / "shards")
            .to_table().to_pylist()}  # fmt: skip
    assert rows["long"]["finish_reason"] == "error" and rows["long"]["prompt_tokens"] > 2048  # shown on the row
    report = json.loads((out / "cost.json").read_text())
    assert report["prompt_tokens"] == rows["ok"]["prompt_tokens"]
    assert report["completion_tokens"] == rows["ok"]["completion_tokens"]
    assert report["tokens_per_second"] == pytest.approx(
        (rows["ok"]["prompt_tokens"] + rows["ok"]["completion_tokens"]) / report["busy_seconds"]
    )
    shard = json.loads((out / "costs" / "00000.json").read_text())
    assert shard["prompt_tokens"] == rows["ok"]["prompt_tokens"]
    # input + output cost = the whole cost, each side priced per its own tokens by its engine time
    assert report["prefill_seconds"] > 0 and report["decode_seconds"] > 0
    assert report["input_cost_usd"] + report["output_cost_usd"] == pytest.approx(report["cost_usd"])
    per_in, per_out = report["usd_per_million_input_tokens"], report["usd_per_million_output_tokens"]
    assert per_in * report["prompt_tokens"] / 1e6 + per_out * report["completion_tokens"] / 1e6 == pytest.approx(
        report["cost_usd"]
    )
    assert per_in < report["cost_usd"] / report["prompt_tokens"] * 1e6  # not the whole cost on one side


def test_split_cost_rule() -> None:
    assert split_cost(10.0, prefill_seconds=1.0, decode_seconds=3.0, computed_prompt=100, completion=5) == (
        pytest.approx(2.5),
        pytest.approx(7.5),
    )
    # records without timings (written before the split): by computed tokens
    assert split_cost(10.0, 0.0, 0.0, computed_prompt=30, completion=10) == (pytest.approx(7.5), pytest.approx(2.5))
    assert split_cost(0.0, 0.0, 0.0, 0, 0) == (0.0, 0.0)
