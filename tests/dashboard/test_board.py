"""The dashboard's numbers are the CLI's: a job's line agrees with `freight jobs --prefix`, its cost
with jobs.finalize.report_now and cost.json; a poll lists only what can still change; downloads are
what `freight results` exports (the OpenAI lines parsed with the `openai` package's types)."""

from __future__ import annotations

import io
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from jobs import datasets
from jobs.dashboard.board import JobBoard, JobSummary
from jobs.dashboard.downloads import openai_file, parquet_results
from jobs.dashboard.job_view import job_detail
from jobs.finalize import committed_shards, report_now
from jobs.job_list import stored_jobs
from jobs.settings import get_settings
from jobs.storage import LocalStore
from tests.dashboard.planted import commit, finish, lose_attempt, plant_job, poison
from tests.jobs.openai_check import parse_errors, parse_output

COMPARED = ("cost_usd", "input_cost_usd", "output_cost_usd", "usd_per_million_input_tokens",
            "usd_per_million_output_tokens", "prompt_tokens", "cached_tokens", "completion_tokens",
            "on_demand_cost_usd", "wasted_cost_usd", "rows", "rows_failed", "spec_accepted_tokens",
            "reasoning_tokens", "result_cache_hits", "result_cache_usd_saved", "deduplicated_rows")  # fmt: skip


class CountingStore(LocalStore):
    """A LocalStore that counts its listings, by prefix."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.listed: list[str] = []

    def list(self, prefix: str = "") -> list[str]:
        self.listed.append(prefix)
        return super().list(prefix)


@pytest.fixture
def store_root(tmp_path: Path) -> Path:
    root = tmp_path / "store"
    running, manifest = plant_job(str(root / "runs" / "running"), shards=6)
    commit(running, manifest, [0, 1, 2], failed_rows=1)
    lose_attempt(running, manifest, 3)
    poison(running, manifest, 4)
    done, done_manifest = plant_job(str(root / "deep" / "er" / "done"), shards=3, market="on-demand")
    finish(done, done_manifest)
    return root


def test_a_jobs_line_and_cost_agree_with_freight_jobs_and_the_cost_report(store_root: Path) -> None:
    board = JobBoard(LocalStore(store_root), get_settings())
    ours = {j.out: j for j in board.snapshot().jobs}
    theirs = {Path(r.output).relative_to(store_root).as_posix(): r for r in stored_jobs(str(store_root), get_settings())}
    assert ours.keys() == theirs.keys() == {"runs/running", "deep/er/done"}
    for out, row in theirs.items():
        job = ours[out]
        assert (job.job_id, job.state, job.shards_committed, job.shards_total, job.rows_done, job.rows_failed) == (
            row.job_id, row.state, row.shards_committed, row.shards_total, row.rows_done, row.rows_failed)  # fmt: skip
        assert job.cost_usd == pytest.approx(row.cost_usd, rel=1e-12)
        store = LocalStore(store_root / out)
        snapshot_out = board.snapshot().listing.outs[out]
        report = board.reader(snapshot_out).report()
        reference = report_now(store, board.reader(snapshot_out).manifest(), sorted(committed_shards(store)))
        for key in COMPARED:
            assert report[key] == pytest.approx(reference[key], rel=1e-12), (out, key)
    running = ours["runs/running"]
    assert running.shards_failed == 1 and running.errors == 3 + 1 and running.progress == 0.5
    assert running.rows_per_second is not None and running.eta_seconds is not None
    detail = job_detail(board, running)
    assert detail["grid"] == "ccctpq" and detail["counts"] == {"committed": 3, "pending": 1, "poison": 1, "retried": 1}
    cost = detail["cost"]
    assert cost["busy"] + cost["idle"] + cost["waste"] == pytest.approx(cost["total"])
    assert cost["busy"] == pytest.approx(3 * (2.0 / 3.0) * 3.0 * 1.2 / 3600)  # 2 of each 3 billed seconds busy
    assert cost["spot"] == pytest.approx(cost["total"]) and cost["on_demand"] == 0
    assert cost["on_demand_equivalent"] == pytest.approx(3 * cost["total"])  # 3.6 vs 1.2 USD/h
    assert [r["id"] for r in detail["failed_rows"]] == ["1", "3", "5"]
    assert detail["tokens"] == {"prompt": 36, "cached": 12, "computed_prompt": 24, "completion": 18, "reasoning": 6}
    assert [e["name"] for e in detail["extras"]] == ["speculative acceptance", "prefix-cache hits", "result-cache hits",
                                                     "duplicate rows computed once"]  # fmt: skip


def test_a_poll_lists_only_what_can_still_change(store_root: Path) -> None:
    store = CountingStore(store_root)
    board = JobBoard(store, get_settings(), refresh_s=0.01, scan_s=3600)
    board.snapshot()
    assert store.listed == [""]  # the first look lists the store once
    running = LocalStore(store_root / "runs" / "running")
    manifest = board.reader(board.snapshot().listing.outs["runs/running"]).manifest()
    store.listed.clear()
    time.sleep(0.02)
    commit(running, manifest, [5])
    jobs = {j.out: j for j in board.refresh().jobs}
    assert sorted(store.listed) == ["active/", "runs/running/"]  # not the finished job, not the store
    assert jobs["runs/running"].shards_committed == 4


def test_a_poll_rebuilds_only_the_lines_that_changed(store_root: Path) -> None:
    store = LocalStore(store_root)
    board = JobBoard(store, get_settings(), refresh_s=0.01, scan_s=0.01)

    def lines() -> dict[str, JobSummary]:
        time.sleep(0.02)  # past scan_s: each poll lists the whole store
        return {j.out: j for j in board.refresh().jobs}

    first, again = lines(), lines()
    assert again["deep/er/done"] is first["deep/er/done"]  # finished, keys unchanged: the same line
    assert again["runs/running"] is not first["runs/running"]  # running: its rate and ETA move with time
    # a finished job's keys change (a record added beside it, say): its line is built again
    done = LocalStore(store_root / "deep" / "er" / "done")
    done.put("notes.txt", b"x")
    rebuilt = lines()["deep/er/done"]
    assert rebuilt is not first["deep/er/done"] and rebuilt.as_dict() == first["deep/er/done"].as_dict()
    store.delete("deep/er/done/manifest.json")  # no longer a job: its line goes
    assert "deep/er/done" not in lines()


def test_downloads_are_what_freight_results_exports(store_root: Path, tmp_path: Path) -> None:
    board = JobBoard(LocalStore(store_root), get_settings())
    out = board.snapshot().listing.outs["runs/running"]
    reader = board.reader(out)
    table = pq.read_table(io.BytesIO(b"".join(parquet_results(reader))))
    assert table.equals(datasets.read_results(LocalStore(store_root / "runs" / "running")))
    assert table.num_rows == 6
    (tmp_path / "o.jsonl").write_bytes(b"".join(openai_file(reader, "output")))
    (tmp_path / "e.jsonl").write_bytes(b"".join(openai_file(reader, "errors")))
    parsed = parse_output(tmp_path / "o.jsonl")
    assert [raw["custom_id"] for raw, _ in parsed] == ["0", "2", "4"]
    assert [e["custom_id"] for e in parse_errors(tmp_path / "e.jsonl")] == ["1", "3", "5"]
