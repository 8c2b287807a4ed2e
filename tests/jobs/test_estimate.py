"""`freight estimate` against real runs: after `freight profile` the estimate of a job is within 15% of
its cost.json, and its token counts are the run's (the shared system prompt computed once, bad rows
counted as error rows with no tokens); `--max-cost` refuses a job over it with nothing written."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from pipeline_data import prompts_table, write_parquet
from typer.testing import CliRunner

from freight_cli import app

ROWS, SHARD_ROWS, MAX_TOKENS = 128, 32, 96


def _job(data: Path, model: Path) -> list[str]:
    return [str(data), "--model", str(model), "--max-tokens", str(MAX_TOKENS), "--shard-rows", str(SHARD_ROWS)]


def _freight(*args: str) -> str:
    cmd = [sys.executable, "-c", "from freight_cli import main; main()", *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ), timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def _estimate(data: Path, model: Path) -> dict:
    result = CliRunner().invoke(app, ["estimate", *_job(data, model), "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.output.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def small_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The "small" demo checkpoint (~4M parameters): the tiny one's job is all model load and
    process start, so its engine time would be noise next to them."""
    from worker.demo_model import make_demo_model

    return make_demo_model(tmp_path_factory.mktemp("small") / "model", size="small")


def test_estimate_counts_the_tokens_the_run_computes(tmp_path: Path, demo_model_dir: Path) -> None:
    """Token counts need no profile: the estimate's rows, bad rows, prompt tokens and prefix-cache
    reuse equal what the run's cost.json reports (the shared system prompt computed once)."""
    data = write_parquet(prompts_table(ROWS), tmp_path / "in.parquet")  # half share a system prompt; 3 bad
    est = _estimate(data, demo_model_dir)
    out = tmp_path / "out"
    _invoke("run", *_job(data, demo_model_dir), "--output", str(out))
    _assert_tokens_equal(est, json.loads((out / "cost.json").read_text()))


def _assert_tokens_equal(est: dict, report: dict) -> None:
    """The estimate's rows, bad rows and prompt tokens (the shared system prompt computed once) are the
    run's cost.json's, and its completion bound is max_tokens per good row."""
    assert est["rows"] == report["rows"] == ROWS and est["rows_bad"] == report["rows_failed"] == 3
    assert est["prompt_tokens"] == report["prompt_tokens"]
    assert est["computed_prompt_tokens"] == report["prompt_tokens"] - report["cached_tokens"]
    assert est["computed_prompt_tokens"] < est["prompt_tokens"] / 2  # the system prompt once, not 32 times
    assert est["max_completion_tokens"] == (ROWS - 3) * MAX_TOKENS


