"""A /v1/responses request's function tools, as OpenAI's Responses API takes them -> the chat shape
worker/tool_request.py checks, and the same tools as the response object repeats them.

- `tools`: a non-empty list of {"type": "function", "name", "description"?, "parameters"?,
  "strict"?} (the Responses shape: the function's fields beside `type`, not under `function`);
  other tool types (web_search, file_search, computer_use, mcp, custom tools) are refused: freight
  runs no tools itself, it parses the model's calls.
- `tool_choice`: "none", "auto" (the default with tools), "required", or {"type": "function",
  "name"}.
- `parallel_tool_calls`: as for chat (default true).

Each rule of worker/tool_request.py holds, and its errors name the Responses field
("tools[0].name ...", "tool_choice.name ..."). Calls come back as `function_call` output items
(jobs/openai_response.py); earlier calls and their outputs are input items (worker/response_input.py).
"""

from __future__ import annotations

import re
from typing import Any

from worker.tool_request import ToolRequest, tool_request

_FUNCTION_KEYS = ("type", "name", "description", "parameters", "strict")
_SERVED_TOOLS = ("web_search", "web_search_preview", "file_search", "computer_use_preview", "code_interpreter",
                 "image_generation", "local_shell", "mcp", "custom")  # fmt: skip


def response_tool_request(tools: Any, tool_choice: Any, parallel: Any) -> ToolRequest | None:
    """The checked tools of a Responses body (None: it has none); ValueError naming the field."""
    chat_tools = None if tools is None else _chat_tools(tools)
    try:
        return tool_request(chat_tools, _chat_choice(tool_choice), parallel)
    except ValueError as exc:  # the chat check names chat's fields: say the Responses ones
        message = re.sub(r"tools\[(\d+)\]\.function\.", r"tools[\1].", str(exc))
        raise ValueError(message.replace("tool_choice.function.name", "tool_choice.name")) from None


def response_tools(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    """The body's tools (checked already) as the response object lists them (FunctionTool: each
    field present, null when not given)."""
    return [{"type": "function", **{k: t.get(k) for k in _FUNCTION_KEYS[1:]}} for t in tools or ()]


def response_tool_choice(request: ToolRequest | None) -> str | dict[str, str]:
    """tool_choice as the response object says it: none without tools, else the request's."""
    if request is None:
        return "none"
    if request.choice == "named":
        assert request.named is not None
        return {"type": "function", "name": request.named}
    return request.choice


def _chat_tools(tools: Any) -> Any:
    if not isinstance(tools, list):
        return tools  # tool_request refuses it with its own message
    return [_chat_tool(i, t) for i, t in enumerate(tools)]


def _chat_tool(i: int, tool: Any) -> Any:
    where = f"tools[{i}]"
    if not isinstance(tool, dict):
        raise ValueError(f'{where}: must be an object {{"type": "function", "name": ..., "parameters": ...}}')
    kind = tool.get("type")
    if kind in _SERVED_TOOLS or (isinstance(kind, str) and kind.startswith("web_search")):
        raise ValueError(f"{where}.type {kind!r}: freight runs no tools itself; give function tools and run the "
                         "calls the model makes")  # fmt: skip
    if kind != "function":
        raise ValueError(f"{where}.type {str(kind)[:40]!r}: must be \"function\"")
    if "function" in tool:
        raise ValueError(f"{where}.function: a Responses tool gives name, description and parameters beside "
                         'type, not under function ({"type": "function", "name": ...})')  # fmt: skip
    extra = sorted(set(tool) - set(_FUNCTION_KEYS))
    if extra:
        raise ValueError(f"unknown field '{where}.{extra[0]}': a function tool takes {', '.join(_FUNCTION_KEYS)}")
    function = {k: v for k, v in tool.items() if k != "type" and v is not None}
    return {"type": "function", "function": function}


def _chat_choice(choice: Any) -> Any:
    if isinstance(choice, dict):
        if choice.get("type") != "function" or set(choice) - {"type", "name"}:
            raise ValueError('tool_choice: an object is {"type": "function", "name": ...} (freight runs function '
                             "tools only)")  # fmt: skip
        return {"type": "function", "function": {"name": choice.get("name")}}
    return choice
