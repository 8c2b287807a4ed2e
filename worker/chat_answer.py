"""A chat choice's answer: its tokens split into reasoning and answer (contracts/reasoning.py) by
the model's reasoning format, and the answer's tool calls parsed (worker/tool_formats.py) when the
request has tools.

Stop strings: the engine cut the whole text at the first; here the part it falls in is cut there
(a stop inside the thinking leaves no answer). A choice with tool calls finishes "tool_calls" (when
it finished "stop"); its content is the answer's text around the calls, None when that is blank.
Each call gets an id derived from the row and the choice (the same on every attempt).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from contracts.reasoning import split_output
from contracts.sampling import SamplingParams
from worker.tool_formats import parse_calls


@dataclass(frozen=True)
class ChatAnswer:
    text: str
    reasoning: str | None
    reasoning_tokens: int
    tool_calls: list[dict[str, str]] | None  # [{id, type, name, arguments}] with tools, else None
    finish_reason: str


def chat_answer(choice: Any, prompt_ids: list[int], params: SamplingParams, tokenizer: Any, tools: Any,
                tool_format: str | None, call_salt: str) -> ChatAnswer:  # fmt: skip
    """`choice`: the engine's CompletionOutput; `tools`: the row's ToolRequest (None: no parsing)."""
    skip = params.skip_special_tokens

    def decode(ids: Any) -> str:
        return tokenizer.decode(list(ids), skip_special_tokens=skip)

    reasoning, tokens, messages = None, 0, ()
    answer_ids: list[int] = list(choice.token_ids)
    text = choice.text
    if params.reasoning is not None:
        split = split_output(tokenizer.reasoning_tokens(params.reasoning), prompt_ids, choice.token_ids, decode)
        reasoning, text, tokens, messages = split.reasoning, split.answer, split.reasoning_tokens, split.messages
        answer_ids = list(split.answer_ids)
        if params.stop and choice.finish_reason == "stop":
            reasoning, text = _cut(reasoning, text, params.stop)
    finish = choice.finish_reason
    calls = None
    if tools is not None and tool_format is not None:
        kept = tokenizer.decode(answer_ids, skip_special_tokens=False)  # markers such as [TOOL_CALLS] are special
        content, parsed = parse_calls(tool_format, kept, tools.names, messages,  # type: ignore[arg-type]
                                      lambda ids: tokenizer.decode(list(ids), skip_special_tokens=False))  # fmt: skip
        calls = [{"id": _call_id(call_salt, k), "type": "function", "name": c.name, "arguments": c.arguments}
                 for k, c in enumerate(parsed)]  # fmt: skip
        if calls:
            # the text around the calls, its special tokens (an EOS, a turn end) dropped
            text = decode(tokenizer.encode(content, add_special_tokens=False)).strip() if content else ""
            finish = "tool_calls" if finish == "stop" else finish
    return ChatAnswer(text, reasoning, tokens, calls, finish)


def _cut(reasoning: str | None, answer: str, stops: tuple[str, ...]) -> tuple[str | None, str]:
    if reasoning is not None:
        at = min((i for s in stops if (i := reasoning.find(s)) >= 0), default=-1)
        if at >= 0:
            return reasoning[:at], ""
    at = min((i for s in stops if (i := answer.find(s)) >= 0), default=-1)
    return reasoning, answer[:at] if at >= 0 else answer


def _call_id(salt: str, k: int) -> str:
    return "call_" + hashlib.blake2b(f"{salt}:{k}".encode(), digest_size=12).hexdigest()