# Slow: it compares dollars, i.e. the wall time of a profiling process against a run's. On this shared
# 2-core machine a fresh process's model load alone has moved between 1.5 s and 9.5 s within one
# hour, so the comparison is a measurement, and measurements stay out of `make test`.
@pytest.mark.slow
def test_estimate_after_profile_is_within_15_percent_of_the_run(
    tmp_path: Path, small_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    demo_model_dir = small_model
    # one torch thread in the profile's and the job's processes: on a CPU shared with other busy
    # processes two spin-waiting threads make steps slower at random (EngineConfig.num_threads)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    data = write_parquet(prompts_table(ROWS), tmp_path / "in.parquet")  # half share a system prompt; 3 bad
    before = _estimate(data, demo_model_dir)
    assert before["confidence"] == "default"
    misses = []
    for attempt in range(2):  # a second profile + run only when the first pair missed (see below)
        profiled = _freight("profile", str(demo_model_dir))  # each step a fresh process, as a user runs them
        est = _estimate(data, demo_model_dir)
        assert est["confidence"] == "measured"
        out = tmp_path / f"out{attempt}"
        _freight("run", *_job(data, demo_model_dir), "--output", str(out))
        report = json.loads((out / "cost.json").read_text())
        _assert_tokens_equal(est, report)  # tokens: exactly what the run computed
        assert est["completion_tokens"] == pytest.approx(report["completion_tokens"], rel=0.15)
        # dollars: the target. Both sides are timings of separate processes on a CPU that other work
        # may share (model load alone moves by seconds between runs), so a miss is measured once
        # more with a fresh profile; two misses fail.
        if est["cost_usd"] == pytest.approx(report["cost_usd"], rel=0.15):
            return
        seen = {k: report[k] for k in ("billed_seconds", "load_seconds", "busy_seconds", "prefill_seconds",
                                       "decode_seconds", "completion_tokens")}  # fmt: skip
        shown = {k: est[k] for k in ("cost_usd", "engine_seconds", "billed_seconds", "completion_tokens")}
        misses.append((shown, report["cost_usd"], seen, profiled))
    pytest.fail(f"estimate off by more than 15% twice: {misses}")

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


def test_estimate_takes_runs_sampling_and_task_flags(tmp_path: Path, demo_model_dir: Path) -> None:
    """`estimate` reads the job as `run` would with the same flags: --n 3 expects three choices per
    row, and a bad flag is refused naming it."""
    data = write_parquet(prompts_table(8), tmp_path / "in.parquet")
    one = _estimate(data, demo_model_dir)
    three = json.loads(_invoke("estimate", *_job(data, demo_model_dir), "--n", "3", "--json").splitlines()[-1])
    assert three["prompt_tokens"] == one["prompt_tokens"]
    assert three["max_completion_tokens"] == 3 * one["max_completion_tokens"]
    bad = CliRunner().invoke(app, ["estimate", *_job(data, demo_model_dir), "--presence-penalty", "3"])
    assert bad.exit_code == 2 and "--presence-penalty" in bad.output, bad.output


def _invoke(*args: str) -> str:
    result = CliRunner().invoke(app, list(args))
    assert result.exit_code == 0, result.output
    return result.output


def test_estimate_of_an_embed_job_counts_input_tokens_only(tmp_path: Path, demo_model_dir: Path) -> None:
    import shutil

    from worker.demo_model import add_pooling_config

    model = add_pooling_config(shutil.copytree(demo_model_dir, tmp_path / "model"))
    data = write_parquet(prompts_table(8), tmp_path / "in.parquet")
    gen = json.loads(_invoke("estimate", *_job(data, model), "--json").splitlines()[-1])
    emb = json.loads(_invoke("estimate", *_job(data, model), "--task", "embed", "--json").splitlines()[-1])
    assert gen["completion_tokens"] > 0 and gen["max_completion_tokens"] > 0
    assert emb["completion_tokens"] == emb["max_completion_tokens"] == 0
    assert emb["prompt_tokens"] == gen["prompt_tokens"] and emb["rows"] == gen["rows"]
    assert emb["computed_prompt_tokens"] == emb["prompt_tokens"]  # embeddings keep no prefix cache


def test_a_profile_fits_the_stop_rate_only_from_jobs_of_one_uniform_max_tokens(
    tmp_path: Path, demo_model_dir: Path
) -> None:
    """n > 1 (job-wide or a column) or JSONL bodies ask for token counts the report does not hold:
    such a finished job refines the rates, never the stop estimate."""
    import pyarrow as pa

    from jobs.planner import prepare_job
    from jobs.profile_store import fit_profile
    from jobs.spec import JobSpec, SamplingSpec

    plain = write_parquet(pa.table({"prompt": ["a b", "c d"]}), tmp_path / "plain.parquet")
    with_n = write_parquet(pa.table({"prompt": ["a b", "c d"], "n": [1, 3]}), tmp_path / "n.parquet")
    report = {"state": "succeeded", "rows": 2, "rows_failed": 0, "prompt_tokens": 40, "cached_tokens": 0,
              "completion_tokens": 64, "prefill_seconds": 0.1, "decode_seconds": 0.4, "busy_seconds": 0.5,
              "billed_seconds": 1.5, "load_seconds": 0.8, "shards": [{}]}  # fmt: skip

    def profile(data: Path, n: int, name: str) -> object:
        spec = JobSpec(input=str(data), model=str(demo_model_dir), output=str(tmp_path / name),
                       sampling=SamplingSpec(max_tokens=64, n=n))  # fmt: skip
        return fit_profile(report, prepare_job(spec).manifest)

    fitted = profile(plain, 1, "a")
    assert fitted.stop_fraction == 0.5 and fitted.decode_tokens_per_s == 160  # 64 of 2 x 64 tokens
    for data, n, name in ((plain, 2, "b"), (with_n, 1, "c")):
        neutral = profile(data, n, name)
        assert neutral.stop_fraction == 1.0 and neutral.stop_hazard == 0.0
        assert neutral.decode_tokens_per_s == fitted.decode_tokens_per_s
