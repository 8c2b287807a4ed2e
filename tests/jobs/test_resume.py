"""A real `freight run` subprocess killed mid-job: the rerun keeps committed shards, recomputes none of
them, and leaves exactly one row per input row. SIGTERM stops gracefully (partial rows, exit 143 = 128 + SIGTERM)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.dataset as ds
import pytest
from pipeline_data import prompts_table, write_parquet
from typer.testing import CliRunner

from freight_cli import app

ROWS, SHARD_ROWS = 40, 4


def _args(data: Path, model: Path, out: Path) -> list[str]:
    return ["run", str(data), "--model", str(model), "--output", str(out), "--id-column", "id",
            "--max-tokens", "8", "--temperature", "0.8", "--shard-rows", str(SHARD_ROWS)]  # fmt: skip


def _start(args: list[str]) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-c", "from freight_cli import main; main()", *args]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=dict(os.environ))


def _stop_after_commits(
    tmp_path: Path, model: Path, commits: int, stop: signal.Signals
) -> tuple[Path, Path, subprocess.Popen[bytes]]:
    """Start `freight run` on ROWS rows in a subprocess, send it `stop` once `commits` shards are
    committed; (input, OUT, the process)."""
    data = write_parquet(prompts_table(ROWS), tmp_path / "in.parquet")
    out = tmp_path / "out"
    proc = _start(_args(data, model, out))
    _wait_for_commits(proc, out, commits)
    proc.send_signal(stop)
    return data, out, proc


def _wait_for_commits(proc: subprocess.Popen[bytes], out: Path, n: int, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while len(list((out / "shards").glob("*.parquet"))) < n:
        if proc.poll() is not None:
            pytest.fail(
                f"freight run exited early ({proc.returncode}): {proc.stderr.read().decode()[-2000:]}"
            )
        if time.monotonic() > deadline:
            proc.kill()
            pytest.fail("no shard committed in time")
        time.sleep(0.02)


def _check_complete(out: Path, committed_before: dict[str, bytes]) -> None:
    assert (out / "_SUCCESS").exists()
    for name, data in committed_before.items():  # never recomputed: the very same bytes
        assert (out / "shards" / name).read_bytes() == data
    ids = (
        ds.dataset(out / "shards")
        .to_table()
        .column("id")
        .to_pylist()
    )
    assert sorted(ids) == [f"row-{i:04d}" for i in range(ROWS)]  # no duplicate, none missing
    report = json.loads((out / "cost.json").read_text())
    assert report["rows"] == ROWS and len(report["shards"]) == ROWS // SHARD_ROWS
    assert list((out / "partial").glob("**/*.parquet")) == [] if (out / "partial").exists() else True


def test_resume_after_kill_keeps_committed_shards(tmp_path: Path, demo_model_dir: Path) -> None:
    data, out, proc = _stop_after_commits(tmp_path, demo_model_dir, 2, signal.SIGKILL)
    proc.wait(timeout=30)
    assert not (out / "_SUCCESS").exists()
    committed = {p.name: p.read_bytes() for p in (out / "shards").iterdir() if p.is_file()}
    assert 2 <= len([n for n in committed if n.endswith(".parquet")]) < ROWS // SHARD_ROWS

    status = CliRunner().invoke(app, ["status", str(out)])
    assert status.exit_code == 0 and "incomplete" in status.output
    so_far = CliRunner().invoke(app, ["cost", str(out)])
    assert so_far.exit_code == 0 and "not finalized" in so_far.output

    result = CliRunner().invoke(app, _args(data, demo_model_dir, out))
    assert result.exit_code == 0, result.output
    _check_complete(out, committed)
    report = json.loads((out / "cost.json").read_text())
    resumed = [s for s in report["shards"] if f"{s['shard']:05d}.parquet" not in committed]
    assert resumed and all(s["worker"].endswith(f":{os.getpid()}") for s in resumed)  # only the rest ran here


@pytest.mark.slow  # a second subprocess; run_shard's interruption is covered in test_shard.py
def test_sigterm_saves_partial_rows_and_the_rerun_uses_them(tmp_path: Path, demo_model_dir: Path) -> None:
    data, out, proc = _stop_after_commits(tmp_path, demo_model_dir, 1, signal.SIGTERM)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 143, stderr.decode()[-2000:]
    assert "rerun the same command to resume" in stderr.decode()
    committed = {p.name: p.read_bytes() for p in (out / "shards").iterdir() if p.is_file()}
    waste = list((out / "waste").glob("*.json"))
    assert len(waste) == 1 and json.loads(waste[0].read_text())["reason"] == "interrupted"

    result = CliRunner().invoke(app, _args(data, demo_model_dir, out))
    assert result.exit_code == 0, result.output
    _check_complete(out, committed)
    report = json.loads((out / "cost.json").read_text())
    assert report["uncommitted_attempts"] == 1 and report["wasted_cost_usd"] >= 0
    assert report["cost_usd"] == pytest.approx(
        sum(s["cost_usd"] for s in report["shards"]) + json.loads(waste[0].read_text())["cost_usd"]
    )
