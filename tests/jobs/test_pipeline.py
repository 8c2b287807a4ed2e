"""End-to-end `freight run` on the demo model: local folders, S3 over HTTP (moto), OpenAI-Batch JSONL."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.dataset as ds
import pytest
from freight_runner import freight
from pipeline_data import prompts_table, write_parquet

from jobs.settings import Settings
from jobs.storage import open_store

DESIGN_COST_KEYS = {
    "job_id",
    "rows",
    "rows_failed",
    "prompt_tokens",
    "cached_tokens",
    "completion_tokens",
    "busy_seconds",
    "wall_seconds",
    "instance_type",
    "market",
    "price_per_hour",
    "cost_usd",
    "usd_per_million_input_tokens",
    "usd_per_million_output_tokens",
    "tokens_per_second",
    "cache_hit_rate",
    "on_demand_cost_usd",
    "wasted_cost_usd",
    "shards",
}
RESULT_COLUMNS = [
    "id",
    "completion",
    "finish_reason",
    "prompt_tokens",
    "cached_tokens",
    "completion_tokens",
    "error",
    "endpoint",
    "completions",
    "finish_reasons",
    "logprobs",
    "embedding",
    "parsed",
    "parsed_choices",
    "reasoning",
    "reasoning_tokens",
    "reasoning_choices",
    "tool_calls",
    "tool_calls_choices",
    "cached",
    "cached_from_job",
    "cached_from_row",
    "cached_similarity",
    "response_fields",
    "adapter",
]


def check_cost_report(
    report: dict, results_rows: list[dict], n_shards: int, attempts_usd: float = 0.0
) -> None:
    """cost.json has the design's keys and its sums agree with the shard records and the result rows."""
    assert set(report) >= DESIGN_COST_KEYS
    shards = report["shards"]
    assert sorted(s["shard"] for s in shards) == list(range(n_shards))
    assert report["rows"] == len(results_rows) == sum(s["rows"] for s in shards)
    assert report["rows_failed"] == sum(r["finish_reason"] == "error" for r in results_rows)
    ran = [r for r in results_rows if r["finish_reason"] != "error"]  # refused rows cost no tokens
    for key in ("prompt_tokens", "cached_tokens", "completion_tokens"):
        assert report[key] == sum(s[key] for s in shards) == sum(r[key] for r in ran)
    assert report["busy_seconds"] == pytest.approx(sum(s["busy_seconds"] for s in shards))
    assert report["prefill_seconds"] + report["decode_seconds"] == pytest.approx(report["busy_seconds"])
    assert report["cost_usd"] == pytest.approx(sum(s["cost_usd"] for s in shards) + attempts_usd, rel=1e-9)
    assert report["cost_usd"] > 0 and report["on_demand_cost_usd"] >= report["cost_usd"] - 1e-12
    for s in shards:
        assert s["cost_usd"] == pytest.approx(s["billed_seconds"] * s["price_per_hour"] / 3600)
    assert report["cache_hit_rate"] == pytest.approx(report["cached_tokens"] / report["prompt_tokens"])
    # the cost split by engine time: prefill prices the input tokens, decode the output tokens
    assert report["input_cost_usd"] + report["output_cost_usd"] == pytest.approx(report["cost_usd"])
    assert report["input_cost_usd"] == pytest.approx(
        report["cost_usd"] * report["prefill_seconds"] / report["busy_seconds"]
    )
    assert report["usd_per_million_input_tokens"] == pytest.approx(
        report["input_cost_usd"] / report["prompt_tokens"] * 1e6
    )
    assert report["usd_per_million_output_tokens"] == pytest.approx(
        report["output_cost_usd"] / report["completion_tokens"] * 1e6
    )


