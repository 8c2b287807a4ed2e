"""`--max-cost` on a rerun of a job that is partly done: only the shards not yet committed are
estimated and held to the cap, and a refusal says what the committed shards already cost; a job with
nothing left to run passes any cap."""

from __future__ import annotations

import json
from pathlib import Path

from freight_runner import freight
from pipeline_data import prompts_table, write_parquet

from freight_cli.job_estimate import estimate_manifest
from jobs.manifest import read_manifest
from jobs.settings import get_settings
from jobs.storage import open_store

ROWS, KEEP = 8, 2  # one row per shard; the first KEPT shards stay committed


def _run(data: Path, model: Path, out: Path, *extra: str) -> tuple[int, str]:
    args = ["run", str(data), "--model", str(model), "--output", str(out), "--max-tokens", "16", "--shard-rows", "1"]
    return freight([*args, *extra])


def _undo_shards(out: Path, keep: int) -> None:
    """Leave the job as an interrupted run leaves it: the first `keep` shards committed, no report."""
    for name in ("_SUCCESS", "cost.json"):
        (out / name).unlink()
    for index in range(keep, ROWS):
        (out / "shards" / f"{index:05d}.parquet").unlink()
        (out / "costs" / f"{index:05d}.json").unlink()


def test_a_resumed_job_is_held_to_the_cap_for_its_remaining_shards(tmp_path: Path, demo_model_dir: Path) -> None:
    data = write_parquet(prompts_table(ROWS, bad=False), tmp_path / "in.parquet")
    out = tmp_path / "out"
    code, output = _run(data, demo_model_dir, out)
    assert code == 0, output
    _undo_shards(out, KEEP)
    spent = sum(json.loads((out / "costs" / f"{i:05d}.json").read_text())["cost_usd"] for i in range(KEEP))
    manifest = read_manifest(open_store(str(out)))
    settings = get_settings()
    whole = estimate_manifest(manifest, settings).cost_usd
    rest = estimate_manifest(manifest.model_copy(update={"shards": manifest.shards[KEEP:]}), settings).cost_usd
    assert rest < whole

    code, output = _run(data, demo_model_dir, out, "--max-cost", repr(rest * 0.5))
    assert code == 2, output
    line = " ".join(output.split())
    assert f"the remaining work ({ROWS - KEEP} of {ROWS} shards, {ROWS - KEEP} rows) is estimated at ${rest:.6f}" in line
    assert f"already spent ${spent:.6f} on {KEEP} committed shards: raise the limit (it caps the work left)" in line
    assert not (out / "shards" / f"{KEEP:05d}.parquet").exists()  # refused: nothing ran

    code, output = _run(data, demo_model_dir, out, "--max-cost", repr((rest + whole) / 2))  # above the rest only
    assert code == 0, output
    assert (out / "_SUCCESS").exists()


def test_a_finished_job_reruns_under_any_cap(tmp_path: Path, demo_model_dir: Path) -> None:
    data = write_parquet(prompts_table(2, bad=False), tmp_path / "in.parquet")
    out = tmp_path / "out"
    assert _run(data, demo_model_dir, out)[0] == 0
    code, output = _run(data, demo_model_dir, out, "--max-cost", "0")
    assert code == 0, output  # nothing left to run costs nothing
