"""`freight run` as a script sees it: the summary on stdout, logs and progress on stderr, exit 143 after
SIGTERM (130 after Ctrl-C), and counts that read right ("1 shard")."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from pipeline_data import prompts_table, write_parquet
from typer.testing import CliRunner

from freight_cli import app


def test_summary_on_stdout_logs_on_stderr(tmp_path: Path, demo_model_dir: Path) -> None:
    data = write_parquet(prompts_table(4, bad=False), tmp_path / "in.parquet")
    out = tmp_path / "out"
    env = {**os.environ, "FREIGHT_LOG_FORMAT": "json", "FREIGHT_LOG_LEVEL": "info"}
    cmd = [sys.executable, "-c", "from freight_cli import main; main()", "run", str(data), "--model",
           str(demo_model_dir), "--output", str(out), "--max-tokens", "2"]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.startswith("done: 4 rows (0 failed) in 1 shard, "), proc.stdout
    assert f"results: {out}/shards/" in proc.stdout
    assert '"event"' not in proc.stdout  # no log line on stdout
    assert '"event": "job_start"' in proc.stderr and "done:" not in proc.stderr


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_signal_stops_the_run_with_128_plus_its_number(
    signum: int, code: int, tmp_path: Path, demo_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import worker.local

    real = worker.local.run_local

    def signalled_run_local(*args: object, **kwargs: object) -> object:
        os.kill(os.getpid(), signum)  # delivered to freight's handler before the first shard starts
        return real(*args, **kwargs)

    monkeypatch.setattr(worker.local, "run_local", signalled_run_local)
    data = write_parquet(prompts_table(4, bad=False), tmp_path / "in.parquet")
    args = ["run", str(data), "--model", str(demo_model_dir), "--output", str(tmp_path / "out")]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == code, result.output
    assert "interrupted: 0 of 1 shard committed" in result.output
    assert "rerun the same command to resume" in result.output


def test_results_to_refuses_an_unfinished_job_unless_partial(tmp_path: Path, demo_model_dir: Path) -> None:
    data = write_parquet(prompts_table(6, bad=False), tmp_path / "in.parquet")
    out = tmp_path / "out"
    args = ["run", str(data), "--model", str(demo_model_dir), "--output", str(out), "--max-tokens", "2"]
    assert CliRunner().invoke(app, [*args, "--shard-rows", "2"]).exit_code == 0
    for name in ("_SUCCESS", "cost.json", "shards/00001.parquet", "costs/00001.json"):
        (out / name).unlink()  # as if shard 1 were still running
    export = tmp_path / "all.jsonl"
    refused = CliRunner().invoke(app, ["results", str(out), "--to", str(export)])
    assert refused.exit_code == 2, refused.output
    lines = [line for line in refused.output.splitlines() if line.strip()]
    assert len(lines) == 1 and "is not complete: 1 of 3 shards (2 of 6 rows) have no results yet" in lines[0]
    assert "--partial" in lines[0] and not export.exists()

    partial = CliRunner().invoke(app, ["results", str(out), "--to", str(export), "--partial"])
    assert partial.exit_code == 0, partial.output
    assert "warning: partial export: 1 of 3 shards (2 of 6 rows)" in partial.output
    assert len(export.read_text().splitlines()) == 4

    shown = CliRunner().invoke(app, ["results", str(out)])
    assert shown.exit_code == 0 and "note: job" in shown.output and "1 of 3 shards" in shown.output


def test_speculative_run_reports_acceptance(tmp_path: Path, demo_model_dir: Path) -> None:
    """`--speculative ngram`: the same completions as a plain run, and cost.json / the summary carry
    the proposed and accepted tokens."""
    import json
    import shutil

    import pyarrow.parquet as pq

    data = write_parquet(prompts_table(4, bad=False), tmp_path / "in.parquet")
    runs = {}
    for name, extra in (("plain", []), ("spec", ["--speculative", "ngram", "--speculative-tokens", "3"])):
        out = tmp_path / name
        args = ["run", str(data), "--model", str(demo_model_dir), "--output", str(out), "--max-tokens", "24", *extra]
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 0, result.output
        runs[name] = (out, result.output)
    completions = {n: pq.read_table(o / "shards").sort_by("id").column("completion").to_pylist() for n, (o, _) in runs.items()}
    assert completions["plain"] == completions["spec"]
    report = json.loads((runs["spec"][0] / "cost.json").read_text())
    assert report["spec_proposed_tokens"] >= report["spec_accepted_tokens"] >= 0
    assert report["shards"][0]["spec_proposed_tokens"] == report["spec_proposed_tokens"]
    assert report["spec_grammar_cut_tokens"] == report["shards"][0]["spec_grammar_cut_tokens"] == 0  # no constraint
    if report["spec_proposed_tokens"]:
        assert "speculation accepted" in runs["spec"][1]
    plain = json.loads((runs["plain"][0] / "cost.json").read_text())
    assert plain["spec_proposed_tokens"] == 0 and plain["spec_acceptance_rate"] is None
    refused = CliRunner().invoke(app, ["run", str(data), "--model", str(demo_model_dir), "--output",
                                       str(tmp_path / "bad"), "--speculative", "medusa"])  # fmt: skip
    assert refused.exit_code != 0 and "'ngram' or 'draft:PATH'" in refused.output
    other = tmp_path / "other-tokenizer"  # a draft with another tokenizer: refused before OUT is written
    shutil.copytree(demo_model_dir, other)
    tok = json.loads((other / "tokenizer.json").read_text())
    vocab = tok["model"]["vocab"]
    vocab["renamed"] = vocab.pop(next(t for t, i in vocab.items() if i == 100))
    (other / "tokenizer.json").write_text(json.dumps(tok))
    bad = CliRunner().invoke(app, ["run", str(data), "--model", str(demo_model_dir), "--output",
                                   str(tmp_path / "bad-draft"), "--speculative", f"draft:{other}"])  # fmt: skip
    assert bad.exit_code != 0 and "another tokenizer" in bad.output and not (tmp_path / "bad-draft").exists()
    good = CliRunner().invoke(app, ["run", str(data), "--model", str(demo_model_dir), "--output",
                                    str(tmp_path / "draft"), "--max-tokens", "8",
                                    "--speculative", f"draft:{demo_model_dir}"])  # fmt: skip
    assert good.exit_code == 0, good.output


def test_progress_counts_speculation_per_row() -> None:
    """run_shard's reporter, once it watches the engine's stats, hands each finished row the
    engine's proposed / accepted tokens since the previous row (their sum: the engine's totals); the progress bar and the JSON progress line show
    the acceptance once something was proposed, nothing before."""
    from types import SimpleNamespace

    from freight_cli.run_progress import _Counters
    from worker.shard import _RowReporter

    stats = SimpleNamespace(spec_proposed_tokens=10, spec_accepted_tokens=4)  # from earlier shards
    seen: list = []
    report = _RowReporter(seen.append, 3)
    report.watch(stats)
    row = SimpleNamespace(prompt_tokens=5, cached_tokens=1, completion_tokens=7, error=None)
    counters = _Counters()
    report(row)  # nothing proposed since the reporter started
    counters.add(seen[-1])
    assert counters.fields()["spec"] == "" and "spec_acceptance_rate" not in counters.log_fields()
    stats.spec_proposed_tokens, stats.spec_accepted_tokens = 30, 19
    report(row)
    stats.spec_proposed_tokens, stats.spec_accepted_tokens = 40, 20
    report(SimpleNamespace(prompt_tokens=5, cached_tokens=0, completion_tokens=0, error="too long"))
    for p in seen[1:]:
        counters.add(p)
    assert [(p.spec_proposed_tokens, p.spec_accepted_tokens) for p in seen] == [(0, 0), (20, 15), (10, 1)]
    assert seen[2].failed and seen[0].shard == 3
    assert counters.fields()["spec"] == "spec accepted 53%"  # 16 of 30
    assert counters.log_fields()["spec_acceptance_rate"] == 0.533
