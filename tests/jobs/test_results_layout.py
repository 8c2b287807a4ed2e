"""OUT/shards/ holds Parquet only (the records are in OUT/costs/), so pandas, pyarrow.dataset and DuckDB
read it with no flags; a job written by the layout before (records in OUT/shards/<n>.json) still
reports, resumes and finalizes, and leaves OUT/shards/ Parquet-only when it does."""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import pandas as pd
import pyarrow.dataset as ds
from freight_runner import freight_ok
from pipeline_data import prompts_table, write_parquet

ROWS, SHARD_ROWS = 6, 2


def _run_args(data: Path, model: Path, out: Path) -> list[str]:
    return ["run", str(data), "--model", str(model), "--output", str(out), "--id-column", "id",
            "--max-tokens", "3", "--shard-rows", str(SHARD_ROWS)]  # fmt: skip


def _read_with_standard_readers(shards: Path) -> list[list[str]]:
    """The ids, sorted, as pandas, pyarrow.dataset and DuckDB read the folder, each with no flags."""
    by_pandas = pd.read_parquet(shards)["id"].tolist()
    by_arrow = ds.dataset(shards).to_table().column("id").to_pylist()
    with duckdb.connect() as con:
        by_duckdb = [r[0] for r in con.execute(f"select id from read_parquet('{shards}/*.parquet')").fetchall()]
    return [sorted(by_pandas), sorted(by_arrow), sorted(by_duckdb)]


def _check_new_layout(out: Path) -> None:
    n = ROWS // SHARD_ROWS
    assert sorted(p.name for p in (out / "shards").iterdir()) == [f"{i:05d}.parquet" for i in range(n)]
    assert sorted(p.name for p in (out / "costs").iterdir()) == [f"{i:05d}.json" for i in range(n)]
    assert {p.name for p in out.iterdir()} == {"manifest.json", "lifecycle.json", "shards", "costs", "cost.json", "_SUCCESS"}
    ids = [f"row-{i:04d}" for i in range(ROWS)]
    assert _read_with_standard_readers(out / "shards") == [ids, ids, ids]


def _to_old_layout(out: Path) -> None:
    """OUT as the layout before OUT/costs/ wrote it: each record beside its Parquet file."""
    for record in (out / "costs").iterdir():
        record.rename(out / "shards" / record.name)
    (out / "costs").rmdir()


def test_old_layout_job_reports_resumes_and_finalizes(tmp_path: Path, demo_model_dir: Path) -> None:
    data = write_parquet(prompts_table(ROWS), tmp_path / "in.parquet")
    out = tmp_path / "out"
    args = _run_args(data, demo_model_dir, out)
    freight_ok(args)
    _check_new_layout(out)
    finished = json.loads((out / "cost.json").read_text())
    for shard in finished["shards"]:
        assert json.loads((out / "costs" / f"{shard['shard']:05d}.json").read_text()) == shard

    _to_old_layout(out)  # a finished job of the old layout: reports and exports
    (out / "cost.json").unlink()  # so `freight cost` builds a report over the old records
    assert json.loads(freight_ok(["cost", str(out), "--json"]))["shards"] == finished["shards"]
    assert "row-0000" in freight_ok(["results", str(out), "--head", "2"])
    freight_ok(["results", str(out), "--format", "openai", "--to", str(tmp_path / "o.jsonl")])
    assert len((tmp_path / "o.jsonl").read_text().splitlines()) == ROWS - 3  # rows 1, 3, 5 failed

    for name in ("_SUCCESS", "shards/00002.parquet", "shards/00002.json"):
        (out / name).unlink()  # as if a job of the shards/*.json record layout stopped before shard 2
    old = out / "shards" / "00000.json"
    record = json.loads(old.read_text())
    record["worker"] = "old-layout-worker"  # so the reports below show they read this very object
    old.write_text(json.dumps(record))
    committed = {name: (out / "shards" / name).read_bytes() for name in ("00000.parquet", "00001.parquet")}

    status = freight_ok(["status", str(out)])
    assert "incomplete" in status and "2 / 3" in status
    provisional = json.loads(freight_ok(["cost", str(out), "--json"]))
    assert [s["shard"] for s in provisional["shards"]] == [0, 1]
    assert provisional["shards"][0]["worker"] == "old-layout-worker"

    freight_ok(args)  # the same command resumes the old job: only shard 2 runs
    assert not (out / "waste").exists()  # no attempt lost a commit race to a shard already done
    for name, data_before in committed.items():
        assert (out / "shards" / name).read_bytes() == data_before  # recognised as done, not recomputed
    report = json.loads((out / "cost.json").read_text())
    assert (out / "_SUCCESS").exists() and report["rows"] == ROWS
    assert [s["shard"] for s in report["shards"]] == [0, 1, 2]
    assert report["shards"][0]["worker"] == "old-layout-worker"  # finalize read the old record
    # finalize moved the old records: OUT/shards/ is Parquet only, and opens with no flags
    _check_new_layout(out)
    assert json.loads((out / "costs" / "00000.json").read_text())["worker"] == "old-layout-worker"
    assert "complete" in freight_ok(["status", str(out)])
    assert json.loads(freight_ok(["cost", str(out), "--json"])) == report
