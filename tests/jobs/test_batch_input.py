"""OpenAI-Batch JSONL files: each line keeps url + raw body; a bad line is that row's problem, a bad file
(not JSONL, no usable line, a repeated custom_id) is refused before anything is written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from jobs.batch_input import BatchFileError, read_batch
from jobs.errors import InputError
from jobs.planner import plan
from jobs.spec import JobSpec


def _file(*lines: object) -> bytes:
    return "".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines).encode()


def test_lines_keep_url_and_raw_body_and_bad_lines_become_row_errors() -> None:
    chat = {"custom_id": "c", "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stop": ["\n"]}}  # fmt: skip
    data = _file(
        chat,
        "{not json",
        {"custom_id": "p", "body": {"prompt": "def f():", "echo": True}},  # no url: from the body
        {"custom_id": "e", "url": "/v1/embeddings", "body": {"input": "text"}},
        {"custom_id": "u", "url": "/v1/moderations", "body": {"input": "x"}},
        {"custom_id": "g", "method": "GET", "url": "/v1/completions", "body": {"prompt": "x"}},
        {"custom_id": "x", "url": "/v1/completions", "body": {"prompt": "x"}, "extra": 1},
        {"url": "/v1/completions", "body": {"prompt": "no id"}},
        {"custom_id": "b", "url": "/v1/completions", "body": [1, 2]},
        "",  # blank lines are not rows
    )
    batch = read_batch("in.jsonl", data)
    rows = batch.table.to_pylist()
    assert [r["custom_id"] for r in rows] == ["c", "line-2", "p", "e", "u", "g", "x", "line-8", "b"]
    assert json.loads(rows[0]["body"]) == chat["body"] and rows[0]["line_error"] is None
    assert [r["url"] for r in rows[:4]] == [
        "/v1/chat/completions", "/v1/chat/completions", "/v1/completions", "/v1/embeddings"
    ]  # fmt: skip
    errors = {r["custom_id"]: r["line_error"] for r in rows}
    assert errors["p"] is None and errors["e"] is None
    assert errors["line-2"].startswith("line 2: not JSON") and rows[1]["body"] is None
    assert "url '/v1/moderations' is not supported: use one of" in errors["u"] and "/v1/responses" in errors["u"]
    assert "method 'GET'" in errors["g"]
    assert "unknown line field 'extra'" in errors["x"]
    assert "line 8: custom_id None: every line needs a custom_id" in errors["line-8"]
    assert "body must be a JSON object" in errors["b"]
    assert batch.prompt_texts[0] == "user\nhi\n" and batch.prompt_texts[2] == "def f():"


def test_responses_lines_take_their_url_and_group_as_chat() -> None:
    """A /v1/responses line; without url, an `input` of message items or a field only responses
    take makes a response (else an embedding); its prompt text is its instructions and input as
    messages, so it groups with the chat requests it renders like."""
    items = [{"role": "user", "content": [{"type": "input_text", "text": "hi"}]}]
    data = _file(
        {"custom_id": "r", "url": "/v1/responses", "body": {"input": "hi", "instructions": "be brief"}},
        {"custom_id": "items", "body": {"input": items}},
        {"custom_id": "max", "body": {"input": "hi", "max_output_tokens": 5}},
        {"custom_id": "emb", "body": {"input": "hi"}},
        {"custom_id": "chat", "body": {"messages": [{"role": "system", "content": "be brief"},
                                                    {"role": "user", "content": "hi"}]}},  # fmt: skip
    )
    batch = read_batch("in.jsonl", data)
    assert [r["url"] for r in batch.table.to_pylist()] == [
        "/v1/responses", "/v1/responses", "/v1/responses", "/v1/embeddings", "/v1/chat/completions"
    ]  # fmt: skip
    assert batch.prompt_texts == ["system\nbe brief\nuser\nhi\n", "user\nhi\n", "user\nhi\n", "hi",
                                  "system\nbe brief\nuser\nhi\n"]  # fmt: skip


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (b"", "is empty"),
        (b"\n\n", "is empty"),
        (b"PAR1\x00\x01binary\nid,prompt\n", "no line of in.jsonl is an OpenAI-Batch request; line 1: not JSON"),
        (_file({"body": {"prompt": "x"}}), "no line of in.jsonl is an OpenAI-Batch request; line 1: custom_id"),
        (
            _file(*({"custom_id": c, "body": {"prompt": "x"}} for c in ("r1", "r2", "r1", "r2", "r1"))),
            "custom_id repeats ('r1' on lines 1, 3, 5; 'r2' on lines 2, 4)",
        ),
        (
            _file("oops", {"custom_id": "line-1", "body": {"prompt": "x"}}),
            "line 1 has no usable custom_id and would be reported as 'line-1', which line 2 uses",
        ),
    ],
)
def test_whole_file_problems_are_refused(data: bytes, expected: str) -> None:
    with pytest.raises(InputError) as err:
        read_batch("in.jsonl", data)
    assert expected in str(err.value)


def test_whole_file_problems_name_their_lines() -> None:
    """What a batch's errors.data reports (freight serve): each repeat by the line it repeats on."""
    data = _file(*({"custom_id": c, "body": {"prompt": "x"}} for c in ("r1", "r2", "r1", "r2", "r1")))
    with pytest.raises(BatchFileError) as err:
        read_batch("in.jsonl", data)
    assert err.value.problems == (
        (3, "duplicate_custom_id", "custom_id 'r1' is also on line 1"),
        (5, "duplicate_custom_id", "custom_id 'r1' is also on line 1"),
        (4, "duplicate_custom_id", "custom_id 'r2' is also on line 2"),
    )
    with pytest.raises(BatchFileError) as empty:
        read_batch("in.jsonl", b"\n\n")
    assert empty.value.problems == ((None, "empty_file", "no JSONL lines"),)


def test_plan_groups_batch_rows_by_prompt_text_and_writes_nothing(tmp_path: Path, demo_model_dir: Path) -> None:
    system = "You are a careful assistant who answers in one short sentence. " * 2
    lines = []
    for i in range(12):  # every other row shares a long system prompt; the rest are unrelated
        msgs = [{"role": "system", "content": system}] if i % 2 == 0 else []
        msgs.append({"role": "user", "content": [{"type": "text", "text": f"question {i}"}]})
        lines.append({"custom_id": f"r{i}", "url": "/v1/chat/completions", "body": {"messages": msgs}})
    path = tmp_path / "batch.jsonl"
    path.write_bytes(_file(*lines))
    m = plan(JobSpec(input=str(path), model=str(demo_model_dir), output=str(tmp_path / "out"), shard_rows=6))
    shard_of = {r: s.index for s in m.shards for r in s.row_indices()}
    assert len({shard_of[i] for i in range(0, 12, 2)}) == 1  # the shared-prefix rows stay together
    assert m.input.prompt_kind == "request" and m.input.rows == 12
    assert not (tmp_path / "out").exists()
