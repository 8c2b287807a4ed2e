"""A chat row's prompt: its messages, tools and chat template variables through the model's chat
template, as transformers' `apply_chat_template(messages, tools=..., **kwargs)` renders them.

Template variables: the job's `--reasoning-effort` / `--no-thinking` (enable_thinking false), with
the row's `reasoning_effort` and `chat_template_kwargs` over them (vLLM's fields). A variable the
template does not read is refused rather than dropped: reasoning effort on a model that does not
reason or whose template has no effort (Qwen3 thinks or not), a thinking switch on a template without
one (gpt-oss always thinks: lower its effort), tools on a template that renders none.
"""

from __future__ import annotations

from typing import Any

from worker.tool_formats import ToolFormat, detect_tool_format
from worker.tool_request import ToolRequest

_RESERVED = ("messages", "tools", "add_generation_prompt", "bos_token", "eos_token")


def template_kwargs(tokenizer: Any, job_effort: str | None, job_thinking: bool, effort: str | None,
                    kwargs: dict[str, Any] | None) -> dict[str, Any]:  # fmt: skip
    """The template variables of a row: the job's flags, the row's fields over them; ValueError naming
    the field the model's template cannot honour."""
    out: dict[str, Any] = {}
    if not job_thinking:
        out["enable_thinking"] = False
    if job_effort is not None:
        out["reasoning_effort"] = job_effort
    for key, value in (kwargs or {}).items():
        if key in _RESERVED:
            raise ValueError(f"chat_template_kwargs.{key}: set by freight (the request's own {key}); leave it out")
        out[key] = value
    if effort is not None:
        out["reasoning_effort"] = effort
    template = tokenizer.chat_template or ""
    if "reasoning_effort" in out:
        field = "reasoning_effort" if effort is not None or job_effort is not None else "chat_template_kwargs.reasoning_effort"
        if tokenizer.reasoning is None:
            raise ValueError(f"{field} {out['reasoning_effort']!r}: this model does not reason (its chat template "
                             "marks no thinking); leave it out")  # fmt: skip
        if "reasoning_effort" not in template:
            raise ValueError(f"{field} {out['reasoning_effort']!r}: this model's chat template takes no reasoning "
                             "effort (it thinks or not: turn thinking off with chat_template_kwargs "
                             '{"enable_thinking": false}, or bound it with reasoning_budget)')  # fmt: skip
    if "enable_thinking" in out and "enable_thinking" not in template:
        where = "chat_template_kwargs.enable_thinking" if "enable_thinking" in (kwargs or {}) else "--no-thinking"
        raise ValueError(f"{where}: this model's chat template has no thinking switch (gpt-oss always thinks: "
                         "lower its reasoning_effort, or bound it with reasoning_budget)")  # fmt: skip
    return out


def tool_format(tokenizer: Any, tools: ToolRequest | None) -> ToolFormat | None:
    """The format the model writes calls in, for a row with tools; ValueError when its template renders
    none freight reads."""
    if tools is None:
        return None
    fmt = detect_tool_format(tokenizer.chat_template, tokenizer.vocab())
    if fmt is None:
        raise ValueError("tools: this model's chat template renders no tools in a format freight parses (Hermes "
                         "<tool_call>, Llama 3 JSON, Mistral [TOOL_CALLS], gpt-oss harmony); leave tools out")  # fmt: skip
    return fmt


def render_chat(messages: list[dict[str, Any]], tokenizer: Any, tools: ToolRequest | None,
                variables: dict[str, Any]) -> str:  # fmt: skip
    """The prompt text; a template error is the row's ValueError."""
    listed = [t.template_dict() for t in tools.tools] if tools is not None else None
    try:
        return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tools=listed, **variables)
    except Exception as exc:  # a template error is this row's problem, not the shard's
        raise ValueError(f"chat template failed: {exc}") from exc
