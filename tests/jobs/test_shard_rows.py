"""A result row from the engine's output: a request whose forked choice failed alone is a failed row
(never choice 0's text passed off as a full answer)."""

from __future__ import annotations

from contracts.sampling import SamplingParams
from worker.engine.outputs import CompletionOutput, RequestOutput
from worker.row_requests import RowRequest
from worker.shard_rows import from_output


def _output(second_reason: str, error: str | None) -> RequestOutput:
    choices = [CompletionOutput(0, "ab", [1, 2], "stop"), CompletionOutput(1, "a", [1], second_reason)]
    return RequestOutput(index=0, prompt_token_ids=[5, 6], token_ids=[1, 2], text="ab", finish_reason="stop",
                         prompt_tokens=2, cached_tokens=0, error=error, outputs=choices)  # fmt: skip


def test_a_row_fails_when_any_choice_failed() -> None:
    req = RowRequest(row=3, id="r", prompt="p", sampling=SamplingParams(max_tokens=2, temperature=1.0, top_p=1.0,
                     seed=1, n=2))  # fmt: skip
    ok = from_output(_output("length", None), req)
    assert ok.error is None and ok.completions == ["ab", "a"] and ok.finish_reasons == ["stop", "length"]
    assert ok.completion_tokens == 3
    bad = from_output(_output("error", "the KV cache is too small for this request"), req)
    assert bad.finish_reason == "error" and bad.completion is None and bad.completions is None
    assert bad.error == "the KV cache is too small for this request"