def test_local_job_end_to_end(tmp_path: Path, demo_model_dir: Path) -> None:
    data = write_parquet(prompts_table(40), tmp_path / "in.parquet")
    out = tmp_path / "out"
    args = [
        "run",
        str(data),
        "--model",
        str(demo_model_dir),
        "--output",
        str(out),
        "--id-column",
        "id",
        "--max-tokens",
        "4",
        "--shard-rows",
        "8",
        "--temperature",
        "0.7",
        "--seed",
        "3",
    ]
    code, output = freight(args)
    assert code == 0, output
    assert (out / "_SUCCESS").exists() and (out / "cost.json").exists() and (out / "manifest.json").exists()

    manifest = json.loads((out / "manifest.json").read_text())
    table = ds.dataset(out / "shards").to_table()
    assert table.column_names == RESULT_COLUMNS
    rows = table.to_pylist()
    assert sorted(r["id"] for r in rows) == [f"row-{i:04d}" for i in range(40)]
    for shard in manifest["shards"]:  # rows keep input order within each shard
        got = ds.dataset(out / f"shards/{shard['index']:05d}.parquet").to_table().column("id").to_pylist()
        assert got == [f"row-{i:04d}" for s, e in shard["ranges"] for i in range(s, e)]
    by_id = {r["id"]: r for r in rows}
    for bad in ("row-0001", "row-0003", "row-0005"):  # null, empty, longer than the context
        assert by_id[bad]["finish_reason"] == "error" and by_id[bad]["completion"] is None
        assert "prompt" in by_id[bad]["error"]
    assert "context" in by_id["row-0005"]["error"]
    good = [r for r in rows if r["finish_reason"] != "error"]
    assert all(
        r["error"] is None and 1 <= r["completion_tokens"] <= 4 and r["prompt_tokens"] > 0 for r in good
    )
    assert sum(r["cached_tokens"] for r in good) > 0  # the shared system prefix hit the prefix cache

    report = json.loads((out / "cost.json").read_text())
    check_cost_report(report, rows, len(manifest["shards"]))
    assert report["job_id"] == manifest["job_id"] and report["instance_type"] == "cpu-local"
    for shard in report["shards"]:
        assert json.loads((out / f"costs/{shard['shard']:05d}.json").read_text()) == shard

    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    code, output = freight(args)  # same spec on a finished OUT: prints the existing result, changes nothing
    assert code == 0 and "already complete" in output
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before

    code, output = freight(["status", str(out)])
    assert code == 0 and "complete" in output and "40 / 40" in output
    code, output = freight(["cost", str(out), "--json"])
    assert code == 0 and json.loads(output) == report
    code, output = freight(["cost", str(out)])
    assert code == 0 and "$ / 1M input tokens" in output
    code, output = freight(["results", str(out), "--head", "3"])
    assert code == 0 and "row-00" in output
    code, _ = freight(["results", str(out), "--to", str(tmp_path / "all.jsonl")])
    lines = (tmp_path / "all.jsonl").read_text().splitlines()
    assert code == 0 and len(lines) == 40 and {json.loads(x)["id"] for x in lines} == set(by_id)
    code, _ = freight(["results", str(out), "--to", str(tmp_path / "all.parquet")])
    exported = ds.dataset(tmp_path / "all.parquet").to_table()
    assert (
        code == 0
        and exported.column_names == RESULT_COLUMNS
        and sorted(exported.column("id").to_pylist()) == sorted(by_id)
    )


def test_s3_job_end_to_end(tmp_path: Path, demo_model_dir: Path, s3_env: Settings) -> None:
    prefix = f"s3://freight-test/{tmp_path.name}"
    inputs = open_store(f"{prefix}/in", s3_env)
    local = write_parquet(prompts_table(20), tmp_path / "in.parquet")
    inputs.put("part-0.parquet", local.read_bytes())
    models = open_store(f"{prefix}/model", s3_env)
    for f in demo_model_dir.iterdir():
        models.put(f.name, f.read_bytes())

    def run(output: str, *options: str) -> tuple[int, str]:
        return freight(["run", f"{prefix}/in", "--model", f"{prefix}/model", "--output", f"{prefix}/{output}", *options])

    code, output = run("out", "--id-column", "id", "--max-tokens", "3", "--shard-rows", "6")
    assert code == 0, output
    out = open_store(f"{prefix}/out", s3_env)
    assert out.exists("_SUCCESS")
    from jobs.datasets import read_results

    rows = read_results(out).to_pylist()
    assert sorted(r["id"] for r in rows) == [f"row-{i:04d}" for i in range(20)]
    report = json.loads(out.get("cost.json"))
    check_cost_report(report, rows, len(report["shards"]))
    cached = list((s3_env.cache_dir / "models").iterdir())
    assert (
        len(cached) == 1
        and (cached[0] / "config.json").read_bytes() == (demo_model_dir / "config.json").read_bytes()
    )
    stamp = (cached[0] / "config.json").stat().st_mtime_ns  # .complete is stamped on every use
    code, output = run("out2", "--max-tokens", "1", "--shard-rows", "20")
    assert code == 0, output  # a second job on the same model: the cached copy, not a second download
    assert (
        list((s3_env.cache_dir / "models").iterdir()) == cached
        and (cached[0] / "config.json").stat().st_mtime_ns == stamp
    )


