"""Planning: shards of about shard_rows rows, each row exactly once, long shared prefixes kept together."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pipeline_data import SYSTEM, prompts_table, write_parquet

from jobs.errors import InputError
from jobs.planner import PREFIX_CHARS, cut_shards, plan
from jobs.spec import JobSpec


def _all_rows(shards: list) -> list[int]:
    return sorted(r for s in shards for r in s.row_indices())


def test_unrelated_prompts_keep_input_order_in_contiguous_shards() -> None:
    shards = cut_shards(pa.array([f"prompt {i}" for i in range(10)]), shard_rows=4)
    assert [s.ranges for s in shards] == [((0, 4),), ((4, 8),), ((8, 10),)]
    assert [s.index for s in shards] == [0, 1, 2]


def test_rows_sharing_a_long_prefix_land_in_one_shard() -> None:
    prefix = "x" * PREFIX_CHARS
    # rows 0, 3, 6, 9 share a long prefix; the others are unique and short
    prompts = [prefix + str(i) if i % 3 == 0 else f"q{i}" for i in range(12)]
    shards = cut_shards(pa.array(prompts), shard_rows=4)
    assert _all_rows(shards) == list(range(12))
    groups = [s for s in shards if {0, 3, 6, 9} <= set(s.row_indices())]
    assert len(groups) == 1
    for s in shards:
        rows = s.row_indices()
        assert rows == sorted(rows)  # input order within a shard
        assert 1 <= s.rows <= 4 and s.rows == len(rows)


def test_a_group_larger_than_a_shard_is_split_over_consecutive_shards() -> None:
    prompts = ["p" * PREFIX_CHARS + str(i) for i in range(10)] + ["a", "b"]
    shards = cut_shards(pa.array(prompts), shard_rows=4)
    assert _all_rows(shards) == list(range(12))
    assert [s.rows for s in shards] == [4, 4, 4]


def test_plan_reads_the_dataset(tmp_path: Path, demo_model_dir: Path) -> None:
    table = prompts_table(40)
    write_parquet(table.slice(0, 25), tmp_path / "in" / "part-0.parquet")
    write_parquet(table.slice(25), tmp_path / "in" / "part-1.parquet")
    spec = JobSpec(
        input=str(tmp_path / "in"),
        model=str(demo_model_dir),
        output=str(tmp_path / "out"),
        id_column="id",
        shard_rows=8,
    )
    m = plan(spec)
    assert m.job_id == spec.job_id and m.input.rows == 40 and len(m.input.files) == 2
    assert _all_rows(list(m.shards)) == list(range(40))
    long_rows = {i for i in range(40) if i % 2 == 0}  # SYSTEM-prefixed prompts
    assert len(SYSTEM) >= PREFIX_CHARS
    # the prefix group fills whole shards: 20 rows over 3 shards, no shard mixes in more than needed
    mixed = [s for s in m.shards if 0 < len(long_rows & set(s.row_indices())) < s.rows]
    assert len(mixed) <= 1
    assert not (tmp_path / "out").exists()  # plan writes nothing


def test_openai_batch_jsonl_with_text_prompts(tmp_path: Path, demo_model_dir: Path) -> None:
    path = tmp_path / "batch.jsonl"
    lines = [
        {"custom_id": "x1", "body": {"prompt": "def f():", "max_tokens": 3, "temperature": 0.5}},
        {"custom_id": "x2", "body": {"prompt": "class A:", "seed": 7}},
    ]
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n\n")
    spec = JobSpec(input=str(path), model=str(demo_model_dir), output=str(tmp_path / "out"))
    m = plan(spec)
    assert m.input.format == "jsonl" and m.input.prompt_kind == "request" and m.input.id_column == "custom_id"
    assert m.input.prompt_column == "body" and m.input.override_columns == () and m.input.rows == 2
    path.write_text(json.dumps({"body": {"prompt": "no id"}}) + "\n")  # no line is a usable request
    with pytest.raises(InputError, match="line 1: custom_id None: every line needs a custom_id"):
        plan(spec)


def test_gzipped_jsonl_input(tmp_path: Path, demo_model_dir: Path) -> None:
    path = tmp_path / "batch.jsonl.gz"
    path.write_bytes(gzip.compress(b'{"custom_id": "a", "body": {"prompt": "x = 1"}}\n'))
    m = plan(JobSpec(input=str(path), model=str(demo_model_dir), output=str(tmp_path / "out")))
    assert m.input.format == "jsonl" and m.input.rows == 1


def test_s3_prefix_is_planned_fetching_each_file_once(
    tmp_path: Path, demo_model_dir: Path, s3_env: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Planning an S3 prefix downloads each file once, in turn (schema, rows and prompt column from
    the same bytes, which go before the next file: a dataset may be larger than memory)."""
    from jobs import datasets
    from jobs.storage import open_store

    prefix = f"s3://freight-test/{tmp_path.name}/in"
    store = open_store(prefix, s3_env)
    for part in range(3):
        table = prompts_table(10 + part, bad=False)
        table = table.set_column(0, "id", pa.array([f"p{part}-{i}" for i in range(table.num_rows)]))
        local = write_parquet(table, tmp_path / f"p{part}.parquet")
        store.put(f"part-{part}.parquet", local.read_bytes())
    fetched: list[str] = []
    real_fetch = datasets.fetch_input

    def counting_fetch(url: str, settings: Any = None) -> bytes | None:
        fetched.append(url)
        return real_fetch(url, settings)

    monkeypatch.setattr(datasets, "fetch_input", counting_fetch)
    spec = JobSpec(input=prefix, model=str(demo_model_dir), output=str(tmp_path / "out"), id_column="id")
    manifest = plan(spec, settings=s3_env)
    assert fetched == [f"{prefix}/part-{i}.parquet" for i in range(3)]
    assert [f.rows for f in manifest.input.files] == [10, 11, 12] and manifest.input.rows == 33
