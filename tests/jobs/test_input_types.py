"""Datasets whose files differ in column types, and ids: checked at planning, before anything is written.

string and large_string (pandas 3 writes large_string) mix; a real mismatch names the file. Ids are
unique and non-null; integer ids stay integers in the results.
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from freight_cli import app


def _run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, list(args))
    return result.exit_code, result.output


def _results(out: Path) -> pa.Table:
    return pads.dataset(out / "shards").to_table()


def _one_error_line(code: int, output: str, *expected: str) -> str:
    assert code == 2, output
    lines = [line for line in output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), output
    for text in expected:
        assert text in lines[0], output
    return lines[0]


def _job(data: Path, model: Path, out: Path, *extra: str) -> tuple[int, str]:
    return _run("run", str(data), "--model", str(model), "--output", str(out), "--max-tokens", "2", *extra)


def test_string_and_large_string_files_run_together(tmp_path: Path, demo_model_dir: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    pq.write_table(pa.table({"id": ["a", "b"], "prompt": ["def f(x):", "def g(y):"]}), data / "part-0.parquet")
    pq.write_table(  # pandas 3's strings, and the columns in another order
        pa.table(
            {
                "prompt": pa.array(["def h(x):", "def k(y):"], pa.large_string()),
                "id": pa.array(["c", "d"], pa.large_string()),
            }
        ),
        data / "part-1.parquet",
    )
    code, output = _job(data, demo_model_dir, tmp_path / "out", "--id-column", "id")
    assert code == 0, output
    table = _results(tmp_path / "out")
    assert table.column("id").to_pylist() == ["a", "b", "c", "d"]
    assert table.column("finish_reason").to_pylist() == ["length"] * 4


def test_a_real_type_mismatch_is_one_line_naming_the_file(tmp_path: Path, demo_model_dir: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    pq.write_table(pa.table({"id": ["a", "b"], "prompt": ["x", "y"]}), data / "part-0.parquet")
    pq.write_table(pa.table({"id": [1, 2], "prompt": ["z", "w"]}), data / "part-1.parquet")
    code, output = _job(data, demo_model_dir, tmp_path / "out", "--id-column", "id")
    _one_error_line(code, output, "part-1.parquet: column 'id' has type int64", "part-0.parquet has string")
    assert not (tmp_path / "out").exists()  # no manifest: a fixed rerun is the same job, not "another"


def test_prompt_type_mismatch_and_missing_column(tmp_path: Path, demo_model_dir: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    pq.write_table(pa.table({"prompt": ["x", "y"]}), data / "part-0.parquet")
    pq.write_table(pa.table({"prompt": [1, 2]}), data / "part-1.parquet")
    _one_error_line(*_job(data, demo_model_dir, tmp_path / "out"), "part-1.parquet: column 'prompt'")
    pq.write_table(pa.table({"prompt": ["z"], "max_tokens": [3]}), data / "part-1.parquet")
    _one_error_line(*_job(data, demo_model_dir, tmp_path / "out"), "part-1.parquet has columns")
    assert not (tmp_path / "out").exists()


def test_integer_ids_keep_their_type(tmp_path: Path, demo_model_dir: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    pq.write_table(pa.table({"id": pa.array([10, 20], pa.int32()), "prompt": ["a", "b"]}), data / "0.parquet")
    pq.write_table(pa.table({"id": pa.array([30, 7], pa.int64()), "prompt": ["c", "d"]}), data / "1.parquet")
    out = tmp_path / "out"
    code, output = _job(data, demo_model_dir, out, "--id-column", "id")
    assert code == 0, output
    table = _results(out)
    assert table.schema.field("id").type == pa.int64()
    assert table.column("id").to_pylist() == [10, 20, 30, 7]
    code, output = _run("results", str(out), "--to", str(tmp_path / "r.jsonl"))
    assert code == 0, output
    rows = [json.loads(line) for line in (tmp_path / "r.jsonl").read_text().splitlines()]
    assert [r["id"] for r in rows] == [10, 20, 30, 7]


@pytest.mark.parametrize(
    ("ids", "expected"),
    [
        (["a", "b", "a", "c", "b", "b"], ["repeats 2 ids", "'b' x3", "'a' x2", "ids must be unique"]),
        ([5, 6, 5], ["repeats 1 id", "5 x2"]),
        (["a", None, "c", None], ["2 null ids", "row 1, 3"]),
        ([1.5, 2.5], ["has type double", "ids must be strings or integers"]),
    ],
)
def test_duplicate_null_and_float_ids_are_refused(
    ids: list[object], expected: list[str], tmp_path: Path, demo_model_dir: Path
) -> None:
    data = tmp_path / "in.parquet"
    pq.write_table(pa.table({"id": ids, "prompt": ["p"] * len(ids)}), data)
    _one_error_line(*_job(data, demo_model_dir, tmp_path / "out", "--id-column", "id"), *expected)
    assert not (tmp_path / "out").exists()


def test_duplicate_custom_ids_in_a_batch_file(tmp_path: Path, demo_model_dir: Path) -> None:
    lines = [{"custom_id": cid, "body": {"prompt": "hi"}} for cid in ("r1", "r2", "r1")]
    data = tmp_path / "batch.jsonl"
    data.write_text("".join(json.dumps(line) + "\n" for line in lines))
    _one_error_line(*_job(data, demo_model_dir, tmp_path / "out"), "custom_id repeats", "'r1' on lines 1, 3")
    assert not (tmp_path / "out").exists()
