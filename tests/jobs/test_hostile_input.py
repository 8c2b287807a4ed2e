"""Careless and hostile input costs its own row, never the job, and never the machine's memory: lines
nested 100k deep, lone surrogates, 5000-digit numbers and prompts of megabytes are that row's one-line
error; a gzip bomb is refused at submit; an OpenAI-Batch file is decompressed and parsed once; an
--output inside the input folder is not read as input."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from pipeline_data import prompts_table, write_parquet
from typer.testing import CliRunner

from freight_cli import app
from jobs.batch_input import read_batch
from jobs.settings import get_settings


def _line(custom_id: str, prompt: str, **body: object) -> str:
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": "/v1/completions",
                       "body": {"prompt": prompt, "max_tokens": 3, "temperature": 0, **body}})  # fmt: skip


def _run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["run", *args])
    return result.exit_code, result.output


def _rows(out: Path) -> dict[str, dict]:
    return {r["id"]: r for r in pq.read_table(out / "shards").to_pylist()}


def test_bad_lines_are_their_rows_errors_and_good_rows_are_kept(tmp_path: Path, demo_model_dir: Path) -> None:
    lines = [
        _line("good-1", "def add(a, b):"),
        '{"custom_id": "deep", "body": {"prompt": ' + "[" * 100_000 + "]" * 100_000 + "}}",
        '{"custom_id": "sur\\ud800", "url": "/v1/completions", "body": {"prompt": "x"}}',
        '{"custom_id": "sur2", "url": "/v1/completions", "body": {"prompt": "x\\udfff"}}',
        '{"custom_id": "big", "url": "/v1/completions", "body": {"prompt": "x", "max_tokens": ' + "9" * 5000 + "}}",
        _line("bias", "x", logit_bias={"9" * 5000: 1}),
        _line("long", "a " * 1_000_000),  # 2 MB of prompt: refused before it is tokenized
        _line("good-2", "def sub(a, b):"),
    ]
    data = tmp_path / "in.jsonl"
    data.write_text("\n".join(lines) + "\n")
    out = tmp_path / "out"
    code, output = _run(str(data), "--model", str(demo_model_dir), "--output", str(out))
    assert code == 0, output
    assert "Traceback" not in output
    rows = _rows(out)
    assert len(rows) == 8 and rows["good-1"]["error"] is None and rows["good-2"]["error"] is None
    errors = {k: r["error"] for k, r in rows.items() if r["error"] is not None}
    assert errors["line-2"] == "line 2: JSON nested deeper than 128 levels: no request needs that"
    assert errors["line-3"].startswith("line 3: holds a lone surrogate escape")
    assert errors["line-4"].startswith("line 4: holds a lone surrogate escape")
    assert errors["line-5"] == "line 5: a number has more than 4,300 digits: no request field takes one"
    assert "is not a token id" in errors["bias"] and "set_int_max_str_digits" not in errors["bias"]
    assert len(errors["bias"]) < 200
    assert errors["long"].startswith("prompt has 2000000 characters, more than the")
    assert all("\n" not in e for e in errors.values())


def test_a_gzip_bomb_is_refused_at_submit_and_nothing_is_written(
    tmp_path: Path, demo_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FREIGHT_MAX_BATCH_FILE_BYTES", str(1 << 20))
    get_settings.cache_clear()
    body = (_line("x", "y" * 1000) + "\n").encode()
    data = tmp_path / "in.jsonl.gz"
    data.write_bytes(gzip.compress(body + b" " * (64 << 20)))  # 64 MiB of spaces: ~64 KiB gzipped
    assert data.stat().st_size < 100_000
    out = tmp_path / "out"
    code, output = _run(str(data), "--model", str(demo_model_dir), "--output", str(out))
    get_settings.cache_clear()
    assert code == 2, output
    assert f"expands from {data.stat().st_size} bytes to more than 1048576 (FREIGHT_MAX_BATCH_FILE_BYTES)" in output
    assert not out.exists()


def test_a_gzipped_batch_is_parsed_once_at_submit(tmp_path: Path, demo_model_dir: Path) -> None:
    """Workers read OUT/input/requests.parquet: the file itself may even be gone after submit."""
    from jobs.planner import prepare_job
    from jobs.spec import JobSpec
    from worker.local import run_local

    data = tmp_path / "in.jsonl.gz"
    data.write_bytes(gzip.compress(("\n".join(_line(f"r{i}", f"def f{i}(x):") for i in range(6)) + "\n").encode()))
    spec = JobSpec(input=str(data), model=str(demo_model_dir), output=str(tmp_path / "out"), shard_rows=2,
                   sampling={"max_tokens": 2})  # fmt: skip
    prepared = prepare_job(spec)
    assert prepared.manifest.input.requests == str(tmp_path / "out" / "input" / "requests.parquet")
    parsed = pq.read_table(tmp_path / "out" / "input" / "requests.parquet")
    assert parsed.column("custom_id").to_pylist() == read_batch(str(data), data.read_bytes()).table.column("custom_id").to_pylist()
    data.unlink()
    run_local(prepared.store, prepared.manifest)
    rows = _rows(tmp_path / "out")
    assert sorted(rows) == [f"r{i}" for i in range(6)] and all(r["error"] is None for r in rows.values())


def test_an_output_inside_the_input_folder_is_not_read_as_input(tmp_path: Path, demo_model_dir: Path) -> None:
    folder = tmp_path / "data"
    write_parquet(prompts_table(6), folder / "part-0.parquet")
    out = folder / "results"
    args = [str(folder), "--model", str(demo_model_dir), "--output", str(out), "--max-tokens", "2", "--shard-rows", "3"]
    code, output = _run(*args)
    assert code == 0, output
    assert len(_rows(out)) == 6
    (out / "_SUCCESS").unlink()  # a rerun that must list the input again
    code, output = _run(*args)
    assert code == 0, output
    assert len(_rows(out)) == 6


def test_a_redis_url_with_a_password_query_reaches_celery_and_redis_alike() -> None:
    import kombu
    import redis

    from jobs.settings import Settings, redis_url_with_userinfo, settings_error

    url = Settings(redis_url="redis://127.0.0.1:6379/0?password=p%40ss").redis_url
    assert url == "redis://:p%40ss@127.0.0.1:6379/0"
    assert kombu.Connection(url).password == "p@ss"  # kombu's parser failed on the query form
    assert redis.Redis.from_url(url).connection_pool.connection_kwargs["password"] == "p@ss"
    assert redis_url_with_userinfo("rediss://h:1/0?username=u&password=p") == "rediss://u:p@h:1/0"
    from pydantic import ValidationError

    with pytest.raises(ValidationError) as err:
        Settings(redis_url="redis://:one@h/0?password=two")
    message = settings_error(err.value)
    assert "gives a password twice" in message and "one" not in message.split("FREIGHT_REDIS_URL=")[1][:20]


def test_results_to_refuses_a_file_inside_out_and_an_existing_file_without_force(
    tmp_path: Path, demo_model_dir: Path
) -> None:
    data = write_parquet(prompts_table(4), tmp_path / "in.parquet")
    out = tmp_path / "out"
    code, output = _run(str(data), "--model", str(demo_model_dir), "--output", str(out), "--max-tokens", "2")
    assert code == 0, output
    runner = CliRunner()
    for inside in (out / "shards" / "x.parquet", out / "export.jsonl"):
        result = runner.invoke(app, ["results", str(out), "--to", str(inside)])
        assert result.exit_code == 2 and "lies inside the job's OUT" in result.output, result.output
        assert not inside.exists()
    assert runner.invoke(app, ["status", str(out)]).exit_code == 0
    export = tmp_path / "export.parquet"
    export.write_bytes(b"precious")
    result = runner.invoke(app, ["results", str(out), "--to", str(export)])
    assert result.exit_code == 2 and "exists: pass --force" in result.output and export.read_bytes() == b"precious"
    result = runner.invoke(app, ["results", str(out), "--to", str(export), "--force"])
    assert result.exit_code == 0, result.output
    assert pq.read_table(export).num_rows == 4
    errors = tmp_path / "o.errors.jsonl"
    errors.write_text("keep")
    result = runner.invoke(app, ["results", str(out), "--to", str(tmp_path / "o.jsonl"), "--format", "openai"])
    assert result.exit_code == 2 and "o.errors.jsonl exists" in result.output and errors.read_text() == "keep"


def test_hostile_row_constraints_are_their_rows_errors(tmp_path: Path, demo_model_dir: Path) -> None:
    """A schema 300 levels deep (RecursionError in canonicalization took the job down), 100,000
    choices (a 16 s compile ending in a multi-line Rust backtrace): each its row's one-line error."""
    import pyarrow as pa

    deep: dict = {"type": "string"}
    for _ in range(300):
        deep = {"type": "object", "properties": {"a": deep}}
    prompts = ["def add(a, b):", "def sub(a, b):", "def mul(a, b):", "def div(a, b):"]
    table = pa.table({
        "prompt": prompts,
        "json_schema": pa.array([None, json.dumps(deep), None, None], pa.string()),
        "choice": pa.array([None, None, [f"c{i}" for i in range(100_000)], None], pa.list_(pa.string())),
    })  # fmt: skip
    data = write_parquet(table, tmp_path / "in.parquet")
    out = tmp_path / "out"
    code, output = _run(str(data), "--model", str(demo_model_dir), "--output", str(out), "--row-constraints",
                        "--max-tokens", "3")  # fmt: skip
    assert code == 0, output
    rows = {r["id"]: r for r in pq.read_table(out / "shards").to_pylist()}
    assert rows["0"]["error"] is None and rows["3"]["error"] is None
    assert "nests more than 64 levels of objects and arrays" in rows["1"]["error"]
    assert "100,000 choices, more than the 10,000" in rows["2"]["error"]
    assert all("\n" not in (r["error"] or "") for r in rows.values())
