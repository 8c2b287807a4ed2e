"""Per-row constraint columns of a Parquet input (response_format, json_schema, regex, choice) are read
only with --row-constraints: a dataset that merely has a column of one of those names (a quiz's
`choice`, a pattern-matching task's `regex`) runs as plain data, with a warning that names the
columns and the flag. OpenAI-Batch JSONL bodies keep their response_format / guided_* fields as
OpenAI and vLLM read them (tests/jobs/test_structured_end_to_end.py runs one)."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.dataset as ds
import pytest
from freight_runner import freight
from pipeline_data import write_parquet

from jobs.settings import get_settings
from jobs.spec import JobSpec

CHOICES = ["red", "green", "blue"]


def _quiz(tmp_path: Path) -> Path:
    """A user's dataset whose columns happen to be named like constraint columns: `choice` holds the
    index of the right answer and `regex` a pattern the question is about."""
    table = pa.table(
        {
            "id": ["q0", "q1", "q2"],
            "prompt": ["Pick a colour:", "Which one?", "Name a colour:"],
            "choice": pa.array([0, 2, 1], pa.int64()),
            "regex": ["^x$", "[a-z]+", "\\d{2}"],
        }
    )
    return write_parquet(table, tmp_path / "quiz.parquet")


def test_columns_named_like_constraints_are_plain_data_without_the_flag(tmp_path: Path, demo_model_dir: Path) -> None:
    out = tmp_path / "out"
    code, output = freight(["run", str(_quiz(tmp_path)), "--model", str(demo_model_dir), "--output", str(out),
                            "--id-column", "id", "--max-tokens", "4"])  # fmt: skip
    assert code == 0, output
    assert "--row-constraints" in output and "choice" in output  # the warning names the columns and the flag
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["input"]["override_columns"] == []
    assert "row_constraints" not in manifest["spec"] or manifest["spec"]["row_constraints"] is False
    rows = ds.dataset(out / "shards").to_table().to_pylist()
    assert [r["error"] for r in rows] == [None] * 3
    assert json.loads((out / "cost.json").read_text())["constrained_rows"] == 0


def test_with_the_flag_each_row_is_held_to_its_column(tmp_path: Path, demo_model_dir: Path) -> None:
    table = pa.table(
        {
            "prompt": ["Pick a colour:", "Another one:", "Plain text here:"],
            "choice": pa.array([CHOICES, CHOICES, None], pa.list_(pa.string())),
        }
    )
    data = write_parquet(table, tmp_path / "in.parquet")
    out = tmp_path / "out"
    code, output = freight(["run", str(data), "--model", str(demo_model_dir), "--output", str(out),
                            "--row-constraints", "--max-tokens", "16"])  # fmt: skip
    assert code == 0, output
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["input"]["override_columns"] == ["choice"] and manifest["spec"]["row_constraints"] is True
    rows = {r["id"]: r for r in ds.dataset(out / "shards").to_table().to_pylist()}
    for rid in ("0", "1"):
        assert rows[rid]["error"] is None
        assert rows[rid]["finish_reason"] != "stop" or rows[rid]["completion"] in CHOICES, rows[rid]
    assert json.loads((out / "cost.json").read_text())["constrained_rows"] == 2


@pytest.mark.parametrize(
    "case",
    ["no such column", "a JSONL input", "an embed job", "a likelihood job", "a column of the wrong type"],
)
def test_the_flag_is_refused_where_it_means_nothing(case: str, tmp_path: Path, demo_model_dir: Path) -> None:
    plain = write_parquet(pa.table({"prompt": ["a", "b"], "other": ["x", "y"]}), tmp_path / "plain.parquet")
    batch = tmp_path / "batch.jsonl"
    batch.write_text(json.dumps({"custom_id": "a", "url": "/v1/completions", "body": {"prompt": "x"}}) + "\n")
    args, expected = {
        "no such column": ([str(plain)], "plain.parquet has none of the columns response_format, json_schema, regex, choice; add one"),
        "a JSONL input": ([str(batch)], "--row-constraints reads Parquet columns; an OpenAI-Batch file's bodies"),
        "an embed job": ([str(plain), "--task", "embed"], "--row-constraints constrains generated text; --task embed"),
        "a likelihood job": ([str(plain), "--continuation-column", "other"], "--row-constraints constrains generated text; likelihood"),
        "a column of the wrong type": ([str(_quiz(tmp_path))], "column 'choice' sets choice per row but has type int64"),
    }[case]  # fmt: skip
    out = tmp_path / "out"
    code, output = freight(["run", *args, "--model", str(demo_model_dir), "--output", str(out), "--row-constraints"])
    assert code == 2, output
    lines = [line for line in output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and expected in lines[0], output
    assert not out.exists()


def test_the_flag_enters_the_job_id_only_when_set() -> None:
    base = JobSpec(input="in.parquet", model="m", output="out")
    assert base.job_id == JobSpec(input="in.parquet", model="m", output="out", row_constraints=False).job_id
    assert base.job_id != JobSpec(input="in.parquet", model="m", output="out", row_constraints=True).job_id
    assert base.job_id == "188bb68647de629a"  # its id before the flag existed: older jobs keep theirs


def test_a_manifest_without_the_flag_reads_as_before_and_a_rerun_names_the_flag() -> None:
    """Off, the field is left out of the spec's JSON (manifests stay readable by workers older than
    it); a rerun that turns it on is refused as another job, naming the flag."""
    off = JobSpec(input="in.parquet", model="m", output="out")
    on = off.model_copy(update={"row_constraints": True})
    assert "row_constraints" not in off.model_dump(mode="json") and on.model_dump(mode="json")["row_constraints"]
    assert JobSpec.model_validate_json(off.model_dump_json()) == off
    assert off.diff(on) == ["row_constraints: False != True"]


def test_the_sampling_columns_a_run_reads_are_named(tmp_path: Path, demo_model_dir: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """Per-row sampling columns are read by name (README "Sampling"); the run says which (an info line,
    the default level), so a dataset column that merely shares such a name (here `n`, the size of a
    puzzle) does not go unnoticed."""
    monkeypatch.setenv("FREIGHT_LOG_LEVEL", "info")
    get_settings.cache_clear()
    table = pa.table({"prompt": ["Solve for n = 3:", "Solve for n = 2:"], "n": pa.array([3, 2], pa.int64())})
    out = tmp_path / "out"
    code, output = freight(["run", str(write_parquet(table, tmp_path / "puzzles.parquet")), "--model",
                            str(demo_model_dir), "--output", str(out), "--max-tokens", "2"])  # fmt: skip
    assert code == 0, output
    assert "row_sampling_columns" in output and '"columns": ["n"]' in output and "rename" in output
    assert json.loads((out / "manifest.json").read_text())["input"]["override_columns"] == ["n"]
