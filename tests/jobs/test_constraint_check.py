"""The job-wide constraint compiled at planning (jobs/constraint_check.py) agrees with the engine's
compile on a worker (GrammarCache, with the model's tokenizer): what one refuses, the other refuses;
and planning refuses a constraint that does not compile before anything is written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pipeline_data import prompts_table, write_parquet
from typer.testing import CliRunner

from jobs.constraint_check import check_constraint, constraint_problem
from jobs.errors import FreightError
from jobs.planner import prepare_job
from jobs.spec import JobSpec, SamplingSpec

SAMPLINGS = {
    "regex": SamplingSpec(regex=r"\d{3}-[a-z]+"),
    "regex named group": SamplingSpec(regex=r"(?P<year>\d{4})"),
    "regex unclosed class": SamplingSpec(regex="[a-z"),
    "regex look-ahead": SamplingSpec(regex="(?=a)b"),
    "regex backreference": SamplingSpec(regex=r"(a)\1"),
    "regex word boundary": SamplingSpec(regex=r"\bfoo"),
    "regex bad repetition": SamplingSpec(regex="a{5,2}"),
    "schema": SamplingSpec(json_schema={"type": "object", "properties": {"n": {"type": "integer"}}}),
    "schema unknown type": SamplingSpec(json_schema={"type": "objekt"}),
    "schema bad pattern": SamplingSpec(json_schema={"type": "string", "pattern": "[a"}),
    "schema bad $ref": SamplingSpec(json_schema={"type": "object", "properties": {"a": {"$ref": "#/nope"}}}),
    "schema unknown format": SamplingSpec(json_schema={"type": "string", "format": "bogus"}),
    "schema unsatisfiable": SamplingSpec(json_schema={"type": "string", "minLength": 5, "maxLength": 2}),
    "choice": SamplingSpec(choice=("yes", "no", 'say "maybe"')),
}


@pytest.mark.parametrize("case", list(SAMPLINGS))
def test_planning_and_the_engine_agree(case: str, demo_model_dir: Path) -> None:
    from worker.engine.grammar_cache import GrammarCache

    config = json.loads((demo_model_dir / "config.json").read_text())
    grammars = GrammarCache(demo_model_dir, config["vocab_size"], (config["eos_token_id"],))
    sampling = SAMPLINGS[case]
    engine_error = grammars.error(sampling.constraint)
    problem = constraint_problem(sampling)
    assert (problem is None) == (engine_error is None), (problem, engine_error)
    if problem is not None:
        assert "\n" not in problem and problem in engine_error  # one line, the engine's own words


def test_no_constraint_is_no_problem() -> None:
    assert constraint_problem(SamplingSpec()) is None
    check_constraint(SamplingSpec())


def test_the_message_names_the_flag_the_value_and_what_to_do() -> None:
    with pytest.raises(FreightError) as info:
        check_constraint(SamplingSpec(regex="(?=a)b"))
    message = str(info.value)
    assert message.startswith("--regex '(?=a)b' does not compile: look-around")
    assert "fix the pattern" in message
    with pytest.raises(FreightError, match=r"--json-schema schema\.json does not compile: Invalid type: objekt; fix the schema"):
        check_constraint(SamplingSpec(json_schema={"type": "objekt"}), "schema.json")


def test_planning_refuses_it_before_reading_the_model_or_writing(tmp_path: Path) -> None:
    """Every way a job is planned (run, submit, estimate, eval runs) goes through prepare_job / plan."""
    data = write_parquet(prompts_table(4, bad=False), tmp_path / "in.parquet")
    spec = JobSpec(input=str(data), model=str(tmp_path / "no-model"), output=str(tmp_path / "out"),
                   sampling=SamplingSpec(regex="[a-z"))  # fmt: skip
    with pytest.raises(FreightError, match=r"--regex '\[a-z' does not compile: unclosed character class"):
        prepare_job(spec)
    assert not (tmp_path / "out").exists()


def test_a_constraint_that_fails_only_on_the_model_s_vocabulary_is_refused_at_submit(
    tmp_path: Path, demo_model_dir: Path
) -> None:
    """`a{1000000}` passes the grammar check and compiles, and fails at the second token: the run
    is refused before anything is written, with one line; a pattern that runs still runs."""
    from freight_cli import app
    from jobs.constraint_check import check_constraint_compiles
    from jobs.model_check import check_model

    config = check_model(str(demo_model_dir))
    assert constraint_problem(SamplingSpec(regex="a{1000000}")) is None  # the old check let it through
    with pytest.raises(FreightError, match=r"cannot run on .*too many expressions constructed; simplify the pattern"):
        check_constraint_compiles(SamplingSpec(regex="a{1000000}"), str(demo_model_dir), config)
    check_constraint_compiles(SamplingSpec(regex="[a-z]{1,5}"), str(demo_model_dir), config)
    check_constraint_compiles(SamplingSpec(choice=("yes", "no")), str(demo_model_dir), config)
    data = write_parquet(prompts_table(2, bad=False), tmp_path / "in.parquet")
    out = tmp_path / "out"
    result = CliRunner().invoke(app, ["run", str(data), "--model", str(demo_model_dir), "--output", str(out),
                                      "--regex", "a{1000000}"])  # fmt: skip
    assert result.exit_code == 2 and "too many expressions constructed" in result.output, result.output
    assert len(result.output.strip().splitlines()) == 1 and not out.exists()


def test_the_submit_compile_is_bounded_in_time(demo_model_dir: Path) -> None:
    from jobs.constraint_check import check_constraint_compiles
    from jobs.model_check import check_model
    from jobs.settings import Settings

    config = check_model(str(demo_model_dir))
    many = SamplingSpec(choice=tuple(f"choice number {i}" for i in range(10_000)))  # ~0.5 s to compile
    with pytest.raises(FreightError, match=r"did not compile within 0.05 s \(FREIGHT_CONSTRAINT_CHECK_TIMEOUT_S\)"):
        check_constraint_compiles(many, str(demo_model_dir), config, Settings(constraint_check_timeout_s=0.05))
