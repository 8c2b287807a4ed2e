"""The oracle of the OpenAI Batch export tests: every body parsed with the official `openai` package's
types, and nothing in it that those types do not know (imported by the test modules).

The `openai` package (3.51.0) has no type for a line of a batch output file, so `BatchRequestOutput`
below transcribes OpenAI's OpenAPI spec of it (components.schemas.BatchRequestOutput: id, custom_id,
response {status_code, request_id, body} or null, error {code, message} or null), extra keys refused.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from openai.types import Completion, CreateEmbeddingResponse
from openai.types.chat import ChatCompletion
from openai.types.responses import Response
from pydantic import BaseModel, ConfigDict


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class BatchResponse(_Strict):
    status_code: int
    request_id: str
    body: dict[str, Any]


class BatchLineError(_Strict):
    code: str
    message: str


class BatchRequestOutput(_Strict):
    id: str
    custom_id: str
    response: BatchResponse | None
    error: BatchLineError | None


BODY_TYPES: dict[str, type[BaseModel]] = {
    "chat.completion": ChatCompletion,
    "text_completion": Completion,
    "list": CreateEmbeddingResponse,
    "response": Response,
}


# Fields freight writes beyond OpenAI's, as vLLM names them (docs/design/requests.md): the thinking
# of a reasoning model's answer
EXTENSIONS = {"ChatCompletionMessage": {"reasoning_content"}}


def assert_known_fields(value: Any, where: str = "line") -> None:
    """No field the openai types would keep only as an unknown extra (a misspelt key passes their
    validation silently), but the vLLM extensions freight writes (EXTENSIONS)."""
    if isinstance(value, BaseModel):
        extra = set(value.model_extra or {}) - EXTENSIONS.get(type(value).__name__, set())
        assert not extra, f"{where}: fields unknown to {type(value).__name__}: {sorted(extra)}"
        for name in type(value).model_fields:
            assert_known_fields(getattr(value, name), f"{where}.{name}")
    elif isinstance(value, list):
        for i, item in enumerate(value):
            assert_known_fields(item, f"{where}[{i}]")
    elif isinstance(value, dict):
        for key, item in value.items():
            assert_known_fields(item, f"{where}[{key!r}]")


def parse_output(path: Path) -> list[tuple[dict[str, Any], BaseModel]]:
    """(raw line, parsed body) per line of an output file; every line a 200 with a typed body."""
    parsed = []
    for text in path.read_text(encoding="utf-8").splitlines():
        raw = json.loads(text)
        line = BatchRequestOutput.model_validate(raw)
        assert_known_fields(line)
        assert line.error is None and line.response is not None and line.response.status_code == 200
        assert line.id and line.custom_id and line.response.request_id
        body_type = BODY_TYPES[raw["response"]["body"]["object"]]
        body = body_type.model_validate(raw["response"]["body"])
        assert_known_fields(body, "body")
        parsed.append((raw, body))
    return parsed


def parse_errors(path: Path) -> list[dict[str, Any]]:
    """Raw lines of an error file; each parses as a BatchRequestOutput with an error code and message."""
    lines = []
    for text in path.read_text(encoding="utf-8").splitlines():
        raw = json.loads(text)
        line = BatchRequestOutput.model_validate(raw)
        assert_known_fields(line)
        assert line.error is not None and line.error.code and line.error.message
        if line.response is not None:
            assert line.response.status_code == 400
            assert raw["response"]["body"]["error"]["message"] == line.error.message
        lines.append(raw)
    return lines
