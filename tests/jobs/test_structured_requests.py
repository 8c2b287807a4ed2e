"""Structured output on every request surface: OpenAI-Batch `response_format`, vLLM's `guided_*` and
`structured_outputs`, Parquet constraint columns and the job's flags all put the right Constraint in
the engine's SamplingParams; every bad shape is that row's error naming the field."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from batch_rows import USER, job_spec, one_request

from contracts.constraint import Constraint
from jobs.manifest import InputFile, InputPlan
from jobs.spec import JobSpec
from worker.row_engine import sampling_params
from worker.row_requests import RowRequest, build_requests

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
AS_SCHEMA = Constraint.json_schema(SCHEMA)


@pytest.fixture(scope="module")
def tokenizer(demo_model_dir: Path) -> Any:
    from worker.engine.tokenizer import Tokenizer

    return Tokenizer(demo_model_dir)


def _rf(schema: Any = SCHEMA, **extra: Any) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "thing-1_A", "schema": schema, **extra}}


GOOD_BODIES = [
    ({"response_format": {"type": "text"}}, None),
    ({"response_format": {"type": "json_object"}}, Constraint("json_object")),
    ({"response_format": _rf(strict=True, description="a thing")}, AS_SCHEMA),
    ({"response_format": _rf(strict=None)}, AS_SCHEMA),
    ({"guided_json": SCHEMA}, AS_SCHEMA),
    ({"guided_json": json.dumps(SCHEMA, indent=2)}, AS_SCHEMA),  # JSON text: the same canonical schema
    ({"guided_regex": "[0-9]{3}"}, Constraint("regex", "[0-9]{3}")),
    ({"guided_choice": ["yes", "no"]}, Constraint("choice", choices=("yes", "no"))),
    ({"guided_grammar": 'start: "a"+'}, Constraint("grammar", 'start: "a"+')),
    ({"guided_choice": ["a"], "guided_decoding_backend": "xgrammar"}, Constraint("choice", choices=("a",))),
    ({"guided_regex": "x+", "response_format": {"type": "text"}}, Constraint("regex", "x+")),  # text asks none
    ({"guided_json": None, "response_format": None}, None),  # null = absent
    ({"structured_outputs": {"json": SCHEMA}}, AS_SCHEMA),
    ({"structured_outputs": {"regex": "a|b"}}, Constraint("regex", "a|b")),
    ({"structured_outputs": {"choice": ["x", "y"]}}, Constraint("choice", choices=("x", "y"))),
    ({"structured_outputs": {"grammar": "g"}}, Constraint("grammar", "g")),
    ({"structured_outputs": {"json_object": True, "regex": None}}, Constraint("json_object")),
]


@pytest.mark.parametrize(("fields", "want"), GOOD_BODIES, ids=[str(i) for i in range(len(GOOD_BODIES))])
@pytest.mark.parametrize("url", ["/v1/chat/completions", "/v1/completions"])
def test_each_body_field_reaches_sampling_params(
    tokenizer: Any, demo_model_dir: Path, fields: dict[str, Any], want: Constraint | None, url: str
) -> None:
    prompt = {"messages": USER} if "chat" in url else {"prompt": "def f():"}
    req = one_request(tokenizer, job_spec(demo_model_dir), {**prompt, **fields}, url)
    assert req.error is None, req.error
    assert req.sampling is not None and req.sampling.constraint == want
    assert sampling_params(req).constraint == want


BAD_BODIES = [
    ({"response_format": {"type": "xml"}}, "response_format.type 'xml': must be text, json_object or json_schema"),
    ({"response_format": {}}, "response_format.type: is required"),
    ({"response_format": "json"}, "response_format: must be a JSON object"),
    ({"response_format": {"type": "json_object", "schema": {}}}, "unknown field 'response_format.schema'"),
    ({"response_format": {"type": "json_schema"}}, "response_format.json_schema: is required"),
    ({"response_format": {"type": "json_schema", "json_schema": SCHEMA}}, "unknown field 'response_format.json_schema.properties'"),
    ({"response_format": {"type": "json_schema", "json_schema": {"schema": SCHEMA}}}, "response_format.json_schema.name: is required"),
    ({"response_format": _rf() | {"json_schema": {"name": "my schema", "schema": SCHEMA}}},
     "response_format.json_schema.name 'my schema': must be 1-64 letters, digits, _ or -"),
    ({"response_format": _rf() | {"json_schema": {"name": "x" * 65, "schema": SCHEMA}}}, "must be 1-64 letters"),
    ({"response_format": _rf(strict="yes")}, "response_format.json_schema.strict 'yes': must be true or false"),
    ({"response_format": _rf(description=3)}, "response_format.json_schema.description: must be a string"),
    ({"response_format": _rf(schema="{}")}, "response_format.json_schema.schema: must be a JSON object"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "n"}}}, "response_format.json_schema.schema: is required"),
    ({"guided_json": "{not json"}, "guided_json: is not valid JSON"),
    ({"guided_json": "[1, 2]"}, "guided_json: must be a JSON object, got list"),
    ({"guided_json": 5}, "guided_json: must be a JSON schema (an object, or its JSON text)"),
    ({"guided_choice": []}, "guided_choice: the list of choices is empty"),
    ({"guided_choice": "yes"}, "guided_choice: must be a list of strings"),
    ({"guided_choice": ["a", ""]}, "guided_choice[1]: a choice must not be empty"),
    ({"guided_regex": ""}, "guided_regex: must not be empty"),
    ({"guided_regex": 5}, "guided_regex: must be a string (a regular expression)"),
    ({"guided_grammar": ["a"]}, "guided_grammar: must be a string (a grammar)"),
    ({"guided_json": SCHEMA, "guided_regex": "a"}, "guided_json and guided_regex both constrain the output"),
    ({"response_format": {"type": "json_object"}, "guided_choice": ["a"]},
     "response_format and guided_choice both constrain the output"),
    ({"structured_outputs": {"regex": "a", "choice": ["a"]}},
     "structured_outputs.regex and structured_outputs.choice both constrain the output"),
    ({"structured_outputs": {}}, "structured_outputs: give one of json, regex, choice, grammar, json_object"),
    ({"structured_outputs": {"whitespace_pattern": " "}}, "unknown field 'structured_outputs.whitespace_pattern'"),
    ({"structured_outputs": {"json_object": 1}}, "structured_outputs.json_object: must be true"),
    ({"structured_outputs": {"choice": []}}, "structured_outputs.choice: the list of choices is empty"),
    ({"guided_whitespace_pattern": " "}, "unknown field 'guided_whitespace_pattern': not supported"),
    ({"guided_decoding_backend": 3}, "guided_decoding_backend 3: must be a string"),
]  # fmt: skip


@pytest.mark.parametrize(("fields", "expected"), BAD_BODIES, ids=[e[:40] for _, e in BAD_BODIES])
def test_bad_constraint_fields_are_row_errors_naming_the_field(
    tokenizer: Any, demo_model_dir: Path, fields: dict[str, Any], expected: str
) -> None:
    req = one_request(tokenizer, job_spec(demo_model_dir), {"messages": USER, **fields})
    assert req.sampling is None and req.error is not None
    assert expected in req.error, req.error


def test_job_flags_apply_to_rows_without_their_own(tokenizer: Any, demo_model_dir: Path) -> None:
    spec = job_spec(demo_model_dir, choice=("yes", "no"))
    assert sampling_params(one_request(tokenizer, spec, {"messages": USER})).constraint == Constraint(
        "choice", choices=("yes", "no")
    )
    own = one_request(tokenizer, spec, {"messages": USER, "guided_regex": "[a-z]+"})
    assert sampling_params(own).constraint == Constraint("regex", "[a-z]+")  # the row's wins
    # a row's response_format of type text asks for plain text: the job's constraint does not apply
    text = one_request(tokenizer, spec, {"messages": USER, "response_format": {"type": "text"}})
    assert sampling_params(text).constraint is None
    # ... unless another field of the row asks for one (OpenAI's default type beside vLLM's fields)
    both = one_request(tokenizer, spec, {"messages": USER, "response_format": {"type": "text"}, "guided_regex": "b"})
    assert sampling_params(both).constraint == Constraint("regex", "b")
    schema_job = job_spec(demo_model_dir, json_schema=json.dumps(SCHEMA, indent=4))
    assert sampling_params(one_request(tokenizer, schema_job, {"messages": USER})).constraint == AS_SCHEMA
    regex_job = job_spec(demo_model_dir, regex=r"\d+")
    assert sampling_params(one_request(tokenizer, regex_job, {"messages": USER})).constraint == Constraint("regex", r"\d+")


def _parquet(table: pa.Table, spec: JobSpec, tokenizer: Any) -> list[RowRequest]:
    columns = tuple(c for c in table.column_names if c != "prompt")
    plan = InputPlan(format="parquet", files=(InputFile(url="in.parquet", rows=table.num_rows, size=1),),
                     rows=table.num_rows, prompt_column="prompt", prompt_kind="text", id_column=None,
                     override_columns=columns)  # fmt: skip
    return build_requests(table, list(range(table.num_rows)), spec, plan, tokenizer, max_n=16)


def test_parquet_constraint_columns(tokenizer: Any, demo_model_dir: Path) -> None:
    rf = json.dumps(_rf())
    table = pa.table(
        {
            "prompt": ["a"] * 9,
            "response_format": [rf, '{"type": "json_object"}', None, None, None, None, None, '{"type": "text"}', None],
            "json_schema": [None, None, json.dumps(SCHEMA), None, None, None, "{oops", None, None],
            "regex": [None, None, None, "[0-9]+", None, None, None, None, None],
            "choice": pa.array([None, None, None, None, ["x", "y"], None, None, None, []], pa.list_(pa.string())),
        }
    )
    spec = job_spec(demo_model_dir, regex="job")
    reqs = _parquet(table, spec, tokenizer)
    got = [r.sampling.constraint if r.sampling else r.error for r in reqs]
    assert got[:6] == [
        AS_SCHEMA,
        Constraint("json_object"),
        AS_SCHEMA,
        Constraint("regex", "[0-9]+"),
        Constraint("choice", choices=("x", "y")),
        Constraint("regex", "job"),  # all null: the job's
    ]
    assert got[6] == "json_schema: is not valid JSON: Expecting property name enclosed in double quotes: line 1 column 2 (char 1)"
    assert got[7] is None  # type text: plain text, the job's constraint notwithstanding
    assert got[8] == "choice: the list of choices is empty; give at least one string"
    assert sampling_params(reqs[0]).constraint == AS_SCHEMA


def test_parquet_struct_response_format_and_text_choices(tokenizer: Any, demo_model_dir: Path) -> None:
    """A struct column has every member on every row (null where unset); a schema may be its JSON text."""
    rf = pa.array(
        [
            {"type": "json_schema", "json_schema": {"name": "n", "schema": json.dumps(SCHEMA), "strict": True}},
            {"type": "json_object", "json_schema": None},
            {"type": "json_schema", "json_schema": {"name": None, "schema": "{}", "strict": None}},
        ]
    )
    table = pa.table({"prompt": ["a", "b", "c"], "response_format": rf, "choice": ['["p", "q"]', None, None]})
    reqs = _parquet(table, job_spec(demo_model_dir), tokenizer)
    assert reqs[0].error == "response_format and choice both constrain the output: a request takes one"
    assert reqs[1].sampling is not None and reqs[1].sampling.constraint == Constraint("json_object")
    assert reqs[2].error == "response_format.json_schema.name: is required (1-64 letters, digits, _ or -)"
    alone = _parquet(table.drop_columns(["response_format"]), job_spec(demo_model_dir), tokenizer)
    assert alone[0].sampling is not None and alone[0].sampling.constraint == Constraint("choice", choices=("p", "q"))
    bad = _parquet(pa.table({"prompt": ["a"], "choice": ["yes"]}), job_spec(demo_model_dir), tokenizer)
    assert bad[0].error is not None and bad[0].error.startswith("choice: not a JSON list of strings"), bad[0].error


def test_likelihood_rows_refuse_a_constraint(tokenizer: Any, demo_model_dir: Path) -> None:
    table = pa.table({"prompt": ["a", "b"], "cont": [" x", " y"], "regex": [None, "x"]})
    plan = InputPlan(format="parquet", files=(InputFile(url="in.parquet", rows=2, size=1),), rows=2,
                     prompt_column="prompt", prompt_kind="text", id_column=None, continuation_column="cont",
                     override_columns=("regex",))  # fmt: skip
    reqs = build_requests(table, [0, 1], job_spec(demo_model_dir), plan, tokenizer, max_n=16)
    assert reqs[0].error is None and reqs[0].continuation_tokens > 0
    assert reqs[1].error is not None and reqs[1].error.startswith("regex: likelihood scoring scores the continuation")


def test_rows_with_different_constraints_share_params_only_when_equal(tokenizer: Any, demo_model_dir: Path) -> None:
    """The greedy params cache keys on the whole SamplingParams: equal constraints share one object,
    different ones (or none) never do."""
    spec = job_spec(demo_model_dir)
    bodies = [{"messages": USER, "guided_json": SCHEMA}, {"messages": USER, "guided_json": json.dumps(SCHEMA)},
              {"messages": USER, "guided_regex": "a"}, {"messages": USER}]  # fmt: skip
    cache: dict[Any, Any] = {}
    params = [sampling_params(one_request(tokenizer, spec, b), cache) for b in bodies]
    assert params[0] is params[1] and params[0].constraint == AS_SCHEMA
    assert params[2].constraint == Constraint("regex", "a") and params[3].constraint is None
    assert len({id(p) for p in params}) == 3
