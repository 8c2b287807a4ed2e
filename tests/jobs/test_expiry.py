"""Completion windows, embedded: a job past its deadline stops at the next engine step, keeps and bills
its committed rows once, ends "expired" (exit 4, status, cost.json); a rerun of the same command runs
only the missing shards. Bad lifecycle flags are refused with one line and nothing written."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pyarrow.dataset as ds
import pytest
from openai_check import parse_errors, parse_output
from pipeline_data import prompts_table, write_parquet
from typer.testing import CliRunner

from freight_cli import app
from jobs.lifecycle import Lifecycle, parse_window
from jobs.settings import get_settings

ROWS, SHARD_ROWS = 24, 4


def _args(data: Path, model: Path, out: Path, *extra: str) -> list[str]:
    return ["run", str(data), "--model", str(model), "--output", str(out), "--id-column", "id",
            "--max-tokens", "8", "--shard-rows", str(SHARD_ROWS), *extra]  # fmt: skip


class _DueAfterCommits(Lifecycle):
    """A deadline that passes once `commits` shards are in, then `steps` engine steps later: the
    clock-free stand-in for a window ending mid-run (past_due is asked before every engine step)."""

    def past_due(self, now: float | None = None) -> bool:
        out = _OUT[0]
        if len(list((out / "shards").glob("*.parquet"))) < 2:
            return False
        _STEPS[0] += 1
        return _STEPS[0] > 3


_OUT: list[Path] = [Path()]
_STEPS = [0]


def _ids(out: Path) -> list[str]:
    table = ds.dataset(out / "shards", format="parquet", exclude_invalid_files=True).to_table()
    return table.column("id").to_pylist()


def test_expired_run_keeps_committed_rows_and_a_rerun_runs_only_the_rest(
    tmp_path: Path, demo_model_dir: Path
) -> None:
    from freight_cli.job_options import prepare_from_options
    from freight_cli.run_progress import run_with_progress

    data = write_parquet(prompts_table(ROWS), tmp_path / "in.parquet")
    out = tmp_path / "out"
    _OUT[0], _STEPS[0] = out, 0
    settings = get_settings()
    prepared = prepare_from_options(
        settings, input=str(data), model=str(demo_model_dir), output=str(out), prompt_column="prompt",
        id_column="id", continuation_column=None, max_tokens=8, temperature=0.0, top_p=1.0, top_k=0,
        seed=0, shard_rows=SHARD_ROWS, instance_type="cpu-local", market="on-demand",
        price_per_hour=None, prices=None, quantization=None,
    )  # fmt: skip
    code = run_with_progress(prepared, settings, _DueAfterCommits(deadline=time.time() + 3600))
    assert code == 4
    assert (out / "_EXPIRED").exists() and not (out / "_SUCCESS").exists()
    committed = {p.name: p.read_bytes() for p in (out / "shards").glob("*.parquet")}
    total = ROWS // SHARD_ROWS
    assert 2 <= len(committed) < total
    report = json.loads((out / "cost.json").read_text())
    assert report["state"] == "expired" and report["shards_missing"] == total - len(committed)
    ids = _ids(out)
    assert len(ids) == len(set(ids)) == report["rows"] == len(committed) * SHARD_ROWS  # once each
    assert report["cost_usd"] == pytest.approx(
        sum(s["cost_usd"] for s in report["shards"])
        + sum(json.loads(p.read_text())["cost_usd"] for p in (out / "waste").glob("*.json"))
    )  # committed shards + the stopped attempt (its partial rows included) are billed
    assert report["cost_usd"] > 0
    status = CliRunner().invoke(app, ["status", str(out)])
    assert status.exit_code == 0 and "expired" in status.output, status.output
    cost = CliRunner().invoke(app, ["cost", str(out)])
    assert cost.exit_code == 0 and "expired" in cost.output, cost.output
    listed = CliRunner().invoke(app, ["jobs", "--prefix", str(tmp_path), "--json"])
    assert listed.exit_code == 0, listed.output
    (row,) = json.loads(listed.output)
    assert row["state"] == "expired" and row["rows_done"] == report["rows"] and row["mode"] == "embedded"
    assert row["cost_usd"] == pytest.approx(report["cost_usd"]) and row["shards_committed"] == len(committed)
    # the OpenAI export of the expired job (no --partial: it will not complete): every request once,
    # the unrun ones in the error file as batch_expired, as OpenAI writes them
    exported = CliRunner().invoke(app, ["results", str(out), "--format", "openai", "--to", str(tmp_path / "o.jsonl")])
    assert exported.exit_code == 0, exported.output
    ok = [line for line, _ in parse_output(tmp_path / "o.jsonl")]  # the openai package's types
    bad = parse_errors(tmp_path / "o.errors.jsonl")
    assert sorted(x["custom_id"] for x in ok + bad) == [f"row-{i:04d}" for i in range(ROWS)]
    assert {x["custom_id"] for x in ok} == set(ids)
    assert {x["error"]["code"] for x in bad} == {"batch_expired"} and all(x["response"] is None for x in bad)

    rerun = CliRunner().invoke(app, _args(data, demo_model_dir, out))
    assert rerun.exit_code == 0, rerun.output
    assert (out / "_SUCCESS").exists() and not (out / "_EXPIRED").exists()
    for name, data_bytes in committed.items():  # never recomputed
        assert (out / "shards" / name).read_bytes() == data_bytes
    assert sorted(_ids(out)) == [f"row-{i:04d}" for i in range(ROWS)]
    final = json.loads((out / "cost.json").read_text())
    assert final["state"] == "succeeded" and final["rows"] == ROWS
    # a second job under the same prefix, newer: listed first; --state filters
    other = CliRunner().invoke(app, _args(data, demo_model_dir, tmp_path / "b" / "out2", "--max-tokens", "2"))
    assert other.exit_code == 0, other.output
    listed = json.loads(CliRunner().invoke(app, ["jobs", "--prefix", str(tmp_path), "--json"]).output)
    assert [r["output"] for r in listed] == [str(tmp_path / "b" / "out2"), str(out)]
    assert [r["state"] for r in listed] == ["succeeded", "succeeded"] and listed[1]["rows_done"] == ROWS
    none = CliRunner().invoke(app, ["jobs", "--prefix", str(tmp_path), "--json", "--state", "expired"])
    assert json.loads(none.output) == []
    table = CliRunner().invoke(app, ["jobs", "--prefix", str(tmp_path)], env={"COLUMNS": "200"})
    assert table.exit_code == 0 and final["job_id"] in table.output


def test_a_deadline_passing_stops_the_run_by_the_clock(tmp_path: Path, demo_model_dir: Path) -> None:
    """The real clock: a deadline already behind when the first engine step asks."""
    from freight_cli.job_options import prepare_from_options
    from freight_cli.run_progress import run_with_progress

    data = write_parquet(prompts_table(8), tmp_path / "in.parquet")
    out = tmp_path / "out"
    settings = get_settings()
    prepared = prepare_from_options(
        settings, input=str(data), model=str(demo_model_dir), output=str(out), prompt_column="prompt",
        id_column="id", continuation_column=None, max_tokens=8, temperature=0.0, top_p=1.0, top_k=0,
        seed=0, shard_rows=4, instance_type="cpu-local", market="on-demand",
        price_per_hour=None, prices=None, quantization=None,
    )  # fmt: skip
    lifecycle = Lifecycle(deadline=time.time() + 0.2)
    time.sleep(0.3)
    assert run_with_progress(prepared, settings, lifecycle) == 4
    report = json.loads((out / "cost.json").read_text())
    assert report["state"] == "expired" and report["rows"] == 0 and report["shards_missing"] == 2
    assert json.loads((out / "_EXPIRED").read_text())["deadline"] == pytest.approx(lifecycle.deadline)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--completion-window", "30s"], "under a minute"),
        (["--completion-window", "soon"], "is not a duration"),
        (["--deadline", "2001-01-01T00:00:00+00:00"], "not in the future"),
        (["--deadline", "20s"], "under a minute away"),
        (["--completion-window", "1h", "--deadline", "2h"], "not both"),
        (["--notify", "ftp://host/x"], "http(s)://"),
        (["--notify", "sns:not-an-arn"], "topic ARN"),
    ],
)
def test_bad_lifecycle_flags_are_refused_with_one_line(
    tmp_path: Path, demo_model_dir: Path, flags: list[str], message: str
) -> None:
    data = write_parquet(prompts_table(4), tmp_path / "in.parquet")
    out = tmp_path / "out"
    result = CliRunner().invoke(app, _args(data, demo_model_dir, out, *flags))
    assert result.exit_code == 2, result.output
    assert message in result.output and result.output.count("error:") == 1, result.output
    assert not out.exists()  # nothing written


def test_parse_window() -> None:
    assert parse_window("24h") == 86400 and parse_window("1h30m") == 5400 and parse_window("1m") == 60
    with pytest.raises(ValueError, match="under a minute"):
        parse_window("59s")
