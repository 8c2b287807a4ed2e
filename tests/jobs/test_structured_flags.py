"""The job-wide structured-output flags (--json-schema FILE, --regex, --choice) of run, submit and
estimate: checked before anything is written, stored in the JobSpec as JSON, and in the job id only
when set (older jobs keep their ids)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pipeline_data import prompts_table, write_parquet
from pydantic import ValidationError
from typer.testing import CliRunner

from freight_cli import app
from jobs.spec import JobSpec, SamplingSpec

SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}}}


@pytest.fixture
def dataset(tmp_path: Path) -> Path:
    return write_parquet(prompts_table(4, bad=False), tmp_path / "in.parquet")


def _bad_cases(tmp_path: Path) -> dict[str, tuple[list[str], str]]:
    listing = tmp_path / "list.json"
    listing.write_text("[1, 2]")
    broken = tmp_path / "broken.json"
    broken.write_text("{oops")
    good = tmp_path / "schema.json"
    good.write_text(json.dumps(SCHEMA))
    unknown_type = tmp_path / "objekt.json"
    unknown_type.write_text(json.dumps({"type": "objekt"}))
    bad_pattern = tmp_path / "pattern.json"
    bad_pattern.write_text(json.dumps({"type": "object", "properties": {"code": {"type": "string", "pattern": "[A-Z"}}}))
    return {
        "missing file": (["--json-schema", str(tmp_path / "nope.json")], "nope.json: no such file"),
        "not JSON": (["--json-schema", str(broken)], "broken.json: json_schema is not valid JSON"),
        "not an object": (["--json-schema", str(listing)], "list.json: json_schema must be a JSON object"),
        "a folder": (["--json-schema", str(tmp_path)], "cannot read it"),
        "two flags": (["--json-schema", str(good), "--regex", "a+"], "--json-schema and --regex both constrain"),
        "three flags": (["--regex", "a", "--choice", "x,y"], "--regex and --choice both constrain"),
        "empty choice": (["--choice", "yes,,no"], "--choice 'yes,,no': an empty choice"),
        "no choices": (["--choice", " , "], "no choices"),
        "empty regex": (["--regex", ""], "--regex"),
        # compiled at submit by the engine's grammar library (llguidance), as the worker compiles it
        "regex does not compile": (["--regex", "[a-z"], "--regex '[a-z' does not compile: unclosed character class"),
        "regex look-around": (["--regex", "(?=a)b"], "look-around"),
        "schema does not compile": (["--json-schema", str(unknown_type)], "objekt.json does not compile: Invalid type"),
        "schema's pattern": (["--json-schema", str(bad_pattern)], "pattern.json does not compile: unclosed character"),
        "embed job": (["--regex", "a", "--task", "embed"], "--regex constrains generated text; --task embed"),
        "likelihood job": (["--choice", "a", "--continuation-column", "id"], "--choice constrains generated text"),
    }


@pytest.mark.parametrize("command", ["run", "estimate", "submit"])
@pytest.mark.parametrize(
    "case",
    ["missing file", "not JSON", "not an object", "a folder", "two flags", "three flags", "empty choice",
     "no choices", "empty regex", "embed job", "likelihood job", "regex does not compile", "regex look-around",
     "schema does not compile", "schema's pattern"],
)  # fmt: skip
def test_bad_flags_exit_nonzero_with_one_line_and_write_nothing(
    command: str, case: str, tmp_path: Path, demo_model_dir: Path, dataset: Path
) -> None:
    flags, expected = _bad_cases(tmp_path)[case]
    out = tmp_path / "out"
    args = [command, str(dataset), "--model", str(demo_model_dir)]
    args += [] if command == "estimate" else ["--output", str(out)]
    result = CliRunner().invoke(app, [*args, *flags])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and expected in lines[0], result.output
    assert not out.exists() and not (tmp_path / "in.parquet.estimate").exists()


def test_the_flags_land_in_the_manifest(tmp_path: Path, demo_model_dir: Path, dataset: Path) -> None:
    from freight_cli.job_options import prepare_from_options
    from jobs.settings import get_settings

    schema = tmp_path / "schema.json"
    schema.write_text(json.dumps(SCHEMA, indent=2))
    base = dict(input=str(dataset), model=str(demo_model_dir), prompt_column="prompt", id_column="id",
                continuation_column=None, max_tokens=8, temperature=0.0, top_p=1.0, top_k=0, seed=0,
                shard_rows=4, instance_type="cpu-local", market="on-demand", price_per_hour=None,
                quantization=None)  # fmt: skip
    prepared = prepare_from_options(get_settings(), output=str(tmp_path / "a"), prices=None, json_schema=schema, **base)
    manifest = json.loads((tmp_path / "a" / "manifest.json").read_text())
    assert manifest["spec"]["sampling"]["json_schema"] == json.dumps(SCHEMA, separators=(",", ":"))  # order kept
    assert prepared.manifest.spec.sampling.constraint_kind == "json_schema"
    choice = prepare_from_options(get_settings(), output=str(tmp_path / "b"), prices=None, choice="yes, no", **base)
    assert choice.manifest.spec.sampling.choice == ("yes", "no")
    regex = prepare_from_options(get_settings(), output=str(tmp_path / "c"), prices=None, regex=r"\d+", **base)
    assert regex.manifest.spec.sampling.regex == r"\d+"


def _spec(**sampling: object) -> JobSpec:
    return JobSpec(input="in.parquet", model="m", output="out", sampling=SamplingSpec(**sampling))


def test_job_ids_keep_older_jobs_and_follow_the_schema_content() -> None:
    assert _spec().job_id == _spec(json_schema=None, regex=None, choice=None).job_id
    a = _spec(json_schema=SCHEMA)
    assert a.job_id == _spec(json_schema=json.dumps(SCHEMA, indent=3)).job_id  # same content, same job
    assert len({a.job_id, _spec().job_id, _spec(regex="a").job_id, _spec(choice=("a",)).job_id}) == 4
    assert a.diff(_spec(regex="a")) == [
        f"sampling.json_schema: {a.sampling.json_schema!r} != None",
        "sampling.regex: None != 'a'",
    ]
    with pytest.raises(ValidationError, match="needs at least one string"):
        SamplingSpec(choice=())