def test_openai_batch_jsonl_round_trips_custom_id(tmp_path: Path, demo_model_dir: Path) -> None:
    lines = [
        {
            "custom_id": "req-a",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {
                "messages": [
                    {"role": "system", "content": "Be brief."},
                    {"role": "user", "content": "sort a list"},
                ],
                "max_tokens": 2,
            },
        },
        {
            "custom_id": "req-b",
            "body": {"messages": [{"role": "user", "content": "reverse a string"}], "max_tokens": 5},
        },
        {"custom_id": "req-c", "body": {"messages": [{"role": "user", "content": "x"}], "max_tokens": -4}},
        {"custom_id": "req-d", "body": {}},
    ]
    path = tmp_path / "batch.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    out = tmp_path / "out"
    code, output = freight(
        ["run", str(path), "--model", str(demo_model_dir), "--output", str(out), "--max-tokens", "8"]
    )
    assert code == 0, output
    rows = {r["id"]: r for r in ds.dataset(out / "shards").to_table().to_pylist()}
    assert sorted(rows) == ["req-a", "req-b", "req-c", "req-d"]
    assert rows["req-a"]["completion_tokens"] <= 2 and rows["req-b"]["completion_tokens"] <= 5
    assert (
        rows["req-a"]["error"] is None and rows["req-a"]["prompt_tokens"] > 5
    )  # rendered through the template
    assert rows["req-c"]["finish_reason"] == "error" and "max_tokens" in rows["req-c"]["error"]
    assert rows["req-d"]["finish_reason"] == "error" and "messages" in rows["req-d"]["error"]


@pytest.mark.parametrize("quantization", ["int8", "fp8"])
def test_quantized_run(tmp_path: Path, demo_model_dir: Path, quantization: str) -> None:
    data = write_parquet(prompts_table(4, bad=False), tmp_path / "in.parquet")
    out = tmp_path / "out"
    code, output = freight(["run", str(data), "--model", str(demo_model_dir), "--output", str(out),
                            "--max-tokens", "2", "--quantization", quantization])  # fmt: skip
    assert code == 0, output
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["spec"]["quantization"] == quantization
    rows = ds.dataset(out / "shards").to_table().to_pylist()
    assert len(rows) == 4 and all(r["error"] is None and r["completion_tokens"] >= 1 for r in rows)


def test_price_table_and_overrides(tmp_path: Path, demo_model_dir: Path) -> None:
    data = write_parquet(prompts_table(4, bad=False), tmp_path / "in.parquet")
    prices = tmp_path / "prices.toml"
    prices.write_text('["my.box"]\non_demand = 3600.0\nspot = 1800.0\n')  # $1 and $0.5 per second
    out = tmp_path / "out"
    code, output = freight(["run", str(data), "--model", str(demo_model_dir), "--output", str(out), "--max-tokens", "1",
                            "--prices", str(prices), "--instance-type", "my.box", "--market", "spot"])  # fmt: skip
    assert code == 0, output
    report = json.loads((out / "cost.json").read_text())
    assert report["instance_type"] == "my.box" and report["market"] == "spot"
    assert report["cost_usd"] == pytest.approx(report["billed_seconds"] * 0.5)
    assert report["on_demand_cost_usd"] == pytest.approx(report["billed_seconds"] * 1.0)
    assert report["price_per_hour"] == pytest.approx(1800.0)

    out2 = tmp_path / "out2"
    code, output = freight(["run", str(data), "--model", str(demo_model_dir), "--output", str(out2), "--max-tokens", "1",
                            "--instance-type", "g5.xlarge", "--market", "spot", "--price-per-hour", "0.36"])  # fmt: skip
    assert code == 0, output
    report = json.loads((out2 / "cost.json").read_text())
    shard = report["shards"][0]
    assert (
        shard["price_per_hour"] == 0.36 and shard["on_demand_price_per_hour"] == 1.006
    )  # shipped g5.xlarge list price
