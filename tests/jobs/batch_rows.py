"""One OpenAI-Batch line through the worker's request building (jobs.batch_input -> RowRequest), for
the request-surface tests (test_request_body.py, test_structured_requests.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from jobs.batch_input import read_batch
from jobs.manifest import InputFile, InputPlan
from jobs.spec import JobSpec, SamplingSpec
from worker.row_requests import RowRequest, build_requests

USER = [{"role": "user", "content": "hi"}]
JSONL_PLAN = InputPlan(
    format="jsonl", files=(InputFile(url="in.jsonl", rows=1, size=1),), rows=1, prompt_column="body",
    prompt_kind="request", id_column="custom_id",
)  # fmt: skip


def job_spec(demo_model_dir: Path, **sampling: Any) -> JobSpec:
    """A JSONL job on the demo model with these job-wide sampling settings."""
    return JobSpec(input="in.jsonl", model=str(demo_model_dir), output="out", sampling=SamplingSpec(**sampling))


def one_request(tokenizer: Any, spec: JobSpec, body: dict[str, Any], url: str = "/v1/chat/completions") -> RowRequest:
    """The RowRequest of a one-line batch file whose line has this body and url."""
    line = {"custom_id": "r", "method": "POST", "url": url, "body": body}
    table = read_batch("in.jsonl", (json.dumps(line) + "\n").encode()).table
    (req,) = build_requests(table, [0], spec, JSONL_PLAN, tokenizer, max_n=16)
    return req
